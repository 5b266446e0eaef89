// Reading a clock in nanoseconds, the unit of every time tierlab keeps
// (CLOCK_MONOTONIC is the trace's time base).
#pragma once

#include <time.h>

#include <cstdint>

namespace tierlab {

inline int64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace tierlab
