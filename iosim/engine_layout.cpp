// Laying a regular file out before a run: finding the parts of it that hold
// no written data (holes, unwritten extents) and writing them.
#include "iosim/engine.h"

#include "common/error.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace tierlab::iosim {
namespace {

constexpr unsigned kExtentsPerCall = 256;
constexpr uint32_t kLayoutChunk = 8u << 20;  // bytes per write
constexpr uint64_t kDirectAlign = 4096;

void add_range(std::vector<ByteRange>& out, uint64_t from, uint64_t to) {
  if (to <= from) return;
  if (!out.empty() && out.back().offset + out.back().length >= from) {
    uint64_t end = std::max(out.back().offset + out.back().length, to);
    out.back().length = end - out.back().offset;
    return;
  }
  out.push_back(ByteRange{from, to - from});
}

// Holes in [0, size) by SEEK_DATA/SEEK_HOLE, for file systems without FIEMAP.
std::vector<ByteRange> holes(int fd, uint64_t size) {
  std::vector<ByteRange> out;
  uint64_t pos = 0;
  while (pos < size) {
    off_t data = ::lseek(fd, off_t(pos), SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) add_range(out, pos, size);  // no data after pos
      break;                                           // EINVAL: no SEEK_DATA here
    }
    add_range(out, pos, std::min<uint64_t>(uint64_t(data), size));
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) break;
    pos = uint64_t(hole);
  }
  return out;
}

}  // namespace

std::vector<ByteRange> unwritten_ranges(int fd, uint64_t size) {
  std::vector<ByteRange> out;
  const size_t bytes = sizeof(fiemap) + kExtentsPerCall * sizeof(fiemap_extent);
  std::unique_ptr<uint8_t[]> mem(new uint8_t[bytes]);
  auto* fm = reinterpret_cast<fiemap*>(mem.get());
  uint64_t pos = 0;  // everything before pos is accounted for
  bool first = true;
  while (pos < size) {
    std::memset(fm, 0, bytes);
    fm->fm_start = pos;
    fm->fm_length = size - pos;
    // SYNC: delayed allocations are written first and show as extents.
    fm->fm_flags = first ? FIEMAP_FLAG_SYNC : 0;
    fm->fm_extent_count = kExtentsPerCall;
    if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
      if (first && (errno == EOPNOTSUPP || errno == ENOTTY || errno == EINVAL)) return holes(fd, size);
      throw RuntimeError(errno_message("FIEMAP", errno));
    }
    first = false;
    if (fm->fm_mapped_extents == 0) break;  // the rest is a hole
    bool last = false;
    for (unsigned i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      uint64_t start = e.fe_logical, end = e.fe_logical + e.fe_length;
      add_range(out, pos, std::min(start, size));  // a hole before the extent
      if (e.fe_flags & FIEMAP_EXTENT_UNWRITTEN) add_range(out, std::max(start, pos), std::min(end, size));
      pos = std::max(pos, std::min(end, size));
      if (e.fe_flags & FIEMAP_EXTENT_LAST) last = true;
    }
    if (last) break;
  }
  add_range(out, pos, size);  // a hole at the end
  return out;
}

uint64_t lay_out(const std::string& path, const std::vector<ByteRange>& ranges, uint64_t seed,
                 const std::atomic<int>* stop) {
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.length;
  if (!total) return 0;
  // Aligned parts through O_DIRECT (no page cache to evict afterwards);
  // where the file system refuses it, and for unaligned ends, buffered.
  int dfd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  int bfd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (bfd < 0) {
    int err = errno;
    if (dfd >= 0) ::close(dfd);
    throw InputError(errno_message(path + ": cannot be written to lay it out (" + std::to_string(total) +
                                       " bytes of holes or unwritten extents, which reads would not take to "
                                       "the device)",
                                   err));
  }
  void* mem = nullptr;
  if (posix_memalign(&mem, kDirectAlign, kLayoutChunk) != 0) {
    if (dfd >= 0) ::close(dfd);
    ::close(bfd);
    throw RuntimeError("cannot allocate " + std::to_string(kLayoutChunk) + " bytes to lay out " + path);
  }
  std::unique_ptr<void, decltype(&std::free)> buf(mem, &std::free);
  auto* b = static_cast<uint8_t*>(mem);
  std::string error;
  uint64_t written = 0;
  for (const auto& r : ranges) {
    uint64_t pos = r.offset, end = r.offset + r.length;
    while (pos < end && error.empty()) {
      if (stop && stop->load(std::memory_order_relaxed)) break;
      uint64_t len = std::min<uint64_t>(kLayoutChunk, end - pos);
      // A chunk that does not start aligned goes up to the next boundary.
      if (pos % kDirectAlign) len = std::min<uint64_t>(len, kDirectAlign - pos % kDirectAlign);
      else if (len % kDirectAlign && len > kDirectAlign) len -= len % kDirectAlign;
      const bool direct = dfd >= 0 && pos % kDirectAlign == 0 && len % kDirectAlign == 0;
      fill_pattern(b, pos, uint32_t(len), seed);
      ssize_t n = ::pwrite(direct ? dfd : bfd, b, len, off_t(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && direct && errno == EINVAL) {  // O_DIRECT after all refused
        ::close(dfd);
        dfd = -1;
        continue;
      }
      if (n <= 0) {
        error = errno_message(path + ": laying out at offset " + std::to_string(pos), n < 0 ? errno : EIO);
        break;
      }
      pos += uint64_t(n);
      written += uint64_t(n);
    }
  }
  if (error.empty() && ::fdatasync(bfd) != 0) error = errno_message(path + ": fdatasync after laying out", errno);
  // The buffered parts leave the page cache, as the direct ones never entered it.
  if (error.empty()) (void)::posix_fadvise(bfd, 0, 0, POSIX_FADV_DONTNEED);
  if (dfd >= 0) ::close(dfd);
  ::close(bfd);
  if (!error.empty()) throw RuntimeError(error);
  return written;
}

uint64_t direct_io_alignment(const std::string& target) {
  struct statx sx{};
  if (::statx(AT_FDCWD, target.c_str(), 0, STATX_TYPE | STATX_DIOALIGN, &sx) == 0) {
    if ((sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) return sx.stx_dio_offset_align;
    if (S_ISBLK(sx.stx_mode)) {
      int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
      int lbs = 0;
      bool ok = fd >= 0 && ::ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0;
      if (fd >= 0) ::close(fd);
      if (ok) return uint64_t(lbs);
    }
    return kDirectAlign;
  }
  // Not there yet: the logical block size of the device under its directory
  // (a partition's is its disk's).
  std::string dir = target.find('/') == std::string::npos ? "." : target.substr(0, target.rfind('/') + 1);
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return kDirectAlign;
  std::string sys = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  for (const char* q : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    if (std::FILE* f = std::fopen((sys + q).c_str(), "re")) {
      unsigned long v = 0;
      bool ok = std::fscanf(f, "%lu", &v) == 1 && v > 0;
      std::fclose(f);
      if (ok) return v;
    }
  }
  return kDirectAlign;
}

}  // namespace tierlab::iosim
