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

// Days from 1970-01-01 to the civil date y-m-d (proleptic Gregorian;
// Howard Hinnant's days_from_civil): for the dates the log reader and
// --start-at parse.
constexpr int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

}  // namespace tierlab
