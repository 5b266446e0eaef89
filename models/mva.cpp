#include "models/mva.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tierlab::models {

namespace {

bool multi_servers(const Station& s) { return s.kind == StationKind::Multi && s.servers > 1; }

// Advances the marginals of multi-server station s from n-1 to n customers
// in the network, given the network's throughput x at n and xc, the
// throughputs of the network without s. Every step multiplies positive
// numbers; nothing is subtracted:
//   p(j|n) = x D / j * p(j-1|n-1)                  j = 1..m-1
//   p(0|n) = p(0|n-1) * x(n) / xc(n)
// The second is the complementary-network identity: p(0|n) = G_-s(n) / G(n)
// with G the normalising constants, and X(n) = G(n-1) / G(n).
void update_marginals(const Station& s, double x, int n, const std::vector<double>& xc,
                      std::vector<double>& pi) {
  const int m = s.servers;
  const double p0 = std::isfinite(xc[static_cast<size_t>(n - 1)])
                        ? pi[0] * x / xc[static_cast<size_t>(n - 1)]
                        : 0.0;
  // From the highest j down so p(j-1|n-1) is still the old value; p(j|n) is
  // zero for j > n.
  for (int j = std::min(m - 1, n); j >= 1; --j)
    pi[static_cast<size_t>(j)] = x * s.demand_s / j * pi[static_cast<size_t>(j - 1)];
  pi[0] = std::min(1.0, p0);
}

// Solves n = 1..max_n. With `points` false only the throughputs are kept
// (out[n-1].throughput), which is all the complementary networks need.
std::vector<MvaPoint> solve(const std::vector<Station>& stations, int max_n, int think_station,
                            bool points) {
  const size_t k = stations.size();
  bool any_cycle = std::any_of(stations.begin(), stations.end(),
                               [](const Station& s) { return s.kind == StationKind::Cycle; });
  // Sum of the Cycle stations' residence times at throughput x.
  auto cycles = [&](double x, int n) {
    double sum = 0;
    for (const auto& s : stations)
      if (s.kind == StationKind::Cycle) sum += s.residence(x, n);
    return sum;
  };
  std::vector<double> q(k, 0.0);
  // p[i][j]: probability of j customers at multi-server station i (j < m).
  std::vector<std::vector<double>> p(k);
  // xc[i][n-1]: throughput of the network without multi-server station i.
  std::vector<std::vector<double>> xc(k);
  for (size_t i = 0; i < k; ++i)
    if (multi_servers(stations[i])) {
      p[i].assign(static_cast<size_t>(stations[i].servers), 0.0);
      p[i][0] = 1.0;
      std::vector<Station> rest;
      rest.reserve(k - 1);
      for (size_t o = 0; o < k; ++o)
        if (o != i) rest.push_back(stations[o]);
      xc[i].resize(static_cast<size_t>(max_n));
      if (rest.empty()) {
        std::fill(xc[i].begin(), xc[i].end(), std::numeric_limits<double>::infinity());
      } else {
        auto sub = solve(rest, max_n, -1, false);
        for (size_t n = 0; n < sub.size(); ++n) xc[i][n] = sub[n].throughput;
      }
    }

  std::vector<MvaPoint> out;
  out.reserve(static_cast<size_t>(max_n));
  std::vector<double> r(k, 0.0);
  for (int n = 1; n <= max_n; ++n) {
    double total = 0;
    for (size_t i = 0; i < k; ++i) {
      const auto& s = stations[i];
      switch (s.kind) {
        case StationKind::Delay:
          r[i] = s.demand_s;
          break;
        case StationKind::Queue:
          r[i] = s.demand_s * (1.0 + q[i]);
          break;
        case StationKind::Multi: {
          const int m = s.servers;
          // p(j|n-1) is zero for j > n-1.
          const int top = std::min(m - 2, n - 1);
          double extra = 0;
          for (int j = 0; j <= top; ++j) extra += (m - 1 - j) * p[i][static_cast<size_t>(j)];
          r[i] = s.demand_s / m * (1.0 + q[i] + extra);
          break;
        }
        case StationKind::Cycle:
          r[i] = 0;  // below, once X is known
          break;
      }
      total += r[i];
    }
    double x = total > 0 ? n / total : (points ? 0.0 : std::numeric_limits<double>::infinity());
    if (any_cycle) {
      // n = x (total + cycles(x)): the right side grows with x, so the root
      // is unique. Invariant: lo (x) <= n and hi (x) > n, or hi is the
      // largest rate the other stations allow (total > 0).
      auto excess = [&](double v) { return v * (total + cycles(v, n)) - n; };
      double lo = 0, hi = total > 0 ? n / total : 1.0;
      if (total <= 0)
        while (excess(hi) < 0 && hi < 1e15) hi *= 2;
      if (excess(hi) <= 0) {
        x = hi;
      } else {
        for (int it = 0; it < 200 && hi - lo > hi * 1e-12; ++it) {
          double mid = (lo + hi) / 2;
          (excess(mid) < 0 ? lo : hi) = mid;
        }
        x = lo;
      }
      for (size_t i = 0; i < k; ++i)
        if (stations[i].kind == StationKind::Cycle) {
          r[i] = stations[i].residence(x, n);
          if (!std::isfinite(r[i])) r[i] = std::numeric_limits<double>::max() / 4;
        }
    }
    if (!points) {
      // Only the throughput, but the state for n+1 still advances. An
      // infinite rate (every demand zero) stays infinite at every n.
      for (size_t i = 0; i < k && std::isfinite(x); ++i) {
        q[i] = x * r[i];
        if (multi_servers(stations[i])) update_marginals(stations[i], x, n, xc[i], p[i]);
      }
      MvaPoint pt;
      pt.n = n;
      pt.throughput = x;
      out.push_back(std::move(pt));
      continue;
    }
    MvaPoint pt;
    pt.n = n;
    pt.throughput = x;
    pt.residence_s = r;
    pt.queue.resize(k);
    pt.utilisation.assign(k, 0.0);
    double best = -1;
    for (size_t i = 0; i < k; ++i) {
      q[i] = x * r[i];
      pt.queue[i] = q[i];
      const auto& s = stations[i];
      if (s.kind == StationKind::Queue) pt.utilisation[i] = x * s.demand_s;
      if (s.kind == StationKind::Multi) {
        const int m = s.servers;
        pt.utilisation[i] = x * s.demand_s / m;
        if (m > 1) update_marginals(s, x, n, xc[i], p[i]);
      }
      if (s.kind != StationKind::Delay && s.kind != StationKind::Cycle && pt.utilisation[i] > best) {
        best = pt.utilisation[i];
        pt.bottleneck = static_cast<int>(i);
      }
    }
    pt.response_s = 0;
    for (size_t i = 0; i < k; ++i)
      if (static_cast<int>(i) != think_station) pt.response_s += r[i];
    out.push_back(std::move(pt));
  }
  return out;
}

}  // namespace

std::vector<MvaPoint> solve_mva(const std::vector<Station>& stations, int max_n,
                                int think_station) {
  if (max_n < 1) throw std::invalid_argument("mva: population must be at least 1");
  for (const auto& s : stations) {
    if (s.demand_s < 0) throw std::invalid_argument("mva: negative demand at " + s.name);
    if (s.kind == StationKind::Multi && s.servers < 1)
      throw std::invalid_argument("mva: station " + s.name + " needs at least one server");
    if (s.kind == StationKind::Cycle && !s.residence)
      throw std::invalid_argument("mva: cycle station " + s.name + " needs a residence function");
  }
  return solve(stations, max_n, think_station, true);
}

}  // namespace tierlab::models
