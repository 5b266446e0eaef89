// Proves that the simulator's event loop, the shaper and the pattern
// generator allocate nothing per I/O.
//
// Allocations are counted at malloc, which this file interposes for the
// whole tierlab_tests_iosim binary (forwarding to glibc's __libc_malloc):
// every operator new -- the default one or a counting replacement in
// another test of this binary -- ends up there.
#include "iosim/sim.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

extern "C" void* __libc_malloc(std::size_t n);

namespace {
std::atomic<uint64_t> g_mallocs{0};
}  // namespace

extern "C" void* malloc(std::size_t n) {
  g_mallocs.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}

namespace {
uint64_t mallocs() { return g_mallocs.load(std::memory_order_relaxed); }
}  // namespace

using namespace tierlab;
using namespace tierlab::iosim;

namespace {

// Allocations made by fn().
template <typename Fn>
uint64_t allocations_of(Fn fn) {
  uint64_t before = mallocs();
  fn();
  return mallocs() - before;
}

}  // namespace

TEST_CASE("the shaper and the pattern generator allocate nothing per I/O", "[sim][alloc]") {
  auto catalog = tiers::Catalog::builtin();
  Shaper shaper(catalog.get("ebs-gp3-16k"), 1);
  PatternSpec spec;
  spec.rw = Rw::RandRw;
  Pattern pattern(spec);
  Nanos now = 0;
  uint64_t n = allocations_of([&] {
    for (int i = 0; i < 1'000'000; ++i) {
      auto s = shaper.schedule(pattern.next(), now);
      now = s.start;
    }
  });
  CHECK(n == 0);
  // The counter does see an allocation.
  CHECK(allocations_of([] {
          auto p = std::make_unique<int[]>(100);
          volatile int* q = p.get();
          q[0] = 1;
        }) == 1);
}

TEST_CASE("the discrete-event loop allocates nothing per event", "[sim][alloc]") {
  auto catalog = tiers::Catalog::builtin();
  for (const char* tier : {"ebs-gp3", "nvme-local", "ebs-gp2-100g"}) {
    INFO(tier);
    auto closed = [&](uint64_t ios) {
      ClosedLoop loop;
      loop.pattern.rw = Rw::RandRw;
      loop.iodepth = 32;
      loop.think_ns = 10'000;
      loop.ios = ios;
      return allocations_of([&] { simulate_closed(catalog.get(tier), loop, SimOptions{}); });
    };
    uint64_t small = closed(1000);
    uint64_t big = closed(1'000'000);
    CHECK(small > 0);  // the counter sees the setup allocations
    CHECK(big == small);

    auto open = [&](uint64_t ios) {
      PatternSpec p;
      p.rw = Rw::RandRead;
      return allocations_of([&] {
        PatternArrivals arr(p, 2000, true, ios, 0);
        simulate_open(catalog.get(tier), arr, SimOptions{});
      });
    };
    CHECK(open(1'000'000) == open(1000));

    // Offered far above the tier's capacity: memory stays what the bound
    // (iodepth) sized up front, however long the run.
    auto flood = [&](Nanos runtime) {
      PatternSpec p;
      SimOptions opt;
      opt.open_runtime_ns = runtime;
      SimResult r;
      uint64_t n = allocations_of([&] {
        PatternArrivals arr(p, 1e12, false, 0, runtime);
        r = simulate_open(catalog.get(tier), arr, opt);
      });
      CHECK(r.max_queue_depth == opt.open_iodepth);
      return n;
    };
    CHECK(flood(2'000'000'000) == flood(10'000'000));
  }
}
