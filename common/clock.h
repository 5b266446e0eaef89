// Time in tierlab: int64 nanoseconds (Nanos), read from CLOCK_MONOTONIC, the
// trace's time base, unless a caller names another clock.
#pragma once

#include <errno.h>
#include <time.h>

#include <cstdint>

namespace tierlab {

using Nanos = int64_t;

inline Nanos clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<Nanos>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// CLOCK_MONOTONIC now: the one clock read for trace times, schedules and
// deadlines.
inline Nanos now_ns() { return clock_ns(CLOCK_MONOTONIC); }

// Sleeps until the absolute CLOCK_MONOTONIC time `t`; a signal does not cut
// the sleep short.
inline void sleep_until_ns(Nanos t) {
  timespec ts{static_cast<time_t>(t / 1'000'000'000), static_cast<long>(t % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace tierlab
