// Private to iosim: RAII around liburing's ring and the clock helpers the
// engine's loop uses.
#pragma once

#include "common/error.h"

#include <liburing.h>
#include <time.h>

#include <cstdint>

namespace tierlab::iosim::detail {

inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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

class Ring {
 public:
  // Throws RuntimeError naming io_uring_queue_init and the errno.
  explicit Ring(unsigned entries) {
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) {
      err_ = -rc;
      throw RuntimeError(errno_message("io_uring_queue_init (io_uring unavailable)", -rc));
    }
  }
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  int err_ = 0;
};

}  // namespace tierlab::iosim::detail
