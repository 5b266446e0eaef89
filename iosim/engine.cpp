#include "iosim/engine.h"

#include "common/error.h"
#include "common/realtime.h"
#include "common/clock.h"
#include "common/uring.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tierlab::iosim {

namespace {

// A pause for spin loops: lets a sibling hardware thread run.
void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

constexpr unsigned kReapBatch = 64;
// A wait shorter than this is spun rather than slept.
constexpr Nanos kMinSleepNs = 20'000;
constexpr uint64_t kSector = 512;
// With EngineOptions::stop, no sleep is longer than this.
constexpr Nanos kStopPollNs = 50'000'000;

// How early to wake up for a deadline. A sleeping thread wakes late: by a
// few microseconds on an idle machine, by tens to hundreds in a virtual
// machine whose halted vCPU the host has to schedule back. The loop sleeps
// until margin() before a deadline and spins the rest. The margin is
// estimated like TCP's retransmission timeout: smoothed lateness of the
// loop's timed wake-ups plus four times their mean deviation. Rare stalls of
// milliseconds (the host running another guest) are not worth spinning
// against, so the margin is capped and each deadline reached by spinning
// alone counts as an on-time wake-up, letting the margin come back down.
class WakeMargin {
 public:
  Nanos margin() const { return std::clamp<Nanos>(avg_ + 4 * dev_ + kSlackNs, kMinNs, kMaxNs); }
  // A timed sleep returned `late` ns after the intended time.
  void observe(Nanos late) {
    Nanos err = late - avg_;
    avg_ += err / 8;
    dev_ += ((err < 0 ? -err : err) - dev_) / 4;
  }
  // A deadline was reached without sleeping.
  void on_time() { observe(avg_); }

 private:
  static constexpr Nanos kSlackNs = 10'000;
  static constexpr Nanos kMinNs = 20'000;
  static constexpr Nanos kMaxNs = 300'000;  // bounds the spinning
  Nanos avg_ = 20'000;
  Nanos dev_ = 5'000;
};

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Returns the first offset in [off, off+len) whose byte differs from the
// pattern, or UINT64_MAX if all match.
uint64_t check_pattern(const uint8_t* buf, uint64_t off, uint32_t len, uint64_t seed) {
  uint64_t end = off + len;
  uint64_t p = off;
  while (p < end) {
    uint64_t word = mix64(seed ^ (p >> 3));
    if ((p & 7) == 0 && end - p >= 8) {
      uint64_t got;
      std::memcpy(&got, buf + (p - off), 8);
      if (got != word) {
        for (int b = 0; b < 8; ++b)
          if (buf[p - off + b] != uint8_t(word >> (8 * b))) return p + b;
      }
      p += 8;
    } else {
      if (buf[p - off] != uint8_t(word >> (8 * (p & 7)))) return p;
      ++p;
    }
  }
  return UINT64_MAX;
}

const char* op_word(IoOp op) {
  switch (op) {
    case IoOp::Read: return "read";
    case IoOp::Write: return "write";
    case IoOp::Flush: return "flush";
    default: return "discard";
  }
}

struct Slot {
  uint8_t* buf = nullptr;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t done = 0;        // bytes transferred so far
  IoOp op = IoOp::Read;
  uint8_t flags = 0;
  bool counted = true;      // part of the main run's stats
  bool was_short = false;   // counted in short_ios already
  Nanos ready = 0;          // when it could go: its latency starts here
  Nanos issued = 0;         // first submission
  Nanos freed = 0;          // when the slot was last freed (closed loop: the next I/O's ready)
  Nanos tier_done = 0;      // when the tier completes it (0 = no tier)
  Nanos device_done = 0;
};

struct Held {
  Nanos release;
  uint32_t slot;
  bool operator>(const Held& o) const { return release > o.release; }
};

// Yields reads over every run of written sectors, for the verify pass.
class WrittenSource : public IoSource {
 public:
  WrittenSource(const std::vector<uint64_t>& bits, uint64_t sectors, uint32_t max_block)
      : bits_(bits), sectors_(sectors), max_sectors_(std::max<uint32_t>(1, max_block / kSector)) {}
  bool next(TimedIo& out) override {
    while (pos_ < sectors_ && !test(pos_)) ++pos_;
    if (pos_ >= sectors_) return false;
    uint64_t start = pos_;
    while (pos_ < sectors_ && test(pos_) && pos_ - start < max_sectors_) ++pos_;
    out = TimedIo{0, start * kSector, uint32_t((pos_ - start) * kSector), IoOp::Read, 0};
    return true;
  }

 private:
  bool test(uint64_t s) const { return (bits_[s >> 6] >> (s & 63)) & 1; }
  const std::vector<uint64_t>& bits_;
  uint64_t sectors_;
  uint64_t max_sectors_;
  uint64_t pos_ = 0;
};

class Engine {
 public:
  Engine(const EngineOptions& o) : o_(o) {}
  ~Engine() {
    if (fd_ >= 0) ::close(fd_);
    std::free(arena_);
  }

  EngineResult run(IoSource& src);

 private:
  void open_target();
  void setup_ring();
  // The loop: issues src's requests and reaps until all are done. When
  // `counted` is false (verify pass) nothing goes into the run's stats.
  void loop(IoSource& src, bool open_loop, bool counted);
  // Reads the next issuable request into next_; `now` checks --runtime.
  bool fetch(IoSource& src, bool counted, Nanos now);
  void issue(uint32_t slot_idx, Nanos ready, Nanos now);
  void prep(uint32_t slot_idx);
  // Submits the prepared requests without waiting.
  void submit_pending();
  // Stops the run on a failed io_uring_enter (not on EINTR, EAGAIN, EBUSY,
  // ETIME: the loop simply goes round again).
  void check_submit(int rc);
  void complete(uint32_t slot_idx, Nanos now);
  void finish(uint32_t slot_idx, Nanos now);
  void fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    stop_ = true;
  }
  void mark_written(uint64_t off, uint32_t len);
  bool sector_known(uint64_t s) const {
    return verify_all_ || ((written_[s >> 6] >> (s & 63)) & 1);
  }
  void verify_read(const Slot& s);

  const EngineOptions& o_;
  EngineResult r_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t align_ = 1;
  uint32_t block_ = 0;  // bytes per slot buffer
  void* arena_ = nullptr;
  std::unique_ptr<Ring> ring_;
  WakeMargin wake_;
  Nanos slept_for_ = 0;            // the deadline the last sleep or spin was for
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;     // free slot indices (capacity iodepth)
  std::vector<Held> held_;         // min-heap by release (capacity iodepth)
  std::vector<uint64_t> written_;  // verify: sectors written in this run
  bool verify_all_ = false;
  uint32_t inflight_ = 0;          // submitted, completion not reaped
  uint32_t pending_ = 0;           // prepared, not yet submitted
  TimedIo next_{};
  bool have_next_ = false;
  bool next_late_ = false;
  bool prev_late_ = false;         // the last issue was later than kLateIssueNs
  Nanos last_at_ = 0;
  bool stop_ = false;
  bool stop_requested() const {
    return o_.stop && o_.stop->load(std::memory_order_relaxed) != 0;
  }
  uint64_t issued_ = 0;
  Nanos start_ = 0;
  Nanos last_done_ = 0;
  std::string error_;
};

void Engine::open_target() {
  if (o_.target.empty()) throw InputError("no target file or device given");
  struct stat st{};
  bool exists = ::stat(o_.target.c_str(), &st) == 0;
  if (!exists && errno != ENOENT)
    throw InputError(errno_message(o_.target, errno));
  if (exists && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    throw InputError(o_.target + ": not a regular file or block device");
  // Read-only when the source only reads, unless the file has to be made or
  // grown to the size asked for.
  const bool grow = !exists || (S_ISREG(st.st_mode) && o_.size > uint64_t(st.st_size));
  int flags = (o_.read_only && !grow ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  if (o_.direct) flags |= O_DIRECT;
  if (!exists) {
    if (!o_.allow_create || o_.size == 0)
      throw TargetError(o_.target + ": does not exist",
                        o_.allow_create ? TargetError::Fix::CreateWithSize : TargetError::Fix::None);
    flags |= O_CREAT;
  }
  fd_ = ::open(o_.target.c_str(), flags, 0644);
  if (fd_ < 0 && errno == EINVAL && o_.direct)
    throw TargetError(o_.target + ": O_DIRECT is not supported here", TargetError::Fix::DropDirect);
  if (fd_ < 0) throw InputError(errno_message(o_.target, errno));
  if (::fstat(fd_, &st) != 0) throw RuntimeError(errno_message(o_.target, errno));
  if (S_ISBLK(st.st_mode)) {
    uint64_t bytes = 0;
    if (ioctl(fd_, BLKGETSIZE64, &bytes) != 0)
      throw RuntimeError(errno_message(o_.target + ": BLKGETSIZE64", errno));
    size_ = bytes;
    if (o_.size && o_.size < size_) size_ = o_.size;
    int lbs = 512;
    if (ioctl(fd_, BLKSSZGET, &lbs) == 0 && lbs > 0) align_ = uint64_t(lbs);
  } else {
    size_ = uint64_t(st.st_size);
    if (o_.size > size_) {
      int rc = posix_fallocate(fd_, 0, off_t(o_.size));
      if (rc != 0) throw RuntimeError(errno_message(o_.target + ": fallocate to " + std::to_string(o_.size) + " bytes", rc));
      size_ = o_.size;
    } else if (o_.size) {
      size_ = o_.size;  // use the first `size` bytes
    }
    align_ = o_.direct ? direct_io_alignment(o_.target) : 1;
    // What posix_fallocate left unwritten, and any hole, is written now:
    // reads of it would otherwise be answered without the device.
    std::vector<ByteRange> todo = unwritten_ranges(fd_, size_);
    if (!todo.empty()) {
      uint64_t bytes = 0;
      for (const auto& r : todo) bytes += r.length;
      if (o_.on_layout) o_.on_layout(o_.target, bytes);
      r_.laid_out_bytes = lay_out(o_.target, todo, o_.seed, o_.stop);
    }
  }
  if (size_ == 0) throw TargetError(o_.target + ": is empty", TargetError::Fix::GiveSize);
  if (o_.direct) align_ = std::max<uint64_t>(align_, 512);
  r_.target_size = size_;
}

void Engine::setup_ring() {
  unsigned entries = 8;
  while (entries < o_.iodepth) entries <<= 1;
  RingOptions ro;
  ro.entries = entries;
  ro.single_task = true;
  ro.fallback = true;
  ro.taskrun_flag = true;
  ro.submit_all = true;
  ring_ = std::make_unique<Ring>(ro);
  io_uring* ring = ring_->get();

  io_uring_probe* probe = io_uring_get_probe_ring(ring);
  if (!probe) throw RuntimeError("io_uring: the kernel has no IORING_REGISTER_PROBE (needs Linux 5.6+)");
  struct { int op; const char* name; } need[] = {
      {IORING_OP_READ_FIXED, "IORING_OP_READ_FIXED"},
      {IORING_OP_WRITE_FIXED, "IORING_OP_WRITE_FIXED"},
      {IORING_OP_FSYNC, "IORING_OP_FSYNC"},
      {IORING_OP_READ, "IORING_OP_READ"},
      {IORING_OP_WRITE, "IORING_OP_WRITE"},
  };
  for (auto& n : need) {
    if (!io_uring_opcode_supported(probe, n.op)) {
      io_uring_free_probe(probe);
      throw RuntimeError(std::string("io_uring: the kernel does not support ") + n.name);
    }
  }
  io_uring_free_probe(probe);

  // One buffer per slot, block_ bytes each, 4 KiB aligned, registered.
  block_ = std::max<uint32_t>(o_.max_block, 4096);
  block_ = (block_ + 4095) & ~4095u;
  size_t total = size_t(block_) * o_.iodepth;
  if (posix_memalign(&arena_, 4096, total) != 0)
    throw RuntimeError("cannot allocate " + std::to_string(total) + " bytes of I/O buffers");
  // Distinct non-zero content, so writes are not all-zero pages.
  auto* bytes = static_cast<uint8_t*>(arena_);
  for (size_t i = 0; i < total; i += 8) {
    uint64_t w = mix64(i);
    std::memcpy(bytes + i, &w, 8);
  }
  std::vector<iovec> iov(o_.iodepth);
  slots_.resize(o_.iodepth);
  for (uint32_t i = 0; i < o_.iodepth; ++i) {
    slots_[i].buf = bytes + size_t(i) * block_;
    iov[i] = iovec{slots_[i].buf, block_};
  }
  int rc = io_uring_register_buffers(ring, iov.data(), unsigned(iov.size()));
  if (rc < 0)
    throw RuntimeError(errno_message("io_uring: registering " + std::to_string(o_.iodepth) +
                                         " fixed buffers (IORING_REGISTER_BUFFERS)",
                                     -rc));
  rc = io_uring_register_files(ring, &fd_, 1);
  if (rc < 0)
    throw RuntimeError(errno_message("io_uring: registering the target (IORING_REGISTER_FILES)", -rc));

  free_.reserve(o_.iodepth);
  for (uint32_t i = o_.iodepth; i-- > 0;) free_.push_back(i);
  held_.reserve(o_.iodepth);
  if (o_.verify) written_.assign((size_ / kSector + 64) / 64, 0);
}

void Engine::prep(uint32_t i) {
  Slot& s = slots_[i];
  io_uring_sqe* sqe = io_uring_get_sqe(ring_->get());
  // Invariant: at most iodepth requests are prepared or in flight, and the
  // SQ ring has at least iodepth entries, so a free SQE always exists.
  if (!sqe) {
    fail("io_uring: submission queue full");
    return;
  }
  switch (s.op) {
    case IoOp::Read:
      io_uring_prep_read_fixed(sqe, 0, s.buf + s.done, s.length - s.done, s.offset + s.done, int(i));
      break;
    case IoOp::Write:
      io_uring_prep_write_fixed(sqe, 0, s.buf + s.done, s.length - s.done, s.offset + s.done, int(i));
      break;
    default:  // Flush
      io_uring_prep_fsync(sqe, 0, (s.flags & trace::kIoMeta) ? 0 : IORING_FSYNC_DATASYNC);
      break;
  }
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, i);
  ++pending_;
}

void Engine::submit_pending() {
  inflight_ += pending_;
  pending_ = 0;
  check_submit(io_uring_submit(ring_->get()));
}

void Engine::check_submit(int rc) {
  if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
    fail(errno_message("io_uring_enter", -rc));
}

void Engine::issue(uint32_t i, Nanos ready, Nanos now) {
  Slot& s = slots_[i];
  s.done = 0;
  s.was_short = false;
  s.ready = ready;
  s.issued = now;
  s.tier_done = 0;
  if (o_.shaper && s.counted)
    s.tier_done = o_.shaper->schedule(IoRequest{s.op, s.offset, s.length}, now).complete;
  if (s.op == IoOp::Write && o_.verify) fill_pattern(s.buf, s.offset, s.length, o_.seed);
  prep(i);
}

void Engine::mark_written(uint64_t off, uint32_t len) {
  // Only whole sectors; a partial sector's other bytes are unknown.
  uint64_t first = (off + kSector - 1) / kSector, last = (off + len) / kSector;
  for (uint64_t s = first; s < last; ++s) written_[s >> 6] |= 1ull << (s & 63);
}

void Engine::verify_read(const Slot& s) {
  uint64_t end = s.offset + s.done;
  for (uint64_t sec = (s.offset + kSector - 1) / kSector; (sec + 1) * kSector <= end; ++sec) {
    if (!sector_known(sec)) continue;
    uint64_t off = sec * kSector;
    uint64_t bad = check_pattern(s.buf + (off - s.offset), off, kSector, o_.seed);
    if (bad != UINT64_MAX) {
      fail("verify: data mismatch at offset " + std::to_string(bad) + " of " + o_.target +
           " (read of " + std::to_string(s.length) + " bytes at " + std::to_string(s.offset) + ")");
      return;
    }
    r_.verified_bytes += kSector;
  }
}

// The device completed slot i (all bytes, or EOF). Holds it back for the tier.
void Engine::complete(uint32_t i, Nanos now) {
  Slot& s = slots_[i];
  s.device_done = now;
  if (s.tier_done) {
    if (now > s.tier_done) {
      ++r_.slower_than_tier;
    } else if (s.tier_done > now) {
      held_.push_back(Held{s.tier_done, i});
      std::push_heap(held_.begin(), held_.end(), std::greater<Held>());
      return;
    }
  }
  finish(i, now);
}

void Engine::finish(uint32_t i, Nanos now) {
  Slot& s = slots_[i];
  if (o_.verify) {
    if (s.op == IoOp::Write) mark_written(s.offset, s.done);
    else if (s.op == IoOp::Read) verify_read(s);
  }
  if (s.counted) {
    // With a tier, the I/O completes at the later of the tier's time and
    // the device's: that is what is reported. How late the loop released it
    // (a descheduled process) is counted apart, so a stall does not bunch
    // completions beyond the tier's cap in the figures.
    Nanos done = now;
    if (s.tier_done) {
      done = std::max(s.tier_done, s.device_done);
      r_.release_lag.record(now - done);
    }
    Nanos lat = done - s.ready;
    OpStats& st = r_.op[size_t(s.op)];
    ++st.ios;
    st.bytes += s.done;
    st.lat.record(lat);
    st.device_lat.record(s.device_done - s.issued);
    r_.lat.record(lat);
    ++r_.ios;
    r_.bytes += s.done;
    if (done > last_done_) last_done_ = done;
    if (o_.live) {  // single writer: plain load and store
      EngineLive& l = *o_.live;
      l.ios.store(l.ios.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      l.bytes.store(l.bytes.load(std::memory_order_relaxed) + s.done, std::memory_order_relaxed);
      l.lat_sum_ns.store(l.lat_sum_ns.load(std::memory_order_relaxed) + lat, std::memory_order_relaxed);
    }
    if (o_.completion_log && o_.completion_log->size() < o_.completion_log->capacity())
      o_.completion_log->push_back(s.tier_done ? s.tier_done : done);
  }
  s.freed = now;
  free_.push_back(i);
}

bool Engine::fetch(IoSource& src, bool counted, Nanos now) {
  for (;;) {
    if (stop_) return false;
    if (counted) {
      if (o_.max_ios && issued_ >= o_.max_ios) return false;
      if (o_.runtime_ns && start_ && now - start_ >= o_.runtime_ns) return false;
    }
    if (!src.next(next_)) return false;
    TimedIo& q = next_;
    if (q.op == IoOp::Discard) {
      if (counted) ++r_.skipped;
      continue;
    }
    if (q.op != IoOp::Flush) {
      if (q.length == 0) {
        if (counted) ++r_.skipped;
        continue;
      }
      if (q.length > block_) {
        fail("request of " + std::to_string(q.length) + " bytes at offset " +
             std::to_string(q.offset) + " is larger than the I/O buffers (" +
             std::to_string(block_) + " bytes)");
        return false;
      }
      if (q.offset >= size_) {
        // Fold an offset beyond the target back into it, keeping alignment.
        // A request that starts inside and crosses the end is issued as is:
        // reads come back short at end of file.
        if (counted) ++r_.wrapped;
        uint64_t room = size_ >= q.length ? size_ - q.length : 0;
        q.offset = room ? (q.offset % (room + 1)) : 0;
        q.offset -= q.offset % align_;
      }
    }
    if (counted) ++issued_;
    next_late_ = false;
    return true;
  }
}

void Engine::loop(IoSource& src, bool open_loop, bool counted) {
  io_uring* ring = ring_->get();
  io_uring_cqe* cqes[kReapBatch];
  have_next_ = fetch(src, counted, 0);
  const Nanos t0 = have_next_ ? next_.at : 0;
  // The schedule's epoch: every request is due at epoch + (at - t0).
  const Nanos epoch = now_ns() + (open_loop ? 200'000 : 0);
  if (counted) start_ = open_loop ? epoch : now_ns();
  if (counted && o_.live) o_.live->start_ns.store(start_, std::memory_order_relaxed);
  // Closed loop: every slot is ready at the start (its stream's first I/O).
  for (Slot& s : slots_) s.freed = counted ? start_ : 0;

  for (;;) {
    Nanos now = now_ns();
    // 0. A stop request: issue nothing more; what is in flight completes.
    if (counted && have_next_ && stop_requested()) {
      have_next_ = false;
      r_.stopped = true;
    }
    // 1. Release held completions whose tier time has come.
    while (!held_.empty() && held_.front().release <= now) {
      std::pop_heap(held_.begin(), held_.end(), std::greater<Held>());
      uint32_t i = held_.back().slot;
      held_.pop_back();
      finish(i, now);
    }
    // 2. Issue what is due, as far as slots allow.
    Nanos next_due = INT64_MAX;
    while (have_next_ && !stop_) {
      // Each I/O's latency and issue lag are taken just before its own
      // submission: with per-I/O submission, the loop's first `now` is as
      // old as the submissions before it in this pass.
      now = now_ns();
      if (free_.empty()) {
        if (open_loop && counted && !next_late_ && epoch + (next_.at - t0) <= now) {
          // Count each late request once: it is issued when a slot frees.
          ++r_.slot_waits;
          next_late_ = true;
        }
        break;
      }
      if (open_loop) {
        Nanos due = epoch + (next_.at - t0);
        if (due > now) {
          next_due = due;
          break;
        }
        if (counted) {
          Nanos lag = now - due;
          r_.issue_lag.record(lag);
          bool late = lag > EngineResult::kLateIssueNs;
          if (late) {
            ++r_.late_issues;
            if (!prev_late_) ++r_.issue_stalls;
          }
          prev_late_ = late;
        }
      }
      uint32_t i = free_.back();
      free_.pop_back();
      Slot& s = slots_[i];
      s.offset = next_.offset;
      s.length = next_.op == IoOp::Flush ? 0 : next_.length;
      s.op = next_.op;
      s.flags = next_.flags;
      s.counted = counted;
      if (counted) last_at_ = next_.at;
      // Closed loop: the I/O was ready when its slot freed, not only once
      // the submissions before it in this pass were done.
      issue(i, open_loop ? now : std::min(std::max(s.freed, start_), now), now);
      if (o_.submit_batch && pending_ >= o_.submit_batch) submit_pending();
      have_next_ = fetch(src, counted, now);
    }
    if (!held_.empty()) next_due = std::min(next_due, held_.front().release);

    // 3. Submit, and wait when there is nothing else to do.
    if (next_due == INT64_MAX) {
      if (inflight_ + pending_ > 0) {
        inflight_ += pending_;
        pending_ = 0;
        check_submit(io_uring_submit_and_wait(ring, 1));
      }
    } else if (next_due - now > wake_.margin() + kMinSleepNs) {
      // Sleep until a completion or margin() before the deadline (with a
      // stop flag to watch, kStopPollNs at most: a short sleep neither
      // teaches the wake-up margin nor counts as the deadline's).
      Nanos wake_at = next_due - wake_.margin();
      const bool partial = o_.stop && wake_at - now > kStopPollNs;
      if (partial) wake_at = now + kStopPollNs;
      if (inflight_ + pending_ > 0) {
        inflight_ += pending_;
        pending_ = 0;
        __kernel_timespec ts = to_kts(std::max<Nanos>(wake_at - now_ns(), 1));
        io_uring_cqe* cqe = nullptr;
        int rc = io_uring_submit_and_wait_timeout(ring, &cqe, 1, &ts, nullptr);
        if (rc == -ETIME) {
          if (!partial) wake_.observe(now_ns() - wake_at);
        } else {
          check_submit(rc);
        }
      } else {
        sleep_until_ns(wake_at);
        if (!partial) wake_.observe(now_ns() - wake_at);
      }
      if (!partial) slept_for_ = next_due;
    } else {
      // Spin the last stretch; completions are still reaped meanwhile.
      if (slept_for_ != next_due) {
        wake_.on_time();
        slept_for_ = next_due;
      }
      if (pending_) submit_pending();
      else if (inflight_ && ring_->work_pending()) check_submit(io_uring_get_events(ring));
      cpu_relax();
    }

    // 4. Reap a batch.
    unsigned n = io_uring_peek_batch_cqe(ring, cqes, kReapBatch);
    if (n) {
      Nanos t = now_ns();
      for (unsigned k = 0; k < n; ++k) {
        uint32_t i = uint32_t(io_uring_cqe_get_data64(cqes[k]));
        int res = cqes[k]->res;
        Slot& s = slots_[i];
        --inflight_;
        if (res == -EAGAIN || res == -EINTR) {
          if (counted) ++(res == -EAGAIN ? r_.eagain : r_.eintr);
          prep(i);  // retried below with this batch
          continue;
        }
        if (res < 0) {
          fail(errno_message(std::string(op_word(s.op)) + " of " + std::to_string(s.length) + " bytes at offset " +
                                 std::to_string(s.offset) + " of " + o_.target,
                             -res));
          free_.push_back(i);
          continue;
        }
        if (s.op == IoOp::Flush) {
          complete(i, t);
          continue;
        }
        s.done += uint32_t(res);
        if (s.done < s.length) {
          if (counted && !s.was_short) ++r_.short_ios;
          s.was_short = true;
          if (res == 0) {  // end of file: nothing more to transfer
            if (counted) ++r_.eof_short;
            complete(i, t);
          } else {
            prep(i);  // resubmit the rest
          }
          continue;
        }
        complete(i, t);
      }
      io_uring_cq_advance(ring, n);
      // Retries and remainders prepared above go out now.
      if (pending_) submit_pending();
    }
    if (!have_next_ && inflight_ == 0 && held_.empty()) break;
    if (stop_ && inflight_ == 0) {
      // Drop held completions: the run is over.
      while (!held_.empty()) {
        std::pop_heap(held_.begin(), held_.end(), std::greater<Held>());
        free_.push_back(held_.back().slot);
        held_.pop_back();
      }
      break;
    }
  }
  if (counted) {
    r_.elapsed_ns = (last_done_ > start_ ? last_done_ : now_ns()) - start_;
    if (open_loop) r_.schedule_ns = last_at_ - t0;
  }
}

EngineResult Engine::run(IoSource& src) {
  check_iodepth(o_.iodepth);
  open_target();
  setup_ring();
  verify_all_ = o_.verify && o_.verify_existing;
  if (o_.shaper) r_.tier = o_.shaper->tier().name;
  tight_timer_slack();  // deadlines are kept to microseconds
  RealTimeScope rt(o_.realtime);
  // Runs that keep deadlines (open loop, or a tier's completion times) hold
  // the CPU wake-up latency down.
  CpuLatencyHold cpu_latency(o_.hold_cpu_latency && (o_.open_loop || o_.shaper));
  r_.cpu_latency_held = cpu_latency.held();

  loop(src, o_.open_loop, true);
  if (error_.empty() && o_.verify && !written_.empty() && !r_.stopped) {
    bool any = std::any_of(written_.begin(), written_.end(), [](uint64_t w) { return w != 0; });
    if (any) {
      verify_all_ = false;
      WrittenSource ws(written_, size_ / kSector, block_);
      loop(ws, false, false);
    }
  }
  if (!error_.empty()) throw RuntimeError(error_);
  return std::move(r_);
}

}  // namespace

void fill_pattern(uint8_t* buf, uint64_t off, uint32_t len, uint64_t seed) {
  uint64_t end = off + len, p = off;
  while (p < end) {
    uint64_t word = mix64(seed ^ (p >> 3));
    if ((p & 7) == 0 && end - p >= 8) {
      std::memcpy(buf + (p - off), &word, 8);
      p += 8;
    } else {
      buf[p - off] = uint8_t(word >> (8 * (p & 7)));
      ++p;
    }
  }
}

void probe_io_uring() {
  RingOptions ro;
  Ring ring(ro);
  io_uring_probe* probe = io_uring_get_probe_ring(ring.get());
  if (!probe) throw RuntimeError("io_uring: the kernel has no IORING_REGISTER_PROBE (needs Linux 5.6+)");
  io_uring_free_probe(probe);
}

void check_iodepth(uint32_t iodepth) {
  if (iodepth == 0 || iodepth > 65536) throw InputError(std::to_string(iodepth) + ": must be 1 to 65536");
}

EngineResult run_engine(const EngineOptions& opts, IoSource& source) {
  Engine e(opts);
  return e.run(source);
}

}  // namespace tierlab::iosim
