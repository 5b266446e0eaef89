// The tier emulator: a FUSE file over the image, a loop device over that file.
#define FUSE_USE_VERSION 312
#include "iosim/emulate.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "common/uring.h"
#include "iosim/engine.h"

#include <fuse3/fuse_lowlevel.h>

#include <fcntl.h>
#include <dirent.h>
#include <linux/loop.h>
#include <mntent.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

namespace tierlab::iosim {
namespace {

constexpr fuse_ino_t kImageIno = 2;
constexpr const char* kImageName = "image";
constexpr uint32_t kMaxRequest = 1u << 20;  // the largest read or write FUSE sends (max_write, max_pages)
constexpr uint32_t kSlab = 128u << 10;      // a held read's data
constexpr uint32_t kSlabs = 256;            // held reads at most (32 MiB, locked)
constexpr uint32_t kMaxBackground = 256;    // requests the kernel keeps in flight to the emulator
// The round trip is measured with reads held as long as the tier holds
// them (its read p50, within these bounds): how late a worker and the reader
// wake after a timed sleep depends on its length (2 ms: 80-160 us on two
// busy CPUs, 400 us: half that). At most kCalibrationReads reads, at most
// kCalibrationNs in all.
constexpr int64_t kCalibrationMinDelayNs = 100'000;
constexpr int64_t kCalibrationMaxDelayNs = 5'000'000;
constexpr int64_t kCalibrationNs = 300'000'000;
constexpr int kCalibrationReads = 100;

}  // namespace

struct Emulator::State {
  models::Tier tier;
  EmulateOptions opts;
  std::string device, mountpoint;
  uint64_t size = 0;
  uint32_t block_size = 512;
  int image_fd = -1;
  int loop_fd = -1;
  int loop_index = -1;
  bool loop_detach_asked = false;
  fuse_session* se = nullptr;
  bool mounted = false;
  std::thread loop_thread;

  // The shaper and the cumulative counters it keeps, under one lock.
  std::mutex shaper_mu;
  Shaper shaper;

  // Preallocated, locked, aligned buffers: one per worker thread.
  std::mutex pool_mu;
  std::vector<char*> pool;
  char* pool_mem = nullptr;
  size_t pool_bytes = 0;

  // Replies held until their time, by one thread, so that a worker is free
  // for the next request as soon as the backing I/O is done: the requests
  // in flight are bounded by the kernel's queue (max_background) and the
  // slabs, not by the workers. A read's data waits in a slab until its
  // reply; a read larger than a slab, or one that finds none free, holds
  // its worker instead.
  struct Pending {
    int64_t at = 0;  // reply time
    fuse_req_t req = nullptr;
    char* slab = nullptr;  // the read's data, or null
    size_t len = 0;        // bytes read or written
    int err = 0;
    IoOp op = IoOp::Read;
    int64_t arrival = 0;
    bool late = false;  // the backing I/O ended after the reply time
  };
  std::mutex reply_mu;
  std::condition_variable reply_cv;
  std::vector<Pending> replies;  // min-heap on `at`, capacity reserved
  bool reply_stop = false;
  std::thread reply_thread;
  std::vector<char*> slabs;
  char* slab_mem = nullptr;
  size_t slab_bytes = 0;

  // Interval and total statistics.
  std::mutex stats_mu;
  EmulateInterval interval, total;
  int64_t interval_start = 0, start = 0;
  ShaperStats shaper_at_interval{};
  std::atomic<uint32_t> inflight{0};
  // The round trip a reader of the device sees beyond the emulator's own
  // arrival-to-reply time (loop device, FUSE queue, worker wake-up, the
  // timed sleep's overshoot), measured at start: replies leave this much
  // before the tier's completion time, so the reader sees the tier's.
  int64_t round_trip_ns = 0;
  DiskFigures disk;
  int lock_fd = -1;                     // MOUNTPOINT.lock, locked while this emulator lives
  long fuse_conn = -1;                  // the FUSE connection's number (/sys/fs/fuse/connections/N)
  std::vector<std::string> leftovers;   // what remove_stale_mounts() did at start
  // While measuring it: requests bypass the shaper and the statistics, and
  // are replied at arrival + kCalibrationDelayNs.
  std::atomic<bool> calibrating{false};
  std::atomic<int64_t> calibration_served_ns{0};
  int64_t calibration_delay_ns = kCalibrationMinDelayNs;
  CpuLatencyHold cpu_latency{true};  // idle CPUs wake at once: replies leave at the tier's time

  State(const models::Tier& t, const EmulateOptions& o) : tier(t), opts(o), shaper(t, o.seed) {}
  ~State();

  char* take_buffer() {
    std::lock_guard<std::mutex> g(pool_mu);
    if (pool.empty()) return nullptr;
    char* b = pool.back();
    pool.pop_back();
    return b;
  }
  void give_buffer(char* b) {
    std::lock_guard<std::mutex> g(pool_mu);
    pool.push_back(b);
  }
};

namespace {

// A worker thread's buffer, taken from the pool on its first request and
// given back when the thread ends. The first request also marks the thread
// as an I/O flusher (PR_SET_IO_FLUSHER; inherited from the session thread
// already, set again here in case the library's threads were not) and
// tightens its timer slack and time slice, for the timed replies.
struct WorkerBuffer {
  Emulator::State* owner = nullptr;
  char* buf = nullptr;
  ~WorkerBuffer() {
    if (owner && buf) owner->give_buffer(buf);
  }
};
thread_local WorkerBuffer t_buffer;

char* worker_buffer(Emulator::State& s) {
  if (t_buffer.owner != &s || !t_buffer.buf) {
    ::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0);
    tight_timer_slack();  // the reply waits for the tier's completion time: no 50 us slack
    request_short_slice(kShortestSliceNs);
    if (t_buffer.owner && t_buffer.buf) t_buffer.owner->give_buffer(t_buffer.buf);
    t_buffer.owner = &s;
    t_buffer.buf = s.take_buffer();
  }
  return t_buffer.buf;
}

Emulator::State& state(fuse_req_t req) { return *static_cast<Emulator::State*>(fuse_req_userdata(req)); }

int op_index(IoOp op) { return op == IoOp::Read ? 0 : op == IoOp::Flush ? 2 : 1; }

// Admits a request to the tier: its schedule, taken at its arrival.
Schedule admit(Emulator::State& s, IoOp op, uint64_t off, uint32_t len, int64_t& arrival) {
  if (s.calibrating.load(std::memory_order_acquire)) {
    arrival = now_ns();
    Schedule c;
    c.start = arrival;
    c.complete = arrival + s.calibration_delay_ns;
    return c;
  }
  std::lock_guard<std::mutex> g(s.shaper_mu);
  arrival = now_ns();
  return s.shaper.schedule(IoRequest{op, off, len}, arrival);
}

void in_flight_begin(Emulator::State& s) {
  const uint32_t q = s.inflight.fetch_add(1) + 1;
  std::lock_guard<std::mutex> g(s.stats_mu);
  s.interval.max_queue_depth = std::max(s.interval.max_queue_depth, q);
  s.total.max_queue_depth = std::max(s.total.max_queue_depth, q);
}

char* take_slab(Emulator::State& s) {
  std::lock_guard<std::mutex> g(s.pool_mu);
  if (s.slabs.empty()) return nullptr;
  char* b = s.slabs.back();
  s.slabs.pop_back();
  return b;
}

void send_reply(const Emulator::State::Pending& p, const char* data) {
  if (p.err) fuse_reply_err(p.req, p.err);
  else if (p.op == IoOp::Read) fuse_reply_buf(p.req, data, p.len);
  else if (p.op == IoOp::Write) fuse_reply_write(p.req, p.len);
  else fuse_reply_err(p.req, 0);
}

// After the reply left: counts the request, gives its slab back.
void served(Emulator::State& s, const Emulator::State::Pending& p, int64_t replied) {
  // As the reader sees it: the reply's time plus the round trip.
  const int64_t lat = replied + s.round_trip_ns - p.arrival;
  const int i = op_index(p.op);
  const uint64_t bytes = p.op == IoOp::Read || p.op == IoOp::Write ? p.len : 0;
  {
    std::lock_guard<std::mutex> g(s.stats_mu);
    for (EmulateInterval* iv : {&s.interval, &s.total}) {
      ++iv->ios[i];
      iv->bytes[i] += bytes;
      if (p.late) ++iv->slower_than_tier;
      if (p.err) ++iv->errors;
      iv->lat.record(lat);
    }
  }
  if (p.slab) {
    std::lock_guard<std::mutex> g(s.pool_mu);
    s.slabs.push_back(p.slab);
  }
  s.inflight.fetch_sub(1);
}

bool reply_later(const Emulator::State::Pending& a, const Emulator::State::Pending& b) { return a.at > b.at; }

// After the backing I/O: the reply leaves at the tier's completion time,
// less the round trip it still travels (measured at start). The backing
// I/O ran inside the tier's time, so a reader sees the tier's latency, not
// the tier's plus the disk's. A reply that must wait goes to the reply
// thread, unless its data is in the worker's own buffer (`data` is not
// p.slab): then the worker waits for it.
void complete(Emulator::State& s, Emulator::State::Pending p, const Schedule& sch, const char* data) {
  const int64_t done = now_ns();
  if (s.calibrating.load(std::memory_order_acquire)) {
    if (done < sch.complete) sleep_until_ns(sch.complete);
    s.calibration_served_ns.store(std::max(done, sch.complete) - p.arrival, std::memory_order_release);
    send_reply(p, data);
    s.inflight.fetch_sub(1);
    if (p.slab) {
      std::lock_guard<std::mutex> g(s.pool_mu);
      s.slabs.push_back(p.slab);
    }
    return;
  }
  p.at = sch.complete - s.round_trip_ns;
  p.late = done > p.at;
  const bool own_buffer = p.op == IoOp::Read && !p.err && data != p.slab;
  if (done < p.at && !own_buffer) {
    std::lock_guard<std::mutex> g(s.reply_mu);
    s.replies.push_back(p);
    std::push_heap(s.replies.begin(), s.replies.end(), reply_later);
    if (s.replies.front().req == p.req) s.reply_cv.notify_one();  // the earliest now
    return;
  }
  if (done < p.at) sleep_until_ns(p.at);
  send_reply(p, data);
  served(s, p, now_ns());
}

// The reply thread: sends each held reply at its time. Its wake-ups keep
// the tier's time, so it sleeps with 1 ns timer slack on a short slice.
void reply_loop(Emulator::State& s) {
  ::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0);
  tight_timer_slack();
  request_short_slice(kShortestSliceNs);
  std::vector<Emulator::State::Pending> due;
  due.reserve(s.replies.capacity());
  std::unique_lock<std::mutex> lk(s.reply_mu);
  for (;;) {
    if (s.replies.empty()) {
      if (s.reply_stop) break;
      s.reply_cv.wait(lk);
      continue;
    }
    int64_t now = now_ns();
    const int64_t at = s.replies.front().at;
    if (at > now && !s.reply_stop) {
      s.reply_cv.wait_until(lk, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(at)));
      continue;
    }
    // Invariant: replies is a min-heap on `at`; everything due leaves together.
    while (!s.replies.empty() && (s.reply_stop || s.replies.front().at <= now)) {
      std::pop_heap(s.replies.begin(), s.replies.end(), reply_later);
      due.push_back(s.replies.back());
      s.replies.pop_back();
    }
    lk.unlock();
    for (const auto& p : due) {
      send_reply(p, p.slab);
      served(s, p, now_ns());
    }
    due.clear();
    lk.lock();
  }
}

void stop_replies(Emulator::State& s) {
  if (!s.reply_thread.joinable()) return;
  {
    std::lock_guard<std::mutex> g(s.reply_mu);
    s.reply_stop = true;
  }
  s.reply_cv.notify_one();
  s.reply_thread.join();
}

struct stat image_attr(const Emulator::State& s, fuse_ino_t ino) {
  struct stat st{};
  st.st_ino = ino;
  st.st_uid = 0;
  st.st_gid = 0;
  if (ino == FUSE_ROOT_ID) {
    st.st_mode = S_IFDIR | 0700;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | 0600;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(s.size);
    st.st_blksize = s.block_size;
    st.st_blocks = static_cast<blkcnt_t>(s.size / 512);
  }
  return st;
}

void op_init(void* userdata, fuse_conn_info* conn) {
  (void)userdata;
  conn->max_write = kMaxRequest;
  conn->max_background = kMaxBackground;  // async direct I/O: up to this many requests of the loop device at once
  conn->congestion_threshold = kMaxBackground * 3 / 4;
  if (conn->capable & FUSE_CAP_ASYNC_DIO) conn->want |= FUSE_CAP_ASYNC_DIO;
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent != FUSE_ROOT_ID || std::strcmp(name, kImageName) != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = kImageIno;
  e.attr = image_attr(state(req), kImageIno);
  e.attr_timeout = 3600;
  e.entry_timeout = 3600;
  fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && ino != kImageIno) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st = image_attr(state(req), ino);
  fuse_reply_attr(req, &st, 3600);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kImageIno) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  fi->direct_io = 1;  // no page cache on the FUSE file: the loop device's requests reach us as they are
  fi->keep_cache = 0;
  fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*) {
  Emulator::State& s = state(req);
  in_flight_begin(s);
  if (off < 0 || uint64_t(off) >= s.size) size = 0;
  else size = std::min<uint64_t>(size, s.size - uint64_t(off));
  Emulator::State::Pending p;
  p.req = req;
  p.op = IoOp::Read;
  // Small reads land in a slab, so the reply can wait without the worker.
  if (size <= kSlab && !s.calibrating.load(std::memory_order_relaxed)) p.slab = take_slab(s);
  char* buf = p.slab ? p.slab : worker_buffer(s);
  if (p.slab) worker_buffer(s);  // the worker's first request sets it up
  const Schedule sch = admit(s, IoOp::Read, uint64_t(off), uint32_t(size), p.arrival);
  size_t got = 0;
  if (!buf || size > kMaxRequest) p.err = EIO;
  while (!p.err && got < size) {
    ssize_t n = ::pread(s.image_fd, buf + got, size - got, off + off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) p.err = errno;
    else if (n == 0) break;  // the image shrank under us: a short read
    else got += size_t(n);
  }
  p.len = got;
  complete(s, p, sch, buf);
}

void op_write(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off, fuse_file_info*) {
  Emulator::State& s = state(req);
  in_flight_begin(s);
  char* buf = worker_buffer(s);
  Emulator::State::Pending p;
  p.req = req;
  p.op = IoOp::Write;
  const Schedule sch = admit(s, IoOp::Write, uint64_t(off), uint32_t(size), p.arrival);
  size_t put = 0;
  if (off < 0 || uint64_t(off) + size > s.size) p.err = ENOSPC;
  else if (!buf || size > kMaxRequest) p.err = EIO;
  else std::memcpy(buf, data, size);  // O_DIRECT wants an aligned buffer; FUSE's follows a header
  while (!p.err && put < size) {
    ssize_t n = ::pwrite(s.image_fd, buf + put, size - put, off + off_t(put));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) p.err = errno;
    else if (n == 0) p.err = EIO;
    else put += size_t(n);
  }
  p.len = put;
  complete(s, p, sch, nullptr);
}

// A flush of the device (the loop device's REQ_OP_FLUSH arrives as fsync):
// acknowledged only once the image's data is on its disk.
void op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  Emulator::State& s = state(req);
  in_flight_begin(s);
  worker_buffer(s);
  Emulator::State::Pending p;
  p.req = req;
  p.op = IoOp::Flush;
  const Schedule sch = admit(s, IoOp::Flush, 0, 0, p.arrival);
  p.err = ::fdatasync(s.image_fd) == 0 ? 0 : errno;
  complete(s, p, sch, nullptr);
}

// A discard (the loop device punches a hole): done on the image, shaped as
// the tier shapes a discard (one counted write I/O).
void op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len, fuse_file_info*) {
  Emulator::State& s = state(req);
  worker_buffer(s);
  if (off < 0 || len < 0 || uint64_t(off) + uint64_t(len) > s.size) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  in_flight_begin(s);
  Emulator::State::Pending p;
  p.req = req;
  p.op = IoOp::Discard;
  const Schedule sch = admit(s, IoOp::Discard, uint64_t(off), uint32_t(std::min<off_t>(len, UINT32_MAX)), p.arrival);
  p.err = ::fallocate(s.image_fd, mode, off, len) == 0 ? 0 : errno;
  complete(s, p, sch, nullptr);
}

void op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }
void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.getattr = op_getattr;
  ops.open = op_open;
  ops.read = op_read;
  ops.write = op_write;
  ops.fsync = op_fsync;
  ops.fallocate = op_fallocate;
  ops.flush = op_flush;
  ops.release = op_release;
  return ops;
}
const fuse_lowlevel_ops kOps = make_ops();

void require_device(const char* path, const char* what) {
  int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    throw RuntimeError(errno_message(std::string(path) + " (" + what + ", needed to emulate a tier)", errno));
  ::close(fd);
}

constexpr const char* kMountDirs[] = {"/run", "/tmp"};
constexpr const char* kMountPrefix = "tierlab-emulate.";
constexpr const char* kLockSuffix = ".lock";

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
  return ::stat(path.c_str(), &sb) == 0 && sb.st_mtime + 60 < ::time(nullptr);
}

}  // namespace

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

namespace {

// Measures the round trip (see State::round_trip_ns): reads of the device
// at queue depth 1, each held by the emulator for the tier's read p50
// (bounded); what the reader waited beyond what the emulator took is the
// round trip. The median of the reads. Returns 0 when the device cannot be
// read.
int64_t measure_round_trip(Emulator::State& s) {
  const size_t len = std::max<size_t>(4096, s.block_size);
  if (s.size < len) return 0;
  int fd = ::open(s.device.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return 0;
  void* buf = nullptr;
  if (::posix_memalign(&buf, len, len) != 0) {
    ::close(fd);
    return 0;
  }
  std::vector<int64_t> extra;
  extra.reserve(kCalibrationReads);
  const uint64_t blocks = s.size / len;
  s.calibration_delay_ns = std::clamp<int64_t>(s.tier.read.p50_ns, kCalibrationMinDelayNs, kCalibrationMaxDelayNs);
  const int reads = int(std::clamp<int64_t>(kCalibrationNs / s.calibration_delay_ns, 30, kCalibrationReads));
  s.calibrating.store(true, std::memory_order_release);
  for (int i = 0; i < reads; ++i) {
    const off_t off = off_t((uint64_t(i) * 7919 % blocks) * len);
    s.calibration_served_ns.store(-1, std::memory_order_release);
    const int64_t t0 = now_ns();
    const ssize_t n = ::pread(fd, buf, len, off);  // the emulator's workers serve it
    const int64_t t1 = now_ns();
    const int64_t served = s.calibration_served_ns.load(std::memory_order_acquire);
    if (n == ssize_t(len) && served >= 0) extra.push_back(std::max<int64_t>(0, t1 - t0 - served));
  }
  s.calibrating.store(false, std::memory_order_release);
  std::free(buf);
  ::close(fd);
  if (extra.empty()) return 0;
  std::nth_element(extra.begin(), extra.begin() + extra.size() / 2, extra.end());
  return extra[extra.size() / 2];
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
// fails, and the workers blocked reading it return. For a stop while a
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

}  // namespace

DiskFigures measure_disk(const std::string& dir, std::string* why) {
  constexpr size_t kFile = 16u << 20, kChunk = 1u << 20, kRead = 4096;
  constexpr unsigned kDepth = 32;
  constexpr int64_t kPhaseNs = 150'000'000;
  DiskFigures out;
  auto fail = [&](const std::string& what, int e) {
    if (why) *why = errno_message(what, e);
    return DiskFigures{};
  };
  // An unnamed file where the file system has them, else a named one
  // removed at once: nothing is left behind either way.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string t = dir + "/.tierlab-disk-probe.XXXXXX";
    fd = ::mkostemp(t.data(), O_CLOEXEC);
    if (fd < 0) return fail("disk probe: creating a file in " + dir, errno);
    ::unlink(t.c_str());
    const int fl = ::fcntl(fd, F_GETFL);
    if (::fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) {
      const int e = errno;
      ::close(fd);
      return fail("disk probe: O_DIRECT in " + dir, e);
    }
  }
  void* mem = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return fail("disk probe: buffer", e);
  }
  char* buf = static_cast<char*>(mem);
  Rng rng(0x7465726c);
  for (size_t i = 0; i < kChunk; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(buf + i, &v, 8);
  }
  std::string err;
  int err_no = 0;
  for (size_t off = 0; off < kFile && err.empty(); off += kChunk)
    if (::pwrite(fd, buf, kChunk, off_t(off)) != ssize_t(kChunk)) err = "disk probe: writing", err_no = errno;
  if (err.empty() && ::fdatasync(fd) != 0) err = "disk probe: fdatasync", err_no = errno;
  const uint64_t blocks = kFile / kRead;
  // Queue depth 1: the p50 of a read.
  if (err.empty()) {
    std::vector<int64_t> lat;
    lat.reserve(400);
    const int64_t end = now_ns() + kPhaseNs;
    while (lat.size() < 400 && now_ns() < end) {
      const int64_t t0 = now_ns();
      if (::pread(fd, buf, kRead, off_t(rng.below(blocks) * kRead)) != ssize_t(kRead)) {
        err = "disk probe: reading", err_no = errno;
        break;
      }
      lat.push_back(now_ns() - t0);
    }
    if (!lat.empty()) {
      std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
      out.read_p50_ns = lat[lat.size() / 2];
    }
  }
  // Queue depth 32 through io_uring: the rate.
  if (err.empty()) {
    try {
      RingOptions ro;
      ro.entries = kDepth;
      Ring ring(ro);
      for (unsigned i = 0; i < kDepth; ++i) {
        io_uring_sqe* e = ring.sqe();
        io_uring_prep_read(e, fd, buf + size_t(i) * kRead, kRead, rng.below(blocks) * kRead);
        io_uring_sqe_set_data64(e, i);
      }
      const int64_t t0 = now_ns(), end = t0 + kPhaseNs;
      uint64_t done = 0;
      unsigned inflight = kDepth;
      io_uring_submit(ring.get());
      while (inflight > 0) {
        io_uring_cqe* cqe = nullptr;
        const int rc = io_uring_wait_cqe(ring.get(), &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) {
          err = "disk probe: io_uring", err_no = -rc;
          break;
        }
        const uint64_t slot = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(ring.get(), cqe);
        --inflight;
        if (res != int(kRead)) {
          if (err.empty()) err = "disk probe: reading at QD 32", err_no = res < 0 ? -res : EIO;
          continue;
        }
        ++done;
        if (err.empty() && now_ns() < end) {
          io_uring_sqe* e = ring.sqe();
          io_uring_prep_read(e, fd, buf + slot * kRead, kRead, rng.below(blocks) * kRead);
          io_uring_sqe_set_data64(e, slot);
          io_uring_submit(ring.get());
          ++inflight;
        }
      }
      const int64_t took = now_ns() - t0;
      if (err.empty() && took > 0) out.read_iops = double(done) * 1e9 / double(took);
    } catch (const std::exception& e) {
      err = std::string("disk probe: ") + e.what();
    }
  }
  ::munmap(mem, kChunk);
  ::close(fd);
  if (!err.empty()) {
    if (why) *why = err_no ? errno_message(err, err_no) : err;
    return DiskFigures{};
  }
  return out;
}

std::string faster_than_disk(const models::Tier& tier, const DiskFigures& disk, int64_t round_trip_ns) {
  std::string what;
  char b[200];
  const int64_t floor = disk.read_p50_ns + round_trip_ns;
  if (disk.read_p50_ns > 0 && tier.read.p50_ns < floor) {
    std::snprintf(b, sizeof b, "%s reads at a p50 of %.0f us, the image's disk and the emulator's round trip take %.0f us",
                  tier.name.c_str(), double(tier.read.p50_ns) / 1e3, double(floor) / 1e3);
    what = b;
  }
  double cap = 0;
  for (double c : {tier.total_iops, tier.read_iops, tier.burst.enabled() ? tier.burst.burst_iops : 0.0})
    if (c > 0 && (cap == 0 || c < cap)) cap = c;
  if (disk.read_iops > 0 && cap > disk.read_iops) {
    std::snprintf(b, sizeof b, "%s%s caps reads at %.0f IOPS, the image's disk delivers %.0f at queue depth 32",
                  what.empty() ? "" : "; ", what.empty() ? tier.name.c_str() : "it", cap, disk.read_iops);
    what += b;
  }
  if (what.empty()) return "";
  return "tier faster than the disk: " + what + " (measured at start); those I/Os run at the machine's speed";
}

Emulator::State::~State() {
  if (loop_fd >= 0) {
    if (!loop_detach_asked) ::ioctl(loop_fd, LOOP_CLR_FD, 0);
    ::close(loop_fd);
  }
  if (se) {
    if (mounted) {
      fuse_session_exit(se);
      fuse_session_unmount(se);
    }
    if (loop_thread.joinable()) loop_thread.join();
    stop_replies(*this);
    fuse_session_destroy(se);
  }
  if (!mountpoint.empty()) {
    ::rmdir(mountpoint.c_str());
    ::unlink((mountpoint + kLockSuffix).c_str());
  }
  if (lock_fd >= 0) ::close(lock_fd);
  if (image_fd >= 0) ::close(image_fd);
  stop_replies(*this);
  if (pool_mem) ::munmap(pool_mem, pool_bytes);
  if (slab_mem) ::munmap(slab_mem, slab_bytes);
}

Emulator::Emulator(const models::Tier& tier, const EmulateOptions& o) {
  if (::geteuid() != 0) throw RuntimeError("emulating a tier needs root (FUSE mount and loop device)");
  require_device("/dev/fuse", "FUSE");
  require_device("/dev/loop-control", "loop devices");
  auto s = std::make_unique<State>(tier, o);
  State& st = *s;

  // The image: opened with O_DIRECT, so its I/O never goes through the page cache.
  struct stat sb{};
  const bool exists = ::stat(o.image.c_str(), &sb) == 0;
  if (exists && !S_ISREG(sb.st_mode)) throw InputError(o.image + ": not a regular file");
  if (!exists && o.size == 0) throw InputError(o.image + ": does not exist (give a size to create it)");
  st.image_fd = ::open(o.image.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (st.image_fd < 0) throw InputError(errno_message(o.image, errno));
  st.block_size = uint32_t(std::max<uint64_t>(512, direct_io_alignment(o.image)));
  uint64_t size = exists ? uint64_t(sb.st_size) : 0;
  if (o.size > size) {
    if (::fallocate(st.image_fd, 0, 0, off_t(o.size)) != 0 && ::ftruncate(st.image_fd, off_t(o.size)) != 0)
      throw RuntimeError(errno_message(o.image + ": growing to " + std::to_string(o.size) + " bytes", errno));
    size = o.size;
  }
  size -= size % st.block_size;
  if (size == 0) throw InputError(o.image + ": is empty (give a size)");
  st.size = size;

  // The disk under the image, before the emulator adds its own load.
  const size_t slash = o.image.rfind('/');
  st.disk = measure_disk(slash == std::string::npos ? "." : slash == 0 ? "/" : o.image.substr(0, slash));

  // Worker buffers, then every page of the process locked (future ones as
  // they are touched: thread stacks stay as small as they are used).
  st.pool_bytes = size_t(o.workers) * kMaxRequest;
  void* mem = ::mmap(nullptr, st.pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) throw RuntimeError(errno_message("allocating the emulator's buffers", errno));
  st.pool_mem = static_cast<char*>(mem);
  for (uint32_t i = 0; i < o.workers; ++i) st.pool.push_back(st.pool_mem + size_t(i) * kMaxRequest);
  st.slab_bytes = size_t(kSlabs) * kSlab;
  mem = ::mmap(nullptr, st.slab_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) throw RuntimeError(errno_message("allocating the emulator's buffers", errno));
  st.slab_mem = static_cast<char*>(mem);
  for (uint32_t i = 0; i < kSlabs; ++i) st.slabs.push_back(st.slab_mem + size_t(i) * kSlab);
  // Every request the kernel can have in flight, and a worker's each.
  st.replies.reserve(kMaxBackground + o.workers + kSlabs);
  st.reply_thread = std::thread([&st] { reply_loop(st); });
  if (::mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0)
    throw RuntimeError(errno_message("mlockall (the emulator must not be paged out)", errno));

  // The FUSE file system, served by a thread pool of `workers` threads.
  st.leftovers = remove_stale_mounts();
  st.mountpoint = make_mountpoint(st.lock_fd);
  char arg0[] = "tierlab";
  char* argv[] = {arg0, nullptr};
  fuse_args args = FUSE_ARGS_INIT(1, argv);
  st.se = fuse_session_new(&args, &kOps, sizeof kOps, &st);
  if (!st.se) throw RuntimeError("FUSE: cannot create a session (libfuse3)");
  if (fuse_session_mount(st.se, st.mountpoint.c_str()) != 0)
    throw RuntimeError("FUSE: cannot mount on " + st.mountpoint);
  st.mounted = true;
  st.fuse_conn = fuse_connection(st.mountpoint);
  const uint32_t workers = o.workers;
  st.loop_thread = std::thread([&st, workers] {
    ::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0);  // inherited by the workers libfuse starts
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, workers);
    fuse_loop_cfg_set_idle_threads(cfg, workers);  // workers never exit, so their buffers stay theirs
    fuse_session_loop_mt(st.se, cfg);
    fuse_loop_cfg_destroy(cfg);
  });

  // The loop device, direct I/O on the FUSE file.
  const std::string file = st.mountpoint + "/" + kImageName;
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
    std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), o.image.c_str(), LO_NAME_SIZE - 1);
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
  st.round_trip_ns = measure_round_trip(st);
  st.start = st.interval_start = now_ns();
  s_ = std::move(s);
}

Emulator::~Emulator() = default;

const std::string& Emulator::device() const { return s_->device; }
const std::string& Emulator::mountpoint() const { return s_->mountpoint; }
uint64_t Emulator::size() const { return s_->size; }
uint32_t Emulator::block_size() const { return s_->block_size; }
const models::Tier& Emulator::tier() const { return s_->tier; }
int64_t Emulator::round_trip_ns() const { return s_->round_trip_ns; }
const DiskFigures& Emulator::disk() const { return s_->disk; }
const std::vector<std::string>& Emulator::leftovers() const { return s_->leftovers; }

EmulateInterval Emulator::take_interval() {
  ShaperStats ss;
  {
    std::lock_guard<std::mutex> g(s_->shaper_mu);
    ss = s_->shaper.stats();
  }
  std::lock_guard<std::mutex> g(s_->stats_mu);
  EmulateInterval out = s_->interval;
  const int64_t now = now_ns();
  out.ns = now - s_->interval_start;
  out.counted_ios = ss.counted_ios - s_->shaper_at_interval.counted_ios;
  out.throttled_ns = ss.throttled_ns - s_->shaper_at_interval.throttled_ns;
  out.queue_depth = s_->inflight.load();
  s_->shaper_at_interval = ss;
  s_->interval_start = now;
  s_->interval = EmulateInterval{};
  return out;
}

EmulateInterval Emulator::totals() {
  ShaperStats ss;
  {
    std::lock_guard<std::mutex> g(s_->shaper_mu);
    ss = s_->shaper.stats();
  }
  std::lock_guard<std::mutex> g(s_->stats_mu);
  EmulateInterval out = s_->total;
  out.ns = now_ns() - s_->start;
  out.counted_ios = ss.counted_ios;
  out.throttled_ns = ss.throttled_ns;
  out.queue_depth = s_->inflight.load();
  return out;
}

void Emulator::detach_loop() {
  State& st = *s_;
  if (st.loop_fd < 0 || st.loop_detach_asked) return;
  // With other users the kernel defers the detach to the last close
  // (autoclear, set at attach); ours is closed right after.
  ::ioctl(st.loop_fd, LOOP_CLR_FD, 0);
  st.loop_detach_asked = true;
  ::close(st.loop_fd);
  st.loop_fd = -1;
}

bool Emulator::loop_detached() const {
  const State& st = *s_;
  if (st.loop_index < 0) return true;
  if (st.loop_fd >= 0) return false;
  const std::string f = "/sys/block/loop" + std::to_string(st.loop_index) + "/loop/backing_file";
  return ::access(f.c_str(), F_OK) != 0;
}

void Emulator::shutdown() {
  State& st = *s_;
  detach_loop();
  if (st.se && st.mounted) {
    fuse_session_exit(st.se);
    // A loop device still attached keeps the FUSE file open, and with it the
    // connection its workers wait on: abort it, so they return and its I/O
    // fails instead of waiting forever.
    // (libfuse leaves an aborted connection's mount alone: unmount it here.)
    if (!loop_detached() && abort_connection(st.fuse_conn)) ::umount2(st.mountpoint.c_str(), MNT_DETACH);
    fuse_session_unmount(st.se);
    st.mounted = false;
  }
  if (st.loop_thread.joinable()) st.loop_thread.join();
  stop_replies(st);  // held replies leave now: the session is gone
  if (!st.mountpoint.empty()) {
    ::rmdir(st.mountpoint.c_str());
    ::unlink((st.mountpoint + kLockSuffix).c_str());
    st.mountpoint.clear();
  }
}

}  // namespace tierlab::iosim
