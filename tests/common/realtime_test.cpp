#include <catch2/catch.hpp>

#include <sched.h>

#include <thread>

#include "common/realtime.h"

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
