// Private to iosim: RAII around liburing's ring and the clock helpers the
// engine's loop uses.
#pragma once

#include "common/clock.h"
#include "common/error.h"

#include <liburing.h>
#include <time.h>

#include <cerrno>
#include <cstdint>

namespace tierlab::iosim::detail {

inline int64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }

inline __kernel_timespec to_kts(int64_t ns) {
  __kernel_timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  return ts;
}

// Sleeps until the absolute CLOCK_MONOTONIC time `ns`.
inline void sleep_until(int64_t ns) {
  timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// A pause for spin loops: lets a sibling hardware thread run.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class Ring {
 public:
  // With `single_task`, the ring is set up for one thread that both submits
  // and reaps: SINGLE_ISSUER, and DEFER_TASKRUN (completions are posted when
  // that thread enters the kernel to wait for them, instead of interrupting
  // it) or, on kernels without it, COOP_TASKRUN. Falls back to a plain ring
  // where the kernel refuses the flags. Throws RuntimeError naming
  // io_uring_queue_init and the errno.
  explicit Ring(unsigned entries, bool single_task = false) {
    int rc = -EINVAL;
    if (single_task) {
      const unsigned tries[] = {
          IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
              IORING_SETUP_TASKRUN_FLAG,
          IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
      };
      for (unsigned flags : tries) {
        rc = io_uring_queue_init(entries, &ring_, flags);
        if (rc != -EINVAL) break;
      }
    }
    if (rc == -EINVAL) rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) throw RuntimeError(errno_message("io_uring_queue_init (io_uring unavailable)", -rc));
  }
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() { return &ring_; }
  // True when completions are waiting to be posted to the CQ ring until
  // this thread enters the kernel (io_uring_get_events, or any wait): task
  // work under DEFER/COOP_TASKRUN, or an overflowed CQ ring.
  bool work_pending() const {
    unsigned f = __atomic_load_n(ring_.sq.kflags, __ATOMIC_ACQUIRE);
    return (f & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0;
  }

 private:
  io_uring ring_{};
};

}  // namespace tierlab::iosim::detail
