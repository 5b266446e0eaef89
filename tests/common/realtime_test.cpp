#include <catch2/catch.hpp>

#include <sched.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>

#include "common/realtime.h"
#include "support/unprivileged.h"

TEST_CASE("run_as_batch_thread moves the calling thread to SCHED_BATCH and no other", "[realtime]") {
  int policy_in_thread = -1;
  bool ok = false;
  std::thread t([&] {
    ok = tierlab::run_as_batch_thread();
    policy_in_thread = sched_getscheduler(0);
  });
  t.join();
  REQUIRE(ok);
  CHECK(policy_in_thread == SCHED_BATCH);
  // Only the calling thread changes: the thread that started it does not.
  CHECK(sched_getscheduler(0) == SCHED_OTHER);
}

TEST_CASE("request_short_slice gives the calling thread a 0.1 ms slice where the kernel has per-task slices",
          "[realtime]") {
  uint64_t got = 0;
  std::string sched;
  int policy_in_thread = -1;
  std::thread t([&] {
    got = tierlab::request_short_slice(100'000);
    policy_in_thread = sched_getscheduler(0);
    std::ifstream in("/proc/thread-self/sched");
    sched.assign(std::istreambuf_iterator<char>(in), {});
  });
  t.join();
  CHECK(policy_in_thread == SCHED_OTHER);
  if (sched.find("se.slice") == std::string::npos) {
    // Before Linux 6.12 a fair thread has no slice of its own to ask for.
    CHECK(got == 0);
    WARN("this kernel has no per-task slices (no se.slice in /proc/thread-self/sched): only the fallback is checked");
    return;
  }
  CHECK(got == 100'000);
  // The kernel's own account of the thread says the same.
  std::smatch m;
  REQUIRE(std::regex_search(sched, m, std::regex(R"(se\.slice\s*:\s*(\d+))")));
  CHECK(m[1] == "100000");
}

TEST_CASE("request_short_slice leaves a thread of another policy alone", "[realtime]") {
  uint64_t got = 1;
  int policy_in_thread = -1;
  bool batch = false;
  std::thread t([&] {
    batch = tierlab::run_as_batch_thread();
    got = tierlab::request_short_slice(100'000);
    policy_in_thread = sched_getscheduler(0);
  });
  t.join();
  REQUIRE(batch);
  CHECK(got == 0);
  CHECK(policy_in_thread == SCHED_BATCH);
}

TEST_CASE("RealTimeScope without the right to SCHED_FIFO says what is missing, naming no flag", "[realtime]") {
  const std::string msg = tierlab::test::thrown_unprivileged([] { tierlab::RealTimeScope rt(true); });
  INFO(msg);
  CHECK(msg.rfind("real-time priority: sched_setscheduler(SCHED_FIFO) (needs root or CAP_SYS_NICE): ", 0) == 0);
  CHECK(msg.find("--") == std::string::npos);
  CHECK(tierlab::test::thrown_unprivileged([] { tierlab::RealTimeScope rt(false); }).empty());
}
