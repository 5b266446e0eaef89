// Proves that the simulator's event loop, the shaper and the pattern
// generator allocate nothing per I/O. This file replaces the global
// operator new for the whole tierlab_tests_iosim binary with a counting one;
// other tests in the binary may read the count through
// tierlab_test_allocations().
#include "iosim/sim.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<uint64_t> g_allocations{0};

void* counted_alloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* counted_alloc_aligned(std::size_t n, std::align_val_t al) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  std::size_t a = static_cast<std::size_t>(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
}  // namespace

uint64_t tierlab_test_allocations() { return g_allocations.load(std::memory_order_relaxed); }

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new(std::size_t n, std::align_val_t al) { return counted_alloc_aligned(n, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return counted_alloc_aligned(n, al); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace tierlab;
using namespace tierlab::iosim;

namespace {

// Allocations made by fn().
template <typename Fn>
uint64_t allocations_of(Fn fn) {
  uint64_t before = tierlab_test_allocations();
  fn();
  return tierlab_test_allocations() - before;
}

}  // namespace

TEST_CASE("the shaper and the pattern generator allocate nothing per I/O", "[sim][alloc]") {
  auto catalog = models::Catalog::builtin();
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
}

TEST_CASE("the discrete-event loop allocates nothing per event", "[sim][alloc]") {
  auto catalog = models::Catalog::builtin();
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
  }
}
