#include "models/mva.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tierlab::models {

std::vector<MvaPoint> solve_mva(const std::vector<Station>& stations, int max_n,
                                int think_station) {
  if (max_n < 1) throw std::invalid_argument("mva: population must be at least 1");
  const size_t k = stations.size();
  for (const auto& s : stations) {
    if (s.demand_s < 0) throw std::invalid_argument("mva: negative demand at " + s.name);
    if (s.kind == StationKind::Multi && s.servers < 1)
      throw std::invalid_argument("mva: station " + s.name + " needs at least one server");
    if (s.kind == StationKind::Cycle && !s.residence)
      throw std::invalid_argument("mva: cycle station " + s.name + " needs a residence function");
  }
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
  for (size_t i = 0; i < k; ++i)
    if (stations[i].kind == StationKind::Multi) {
      p[i].assign(static_cast<size_t>(stations[i].servers), 0.0);
      p[i][0] = 1.0;
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
          double extra = 0;
          for (int j = 0; j <= m - 2; ++j) extra += (m - 1 - j) * p[i][static_cast<size_t>(j)];
          r[i] = s.demand_s / m * (1.0 + q[i] + extra);
          break;
        }
        case StationKind::Cycle:
          r[i] = 0;  // below, once X is known
          break;
      }
      total += r[i];
    }
    double x = total > 0 ? n / total : 0.0;
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
        // Update marginals from the highest j down so p(j-1|n-1) is still old.
        auto& pi = p[i];
        for (int j = m - 1; j >= 1; --j)
          pi[static_cast<size_t>(j)] = x * s.demand_s / j * pi[static_cast<size_t>(j - 1)];
        double acc = x * s.demand_s;
        for (int j = 1; j <= m - 1; ++j) acc += (m - j) * pi[static_cast<size_t>(j)];
        pi[0] = std::max(0.0, 1.0 - acc / m);
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

}  // namespace tierlab::models
