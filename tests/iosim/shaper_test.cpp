#include "iosim/pattern.h"
#include "iosim/shaper.h"

#include "common/error.h"
#include "common/histogram.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace tierlab;
using namespace tierlab::iosim;

namespace {

tiers::Tier uncapped(Nanos latency) {
  tiers::Tier t;
  t.name = "test";
  t.read = t.write = t.flush = {tiers::LatencyDist::Fixed, latency, 0};
  return t;
}

}  // namespace

TEST_CASE("EBS counting: a 1 MiB I/O counts 4, sequential 16 KiB I/Os merge", "[shaper]") {
  auto t = uncapped(1000);
  t.io_unit_bytes = 256 * 1024;
  t.merge_sequential = true;
  Shaper s(t, 1);
  CHECK(s.count({IoOp::Read, 0, 1024 * 1024}) == 4);
  CHECK(s.count({IoOp::Read, 100ull << 20, 500 * 1024}) == 2);  // 256 + 244 KiB
  CHECK(s.count({IoOp::Read, 200ull << 20, 4096}) == 1);

  // 16 sequential 16 KiB reads fill one 256 KiB unit: counted once.
  uint32_t total = 0;
  for (int i = 0; i < 16; ++i) total += s.count({IoOp::Read, (1ull << 30) + i * 16384ull, 16384});
  CHECK(total == 1);
  // The 17th starts a new unit.
  CHECK(s.count({IoOp::Read, (1ull << 30) + 16 * 16384ull, 16384}) == 1);
  // Random 16 KiB reads count one each.
  total = 0;
  for (int i = 0; i < 16; ++i) total += s.count({IoOp::Read, (2ull << 30) + i * 1048576ull, 16384});
  CHECK(total == 16);
  // Reads and writes merge separately; a write in between does not break a read run.
  CHECK(s.count({IoOp::Read, 5ull << 30, 8192}) == 1);
  CHECK(s.count({IoOp::Write, 9ull << 30, 8192}) == 1);
  CHECK(s.count({IoOp::Read, (5ull << 30) + 8192, 8192}) == 0);
  CHECK(s.count({IoOp::Flush, 0, 0}) == 0);

  auto nomerge = t;
  nomerge.merge_sequential = false;
  Shaper n(nomerge, 1);
  total = 0;
  for (int i = 0; i < 16; ++i) total += n.count({IoOp::Read, i * 16384ull, 16384});
  CHECK(total == 16);
}

TEST_CASE("merged I/Os do not take IOPS tokens", "[shaper]") {
  auto t = uncapped(1000);
  t.total_iops = 1000;
  t.io_unit_bytes = 256 * 1024;
  t.merge_sequential = true;
  Shaper s(t, 1);
  // 1,600 sequential 16 KiB reads count 100 I/Os: at 1,000 IOPS that is
  // ~0.1 s, where 1,600 random ones would take ~1.6 s.
  Schedule last;
  for (int i = 0; i < 1600; ++i) last = s.schedule({IoOp::Read, i * 16384ull, 16384}, 0);
  CHECK(s.stats().counted_ios == 100);
  CHECK(s.stats().merged_ios == 1500);
  CHECK(last.start < 110'000'000);
  CHECK(last.start > 90'000'000);
}

TEST_CASE("IOPS and throughput buckets space I/Os at the cap", "[shaper]") {
  auto t = uncapped(50'000);
  t.total_iops = 16000;
  t.bucket_ns = 1'000'000;
  Shaper s(t, 1);
  // Everything submitted at once: the first ~17 go at t=0 (bucket depth),
  // then one every 62.5 us.
  std::vector<Nanos> starts;
  for (int i = 0; i < 32000; ++i) starts.push_back(s.schedule({IoOp::Read, 0, 4096}, 0).start);
  CHECK(std::is_sorted(starts.begin(), starts.end()));
  double span_s = static_cast<double>(starts.back() - starts.front()) / 1e9;
  CHECK(32000 / span_s == Approx(16000).epsilon(0.01));
  CHECK(s.stats().throttled_ios > 31900);
  CHECK(s.stats().throttled_ns == starts.back());

  auto b = uncapped(50'000);
  b.bytes_per_sec = 100.0 * 1024 * 1024;
  Shaper bs(b, 1);
  Nanos last = 0;
  for (int i = 0; i < 1000; ++i) last = bs.schedule({IoOp::Write, 0, 1 << 20}, 0).start;
  // 1,000 MiB at 100 MiB/s: the last one starts after ~9.99 s.
  CHECK(static_cast<double>(last) / 1e9 == Approx(9.99).epsilon(0.01));
}

TEST_CASE("per-op caps apply to their op only", "[shaper]") {
  auto t = uncapped(1000);
  t.read_iops = 1000;
  t.write_iops = 100;
  Shaper s(t, 1);
  Nanos last_r = 0, last_w = 0;
  for (int i = 0; i < 1000; ++i) {
    last_r = s.schedule({IoOp::Read, 0, 4096}, 0).start;
    if (i < 100) last_w = s.schedule({IoOp::Write, 0, 4096}, 0).start;
  }
  CHECK(static_cast<double>(last_r) / 1e9 == Approx(1.0).epsilon(0.01));
  CHECK(static_cast<double>(last_w) / 1e9 == Approx(1.0).epsilon(0.02));
}

TEST_CASE("flushes take write IOPS tokens only on tiers that count them", "[shaper]") {
  auto t = uncapped(1000);
  t.write_iops = 100;
  Shaper free_flushes(t, 1);
  CHECK(free_flushes.count({IoOp::Flush, 0, 0}) == 0);
  Nanos last = 0;
  for (int i = 0; i < 200; ++i) last = free_flushes.schedule({IoOp::Flush, 0, 0}, 0).start;
  CHECK(last == 0);

  t.count_flushes = true;  // as Linux's block throttling does
  Shaper counted(t, 1);
  CHECK(counted.count({IoOp::Flush, 0, 0}) == 1);
  // 100 writes and 100 flushes against 100 write IOPS: about 2 s.
  for (int i = 0; i < 100; ++i) {
    counted.schedule({IoOp::Write, 0, 4096}, 0);
    last = counted.schedule({IoOp::Flush, 0, 0}, 0).start;
  }
  CHECK(static_cast<double>(last) / 1e9 == Approx(2.0).epsilon(0.02));
  CHECK(counted.stats().counted_ios == 200);
}

TEST_CASE("a burst bucket drains at the burst rate and refills at the baseline", "[shaper]") {
  auto t = uncapped(1000);
  t.burst = tiers::Burst{3000, 1000, 100};  // 3,000 credits, 1,000 IOPS burst, 100 IOPS baseline
  Shaper s(t, 1);
  // Full bucket: the first ~3,000 I/Os run at the burst rate (~3.3 s with
  // refill during the burst), then the rate falls to the baseline.
  Nanos now = 0;
  std::vector<Nanos> starts;
  for (int i = 0; i < 4000; ++i) {
    auto sc = s.schedule({IoOp::Read, 0, 4096}, now);
    starts.push_back(sc.start);
    now = sc.start;
  }
  // Rate over I/Os 100..1100: burst.
  double burst_rate = 1000.0 / (static_cast<double>(starts[1100] - starts[100]) / 1e9);
  CHECK(burst_rate == Approx(1000).epsilon(0.02));
  // Rate over the last 500: baseline.
  double base_rate = 500.0 / (static_cast<double>(starts[3999] - starts[3499]) / 1e9);
  CHECK(base_rate == Approx(100).epsilon(0.02));
  // Credits drain after about credits / (burst - baseline) = 3.33 s.
  // Then idle for 20 s: 2,000 credits come back, good for ~2,000 burst I/Os.
  now = starts.back() + 20'000'000'000;
  Nanos t0 = now;
  Nanos end = 0;
  for (int i = 0; i < 2000; ++i) {
    auto sc = s.schedule({IoOp::Read, 0, 4096}, now);
    end = sc.start;
    now = sc.start;
  }
  double refill_rate = 2000.0 / (static_cast<double>(end - t0) / 1e9);
  CHECK(refill_rate > 900);  // ran at burst speed again
  // The ~200 credits earned meanwhile last ~220 more I/Os; after that the
  // tier is back at its baseline.
  for (int i = 0; i < 500; ++i) now = s.schedule({IoOp::Read, 0, 4096}, now).start;
  Nanos b0 = now;
  for (int i = 0; i < 500; ++i) now = s.schedule({IoOp::Read, 0, 4096}, now).start;
  CHECK(500.0 / (static_cast<double>(now - b0) / 1e9) == Approx(100).epsilon(0.02));
}

TEST_CASE("parallelism limits I/Os in service", "[shaper]") {
  auto t = uncapped(1'000'000);
  t.parallelism = 4;
  Shaper s(t, 1);
  for (int i = 0; i < 8; ++i) {
    auto sc = s.schedule({IoOp::Read, 0, 4096}, 0);
    CHECK(sc.start == (i < 4 ? 0 : 1'000'000));
    CHECK(sc.complete == sc.start + 1'000'000);
  }
  CHECK(s.stats().slot_wait_ns == 4 * 1'000'000);
}

TEST_CASE("latency distributions match their parameters and are seeded", "[shaper]") {
  auto t = uncapped(0);
  t.read = {tiers::LatencyDist::Lognormal, 500'000, 2'000'000};
  t.write = {tiers::LatencyDist::Exponential, 693'147, 0};  // mean 1 ms
  Shaper a(t, 7), b(t, 7), c(t, 8);
  Histogram hr, hw;
  bool same = true, differs = false;
  for (int i = 0; i < 400000; ++i) {
    Nanos x = a.service_time(IoOp::Read);
    Nanos y = b.service_time(IoOp::Read);
    same = same && x == y;
    differs = differs || x != c.service_time(IoOp::Read);
    hr.record(x);
    hw.record(a.service_time(IoOp::Write));
    b.service_time(IoOp::Write);
  }
  CHECK(same);
  CHECK(differs);
  CHECK(static_cast<double>(hr.quantile(0.5)) == Approx(500'000).epsilon(0.03));
  CHECK(static_cast<double>(hr.quantile(0.99)) == Approx(2'000'000).epsilon(0.05));
  CHECK(hw.mean() == Approx(1'000'000).epsilon(0.01));
  CHECK(std::abs(inverse_normal_cdf(0.975) - 1.959963985) < 1e-8);
  CHECK(std::abs(inverse_normal_cdf(0.001) + 3.090232306) < 1e-8);
}

TEST_CASE("patterns: fio rw modes, alignment, mix and determinism", "[pattern]") {
  PatternSpec spec;
  spec.rw = Rw::RandRw;
  spec.bs = 8192;
  spec.size = 1 << 20;
  spec.rwmixread = 70;
  spec.seed = 3;
  Pattern p(spec), q(spec);
  int reads = 0;
  for (int i = 0; i < 100000; ++i) {
    auto r = p.next();
    auto r2 = q.next();
    REQUIRE(r.offset == r2.offset);
    REQUIRE(r.op == r2.op);
    REQUIRE(r.offset % 8192 == 0);
    REQUIRE(r.offset + r.length <= spec.size);
    REQUIRE(r.length == 8192);
    reads += r.op == IoOp::Read;
  }
  CHECK(reads / 100000.0 == Approx(0.70).epsilon(0.02));

  spec.rw = Rw::Write;
  spec.size = 4 * 8192;
  Pattern s(spec);
  for (uint64_t i = 0; i < 8; ++i) {
    auto r = s.next();
    CHECK(r.op == IoOp::Write);
    CHECK(r.offset == (i % 4) * 8192);
  }
  CHECK(parse_rw("randread") == Rw::RandRead);
  CHECK(parse_rw("rw") == Rw::ReadWrite);
  // The library names the value and what is wrong with it, never a flag.
  CHECK_THROWS_AS(parse_rw("random"), InputError);
  CHECK_THROWS_WITH(parse_rw("random"),
                    "random: unknown pattern (known: randread, randwrite, read, write, randrw, readwrite)");
  PatternSpec bad;
  bad.size = 100;
  CHECK_THROWS_AS(Pattern(bad), InputError);
  CHECK_THROWS_WITH(Pattern(bad), "region 100 bytes: must hold at least one block (4096 bytes)");
  bad = PatternSpec{};
  bad.rwmixread = 101;
  CHECK_THROWS_AS(Pattern(bad), InputError);
  CHECK_THROWS_WITH(Pattern(bad), "rwmixread 101: must be a percentage from 0 to 100");
  bad = PatternSpec{};
  bad.bs = 0;
  CHECK_THROWS_WITH(Pattern(bad), "block size 0: must be at least 1 byte");
}
