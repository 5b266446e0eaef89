// The simulator against queueing theory and against its own contracts.
#include "iosim/sim.h"

#include "common/error.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <vector>

using namespace tierlab;
using namespace tierlab::iosim;

namespace {

tiers::Tier uncapped_tier(tiers::Latency lat, uint32_t parallelism = 0) {
  tiers::Tier t;
  t.name = "test";
  t.read = t.write = t.flush = lat;
  t.parallelism = parallelism;
  return t;
}

struct Collected {
  std::vector<IoEvent> events;
  static void add(void* ctx, const IoEvent& e) { static_cast<Collected*>(ctx)->events.push_back(e); }
};

// Largest weight in any window [t, t + w) over (time, weight) pairs.
uint64_t max_in_window(std::vector<std::pair<Nanos, uint32_t>> v, Nanos w) {
  std::sort(v.begin(), v.end());
  uint64_t best = 0, sum = 0;
  size_t lo = 0;
  for (size_t hi = 0; hi < v.size(); ++hi) {
    sum += v[hi].second;
    while (v[hi].first - v[lo].first >= w) sum -= v[lo++].second;
    best = std::max(best, sum);
  }
  return best;
}

// Open-loop M/x/1: Poisson arrivals at rho / S, one server.
SimResult run_mx1(tiers::LatencyDist dist, double service_ns, double rho, uint64_t n, uint64_t seed) {
  tiers::Latency lat{dist, 0, 0};
  lat.p50_ns = dist == tiers::LatencyDist::Exponential
                   ? static_cast<Nanos>(std::llround(service_ns * std::log(2.0)))
                   : static_cast<Nanos>(service_ns);
  auto tier = uncapped_tier(lat, 1);
  PatternSpec p;
  p.seed = seed;
  PatternArrivals arrivals(p, rho / service_ns * 1e9, /*poisson=*/true, n, 0);
  SimOptions opt;
  opt.seed = seed * 7 + 1;
  opt.open_iodepth = 1 << 16;  // an unbounded queue, as the formulas assume
  return simulate_open(tier, arrivals, opt);
}

}  // namespace

TEST_CASE("an IOPS cap is never exceeded over any 100 ms window", "[sim]") {
  auto catalog = tiers::Catalog::builtin();
  struct Case {
    const char* tier;
    Rw rw;
    uint64_t bs;
  };
  for (auto c : {Case{"ebs-gp3", Rw::RandRead, 4096}, Case{"ebs-gp3-16k", Rw::RandRw, 16384},
                 Case{"rds-16k", Rw::RandWrite, 1 << 20}, Case{"ebs-gp3-16k", Rw::Read, 16384}}) {
    const auto& tier = catalog.get(c.tier);
    INFO(c.tier << " " << rw_name(c.rw) << " bs " << c.bs);
    ClosedLoop loop;
    loop.pattern.rw = c.rw;
    loop.pattern.bs = c.bs;
    loop.pattern.size = 64ull << 30;
    loop.iodepth = 128;
    loop.runtime_ns = 3'000'000'000;
    Collected col;
    SimOptions opt;
    opt.observer = &Collected::add;
    opt.observer_ctx = &col;
    auto r = simulate_closed(tier, loop, opt);
    std::vector<std::pair<Nanos, uint32_t>> starts, completes;
    uint64_t counted = 0;
    uint32_t max_cost = 0;
    for (const auto& e : col.events) {
      starts.push_back({e.start, e.counted});
      counted += e.counted;
      max_cost = std::max(max_cost, e.counted);
    }
    const Nanos window = 100'000'000;
    // A token bucket of rate r and depth r * bucket_ns admits at most
    // r * (window + bucket_ns) counted I/Os in a window, plus the one
    // being admitted when the bucket runs dry.
    const double cap = tier.total_iops * static_cast<double>(window + tier.bucket_ns) / 1e9 + max_cost;
    const uint64_t seen = max_in_window(starts, window);
    CHECK(static_cast<double>(seen) <= cap);
    // And the cap is reached: the run is throttled, not latency-bound.
    // (Sequential 16 KiB reads merge 16 to one counted I/O and hit the
    // throughput cap instead: 1,000 MiB/s = 4,000 counted I/Os per second.)
    if (c.rw != Rw::Read) CHECK(static_cast<double>(seen) >= 0.97 * tier.total_iops * 0.1);
    else CHECK(r.bw_bytes == Approx(tier.bytes_per_sec).epsilon(0.01));
    double counted_rate = static_cast<double>(counted) / (static_cast<double>(r.elapsed_ns) / 1e9);
    CHECK(counted_rate <= tier.total_iops * 1.01);
    CHECK(r.shaper.throttled_ns > 0);
    if (c.bs == (1u << 20)) CHECK(max_cost == 4);
    if (c.rw == Rw::Read) CHECK(r.shaper.merged_ios > r.shaper.counted_ios);
  }
}

TEST_CASE("M/D/1 and M/M/1 mean waits match the formulas within 3%", "[sim]") {
  // 4 M customers per run. The standard error of the mean wait for M/M/1
  // (asymptotic variance rho(2+5rho-4rho^2+rho^3)/(1-rho)^4 / mu^2 per
  // customer) is about 0.3% at rho 0.5, 0.4% at 0.7 and 0.6% at 0.8, and
  // smaller for M/D/1: 3% is at least five standard errors. (Measured with
  // these seeds: M/D/1 within 0.1%, M/M/1 within 0.35%.)
  const double S = 1'000'000;  // 1 ms service
  const uint64_t n = 4'000'000;
  for (double rho : {0.5, 0.7, 0.8}) {
    INFO("rho " << rho);
    {
      auto r = run_mx1(tiers::LatencyDist::Fixed, S, rho, n, 11);
      double wq = static_cast<double>(r.shaper.slot_wait_ns) / static_cast<double>(r.ios);
      double expect = rho * S / (2 * (1 - rho));  // Pollaczek-Khinchine, deterministic service
      CHECK(wq == Approx(expect).epsilon(0.03));
      CHECK(r.lat.mean() == Approx(expect + S).epsilon(0.03));
    }
    {
      auto r = run_mx1(tiers::LatencyDist::Exponential, S, rho, n, 23);
      double mean_s = std::llround(S * std::log(2.0)) / std::log(2.0);
      double wq = static_cast<double>(r.shaper.slot_wait_ns) / static_cast<double>(r.ios);
      double expect = rho * mean_s / (1 - rho);
      CHECK(wq == Approx(expect).epsilon(0.03));
      CHECK(r.lat.mean() == Approx(mean_s / (1 - rho)).epsilon(0.03));
    }
  }
}

TEST_CASE("Little's law holds: L = lambda W", "[sim]") {
  auto catalog = tiers::Catalog::builtin();
  // Open loop through a capped, jittery tier...
  {
    PatternSpec p;
    p.rw = Rw::RandRw;
    p.seed = 5;
    PatternArrivals arrivals(p, 2500, true, 200000, 0);
    auto r = simulate_open(catalog.get("ebs-gp3"), arrivals, SimOptions{});
    double lambda = static_cast<double>(r.ios) / (static_cast<double>(r.elapsed_ns) / 1e9);
    double w = r.lat.mean() / 1e9;
    CHECK(r.mean_queue_depth == Approx(lambda * w).epsilon(0.01));
    CHECK(r.mean_queue_depth > 1);
  }
  // ...and a closed loop with think time.
  {
    ClosedLoop loop;
    loop.iodepth = 16;
    loop.think_ns = 200'000;
    loop.runtime_ns = 2'000'000'000;
    auto r = simulate_closed(catalog.get("rds-16k"), loop, SimOptions{});
    double lambda = r.iops;
    double w = r.lat.mean() / 1e9;
    CHECK(r.mean_queue_depth == Approx(lambda * w).epsilon(0.01));
    CHECK(r.mean_queue_depth < 16);
  }
}

TEST_CASE("closed loop at queue depth q on an uncapped tier gives q/L IOPS", "[sim]") {
  for (uint32_t q : {1u, 8u, 32u, 256u}) {
    for (Nanos L : {Nanos{100'000}, Nanos{1'000'000}}) {
      INFO("q " << q << " L " << L);
      auto tier = uncapped_tier({tiers::LatencyDist::Fixed, L, 0});
      ClosedLoop loop;
      loop.iodepth = q;
      loop.runtime_ns = 1'000'000'000;
      auto r = simulate_closed(tier, loop, SimOptions{});
      CHECK(r.iops == Approx(q * 1e9 / static_cast<double>(L)).epsilon(0.01));
      CHECK(r.mean_queue_depth == Approx(q).epsilon(0.01));
      CHECK(r.lat.max() == L);
    }
  }
  // With --ios instead of --runtime: exactly that many I/Os.
  auto tier = uncapped_tier({tiers::LatencyDist::Fixed, 250'000, 0});
  ClosedLoop loop;
  loop.iodepth = 4;
  loop.ios = 1000;
  auto r = simulate_closed(tier, loop, SimOptions{});
  CHECK(r.ios == 1000);
  CHECK(r.elapsed_ns == 250 * 250'000);
  // Parallelism caps the served queue depth: q = 32 on 8 slots gives 8/L.
  auto narrow = uncapped_tier({tiers::LatencyDist::Fixed, 100'000, 0}, 8);
  ClosedLoop deep;
  deep.iodepth = 32;
  deep.runtime_ns = 500'000'000;
  auto rn = simulate_closed(narrow, deep, SimOptions{});
  CHECK(rn.iops == Approx(8 * 1e9 / 100'000).epsilon(0.01));
}

TEST_CASE("a simulation is deterministic for a seed", "[sim]") {
  auto catalog = tiers::Catalog::builtin();
  ClosedLoop loop;
  loop.pattern.rw = Rw::RandRw;
  loop.pattern.rwmixread = 70;
  loop.iodepth = 32;
  loop.runtime_ns = 1'000'000'000;
  auto run = [&](uint64_t seed) {
    Collected col;
    SimOptions opt;
    opt.seed = seed;
    opt.observer = &Collected::add;
    opt.observer_ctx = &col;
    loop.pattern.seed = seed;
    auto r = simulate_closed(catalog.get("ebs-gp3-16k"), loop, opt);
    return std::make_pair(r, col.events);
  };
  auto [a, ea] = run(42);
  auto [b, eb] = run(42);
  auto [c, ec] = run(43);
  REQUIRE(ea.size() == eb.size());
  bool same = true;
  for (size_t i = 0; i < ea.size(); ++i)
    same = same && ea[i].complete == eb[i].complete && ea[i].req.offset == eb[i].req.offset &&
           ea[i].req.op == eb[i].req.op && ea[i].start == eb[i].start;
  CHECK(same);
  CHECK(a.ios == b.ios);
  CHECK(a.lat.quantile(0.99) == b.lat.quantile(0.99));
  CHECK(a.mean_queue_depth == b.mean_queue_depth);
  CHECK(a.shaper.throttled_ns == b.shaper.throttled_ns);
  CHECK(a.lat.sum() != c.lat.sum());
}

TEST_CASE("queue depth series covers the run and averages to the mean", "[sim]") {
  auto tier = uncapped_tier({tiers::LatencyDist::Fixed, 500'000, 0});
  ClosedLoop loop;
  loop.iodepth = 10;
  loop.runtime_ns = 10'000'000'000;
  auto r = simulate_closed(tier, loop, SimOptions{});
  REQUIRE(!r.qd_series.empty());
  CHECK(r.qd_series.size() <= 64);
  double area = 0;
  Nanos covered = 0;
  uint64_t done = 0;
  for (const auto& p : r.qd_series) {
    CHECK(p.t == covered);
    area += p.mean_qd * static_cast<double>(p.width);
    covered += p.width;
    done += p.completed;
  }
  CHECK(covered == r.elapsed_ns);
  CHECK(done == r.ios);
  // 10 / 0.5 ms = 20,000 IOPS in every full interval.
  const auto& mid = r.qd_series[5];
  CHECK(static_cast<double>(mid.completed) / (static_cast<double>(mid.width) / 1e9) ==
        Approx(20000).epsilon(0.001));
  CHECK(area / static_cast<double>(covered) == Approx(r.mean_queue_depth).epsilon(1e-6));
  CHECK(r.qd_series[3].mean_qd == Approx(10).epsilon(1e-9));
}

TEST_CASE("open loop from a trace reports how far completions fell behind", "[sim]") {
  char path[] = "/tmp/tierlab_sim_trace_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  // 20,000 4 KiB reads at 10,000/s that completed 100 us after issue, written
  // in completion order with some reordering: a 3,000-IOPS tier falls behind.
  {
    auto w = trace::open_writer(path);
    for (int i = 0; i < 20000; ++i) {
      int j = (i % 2 == 0 && i + 1 < 20000) ? i + 1 : (i % 2 == 1 ? i - 1 : i);  // swap pairs
      trace::BlockIo b;
      const Nanos issue = 1'000'000'000 + static_cast<Nanos>(j) * 100'000;
      b.complete_ns = issue + 100'000;
      b.offset = static_cast<uint64_t>(j) * 1048576;
      b.length = 4096;
      b.op = trace::IoOp::Read;
      w->write(issue, 0, b);
    }
    trace::FileIo f;
    f.file = "base/1/1234";
    f.length = 8192;
    w->write(3'000'000'000, 0, f);
    w->close();
  }
  auto catalog = tiers::Catalog::builtin();
  {
    auto reader = trace::open_reader(path);
    TraceArrivals arr(*reader, TraceRecords::Block);
    auto r = simulate_open(catalog.get("ebs-gp3"), arr, SimOptions{});
    CHECK(r.ios == 20000);
    CHECK(r.late_arrivals == 0);
    CHECK(r.first_issue == 1'000'000'000);
    CHECK(r.iops == Approx(3000).epsilon(0.02));
    CHECK(r.behind_ios > 19000);
    // 20,000 I/Os at 3,000/s take ~6.7 s instead of 2 s.
    CHECK(static_cast<double>(r.end_behind_ns) / 1e9 == Approx(4.67).epsilon(0.03));
    CHECK(r.behind.max() > 4'000'000'000);
    // At most iodepth (32) outstanding, as iosim run holds them: the rest
    // wait for a slot and go late.
    CHECK(r.max_queue_depth == 32);
    CHECK(r.slot_waits > 19000);
    CHECK(r.late_issues > 19000);
    CHECK(r.issue_stalls >= 1);
    CHECK(r.issue_lag.max() > 4'000'000'000);
    CHECK(arr.file_records() == 1);
  }
  {
    auto reader = trace::open_reader(path);
    TraceArrivals arr(*reader, TraceRecords::Block);
    auto r = simulate_open(catalog.get("nvme-local"), arr, SimOptions{});
    CHECK(r.ios == 20000);
    CHECK(r.iops == Approx(10000).epsilon(0.02));
    CHECK(r.end_behind_ns < 2'000'000);
  }
  {
    auto reader = trace::open_reader(path);
    TraceArrivals arr(*reader, TraceRecords::All, 1);  // no reordering window
    auto r = simulate_open(catalog.get("nvme-local"), arr, SimOptions{});
    CHECK(r.ios == 20001);
    CHECK(r.late_arrivals == 10000);
    CHECK(r.other.ios == 0);
    CHECK(r.read.bytes == 20000ull * 4096 + 8192);
  }
  std::remove(path);
}

TEST_CASE("an open loop above the tier's capacity stays within iodepth", "[sim]") {
  auto catalog = tiers::Catalog::builtin();
  const auto& gp3 = catalog.get("ebs-gp3");  // 3,000 IOPS
  PatternSpec p;
  SimOptions opt;
  opt.open_iodepth = 32;
  opt.open_runtime_ns = 2'000'000'000;
  // A million times the cap: without a bound every arrival would be queued.
  PatternArrivals arrivals(p, 3e9, false, 0, opt.open_runtime_ns);
  auto r = simulate_open(gp3, arrivals, opt);
  CHECK(r.max_queue_depth == 32);
  // The tier's rate, for the run's 2 s: I/Os not issued by then are not.
  CHECK(r.iops == Approx(3000).epsilon(0.02));
  CHECK(static_cast<double>(r.ios) == Approx(6000).epsilon(0.03));
  CHECK(r.last_complete - r.first_issue < 2'100'000'000);
  // Every I/O after the first 32 waited for a slot and went late, in one stall.
  CHECK(r.slot_waits >= r.ios - 32);
  CHECK(r.late_issues >= r.ios - 33);
  CHECK(r.issue_stalls == 1);
  // Little's law at the bound: 32 outstanding at 3,000 IOPS is ~10.7 ms each.
  CHECK(r.lat.mean() / 1e9 == Approx(32.0 / 3000).epsilon(0.03));

  // A bigger --iodepth is a bigger bound, still held.
  opt.open_iodepth = 1000;
  PatternArrivals more(p, 3e9, false, 0, opt.open_runtime_ns);
  CHECK(simulate_open(gp3, more, opt).max_queue_depth == 1000);
}

TEST_CASE("simulator input errors are InputErrors", "[sim]") {
  auto tier = uncapped_tier({tiers::LatencyDist::Fixed, 1000, 0});
  ClosedLoop loop;
  CHECK_THROWS_AS(simulate_closed(tier, loop, SimOptions{}), InputError);  // no end
  loop.ios = 10;
  loop.iodepth = 0;
  CHECK_THROWS_AS(simulate_closed(tier, loop, SimOptions{}), InputError);
  PatternSpec p;
  CHECK_THROWS_AS(PatternArrivals(p, 0, true, 10, 0), InputError);
  CHECK_THROWS_AS(PatternArrivals(p, 100, true, 0, 0), InputError);
  PatternArrivals ok(p, 100, true, 10, 0);
  SimOptions no_depth;
  no_depth.open_iodepth = 0;
  CHECK_THROWS_AS(simulate_open(tier, ok, no_depth), InputError);
}

// The simulator is a library: its messages name the value that is wrong in
// the simulator's terms, never a flag of the command that called it.
TEST_CASE("simulator input errors name the value, not a flag", "[sim]") {
  auto tier = uncapped_tier({tiers::LatencyDist::Fixed, 1000, 0});
  ClosedLoop loop;
  CHECK_THROWS_WITH(simulate_closed(tier, loop, SimOptions{}),
                    "a closed loop needs a runtime or an I/O count to end");
  loop.ios = 10;
  loop.think_ns = -5;
  CHECK_THROWS_WITH(simulate_closed(tier, loop, SimOptions{}), "think time -5 ns: must not be negative");
  loop.think_ns = 0;
  loop.iodepth = 0;
  CHECK_THROWS_WITH(simulate_closed(tier, loop, SimOptions{}), "iodepth 0: must be at least 1");
  PatternSpec p;
  CHECK_THROWS_WITH(PatternArrivals(p, 0, true, 10, 0), "arrival rate 0 IOPS: must be above 0");
  CHECK_THROWS_WITH(PatternArrivals(p, -2.5, true, 10, 0), "arrival rate -2.5 IOPS: must be above 0");
  CHECK_THROWS_WITH(PatternArrivals(p, 100, true, 0, 0), "an open loop needs a runtime or an I/O count to end");
  PatternArrivals ok(p, 100, true, 10, 0);
  SimOptions no_depth;
  no_depth.open_iodepth = 0;
  CHECK_THROWS_WITH(simulate_open(tier, ok, no_depth), "iodepth 0: must be at least 1");
}
