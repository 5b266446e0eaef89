// The tier emulator: a FUSE file over the image, a loop device over that file.
#define FUSE_USE_VERSION 312
#include "iosim/emulate.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "iosim/engine.h"

#include <fuse3/fuse_lowlevel.h>

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

  // Interval and total statistics.
  std::mutex stats_mu;
  EmulateInterval interval, total;
  int64_t interval_start = 0, start = 0;
  ShaperStats shaper_at_interval{};
  std::atomic<uint32_t> inflight{0};
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
  std::lock_guard<std::mutex> g(s.shaper_mu);
  arrival = now_ns();
  return s.shaper.schedule(IoRequest{op, off, len}, arrival);
}

// After the backing I/O: holds the reply until the tier completes the I/O,
// then counts it. The caller replies right after.
void finish(Emulator::State& s, IoOp op, uint32_t bytes, int64_t arrival, const Schedule& sch, bool failed) {
  const int64_t done = now_ns();
  if (done < sch.complete) sleep_until_ns(sch.complete);
  const int64_t lat = std::max(done, sch.complete) - arrival;
  std::lock_guard<std::mutex> g(s.stats_mu);
  for (EmulateInterval* iv : {&s.interval, &s.total}) {
    ++iv->ios[op_index(op)];
    iv->bytes[op_index(op)] += bytes;
    if (done > sch.complete) ++iv->slower_than_tier;
    if (failed) ++iv->errors;
    iv->lat.record(lat);
  }
}

struct InFlight {
  Emulator::State& s;
  explicit InFlight(Emulator::State& st) : s(st) {
    const uint32_t q = s.inflight.fetch_add(1) + 1;
    std::lock_guard<std::mutex> g(s.stats_mu);
    s.interval.max_queue_depth = std::max(s.interval.max_queue_depth, q);
    s.total.max_queue_depth = std::max(s.total.max_queue_depth, q);
  }
  ~InFlight() { s.inflight.fetch_sub(1); }
};

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
  conn->max_background = 128;  // async direct I/O: up to this many requests of the loop device at once
  conn->congestion_threshold = 96;
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
  InFlight in(s);
  char* buf = worker_buffer(s);
  if (off < 0 || uint64_t(off) >= s.size) size = 0;
  else size = std::min<uint64_t>(size, s.size - uint64_t(off));
  int64_t arrival = 0;
  const Schedule sch = admit(s, IoOp::Read, uint64_t(off), uint32_t(size), arrival);
  int err = 0;
  size_t got = 0;
  if (!buf || size > kMaxRequest) err = EIO;
  while (!err && got < size) {
    ssize_t n = ::pread(s.image_fd, buf + got, size - got, off + off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    else if (n == 0) break;  // the image shrank under us: a short read
    else got += size_t(n);
  }
  finish(s, IoOp::Read, uint32_t(got), arrival, sch, err != 0);
  if (err) fuse_reply_err(req, err);
  else fuse_reply_buf(req, buf, got);
}

void op_write(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off, fuse_file_info*) {
  Emulator::State& s = state(req);
  InFlight in(s);
  char* buf = worker_buffer(s);
  int64_t arrival = 0;
  const Schedule sch = admit(s, IoOp::Write, uint64_t(off), uint32_t(size), arrival);
  int err = 0;
  size_t put = 0;
  if (off < 0 || uint64_t(off) + size > s.size) err = ENOSPC;
  else if (!buf || size > kMaxRequest) err = EIO;
  else std::memcpy(buf, data, size);  // O_DIRECT wants an aligned buffer; FUSE's follows a header
  while (!err && put < size) {
    ssize_t n = ::pwrite(s.image_fd, buf + put, size - put, off + off_t(put));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    else if (n == 0) err = EIO;
    else put += size_t(n);
  }
  finish(s, IoOp::Write, uint32_t(put), arrival, sch, err != 0);
  if (err) fuse_reply_err(req, err);
  else fuse_reply_write(req, put);
}

// A flush of the device (the loop device's REQ_OP_FLUSH arrives as fsync):
// acknowledged only once the image's data is on its disk.
void op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  Emulator::State& s = state(req);
  InFlight in(s);
  worker_buffer(s);
  int64_t arrival = 0;
  const Schedule sch = admit(s, IoOp::Flush, 0, 0, arrival);
  int err = ::fdatasync(s.image_fd) == 0 ? 0 : errno;
  finish(s, IoOp::Flush, 0, arrival, sch, err != 0);
  fuse_reply_err(req, err);
}

// A discard (the loop device punches a hole): done on the image, shaped as
// the tier shapes a discard (one counted write I/O).
void op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len, fuse_file_info*) {
  Emulator::State& s = state(req);
  InFlight in(s);
  worker_buffer(s);
  if (off < 0 || len < 0 || uint64_t(off) + uint64_t(len) > s.size) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  int64_t arrival = 0;
  const Schedule sch = admit(s, IoOp::Discard, uint64_t(off), uint32_t(std::min<off_t>(len, UINT32_MAX)), arrival);
  int err = ::fallocate(s.image_fd, mode, off, len) == 0 ? 0 : errno;
  finish(s, IoOp::Discard, 0, arrival, sch, err != 0);
  fuse_reply_err(req, err);
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

std::string make_mountpoint() {
  for (const char* dir : {"/run", "/tmp"}) {
    std::string t = std::string(dir) + "/tierlab-emulate.XXXXXX";
    if (::mkdtemp(t.data())) return t;
  }
  throw RuntimeError(errno_message("mkdtemp /run/tierlab-emulate.XXXXXX", errno));
}

}  // namespace

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
    fuse_session_destroy(se);
  }
  if (!mountpoint.empty()) ::rmdir(mountpoint.c_str());
  if (image_fd >= 0) ::close(image_fd);
  if (pool_mem) ::munmap(pool_mem, pool_bytes);
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

  // Worker buffers, then every page of the process locked (future ones as
  // they are touched: thread stacks stay as small as they are used).
  st.pool_bytes = size_t(o.workers) * kMaxRequest;
  void* mem = ::mmap(nullptr, st.pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) throw RuntimeError(errno_message("allocating the emulator's buffers", errno));
  st.pool_mem = static_cast<char*>(mem);
  for (uint32_t i = 0; i < o.workers; ++i) st.pool.push_back(st.pool_mem + size_t(i) * kMaxRequest);
  if (::mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0)
    throw RuntimeError(errno_message("mlockall (the emulator must not be paged out)", errno));

  // The FUSE file system, served by a thread pool of `workers` threads.
  st.mountpoint = make_mountpoint();
  char arg0[] = "tierlab";
  char* argv[] = {arg0, nullptr};
  fuse_args args = FUSE_ARGS_INIT(1, argv);
  st.se = fuse_session_new(&args, &kOps, sizeof kOps, &st);
  if (!st.se) throw RuntimeError("FUSE: cannot create a session (libfuse3)");
  if (fuse_session_mount(st.se, st.mountpoint.c_str()) != 0)
    throw RuntimeError("FUSE: cannot mount on " + st.mountpoint);
  st.mounted = true;
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
  st.start = st.interval_start = now_ns();
  s_ = std::move(s);
}

Emulator::~Emulator() = default;

const std::string& Emulator::device() const { return s_->device; }
const std::string& Emulator::mountpoint() const { return s_->mountpoint; }
uint64_t Emulator::size() const { return s_->size; }
uint32_t Emulator::block_size() const { return s_->block_size; }
const models::Tier& Emulator::tier() const { return s_->tier; }

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
    fuse_session_unmount(st.se);
    st.mounted = false;
  }
  if (st.loop_thread.joinable()) st.loop_thread.join();
  if (!st.mountpoint.empty()) {
    ::rmdir(st.mountpoint.c_str());
    st.mountpoint.clear();
  }
}

}  // namespace tierlab::iosim
