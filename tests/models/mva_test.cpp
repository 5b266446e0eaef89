// Mean value analysis against independent exact results: Buzen's convolution
// algorithm for product-form networks, the finite-source (machine repairman)
// closed forms for one and m servers, a network solved by hand, and the
// asymptotic bounds of Lazowska et al., "Quantitative System Performance",
// ch. 5-6.
#include "models/mva.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace tierlab::models;

namespace {

// Buzen's convolution: G(n) for queueing stations with demands d and an
// optional delay station of demand z. X(N) = G(N-1) / G(N).
double buzen_throughput(const std::vector<double>& d, double z, int n) {
  std::vector<double> g(static_cast<size_t>(n) + 1, 0.0);
  // Delay station first: g[k] = z^k / k!
  g[0] = 1;
  for (int k = 1; k <= n; ++k) g[static_cast<size_t>(k)] = g[static_cast<size_t>(k - 1)] * z / k;
  for (double di : d)
    for (int k = 1; k <= n; ++k)
      g[static_cast<size_t>(k)] += di * g[static_cast<size_t>(k - 1)];
  return g[static_cast<size_t>(n - 1)] / g[static_cast<size_t>(n)];
}

// Finite-source M/M/m//N with think time z and demand d: throughput from the
// stationary distribution of the birth-death chain.
double repairman_throughput(double d, double z, int m, int n) {
  std::vector<double> w(static_cast<size_t>(n) + 1);
  w[0] = 1;
  for (int k = 1; k <= n; ++k) {
    double birth = (n - k + 1) / z;       // arrivals from thinking clients
    double death = std::min(k, m) / d;    // completions with k present
    w[static_cast<size_t>(k)] = w[static_cast<size_t>(k - 1)] * birth / death;
  }
  double sum = 0, x = 0;
  for (int k = 0; k <= n; ++k) sum += w[static_cast<size_t>(k)];
  for (int k = 0; k <= n; ++k) x += w[static_cast<size_t>(k)] / sum * std::min(k, m) / d;
  return x;
}

// The same finite-source queue for large populations: the chain's weights in
// log space, scaled by the largest before summing, so nothing overflows and
// nothing is subtracted. Exact and stable for any m and n.
double repairman_throughput_stable(double d, double z, int m, int n) {
  std::vector<double> lw(static_cast<size_t>(n) + 1);
  lw[0] = 0;
  for (int k = 1; k <= n; ++k)
    lw[static_cast<size_t>(k)] = lw[static_cast<size_t>(k - 1)] + std::log((n - k + 1) / z) -
                                 std::log(std::min(k, m) / d);
  double top = *std::max_element(lw.begin(), lw.end());
  double sum = 0, x = 0;
  for (int k = 0; k <= n; ++k) {
    double w = std::exp(lw[static_cast<size_t>(k)] - top);
    sum += w;
    x += w * std::min(k, m) / d;
  }
  return x / sum;
}

}  // namespace

TEST_CASE("mva: a network solved by hand", "[mva]") {
  // Two queues, D = 1 s and 2 s, no think time.
  auto pts = solve_mva({{"a", StationKind::Queue, 1.0, 1}, {"b", StationKind::Queue, 2.0, 1}}, 3);
  REQUIRE(pts.size() == 3);
  CHECK(pts[0].throughput == Approx(1.0 / 3));
  CHECK(pts[1].throughput == Approx(2.0 / (4.0 / 3 + 10.0 / 3)));
  CHECK(pts[1].queue[0] == Approx(0.571428571).epsilon(1e-6));
  CHECK(pts[2].throughput == Approx(7.0 / 15));  // G(2)/G(3) = 7/15
  CHECK(pts[2].bottleneck == 1);
  CHECK(pts[2].utilisation[1] == Approx(14.0 / 15));
}

TEST_CASE("mva: a timesharing network (terminals, CPU, two disks)", "[mva]") {
  // Terminals with Z = 15 s, CPU D = 0.605 s, disks D = 2.1 s and 1.35 s,
  // checked against convolution and the interactive response time law.
  std::vector<Station> st{{"think", StationKind::Delay, 15.0, 1},
                          {"cpu", StationKind::Queue, 0.605, 1},
                          {"disk1", StationKind::Queue, 2.1, 1},
                          {"disk2", StationKind::Queue, 1.35, 1}};
  auto pts = solve_mva(st, 30, 0);
  for (int n : {1, 2, 5, 10, 20, 30}) {
    double x = buzen_throughput({0.605, 2.1, 1.35}, 15.0, n);
    CHECK(pts[static_cast<size_t>(n - 1)].throughput == Approx(x).epsilon(1e-9));
    // Interactive response time law: R = N/X - Z.
    CHECK(pts[static_cast<size_t>(n - 1)].response_s == Approx(n / x - 15.0).epsilon(1e-9));
  }
  CHECK(pts.back().bottleneck == 2);
}

TEST_CASE("mva: random product-form networks agree with convolution", "[mva]") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.001, 0.05);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Station> st;
    std::vector<double> d;
    double z = u(rng) * 10;
    st.push_back({"think", StationKind::Delay, z, 1});
    int k = 1 + trial % 5;
    for (int i = 0; i < k; ++i) {
      d.push_back(u(rng));
      st.push_back({"q", StationKind::Queue, d.back(), 1});
    }
    auto pts = solve_mva(st, 40, 0);
    for (int n = 1; n <= 40; ++n)
      REQUIRE(pts[static_cast<size_t>(n - 1)].throughput ==
              Approx(buzen_throughput(d, z, n)).epsilon(1e-9));
  }
}

TEST_CASE("mva: multi-server station is exact against the finite-source queue", "[mva]") {
  for (int m : {1, 2, 4, 8}) {
    for (double z : {0.0, 0.01, 0.1}) {
      double d = 0.004;
      std::vector<Station> st{{"think", StationKind::Delay, z, 1},
                              {"cpu", StationKind::Multi, d, m}};
      auto pts = solve_mva(st, 64, 0);
      for (int n = 1; n <= 64; ++n) {
        double x = pts[static_cast<size_t>(n - 1)].throughput;
        if (z > 0) {
          CHECK(x == Approx(repairman_throughput(d, z, m, n)).epsilon(1e-9));
        } else {
          // No think time: min(n, m) busy servers.
          CHECK(x == Approx(std::min(n, m) / d).epsilon(1e-9));
        }
      }
    }
  }
}

TEST_CASE("mva: many servers and many clients stay exact against the birth-death chain",
          "[mva]") {
  // A c-server CPU and a delay (think time) solved directly as a birth-death
  // chain. With think time z = f d the knee is near N = c (1 + f); N runs to
  // 256 so every c is seen below, at and above it.
  const double d = 0.004;
  for (int c : {1, 2, 8, 12, 16, 64, 128}) {
    for (double f : {0.1, 1.0, 8.0}) {
      const double z = f * d;
      std::vector<Station> st{{"think", StationKind::Delay, z, 1},
                              {"cpu", StationKind::Multi, d, c}};
      auto pts = solve_mva(st, 256, 0);
      for (int n = 1; n <= 256; ++n) {
        const auto& p = pts[static_cast<size_t>(n - 1)];
        INFO("c = " << c << ", z = " << z << ", n = " << n);
        REQUIRE(p.throughput == Approx(repairman_throughput_stable(d, z, c, n)).epsilon(1e-9));
        REQUIRE(p.utilisation[1] <= 1.0 + 1e-12);
      }
    }
  }
}

TEST_CASE("mva: throughput stays under the bottleneck bound and saturates it", "[mva]") {
  // Networks shaped like a projection: think time, a CPU with many vcpus,
  // storage with many parallel slots, a WAL device, a fixed latency. With 256
  // clients the busiest station must be nearly saturated.
  struct Shape {
    int cpus, slots;
    double cpu_d, io_d, wal_d, lat, z;
  };
  for (const Shape& s : {Shape{16, 64, 0.0002, 0.002, 0.00001, 0.0001, 0.0},
                         Shape{16, 128, 0.0004, 0.0008, 0.00002, 0.0002, 0.0},
                         Shape{8, 256, 0.0001, 0.01, 0.000005, 0.00005, 0.0},
                         Shape{32, 16, 0.0005, 0.00015, 0.00001, 0.0, 0.0005},
                         Shape{64, 64, 0.001, 0.001, 0.00002, 0.0001, 0.0}}) {
    std::vector<Station> st{{"think", StationKind::Delay, s.z, 1},
                            {"cpu", StationKind::Multi, s.cpu_d, s.cpus},
                            {"storage", StationKind::Multi, s.io_d, s.slots},
                            {"wal", StationKind::Queue, s.wal_d, 1},
                            {"lat", StationKind::Delay, s.lat, 1}};
    const double bound = std::min({s.cpus / s.cpu_d, s.slots / s.io_d, 1 / s.wal_d});
    auto pts = solve_mva(st, 256, 0);
    double prev = 0;
    for (const auto& p : pts) {
      INFO("cpus " << s.cpus << ", slots " << s.slots << ", n = " << p.n);
      REQUIRE(p.throughput <= bound * (1 + 1e-9));
      REQUIRE(p.throughput >= prev * (1 - 1e-9));  // never falls as clients are added
      prev = p.throughput;
      for (double u : p.utilisation) REQUIRE(u <= 1.0 + 1e-9);
    }
    INFO("cpus " << s.cpus << ", slots " << s.slots);
    CHECK(pts.back().utilisation[static_cast<size_t>(pts.back().bottleneck)] > 0.95);
    CHECK(pts.back().throughput > 0.95 * bound);
  }
}

TEST_CASE("mva: asymptotic bounds hold and N = 1 has no queueing", "[mva]") {
  std::vector<Station> st{{"think", StationKind::Delay, 0.02, 1},
                          {"cpu", StationKind::Multi, 0.003, 2},
                          {"disk", StationKind::Queue, 0.002, 1},
                          {"lat", StationKind::Delay, 0.001, 1}};
  auto pts = solve_mva(st, 100, 0);
  double dsum = 0.003 + 0.002 + 0.001, z = 0.02;
  double dmax = std::max(0.003 / 2, 0.002);
  CHECK(pts[0].throughput == Approx(1.0 / (dsum + z)));
  CHECK(pts[0].response_s == Approx(dsum));
  for (const auto& p : pts) {
    CHECK(p.throughput <= std::min(p.n / (dsum + z), 1.0 / dmax) * (1 + 1e-9));
    CHECK(p.throughput >= p.n / (p.n * dsum + z) * (1 - 1e-9));
    for (double u : p.utilisation) CHECK(u <= 1.0 + 1e-9);
  }
  CHECK(pts.back().bottleneck == 2);
  CHECK(pts.back().throughput == Approx(1.0 / 0.002).epsilon(0.01));
}

TEST_CASE("mva: a multi-server station alone or with a WAL cycle", "[mva]") {
  // Alone (its complementary network is empty): min(n, m) busy servers.
  auto alone = solve_mva({{"cpu", StationKind::Multi, 0.002, 64}}, 200);
  for (const auto& p : alone) REQUIRE(p.throughput == Approx(std::min(p.n, 64) / 0.002).epsilon(1e-9));
  // With a throughput-dependent cycle: still under the bound, saturating.
  std::vector<Station> st{{"cpu", StationKind::Multi, 0.0002, 16},
                          {"storage", StationKind::Multi, 0.001, 128},
                          Station("commit", StationKind::Cycle, 0, 1,
                                  [](double x, int) { return 0.0002 + x * 1e-9; })};
  auto pts = solve_mva(st, 256);
  for (const auto& p : pts) REQUIRE(p.throughput <= 16 / 0.0002 * (1 + 1e-9));
  CHECK(pts.back().utilisation[0] > 0.95);
}

TEST_CASE("mva: bad input throws", "[mva]") {
  CHECK_THROWS(solve_mva({{"a", StationKind::Queue, -1, 1}}, 3));
  CHECK_THROWS(solve_mva({{"a", StationKind::Queue, 1, 1}}, 0));
  CHECK_THROWS(solve_mva({{"a", StationKind::Multi, 1, 0}}, 2));
}
