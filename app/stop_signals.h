// SIGINT/SIGTERM as a stop request for long-running capture commands.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>

namespace tierlab::app {

// Blocks SIGINT and SIGTERM in the calling thread, so that every thread
// started afterwards inherits the mask and the signals are only taken by
// wait(); the previous mask is restored on destruction. Construct it before
// starting any worker thread.
// "SIGINT", "SIGTERM", or "a signal".
const char* signal_name(int sig);

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Waits up to timeout_ns for SIGINT or SIGTERM; returns the signal, or 0.
  int wait(long timeout_ns);

  // A capture's wait for its end: until SIGINT or SIGTERM comes,
  // `duration_ns` has passed since the call (0: no limit) or `ended()`
  // (asked every 200 ms: the capture failed or finished on its own) is
  // true. Returns why, for the summary: "SIGINT", "SIGTERM", "duration
  // reached" or `ended_why`.
  const char* until_stop(int64_t duration_ns, const std::function<bool()>& ended, const char* ended_why);

 private:
  sigset_t set_;
  sigset_t old_;
};

}  // namespace tierlab::app
