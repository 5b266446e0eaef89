#include "models/group_commit.h"

#include <algorithm>
#include <cmath>
#include <limits>


namespace tierlab::models {

double group_commit_batch(double x, double f, int n) {
  if (!(x > 0) || !(f > 0)) return 1.0;
  double xf = x * f;
  double b = std::isfinite(xf) ? xf + std::exp(-xf) : std::numeric_limits<double>::infinity();
  return std::clamp(b, 1.0, std::max(1.0, static_cast<double>(n)));
}

double FlushCycle::cycle_s(double x) const {
  const double d = device_s;
  double pace = 0;
  for (const auto& p : paces) {
    if (p.tokens <= 0) continue;
    double rest = server_writes_at(p.fixed_per_s, p.fixed_per_tx, x) + std::max(0.0, x) * p.per_tx;
    double left = p.limit - rest;
    if (left <= 0) {
      // The rest alone asks for more than the cap: everything is throttled
      // in proportion to what it asks, the cycles one cycle per device time.
      if (!(d > 0)) return std::numeric_limits<double>::infinity();
      double want = p.tokens / d;
      left = p.limit * want / (want + rest);
    }
    pace = std::max(pace, p.tokens / left);
  }
  const double c = share * x;  // commits per second
  if (pace <= d || !(c > 0)) return d;
  // F = e^{-xF} d + (1 - e^{-xF}) pace. g(F) = rhs - F is >= 0 at F = d and
  // <= 0 at F = pace. Invariant: g(lo) >= 0 >= g(hi).
  auto g = [&](double f) {
    double e = std::exp(-c * f);
    return e * d + (1 - e) * pace - f;
  };
  double lo = d, hi = pace;
  for (int i = 0; i < 100 && hi - lo > hi * 1e-12; ++i) {
    double mid = (lo + hi) / 2;
    (g(mid) >= 0 ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

double FlushCycle::busy(double x, int n) const {
  double f = cycle_s(x);
  if (!std::isfinite(f)) return 1.0;
  double c = share * x;
  return std::min(1.0, c / group_commit_batch(c, f, n) * f);
}

double FlushCycle::residence_s(double x, int n) const {
  double f = cycle_s(x);
  if (!std::isfinite(f)) return f;
  double rho = n > 1 ? busy(x, n) * (n - 1) / n : 0.0;
  return share * f * (1 + rho / 2);
}

namespace {

double device_time(const FlushCycle& c, double lw, double lf) {
  return (c.flushes > 0 ? c.writes / c.flushes : 0) * lw + lf;
}

}  // namespace

void set_device(FlushCycle& c, double lw, double lf) {
  double d = device_time(c, lw, lf);
  c.device_s = c.captured_device_s > 0 ? c.captured_s * d / c.captured_device_s : c.captured_s;
}

FlushCycle calibrate_flush_cycle(double flushes_per_tx, double writes_per_tx, double x_c, int n_c,
                                 double lw, double lf, double share) {
  FlushCycle c;
  c.share = std::clamp(share, 1e-9, 1.0);
  x_c *= c.share;  // commits per second
  double want = flushes_per_tx > 0 ? c.share / flushes_per_tx : 1;  // measured commits per flush
  if (want <= 1) {
    // Never shared: the flushes beyond one per commit are ones the commits
    // do not wait for.
    // Each commit still waits for a whole cycle: its writes and flush on
    // the captured device.
    c.flushes = std::max(1.0, flushes_per_tx / c.share);
    c.writes = writes_per_tx / c.share;
    c.captured_s = device_time(c, lw, lf);
  } else {
    c.flushes = 1;
    c.writes = writes_per_tx / flushes_per_tx;
    // b(x_c, F) grows with F; past n_c it cannot, so aim just below n_c.
    want = std::min(want, std::max(1.0, n_c * (1 - 1e-9)));
    double lo = 0, hi = 1e-6;
    while (group_commit_batch(x_c, hi, n_c) < want && hi < 1e6) hi *= 2;
    // Invariant: batch(lo) < want <= batch(hi).
    for (int i = 0; i < 200 && hi - lo > hi * 1e-12; ++i) {
      double mid = (lo + hi) / 2;
      (group_commit_batch(x_c, mid, n_c) < want ? lo : hi) = mid;
    }
    c.captured_s = hi;
  }
  c.captured_device_s = device_time(c, lw, lf);
  c.device_s = c.captured_s;
  return c;
}

}  // namespace tierlab::models
