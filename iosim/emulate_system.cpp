// The tier emulator's system plumbing: mount points and their locks, stale
// mounts of killed emulators, the loop device, the FUSE connection.
#include "iosim/emulate_internal.h"

#include "common/clock.h"
#include "common/error.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <mntent.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace tierlab::iosim {
namespace emulate_detail {
namespace {

constexpr const char* kMountDirs[] = {"/run", "/tmp"};
constexpr const char* kMountPrefix = "tierlab-emulate.";

// True when the emulator that made mount point `path` is gone: its lock file
// is not locked, or (without one: an emulator older than the lock) its FUSE
// connection is dead.
bool owner_gone(const std::string& path, bool is_mounted) {
  const int fd = ::open((path + kLockSuffix).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return free;
  }
  struct stat sb{};
  if (is_mounted) {
    // Its root's attributes may still be cached; opening the image asks
    // the daemon.
    if (::stat(path.c_str(), &sb) != 0) return errno == ENOTCONN;
    const int f = ::open((path + "/" + kImageName).c_str(), O_RDONLY | O_CLOEXEC);
    if (f >= 0) ::close(f);
    return f < 0 && errno == ENOTCONN;
  }
  // An empty directory without a lock, not new: an emulator killed between
  // its mkdtemp and its lock, or a lock removed by hand.
  return ::stat(path.c_str(), &sb) == 0 && sb.st_mtime + 60 < clock_ns(CLOCK_REALTIME) / 1'000'000'000;
}

}  // namespace

void require_device(const char* path, const char* what) {
  int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    throw RuntimeError(errno_message(std::string(path) + " (" + what + ", needed to emulate a tier)", errno));
  ::close(fd);
}

// A fresh mount point, and beside it its lock file (MOUNT.lock, holding the
// pid), locked for the life of `lock_fd`: while it is held, the mount's
// emulator is alive.
std::string make_mountpoint(int& lock_fd) {
  for (const char* dir : kMountDirs) {
    std::string t = std::string(dir) + "/" + kMountPrefix + "XXXXXX";
    if (!::mkdtemp(t.data())) continue;
    lock_fd = ::open((t + kLockSuffix).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::rmdir(t.c_str());
      throw RuntimeError(errno_message("locking " + t + kLockSuffix, e));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::write(lock_fd, pid.data(), pid.size()) < 0) {
      // The pid is for people; the lock is what counts.
    }
    return t;
  }
  throw RuntimeError(errno_message("mkdtemp /run/tierlab-emulate.XXXXXX", errno));
}

void attach_loop(Emulator::State& st, const std::string& file) {
  const tiers::Tier& tier = st.tier;
  int ffd = ::open(file.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (ffd < 0) throw RuntimeError(errno_message("FUSE: opening " + file, errno));
  int ctl = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) {
    int e = errno;
    ::close(ffd);
    throw RuntimeError(errno_message("/dev/loop-control", e));
  }
  int last_err = 0;
  for (int attempt = 0; attempt < 20 && st.loop_fd < 0; ++attempt) {
    int n = ::ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) {
      last_err = errno;
      break;
    }
    const std::string dev = "/dev/loop" + std::to_string(n);
    int lfd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
    if (lfd < 0) {
      last_err = errno;
      continue;
    }
    loop_config cfg{};
    cfg.fd = uint32_t(ffd);
    cfg.block_size = st.block_size;
    cfg.info.lo_flags = LO_FLAGS_DIRECT_IO | LO_FLAGS_AUTOCLEAR;
    std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), st.opts.image.c_str(), LO_NAME_SIZE - 1);
    if (::ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0) {
      st.loop_fd = lfd;
      st.loop_index = n;
      st.device = dev;
      break;
    }
    last_err = errno;
    ::close(lfd);
    if (last_err != EBUSY) break;  // another process took it first: try the next free one
  }
  ::close(ctl);
  ::close(ffd);
  if (st.loop_fd < 0) throw RuntimeError(errno_message("attaching a loop device (LOOP_CONFIGURE)", last_err));
  loop_info64 info{};
  if (::ioctl(st.loop_fd, LOOP_GET_STATUS64, &info) != 0)
    throw RuntimeError(errno_message(st.device + ": LOOP_GET_STATUS64", errno));
  if (!(info.lo_flags & LO_FLAGS_DIRECT_IO))
    throw RuntimeError(st.device + ": the kernel did not enable direct I/O on the FUSE file (the page cache would "
                       "sit under the device)");
  // The block layer splits a request the device cannot take in one (its
  // segment limits) wherever the buffer's pages fall: a 1 MiB read could
  // arrive as 516 + 508 KiB and count 5 units. Requests no larger than the
  // tier's counting unit are split at unit multiples instead, so what the
  // emulator counts is what the tier counts for the request.
  if (tier.io_unit_bytes) {
    const std::string q = "/sys/block/loop" + std::to_string(st.loop_index) + "/queue/";
    uint64_t hw_kb = 0;
    if (FILE* f = std::fopen((q + "max_hw_sectors_kb").c_str(), "r")) {
      if (std::fscanf(f, "%lu", &hw_kb) != 1) hw_kb = 0;
      std::fclose(f);
    }
    const uint64_t kb = std::max<uint64_t>(st.block_size / 1024 ? st.block_size / 1024 : 1,
                                           std::min<uint64_t>(tier.io_unit_bytes / 1024, hw_kb ? hw_kb : UINT64_MAX));
    FILE* f = std::fopen((q + "max_sectors_kb").c_str(), "w");
    const bool ok = f && std::fprintf(f, "%lu\n", kb) > 0;
    if (f && std::fclose(f) != 0) f = nullptr;
    if (!ok || !f) throw RuntimeError(errno_message(q + "max_sectors_kb: setting " + std::to_string(kb), errno));
  }
}

// The FUSE connection of the mount at `path`: the minor number of its
// device, from /proc/self/mountinfo (no request to the file system). -1 if
// not found.
long fuse_connection(const std::string& path) {
  FILE* f = std::fopen("/proc/self/mountinfo", "r");
  if (!f) return -1;
  long conn = -1;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) {
    unsigned id = 0, parent = 0, maj = 0, min = 0;
    char root[1024], mnt[1024];
    if (std::sscanf(line, "%u %u %u:%u %1023s %1023s", &id, &parent, &maj, &min, root, mnt) == 6 && path == mnt)
      conn = long(min);
  }
  std::fclose(f);
  return conn;
}

// Aborts FUSE connection `conn` through the fuse control file system
// (mounted if it is not): every request waiting on it, and every later one,
// fails, and a read of /dev/fuse returns. For a stop while a
// loop device still holds the FUSE file open, which keeps the connection
// alive past the unmount. False when it could not be done.
bool abort_connection(long conn) {
  if (conn < 0) return false;
  const std::string dir = "/sys/fs/fuse/connections";
  const std::string f = dir + "/" + std::to_string(conn) + "/abort";
  if (::access(f.c_str(), W_OK) != 0) ::mount("fusectl", dir.c_str(), "fusectl", 0, nullptr);
  const int fd = ::open(f.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "1", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace emulate_detail

using emulate_detail::kLockSuffix;
using emulate_detail::kMountDirs;
using emulate_detail::kMountPrefix;
using emulate_detail::owner_gone;

std::vector<std::string> remove_stale_mounts() {
  std::vector<std::string> said;
  std::vector<std::string> mounts;
  if (FILE* f = ::setmntent("/proc/self/mounts", "r")) {
    while (const mntent* m = ::getmntent(f)) {
      const std::string d = m->mnt_dir;
      for (const char* dir : kMountDirs)
        if (d.rfind(std::string(dir) + "/" + kMountPrefix, 0) == 0) mounts.push_back(d);
    }
    ::endmntent(f);
  }
  std::vector<std::string> dirs;
  for (const char* dir : kMountDirs) {
    DIR* d = ::opendir(dir);
    if (!d) continue;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(kMountPrefix, 0) != 0) continue;
      const size_t n = std::strlen(kLockSuffix);
      if (name.size() > n && name.compare(name.size() - n, n, kLockSuffix) == 0) {
        // A lock whose directory is gone (removed by hand): drop it once free.
        const std::string path = std::string(dir) + "/" + name.substr(0, name.size() - n);
        struct stat sb{};
        if (::stat(path.c_str(), &sb) != 0 && errno == ENOENT && owner_gone(path, false)) ::unlink((path + kLockSuffix).c_str());
        continue;
      }
      dirs.push_back(std::string(dir) + "/" + name);
    }
    ::closedir(d);
  }
  for (const std::string& p : dirs) {
    const bool is_mounted = std::find(mounts.begin(), mounts.end(), p) != mounts.end();
    if (!owner_gone(p, is_mounted)) continue;
    if (is_mounted && ::umount2(p.c_str(), MNT_DETACH) != 0) {
      said.push_back(errno_message("cannot unmount the stale " + p + " of a killed emulator", errno));
      continue;
    }
    ::rmdir(p.c_str());
    ::unlink((p + kLockSuffix).c_str());
    said.push_back(is_mounted ? "unmounted the stale " + p + " of a killed emulator"
                              : "removed the leftover directory " + p + " of a killed emulator");
  }
  return said;
}

}  // namespace tierlab::iosim
