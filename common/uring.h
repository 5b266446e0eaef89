// tierlab's one io_uring setup, shared by iosim's engine, the replay's
// workers and the capture proxy's loops (through common/loop.h).
//
// Ring is the RAII ring; BufRing a ring of provided receive buffers
// registered with one. What the kernel supports is probed once per process
// (uring_support), and each user asks it for what it needs (uring_missing),
// so a missing feature is named exactly, before any loop starts.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

namespace tierlab {

inline __kernel_timespec to_kts(int64_t ns) {
  __kernel_timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  return ts;
}

struct RingOptions {
  unsigned entries = 8;     // submission queue entries
  unsigned cq_entries = 0;  // completion queue entries; 0: the kernel's (twice entries)
  // One thread submits and reaps: SINGLE_ISSUER and DEFER_TASKRUN
  // (completions are posted when that thread enters the kernel to wait for
  // them, instead of interrupting it).
  bool single_task = false;
  // With single_task: where the kernel refuses those flags, fall back to
  // COOP_TASKRUN, then to a plain ring, instead of failing.
  bool fallback = false;
  // With single_task: TASKRUN_FLAG, so that work_pending() can tell when
  // completions wait for this thread. liburing then enters the kernel to
  // flush them whenever the flag is up, so loops that always wait in
  // io_uring_enter anyway leave it off.
  bool taskrun_flag = false;
  bool submit_all = false;  // SUBMIT_ALL: a failed submission does not stop the batch
  // R_DISABLED: the ring is created on one thread and enabled (enable())
  // on the one that uses it, which becomes its single issuer.
  bool disabled = false;
};

class Ring {
 public:
  // Throws RuntimeError "io_uring_queue_init (WHAT): strerror" naming the
  // flags the kernel refused.
  explicit Ring(const RingOptions& o);
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() { return &ring_; }
  io_uring& operator*() { return ring_; }
  unsigned features() const { return features_; }

  // Enables a ring made with `disabled`, on the calling thread. Returns 0 or
  // -errno.
  int enable();

  // A free submission queue entry; when the queue is full, hands it to the
  // kernel first. Never null.
  io_uring_sqe* sqe() {
    io_uring_sqe* e = io_uring_get_sqe(&ring_);
    while (!e) {
      io_uring_submit(&ring_);
      e = io_uring_get_sqe(&ring_);
    }
    return e;
  }

  // True when completions are waiting to be posted to the CQ ring until
  // this thread enters the kernel (io_uring_get_events, or any wait): task
  // work under DEFER/COOP_TASKRUN (on a ring made with taskrun_flag), or an
  // overflowed CQ ring.
  bool work_pending() const {
    unsigned f = __atomic_load_n(ring_.sq.kflags, __ATOMIC_ACQUIRE);
    return (f & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0;
  }

 private:
  io_uring ring_{};
  unsigned features_ = 0;
};

// `count` (a power of two) receive buffers of `size` bytes, registered with
// a ring as provided buffer group `group`. A buffer the kernel filled is the
// caller's until give_back(); given-back buffers are published to the kernel
// together by publish().
class BufRing {
 public:
  // Throws RuntimeError naming the failed step.
  BufRing(Ring& ring, uint16_t group, uint32_t count, uint32_t size);
  ~BufRing();
  BufRing(const BufRing&) = delete;
  BufRing& operator=(const BufRing&) = delete;

  uint16_t group() const { return group_; }
  uint32_t count() const { return count_; }
  uint32_t size() const { return size_; }
  uint8_t* data(uint32_t id) { return mem_.get() + static_cast<size_t>(id) * size_; }
  // Buffers taken by the kernel and not yet given back.
  uint32_t held() const { return held_; }
  void taken() { ++held_; }
  void give_back(uint32_t id) {
    io_uring_buf_ring_add(br_, data(id), size_, static_cast<unsigned short>(id), io_uring_buf_ring_mask(count_),
                          returns_++);
    --held_;
  }
  // True if give_back() was called since the last publish().
  bool returns() const { return returns_ != 0; }
  void publish() {
    if (returns_ == 0) return;
    io_uring_buf_ring_advance(br_, returns_);
    returns_ = 0;
  }

 private:
  Ring& ring_;
  io_uring_buf_ring* br_ = nullptr;
  std::unique_ptr<uint8_t[]> mem_;
  uint16_t group_;
  uint32_t count_, size_;
  uint32_t held_ = 0;
  int returns_ = 0;
};

// What the kernel offers, probed once per process with a single-issuer,
// deferred-task-work ring (Linux 6.1 or later).
struct UringSupport {
  std::string setup_error;  // why such a ring cannot be set up, "" if it can
  bool ext_arg = false;     // io_uring_enter takes a timeout (IORING_FEAT_EXT_ARG)
  std::string buf_ring_error;  // why provided buffer rings cannot be registered, "" if they can
  io_uring_probe* ops = nullptr;  // supported operations; null if probing failed
};
const UringSupport& uring_support();

// Needs of a loop, checked against uring_support().
struct UringNeeds {
  bool ext_arg = false;
  bool buf_ring = false;
  std::initializer_list<std::pair<int, const char*>> ops;  // (opcode, name)
};
// "" when the kernel has everything `need` names; else the first thing
// missing, in one line ("io_uring operation NAME not supported").
std::string uring_missing(const UringNeeds& need);

// An --io choice, `io` ("auto", "io_uring" or "epoll"). True for io_uring:
// asked for by name, or "auto" when `auto_uring` and `missing()` (why
// io_uring cannot run here, "" when it can) is empty. InputError "IO:
// expected auto, io_uring or epoll" for another name; RuntimeError "WHO:
// io_uring: WHY" when io_uring is asked for by name and missing.
bool use_uring(const std::string& io, const char* who, bool auto_uring, std::string (*missing)());

}  // namespace tierlab
