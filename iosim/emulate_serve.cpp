// The tier emulator's server: the one-file FUSE file system, and the one
// thread that serves it.
//
// The thread reads requests from /dev/fuse (non-blocking, as many as are
// queued, each with one read), admits each to the tier's shaper and puts its
// backing I/O in an io_uring (O_DIRECT on the image, into buffers
// registered with the ring); the requests it received go to the kernel in
// one submission. It then waits in the ring for whichever comes first: a
// backing I/O's completion, the next held reply's time (the wait's timeout),
// /dev/fuse becoming readable (a poll in the same ring) or a stop. A reply
// leaves at the tier's completion time, less the round trip (see
// Emulator::round_trip_ns), and its buffer is free again. So a request costs
// the emulator a read and a write on /dev/fuse and its share of one ring
// submission, and no thread switch: requests in flight are bounded by the
// kernel's queue (max_background) and the buffers, not by threads.
#include "iosim/emulate_internal.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/uring.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

namespace tierlab::iosim {
namespace emulate_detail {
namespace {

constexpr uint32_t kSlab = 64u << 10;                   // a request's buffer is made of these
constexpr uint32_t kSlabs = 512;                        // 32 MiB, locked and registered with the ring
constexpr uint32_t kSlabsPerOp = kMaxRequest / kSlab;   // the largest request's
constexpr uint32_t kOps = 2 * kMaxBackground;           // requests in the emulator at once, at most
constexpr uint64_t kFuseReady = ~0ull;                  // user_data of the poll on /dev/fuse
constexpr uint64_t kWake = ~0ull - 1;                   // user_data of the poll on the stop eventfd

// A request between its arrival and its reply.
struct Op {
  fuse_req_t req = nullptr;
  IoOp op = IoOp::Read;
  bool calibration = false;  // measuring the round trip: no shaper, no statistics
  bool late = false;         // the backing I/O ended after the reply time
  int err = 0;
  int mode = 0;              // a discard's fallocate mode
  uint64_t off = 0;
  uint64_t len = 0;          // bytes asked
  uint64_t done = 0;         // bytes read or written so far
  int64_t arrival = 0;
  int64_t at = 0;            // reply time
  uint32_t nslabs = 0;
  uint32_t slab[kSlabsPerOp];
  iovec iov[kSlabsPerOp];
};

struct Held {
  int64_t at;
  uint32_t op;
};
bool later(const Held& a, const Held& b) { return a.at > b.at; }

}  // namespace

struct Server {
  Ring ring;
  bool fixed = false;  // the slabs are registered with the ring (read_fixed / write_fixed)
  char* mem = nullptr;
  std::vector<uint32_t> free_slabs, free_ops;  // capacities kSlabs, kOps
  std::vector<Op> ops;                         // kOps
  std::vector<Held> held;                      // replies waiting for their time; capacity kOps
  uint32_t backing = 0;                        // ops whose backing I/O is in the ring
  int wake_fd = -1;
  bool fuse_armed = false, wake_armed = false;
  uint64_t wake_value = 0;
  std::atomic<bool> stop{false};
  fuse_buf fbuf{};  // the request being read; libfuse allocates its memory once

  explicit Server(const RingOptions& o) : ring(o) {}
  ~Server() {
    if (mem) ::munmap(mem, size_t(kSlabs) * kSlab);
    if (wake_fd >= 0) ::close(wake_fd);
    std::free(fbuf.mem);
  }
  char* slab(uint32_t i) { return mem + size_t(i) * kSlab; }
};

void ServerDeleter::operator()(Server* v) const { delete v; }

namespace {

Emulator::State& state(fuse_req_t req) { return *static_cast<Emulator::State*>(fuse_req_userdata(req)); }

int op_index(IoOp op) { return op == IoOp::Read ? 0 : op == IoOp::Flush ? 2 : 1; }

void in_flight_begin(Emulator::State& s) {
  const uint32_t q = s.inflight.fetch_add(1) + 1;
  std::lock_guard<std::mutex> g(s.stats_mu);
  s.interval.max_queue_depth = std::max(s.interval.max_queue_depth, q);
  s.total.max_queue_depth = std::max(s.total.max_queue_depth, q);
}

// A request slot with buffers for `bytes`; kOps when none is free (the
// receiving loop reads a request only when one is, with the largest
// request's buffers).
uint32_t take_op(Server& v, fuse_req_t req, IoOp op, uint64_t bytes) {
  const uint32_t n = uint32_t((std::min<uint64_t>(bytes, kMaxRequest) + kSlab - 1) / kSlab);
  if (v.free_ops.empty() || v.free_slabs.size() < n) return kOps;
  const uint32_t i = v.free_ops.back();
  v.free_ops.pop_back();
  Op& o = v.ops[i];
  o.req = req;
  o.op = op;
  o.calibration = o.late = false;
  o.err = o.mode = 0;
  o.off = o.len = o.done = 0;
  o.nslabs = n;
  for (uint32_t k = 0; k < n; ++k) {
    o.slab[k] = v.free_slabs.back();
    v.free_slabs.pop_back();
  }
  return i;
}

// Admits the request to the tier: its arrival and reply time.
void admit(Emulator::State& s, Op& o) {
  if (s.calibrating.load(std::memory_order_acquire)) {
    o.calibration = true;
    o.arrival = now_ns();
    o.at = o.arrival + s.calibration_delay_ns;
    return;
  }
  std::lock_guard<std::mutex> g(s.shaper_mu);
  o.arrival = now_ns();
  const uint32_t len = uint32_t(std::min<uint64_t>(o.len, UINT32_MAX));
  o.at = s.shaper.schedule(IoRequest{o.op, o.off, len}, o.arrival).complete - s.round_trip_ns;
}

// Points o.iov at bytes [from, o.done or o.len) of the op's buffers; returns
// how many entries.
uint32_t fill_iov(Server& v, Op& o, uint64_t from, uint64_t to) {
  uint32_t n = 0;
  for (uint64_t at = from; at < to; ++n) {
    const uint64_t within = at % kSlab;
    const uint64_t l = std::min<uint64_t>(to - at, kSlab - within);
    o.iov[n] = iovec{v.slab(o.slab[at / kSlab]) + within, l};
    at += l;
  }
  return n;
}

// Puts the op's backing I/O (what is left of it) in the ring.
void submit_backing(Emulator::State& s, Server& v, uint32_t i) {
  Op& o = v.ops[i];
  io_uring_sqe* e = v.ring.sqe();
  const int fd = s.image_fd;
  if (o.op == IoOp::Read || o.op == IoOp::Write) {
    const uint64_t rest = o.len - o.done, within = o.done % kSlab, pos = o.off + o.done;
    const bool read = o.op == IoOp::Read;
    if (rest <= kSlab - within) {
      char* p = v.slab(o.slab[o.done / kSlab]) + within;
      if (v.fixed && read) io_uring_prep_read_fixed(e, fd, p, unsigned(rest), pos, 0);
      else if (v.fixed) io_uring_prep_write_fixed(e, fd, p, unsigned(rest), pos, 0);
      else if (read) io_uring_prep_read(e, fd, p, unsigned(rest), pos);
      else io_uring_prep_write(e, fd, p, unsigned(rest), pos);
    } else {
      const uint32_t n = fill_iov(v, o, o.done, o.len);
      if (read) io_uring_prep_readv(e, fd, o.iov, n, pos);
      else io_uring_prep_writev(e, fd, o.iov, n, pos);
    }
  } else if (o.op == IoOp::Flush) {
    io_uring_prep_fsync(e, fd, IORING_FSYNC_DATASYNC);
  } else {
    io_uring_prep_fallocate(e, fd, o.mode, off_t(o.off), off_t(o.len));
  }
  io_uring_sqe_set_data64(e, i);
  ++v.backing;
}

// Sends the op's reply, counts it and frees its slot.
void reply(Emulator::State& s, Server& v, uint32_t i) {
  Op& o = v.ops[i];
  if (o.err) {
    fuse_reply_err(o.req, o.err);
  } else if (o.op == IoOp::Read) {
    if (o.nslabs <= 1 || o.done <= kSlab) fuse_reply_buf(o.req, o.nslabs ? v.slab(o.slab[0]) : nullptr, o.done);
    else fuse_reply_iov(o.req, o.iov, int(fill_iov(v, o, 0, o.done)));
  } else if (o.op == IoOp::Write) {
    fuse_reply_write(o.req, o.done);
  } else {
    fuse_reply_err(o.req, 0);
  }
  if (!o.calibration) {
    // As the reader sees it: the reply's time plus the round trip.
    const int64_t lat = now_ns() + s.round_trip_ns - o.arrival;
    const int k = op_index(o.op);
    const uint64_t bytes = o.op == IoOp::Read || o.op == IoOp::Write ? o.done : 0;
    std::lock_guard<std::mutex> g(s.stats_mu);
    for (EmulateInterval* iv : {&s.interval, &s.total}) {
      ++iv->ios[k];
      iv->bytes[k] += bytes;
      if (o.late) ++iv->slower_than_tier;
      if (o.err) ++iv->errors;
      iv->lat.record(lat);
    }
  }
  s.inflight.fetch_sub(1);
  for (uint32_t k = 0; k < o.nslabs; ++k) v.free_slabs.push_back(o.slab[k]);
  o.nslabs = 0;
  v.free_ops.push_back(i);
}

// The backing I/O is done (or failed): the reply leaves now if its time has
// come, else it is held until then. The backing I/O ran inside the tier's
// time, so a reader sees the tier's latency, not the tier's plus the disk's.
void backing_done(Emulator::State& s, Server& v, uint32_t i) {
  Op& o = v.ops[i];
  const int64_t now = now_ns();
  if (o.calibration) s.calibration_served_ns.store(std::max(now, o.at) - o.arrival, std::memory_order_release);
  o.late = now > o.at;
  if (now >= o.at) {
    reply(s, v, i);
    return;
  }
  v.held.push_back(Held{o.at, i});
  std::push_heap(v.held.begin(), v.held.end(), later);
}

// A completion of op i's backing I/O: short ones go on, EAGAIN and EINTR
// are tried again.
void completed(Emulator::State& s, Server& v, uint32_t i, int res) {
  Op& o = v.ops[i];
  --v.backing;
  if (res == -EAGAIN || res == -EINTR) {
    submit_backing(s, v, i);
    return;
  }
  if (res < 0) {
    o.err = -res;
  } else if (o.op == IoOp::Read || o.op == IoOp::Write) {
    o.done += uint64_t(res);
    if (o.done < o.len) {
      if (res > 0) {
        submit_backing(s, v, i);
        return;
      }
      if (o.op == IoOp::Write) o.err = EIO;  // nothing written: the disk is full or failing
      // A read of 0 bytes: the image ended (shrank under us): a short read.
    }
  }
  backing_done(s, v, i);
}

// Replies whose time has come (all of them when stopping).
void reply_due(Emulator::State& s, Server& v, bool all) {
  if (v.held.empty()) return;
  const int64_t now = now_ns();
  // Invariant: held is a min-heap on `at`; everything due leaves together.
  while (!v.held.empty() && (all || v.held.front().at <= now)) {
    std::pop_heap(v.held.begin(), v.held.end(), later);
    const uint32_t i = v.held.back().op;
    v.held.pop_back();
    reply(s, v, i);
  }
}

// Reads and dispatches every request queued on /dev/fuse while a slot and
// the largest request's buffers are free; when the queue is empty, asks
// the ring to say when it is not. Called only while no such poll is armed.
void receive(Emulator::State& s, Server& v) {
  while (!v.free_ops.empty() && v.free_slabs.size() >= kSlabsPerOp) {
    const int r = fuse_session_receive_buf(s.se, &v.fbuf);
    if (r == -EINTR) continue;
    if (r == -EAGAIN) {
      io_uring_sqe* e = v.ring.sqe();
      io_uring_prep_poll_add(e, fuse_session_fd(s.se), POLLIN);
      io_uring_sqe_set_data64(e, kFuseReady);
      v.fuse_armed = true;
      return;
    }
    if (r <= 0) {
      // Unmounted, aborted, or a read that failed: the session is over, as
      // libfuse's own loops end it.
      fuse_session_exit(s.se);
      return;
    }
    fuse_session_process_buf(s.se, &v.fbuf);
  }
}

void serve(Emulator::State& s) {
  Server& v = *s.server;
  ::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0);  // and the ring's workers, which inherit it
  tight_timer_slack();                      // the replies keep the tier's time: no 50 us slack
  request_short_slice(kShortestSliceNs);
  v.ring.enable();
  io_uring* ring = v.ring.get();
  for (;;) {
    const bool stopping = v.stop.load(std::memory_order_acquire) || fuse_session_exited(s.se);
    if (!stopping) {
      // With the poll armed and not fired there is nothing to read.
      if (!v.fuse_armed) receive(s, v);
      if (!v.wake_armed) {
        io_uring_sqe* e = v.ring.sqe();
        io_uring_prep_poll_add(e, v.wake_fd, POLLIN);
        io_uring_sqe_set_data64(e, kWake);
        v.wake_armed = true;
      }
    }
    reply_due(s, v, stopping);  // stopping: held replies leave now
    if (stopping && v.backing == 0) break;
    io_uring_cqe* cqe = nullptr;
    if (!v.held.empty()) {
      __kernel_timespec ts = to_kts(std::max<int64_t>(0, v.held.front().at - now_ns()));
      io_uring_submit_and_wait_timeout(ring, &cqe, 1, &ts, nullptr);
    } else {
      io_uring_submit_and_wait_timeout(ring, &cqe, 1, nullptr, nullptr);
    }
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      const uint64_t ud = io_uring_cqe_get_data64(cqe);
      if (ud == kFuseReady) {
        v.fuse_armed = false;
      } else if (ud == kWake) {
        v.wake_armed = false;
        if (::read(v.wake_fd, &v.wake_value, sizeof v.wake_value) < 0) {
          // Already read: the eventfd is non-blocking and only says "look at stop".
        }
      } else {
        completed(s, v, uint32_t(ud), cqe->res);
      }
    }
    io_uring_cq_advance(ring, seen);
  }
}

// --- the file system -------------------------------------------------------

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

// A slot for a request of `len` bytes at `off`, with buffers for `bytes`,
// admitted to the tier; kOps, after its error reply, when there is none
// (the receiving loop keeps one free, so this does not happen).
uint32_t begin(Emulator::State& s, fuse_req_t req, IoOp op, uint64_t off, uint64_t len, uint64_t bytes) {
  const uint32_t i = take_op(*s.server, req, op, bytes);
  if (i == kOps) {
    fuse_reply_err(req, EBUSY);
    return kOps;
  }
  in_flight_begin(s);
  Op& o = s.server->ops[i];
  o.off = off;
  o.len = len;
  admit(s, o);
  return i;
}

// The backing I/O of op i, or its reply at its time when it has none.
void go(Emulator::State& s, uint32_t i) {
  const Op& o = s.server->ops[i];
  if (o.err || ((o.op == IoOp::Read || o.op == IoOp::Write) && o.len == 0)) backing_done(s, *s.server, i);
  else submit_backing(s, *s.server, i);
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*) {
  Emulator::State& s = state(req);
  if (off < 0 || uint64_t(off) >= s.size) size = 0;
  else size = std::min<uint64_t>(size, s.size - uint64_t(off));
  const uint32_t i = begin(s, req, IoOp::Read, uint64_t(off), size, size);
  if (i == kOps) return;
  if (size > kMaxRequest) s.server->ops[i].err = EIO;
  go(s, i);
}

void op_write(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off, fuse_file_info*) {
  Emulator::State& s = state(req);
  Server& v = *s.server;
  const uint32_t i = begin(s, req, IoOp::Write, uint64_t(off), size, size);
  if (i == kOps) return;
  Op& o = v.ops[i];
  if (off < 0 || uint64_t(off) + size > s.size) o.err = ENOSPC;
  else if (size > kMaxRequest) o.err = EIO;
  // O_DIRECT wants aligned buffers; FUSE's data follows a header, in a
  // buffer the next request reuses.
  for (uint32_t k = 0; !o.err && k < o.nslabs; ++k)
    std::memcpy(v.slab(o.slab[k]), data + size_t(k) * kSlab, std::min<size_t>(kSlab, size - size_t(k) * kSlab));
  go(s, i);
}

// A flush of the device (the loop device's REQ_OP_FLUSH arrives as fsync):
// acknowledged only once the image's data is on its disk.
void op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  Emulator::State& s = state(req);
  const uint32_t i = begin(s, req, IoOp::Flush, 0, 0, 0);
  if (i != kOps) go(s, i);
}

// A discard (the loop device punches a hole): done on the image, shaped as
// the tier shapes a discard (one counted write I/O).
void op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len, fuse_file_info*) {
  Emulator::State& s = state(req);
  if (off < 0 || len < 0 || uint64_t(off) + uint64_t(len) > s.size) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  const uint32_t i = begin(s, req, IoOp::Discard, uint64_t(off), uint64_t(len), 0);
  if (i == kOps) return;
  s.server->ops[i].mode = mode;
  go(s, i);
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

}  // namespace

const fuse_lowlevel_ops& fuse_ops() {
  static const fuse_lowlevel_ops ops = make_ops();
  return ops;
}

void make_server(Emulator::State& s) {
  RingOptions ro;
  ro.entries = 256;
  ro.cq_entries = 2 * kOps;  // every op's completion and the two polls, with room to spare
  ro.single_task = true;     // the serving thread alone submits and reaps
  ro.fallback = true;
  ro.disabled = true;        // enabled by the serving thread, its single issuer
  std::unique_ptr<Server, ServerDeleter> v(new Server(ro));
  const size_t bytes = size_t(kSlabs) * kSlab;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) throw RuntimeError(errno_message("allocating the emulator's buffers", errno));
  v->mem = static_cast<char*>(mem);
  // Registered, the buffers' pages are pinned once instead of per I/O; a
  // kernel that refuses leaves plain reads and writes.
  const iovec whole{v->mem, bytes};
  v->fixed = io_uring_register_buffers(v->ring.get(), &whole, 1) == 0;
  v->ops.resize(kOps);
  v->free_ops.reserve(kOps);
  for (uint32_t i = kOps; i-- > 0;) v->free_ops.push_back(i);
  v->free_slabs.reserve(kSlabs);
  for (uint32_t i = kSlabs; i-- > 0;) v->free_slabs.push_back(i);
  v->held.reserve(kOps);
  v->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (v->wake_fd < 0) throw RuntimeError(errno_message("eventfd (the emulator's stop)", errno));
  s.server = std::move(v);
}

void start_serving(Emulator::State& s) {
  const int fd = fuse_session_fd(s.se);
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    throw RuntimeError(errno_message("/dev/fuse: O_NONBLOCK", errno));
  s.serve_thread = std::thread([&s] { serve(s); });
}

void stop_serving(Emulator::State& s) {
  if (!s.serve_thread.joinable()) return;
  s.server->stop.store(true, std::memory_order_release);
  const uint64_t one = 1;
  if (::write(s.server->wake_fd, &one, sizeof one) < 0) {
    // Cannot fail on a non-blocking eventfd short of overflow, which
    // would itself wake the thread.
  }
  s.serve_thread.join();
}

}  // namespace emulate_detail
}  // namespace tierlab::iosim
