// StopSignals::until_stop: the one wait of the capture commands (proxy, run,
// sniff) for SIGINT/SIGTERM, --duration or the capture's own end.
#include "app/stop_signals.h"
#include "common/clock.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <thread>

using tierlab::app::StopSignals;

TEST_CASE("until_stop ends on a signal sent to the process and names it", "[cli][stop]") {
  StopSignals signals;
  // Sent by a thread started after the mask: it is taken by the wait, not
  // by the default action.
  std::thread t([] { ::kill(::getpid(), SIGTERM); });
  const char* why = signals.until_stop(0, [] { return false; }, "ended");
  t.join();
  CHECK(std::string(why) == "SIGTERM");
  ::raise(SIGINT);
  CHECK(std::string(signals.until_stop(0, [] { return false; }, "ended")) == "SIGINT");
}

TEST_CASE("until_stop ends when the duration has passed", "[cli][stop]") {
  StopSignals signals;
  const int64_t start = tierlab::now_ns();
  CHECK(std::string(signals.until_stop(300'000'000, [] { return false; }, "ended")) == "duration reached");
  const int64_t took = tierlab::now_ns() - start;
  CHECK(took >= 300'000'000);
  CHECK(took < 5'000'000'000);
}

TEST_CASE("until_stop ends when the capture ended on its own, before its duration", "[cli][stop]") {
  StopSignals signals;
  int asked = 0;
  const char* why = signals.until_stop(60'000'000'000, [&] { return ++asked == 2; }, "transaction capture failed");
  CHECK(std::string(why) == "transaction capture failed");
  CHECK(asked == 2);
}
