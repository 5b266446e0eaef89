// The moments of a tier's latency distributions and the p99 estimate of a
// projection (a gamma distribution fitted to the response time's mean and
// variance).
#include "models/project_internal.h"

#include <cmath>

namespace tierlab::models {

namespace {

constexpr double kZ99 = 2.326347874;  // standard normal 99th percentile

double lognormal_sigma(const Latency& l) {
  if (l.p99_ns <= l.p50_ns || l.p50_ns <= 0) return 0;
  return std::log(static_cast<double>(l.p99_ns) / static_cast<double>(l.p50_ns)) / kZ99;
}

}  // namespace

double second_moment(const Latency& l) {
  double m = static_cast<double>(l.p50_ns) / 1e9;
  switch (l.dist) {
    case LatencyDist::Fixed:
      return m * m;
    case LatencyDist::Lognormal: {
      double s = lognormal_sigma(l);
      return m * m * std::exp(2 * s * s);
    }
    case LatencyDist::Exponential: {
      double mean = m / std::log(2.0);
      return 2 * mean * mean;
    }
  }
  return m * m;
}

namespace {

// Regularised lower incomplete gamma P(a, x) (series below a + 1, Lentz's
// continued fraction above; Numerical Recipes §6.2).
double gamma_p(double a, double x) {
  if (x <= 0) return 0;
  double lg = std::lgamma(a);
  if (x < a + 1) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::abs(term) < std::abs(sum) * 1e-14) break;
    }
    return sum * std::exp(-x + a * std::log(x) - lg);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::abs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    double del = d * c;
    h *= del;
    if (std::abs(del - 1) < 1e-14) break;
  }
  return 1 - std::exp(-x + a * std::log(x) - lg) * h;
}

}  // namespace

double gamma_p99(double mean, double var) {
  if (mean <= 0) return 0;
  if (var <= 0) return mean;
  double k = mean * mean / var;
  double theta = var / mean;
  double lo = 0, hi = mean;
  while (gamma_p(k, hi / theta) < 0.99) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > mean * 1e-9; ++i) {
    double mid = (lo + hi) / 2;
    (gamma_p(k, mid / theta) < 0.99 ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

double mean_latency_s(const Latency& l) {
  double m = static_cast<double>(l.p50_ns) / 1e9;
  switch (l.dist) {
    case LatencyDist::Fixed:
      return m;
    case LatencyDist::Lognormal: {
      double s = lognormal_sigma(l);
      return m * std::exp(s * s / 2);
    }
    case LatencyDist::Exponential:
      return m / std::log(2.0);
  }
  return m;
}

}  // namespace tierlab::models
