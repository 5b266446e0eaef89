// The tier shaper: when would a storage tier start and complete an I/O?
//
// One Shaper holds the state of one tier being driven: token buckets for the
// IOPS caps (per op and combined) and the throughput cap, EBS-style I/O
// counting with sequential merge, the gp2-style burst bucket, the device's
// parallel slots, and a seeded latency model. Both the discrete-event
// simulator (iosim/sim.h) and the io_uring engine use it, so a simulated run
// and an emulated run on a real device follow the same rules.
//
//   Shaper shaper(tier, seed);
//   Schedule s = shaper.schedule(req, now);   // at submission
//   // simulator: the I/O completes at s.complete
//   // engine:    hold the real completion until s.complete
//
// schedule() is O(log parallelism), never allocates, and is deterministic:
// the same tier, seed and sequence of (request, now) give the same
// schedules. Calls must come in submission order with `now` non-decreasing
// (a smaller `now` is treated as the previous one). Slots are reserved until
// the scheduled completion; I/Os start in submission order (FIFO).
// A Shaper is not thread-safe: one per submitting thread (or ring), or a lock.
//
// For an emulated run: if the real device completes an I/O after
// s.complete, the device is slower than the tier; the shaper does not
// correct for that (its slot was already released at s.complete), so the
// caller should count such completions and say so.
#pragma once

#include "tiers/tiers.h"
#include "trace/record.h"

#include <cstdint>
#include <vector>

namespace tierlab::iosim {

using trace::IoOp;

// One I/O as the shaper and the pattern generator see it.
struct IoRequest {
  IoOp op = IoOp::Read;
  uint64_t offset = 0;  // bytes
  uint32_t length = 0;  // bytes
};

// Small, fast, seedable generator (xoshiro256**, seeded by splitmix64).
// Identical sequences for identical seeds on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 1) { reseed(seed); }
  void reseed(uint64_t seed) {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1): never exactly 0 or 1.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-64 * n).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Inverse of the standard normal CDF for p in (0, 1), relative error < 1.2e-9.
double inverse_normal_cdf(double p);

// What the tier does with one I/O.
struct Schedule {
  Nanos start = 0;      // the tier starts serving it
  Nanos complete = 0;   // the tier completes it (start + service time)
  Nanos throttled = 0;  // of start - now: time waiting for bucket tokens
  uint32_t counted = 0; // I/Os the tier counted against its caps (0: merged)
};

struct ShaperStats {
  uint64_t ios = 0;           // schedule() calls
  uint64_t counted_ios = 0;   // I/Os counted against the caps
  uint64_t merged_ios = 0;    // I/Os merged into the previous one (counted 0)
  uint64_t throttled_ios = 0; // I/Os that waited for tokens
  Nanos throttle_wait_ns = 0; // sum over I/Os of the wait for tokens
  Nanos throttled_ns = 0;     // time during which some I/O waited for tokens
  Nanos slot_wait_ns = 0;     // sum over I/Os of the wait for a free slot
};

class Shaper {
 public:
  // Copies what it needs from `tier`; throws InputError if validate() fails.
  Shaper(const tiers::Tier& tier, uint64_t seed);

  // Admits the I/O submitted at `now`: counts it, takes its tokens, reserves
  // a slot and draws its service time.
  Schedule schedule(const IoRequest& req, Nanos now);

  // The pieces schedule() is made of, for callers that need only one:
  // How many I/Os the tier counts for `req` (updates the merge state).
  uint32_t count(const IoRequest& req);
  // A service time drawn from the op's latency distribution.
  Nanos service_time(IoOp op);

  const ShaperStats& stats() const { return stats_; }
  const tiers::Tier& tier() const { return tier_; }

 private:
  // A token bucket in GCRA form: `tat` is when the bucket would be full
  // again; a request may go at t >= tat - tau and then pushes tat by
  // cost * interval. Starts full.
  struct Bucket {
    bool on = false;
    double interval = 0;  // ns per unit
    double tau = 0;       // ns of banked tokens
    double tat = -1e300;
    void init(double rate_per_sec, double tau_ns);
    double ready() const { return tat - tau; }
    void take(double t, double cost) { tat = (tat > t ? tat : t) + cost * interval; }
  };
  // A service-time distribution, sampled by inverse transform: a table of
  // its quantile function at i / kQuantiles, interpolated linearly, with
  // the two outer segments computed exactly so the tails stay exact.
  static constexpr int kQuantiles = 4096;
  struct Dist {
    tiers::LatencyDist kind = tiers::LatencyDist::Fixed;
    double p50 = 0;
    double sigma = 0;  // lognormal
    double mean = 0;   // exponential
    std::vector<float> table;  // kQuantiles + 1 entries unless Fixed
    double quantile(double u) const;  // exact
  };

  static int op_slot(IoOp op);

  tiers::Tier tier_;
  Rng rng_;
  Bucket read_iops_, write_iops_, total_iops_, bytes_, burst_credits_, burst_peak_;
  Dist dist_[3];  // read, write, flush
  uint64_t last_end_[2] = {~0ull, ~0ull};  // per op, for sequential merge
  uint64_t merge_fill_[2] = {0, 0};
  Nanos merge_start_[2] = {0, 0};  // when the I/O merged into was admitted
  std::vector<Nanos> slots_;  // min-heap of slot free times, size = parallelism
  Nanos last_now_ = INT64_MIN;
  Nanos throttled_until_ = INT64_MIN;
  ShaperStats stats_;
};

// --- fast paths, inline -------------------------------------------------------

inline int Shaper::op_slot(IoOp op) {
  return op == IoOp::Read ? 0 : op == IoOp::Flush ? 2 : 1;  // Discard counts as a write
}

inline uint32_t Shaper::count(const IoRequest& req) {
  if (req.op == IoOp::Flush) return tier_.count_flushes ? 1 : 0;
  if (req.op == IoOp::Discard) return 1;
  const uint64_t unit = tier_.io_unit_bytes;
  if (unit == 0) return 1;
  const int i = op_slot(req.op);
  const uint64_t len = req.length;
  const uint64_t end = req.offset + len;
  if (tier_.merge_sequential && req.offset == last_end_[i] && merge_fill_[i] + len <= unit) {
    merge_fill_[i] += len;
    last_end_[i] = end;
    return 0;
  }
  const uint64_t n = len == 0 ? 1 : (len + unit - 1) / unit;
  merge_fill_[i] = len - (n - 1) * unit;
  last_end_[i] = end;
  return static_cast<uint32_t>(n);
}

inline Nanos Shaper::service_time(IoOp op) {
  const Dist& d = dist_[op_slot(op)];
  if (d.kind == tiers::LatencyDist::Fixed) return static_cast<Nanos>(d.p50);
  const double u = rng_.uniform();
  const double x = u * kQuantiles;
  const int i = static_cast<int>(x);
  if (i == 0 || i >= kQuantiles - 1) return static_cast<Nanos>(d.quantile(u));
  const double lo = d.table[i], hi = d.table[i + 1];
  return static_cast<Nanos>(lo + (hi - lo) * (x - i));
}

}  // namespace tierlab::iosim
