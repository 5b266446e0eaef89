#include "iosim/shaper.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace tierlab::iosim {
namespace {

constexpr double kZ99 = 2.3263478740408408;  // standard normal 99th percentile

// Restores the min-heap property after the root grew. Bottom-up: the hole
// walks to a leaf along the smaller children (branch-free), then the value
// sifts up; a new completion usually belongs near the bottom.
void sift_down(Nanos* h, size_t n) {
  const Nanos v = h[0];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c + 1 < n) {
      c += h[c + 1] < h[c];
    } else if (c >= n) {
      break;
    }
    h[i] = h[c];
    i = c;
  }
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h[p] <= v) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = v;
}

}  // namespace

// Acklam's rational approximation of the normal quantile.
double inverse_normal_cdf(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00, 2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double lo = 0.02425, hi = 1 - lo;
  if (p < lo) {
    double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > hi) {
    double q = std::sqrt(-2 * std::log1p(-p));
    return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

void Shaper::Bucket::init(double rate_per_sec, double tau_ns) {
  on = rate_per_sec > 0;
  if (!on) return;
  interval = 1e9 / rate_per_sec;
  tau = tau_ns;
  tat = -1e300;
}

Shaper::Shaper(const tiers::Tier& tier, uint64_t seed) : tier_(tier), rng_(seed) {
  tiers::validate(tier_, "tier " + tier_.name);
  double tau = static_cast<double>(tier_.bucket_ns);
  read_iops_.init(tier_.read_iops, tau);
  write_iops_.init(tier_.write_iops, tau);
  total_iops_.init(tier_.total_iops, tau);
  bytes_.init(tier_.bytes_per_sec, tau);
  if (tier_.burst.enabled()) {
    // The credit bucket holds `credits` I/Os and refills at the baseline;
    // the peak bucket keeps bursts at burst_iops.
    burst_credits_.init(tier_.burst.refill_iops, tier_.burst.credits / tier_.burst.refill_iops * 1e9);
    burst_peak_.init(tier_.burst.burst_iops, tau);
  }
  const tiers::Latency* lat[3] = {&tier_.read, &tier_.write, &tier_.flush};
  for (int i = 0; i < 3; ++i) {
    Dist& d = dist_[i];
    d.kind = lat[i]->dist;
    d.p50 = static_cast<double>(lat[i]->p50_ns);
    if (d.kind == tiers::LatencyDist::Lognormal)
      d.sigma = std::log(static_cast<double>(lat[i]->p99_ns) / d.p50) / kZ99;
    d.mean = d.p50 / std::log(2.0);
    if (d.kind != tiers::LatencyDist::Fixed) {
      d.table.resize(kQuantiles + 1);
      d.table[0] = 0;
      for (int q = 1; q < kQuantiles; ++q)
        d.table[q] = static_cast<float>(d.quantile(static_cast<double>(q) / kQuantiles));
      d.table[kQuantiles] = d.table[kQuantiles - 1];  // never read: top segment is exact
    }
  }
  if (tier_.parallelism > 0) slots_.assign(tier_.parallelism, INT64_MIN);
}

double Shaper::Dist::quantile(double u) const {
  switch (kind) {
    case tiers::LatencyDist::Fixed: return p50;
    case tiers::LatencyDist::Lognormal: return p50 * std::exp(sigma * inverse_normal_cdf(u));
    case tiers::LatencyDist::Exponential: return -mean * std::log1p(-u);
  }
  return p50;
}

Schedule Shaper::schedule(const IoRequest& req, Nanos now) {
  if (now < last_now_) now = last_now_;
  last_now_ = now;
  ++stats_.ios;

  const uint32_t n = count(req);
  if (n == 0 && req.op != IoOp::Flush) ++stats_.merged_ios;
  stats_.counted_ios += n;
  const double cost = n;
  const double bytes = (req.op == IoOp::Read || req.op == IoOp::Write) ? req.length : 0;
  // A counted flush draws on the write bucket (tiers with count_flushes).
  Bucket* op_bucket = req.op == IoOp::Read ? &read_iops_ : &write_iops_;

  // Earliest time every bucket that this I/O draws on has a token.
  double ready = static_cast<double>(now);
  if (n > 0) {
    if (op_bucket && op_bucket->on) ready = std::max(ready, op_bucket->ready());
    if (total_iops_.on) ready = std::max(ready, total_iops_.ready());
    if (burst_credits_.on) {
      ready = std::max(ready, burst_credits_.ready());
      ready = std::max(ready, burst_peak_.ready());
    }
  }
  if (bytes > 0 && bytes_.on) ready = std::max(ready, bytes_.ready());
  // A merged I/O rides with the one it was merged into: never before it.
  const int oi = op_slot(req.op);
  if (n == 0 && oi < 2) ready = std::max(ready, static_cast<double>(merge_start_[oi]));
  Nanos tok = static_cast<Nanos>(ready);  // ceil, without a libm call
  if (static_cast<double>(tok) < ready) ++tok;
  if (tok < now) tok = now;
  const double t = static_cast<double>(tok);
  if (n > 0) {
    if (op_bucket && op_bucket->on) op_bucket->take(t, cost);
    if (total_iops_.on) total_iops_.take(t, cost);
    if (burst_credits_.on) {
      burst_credits_.take(t, cost);
      burst_peak_.take(t, cost);
    }
  }
  if (bytes > 0 && bytes_.on) bytes_.take(t, bytes);
  if (n > 0 && oi < 2) merge_start_[oi] = tok;

  Schedule s;
  s.counted = n;
  s.throttled = tok - now;
  if (s.throttled > 0) {
    ++stats_.throttled_ios;
    stats_.throttle_wait_ns += s.throttled;
    // Union of the intervals [now, tok): `now` never decreases.
    Nanos from = std::max(now, throttled_until_);
    if (tok > from) stats_.throttled_ns += tok - from;
    throttled_until_ = std::max(throttled_until_, tok);
  }

  s.start = tok;
  if (!slots_.empty() && slots_[0] > s.start) {
    stats_.slot_wait_ns += slots_[0] - s.start;
    s.start = slots_[0];
  }
  s.complete = s.start + service_time(req.op);
  if (!slots_.empty()) {
    // Invariant: slots_ is a min-heap; its root is the slot that frees first,
    // and it is the one this I/O takes.
    slots_[0] = s.complete;
    sift_down(slots_.data(), slots_.size());
  }
  return s;
}

}  // namespace tierlab::iosim
