// Group commit: commits per WAL flush against hand-computed cases, and the
// mean value analysis step with a throughput-dependent (Cycle) station.
#include "models/group_commit.h"
#include "models/mva.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace tierlab::models;

TEST_CASE("group commit: batch is x F + exp(-x F), between 1 and the clients", "[group_commit]") {
  CHECK(group_commit_batch(0, 0.001, 8) == 1.0);
  CHECK(group_commit_batch(1000, 0, 8) == 1.0);
  CHECK(group_commit_batch(1000, 0.001, 8) == Approx(1 + std::exp(-1.0)));
  CHECK(group_commit_batch(2000, 0.001, 8) == Approx(2 + std::exp(-2.0)));
  CHECK(group_commit_batch(100000, 0.001, 8) == 8.0);
  CHECK(group_commit_batch(100000, 0.001, 1) == 1.0);
}

TEST_CASE("group commit: calibration gives the captured flushes at the captured rate", "[group_commit]") {
  // 0.5 flushes per transaction at 1,000 tps with 8 clients: two commits
  // per flush, so 1000 F + exp(-1000 F) = 2, F = 1.8414 ms.
  FlushCycle c = calibrate_flush_cycle(0.5, 0.5, 1000, 8, 0.0001, 0.0002);
  CHECK(c.flushes == 1.0);
  CHECK(c.writes == Approx(1.0));
  CHECK(c.captured_s == Approx(0.0018414).epsilon(1e-3));
  CHECK(c.captured_device_s == Approx(0.0003));
  CHECK(c.device_s == Approx(c.captured_s));
  CHECK(c.flushes_per_tx(1000, 8) == Approx(0.5).epsilon(1e-9));
  CHECK(c.writes_per_tx(1000, 8) == Approx(0.5).epsilon(1e-9));
  // At low load each commit flushes alone.
  CHECK(c.flushes_per_tx(1, 8) == Approx(1.0).epsilon(0.01));
  // Twice the commit rate: 3.68 + exp(-3.68) commits per flush.
  CHECK(c.flushes_per_tx(2000, 8) == Approx(1 / (2000 * c.captured_s + std::exp(-2000 * c.captured_s))));
  // A tier whose write and flush take twice as long: a cycle twice as long.
  FlushCycle t = c;
  set_device(t, 0.0002, 0.0004);
  CHECK(t.device_s == Approx(2 * c.captured_s));
  // More flushes than commits: never shared, the extra ones kept.
  FlushCycle e = calibrate_flush_cycle(1.25, 1.5, 1000, 8, 0.0001, 0.0002);
  CHECK(e.flushes == 1.25);
  // Each commit still waits for one cycle of the device's writes and flush.
  CHECK(e.captured_s == Approx(1.5 / 1.25 * 0.0001 + 0.0002));
  CHECK(e.device_s == Approx(e.captured_s));
  CHECK(e.residence_s(1, 8) == Approx(e.captured_s).epsilon(1e-3));
  FlushCycle slow = e;
  set_device(slow, 0.001, 0.002);
  CHECK(slow.device_s == Approx(10 * e.captured_s));
  // At a low rate the captured flushes per commit; more commits per flush as
  // the rate grows.
  CHECK(e.flushes_per_tx(1, 8) == Approx(1.25).epsilon(1e-3));
  CHECK(e.flushes_per_tx(1000, 8) == Approx(1.25 / group_commit_batch(1000, e.captured_s, 8)));
  CHECK(e.writes_per_tx(5000, 8) == Approx(1.5 / group_commit_batch(5000, e.captured_s, 8)));
  // A quarter of the transactions commit through the cycle: 0.125 flushes
  // per transaction is two commits per flush at 250 commits/s.
  FlushCycle q = calibrate_flush_cycle(0.125, 0.125, 1000, 8, 0.0001, 0.0002, 0.25);
  CHECK(q.share == 0.25);
  CHECK(group_commit_batch(250, q.captured_s, 8) == Approx(2).epsilon(1e-9));
  CHECK(q.flushes_per_tx(1000, 8) == Approx(0.125).epsilon(1e-9));
  CHECK(q.residence_s(1000, 1) == Approx(0.25 * q.captured_s));
  // A batch beyond the clients cannot be reached: aimed just below it.
  FlushCycle b = calibrate_flush_cycle(0.1, 0.1, 1000, 4, 0.0001, 0.0002);
  CHECK(b.flushes_per_tx(1000, 4) == Approx(0.25).epsilon(1e-6));
}

TEST_CASE("group commit: a cap that counts the cycle's I/Os lengthens it", "[group_commit]") {
  FlushCycle c;
  c.writes = 1;
  c.captured_s = c.device_s = 0.001;
  // No pace: the device's cycle.
  CHECK(c.cycle_s(500) == 0.001);
  // Two tokens per cycle, 1,000/s of which the rest takes 500/s: cycles
  // back to back come every 4 ms. At 500 tps F solves
  // F = exp(-500 F) 1 ms + (1 - exp(-500 F)) 4 ms.
  c.paces.push_back({2, 1000, 500, 0});
  double f = c.cycle_s(500);
  double e = std::exp(-500 * f);
  CHECK(f == Approx(e * 0.001 + (1 - e) * 0.004).epsilon(1e-9));
  CHECK(f > 0.001);
  CHECK(f < 0.004);
  // Hardly any commits: the cycle finds tokens banked.
  CHECK(c.cycle_s(0.01) == Approx(0.001).epsilon(1e-3));
  // The rest of the workload grows with throughput (per_tx): less left.
  FlushCycle g = c;
  g.paces[0].per_tx = 0.5;
  CHECK(g.cycle_s(500) > f);
  // As the cap tightens at a fixed commit rate, flushes per transaction
  // fall, towards one per `clients` commits.
  c.paces.clear();
  double prev = c.flushes_per_tx(1000, 8);
  for (double limit : {5000.0, 2000.0, 1000.0, 700.0, 550.0, 520.0, 505.0}) {
    c.paces = {{2, limit, 500, 0}};
    double now = c.flushes_per_tx(1000, 8);
    CHECK(now <= prev);
    prev = now;
  }
  CHECK(prev == Approx(1.0 / 8));
  // The rest alone over the cap: shared in proportion, still a finite cycle.
  c.paces[0] = {2, 1000, 3000, 0};
  CHECK(std::isfinite(c.cycle_s(100)));
  CHECK(c.cycle_s(100) > 0.001);
}

TEST_CASE("group commit: a commit waits for its cycle and the rest of the one in progress",
          "[group_commit]") {
  FlushCycle c;
  c.writes = 1;
  c.captured_s = c.device_s = 0.002;
  // One client never waits for another's cycle.
  CHECK(c.residence_s(400, 1) == Approx(0.002));
  // x = 400, F = 2 ms: batch 0.8 + exp(-0.8) = 1.2493, busy 400 / 1.2493 *
  // 2 ms = 0.6403; seen by an arrival among 4 clients: 3/4 of it.
  double b = 0.8 + std::exp(-0.8);
  double rho = 400 / b * 0.002 * 3 / 4;
  CHECK(c.busy(400, 4) == Approx(400 / b * 0.002));
  CHECK(c.residence_s(400, 4) == Approx(0.002 * (1 + rho / 2)));
}

TEST_CASE("mva: a Cycle station with constant residence is a delay station", "[mva]") {
  std::vector<Station> a{{"think", StationKind::Delay, 0.01, 1},
                         {"cpu", StationKind::Multi, 0.002, 2},
                         {"disk", StationKind::Queue, 0.003, 1},
                         {"lat", StationKind::Delay, 0.004, 1}};
  std::vector<Station> b = a;
  b[3] = Station("lat", StationKind::Cycle, 0, 1, [](double, int) { return 0.004; });
  auto pa = solve_mva(a, 20, 0), pb = solve_mva(b, 20, 0);
  for (size_t i = 0; i < pa.size(); ++i) {
    CHECK(pb[i].throughput == Approx(pa[i].throughput).epsilon(1e-9));
    CHECK(pb[i].response_s == Approx(pa[i].response_s).epsilon(1e-9));
    CHECK(pb[i].bottleneck == pa[i].bottleneck);
  }
  CHECK_THROWS(solve_mva({Station("c", StationKind::Cycle, 0, 1)}, 2));
}

TEST_CASE("mva: a Cycle station's residence is solved with the throughput", "[mva]") {
  // One client, think 1 s, a cycle of 1 + x seconds: X (1 + 1 + X) = 1,
  // X = sqrt(2) - 1.
  std::vector<Station> st{{"think", StationKind::Delay, 1.0, 1},
                          Station("c", StationKind::Cycle, 0, 1, [](double x, int) { return 1 + x; })};
  auto pts = solve_mva(st, 1, 0);
  CHECK(pts[0].throughput == Approx(std::sqrt(2.0) - 1).epsilon(1e-9));
  CHECK(pts[0].response_s == Approx(std::sqrt(2.0)).epsilon(1e-9));
  // Two clients: X (2 + X) = 2, X = sqrt(3) - 1.
  pts = solve_mva(st, 2, 0);
  CHECK(pts[1].throughput == Approx(std::sqrt(3.0) - 1).epsilon(1e-9));
}
