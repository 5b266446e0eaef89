#include "app/stop_signals.h"

#include "common/clock.h"

#include <pthread.h>
#include <ctime>

namespace tierlab::app {

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
}

StopSignals::~StopSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

int StopSignals::wait(long timeout_ns) {
  timespec tick{timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  int sig = sigtimedwait(&set_, nullptr, &tick);
  return sig == SIGINT || sig == SIGTERM ? sig : 0;
}

const char* StopSignals::until_stop(int64_t duration_ns, const std::function<bool()>& ended, const char* ended_why) {
  const int64_t start = now_ns();
  for (;;) {
    if (int sig = wait(200'000'000)) return signal_name(sig);
    if (ended()) return ended_why;
    if (duration_ns > 0 && now_ns() - start >= duration_ns) return "duration reached";
  }
}

}  // namespace tierlab::app
