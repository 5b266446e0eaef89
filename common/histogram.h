// Latency histogram with fixed log-linear buckets (HdrHistogram-like): values
// are non-negative int64 (nanoseconds by convention), kept with a relative
// error under 1/kSubBuckets (about 1.6%). Recording is O(1) and never
// allocates; histograms merge by adding counts, so per-thread histograms are
// merged at the end of a run. The layout is fixed (kSubBits, kBuckets), so
// histograms of separate runs (the shards of one replay) merge without
// loss: buckets() and from_buckets() carry one through a file.
#pragma once

#include <array>
#include <cstdint>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace tierlab {

class Histogram {
 public:
  static constexpr int kSubBits = 6;
  static constexpr int kSubBuckets = 1 << kSubBits;  // per power of two
  static constexpr int kBuckets = (64 - kSubBits + 1) * kSubBuckets;

  void record(int64_t v) {
    if (v < 0) v = 0;
    ++counts_[index(static_cast<uint64_t>(v))];
    ++n_;
    sum_ += static_cast<double>(v);
    sumsq_ += static_cast<double>(v) * static_cast<double>(v);
    if (v > max_) max_ = v;
    if (v < min_) min_ = v;
  }

  void merge(const Histogram& o) {
    for (int i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
    n_ += o.n_;
    sum_ += o.sum_;
    sumsq_ += o.sumsq_;
    if (o.max_ > max_) max_ = o.max_;
    if (o.min_ < min_) min_ = o.min_;
  }

  void reset() { *this = Histogram{}; }

  // The bucket of `v` (values below 0 count as 0), and the smallest value
  // of bucket `i` (0 <= i <= kBuckets; kBuckets gives the end of the last).
  static int bucket_of(int64_t v) { return index(v < 0 ? 0 : static_cast<uint64_t>(v)); }
  static uint64_t bucket_lower(int i) { return lower_bound(i); }

  // The non-empty buckets, (index, count) by index: with count(), sum(),
  // sum_squares(), min() and max(), everything a histogram holds.
  std::vector<std::pair<int, uint64_t>> buckets() const {
    std::vector<std::pair<int, uint64_t>> v;
    for (int i = 0; i < kBuckets; ++i)
      if (counts_[i]) v.emplace_back(i, counts_[i]);
    return v;
  }
  double sum_squares() const { return sumsq_; }

  // The histogram buckets() and the moments describe; nullopt when they do
  // not describe one (an index out of range, min above max, no buckets
  // with a non-zero min or max).
  static std::optional<Histogram> from_buckets(const std::vector<std::pair<int, uint64_t>>& buckets, double sum,
                                               double sum_squares, int64_t min, int64_t max) {
    Histogram h;
    for (const auto& [i, n] : buckets) {
      if (i < 0 || i >= kBuckets) return std::nullopt;
      h.counts_[i] += n;
      h.n_ += n;
    }
    if (h.n_ == 0) return (min == 0 && max == 0) ? std::optional<Histogram>(h) : std::nullopt;
    if (min < 0 || min > max) return std::nullopt;
    h.sum_ = sum;
    h.sumsq_ = sum_squares;
    h.min_ = min;
    h.max_ = max;
    return h;
  }

  bool operator==(const Histogram& o) const {
    return counts_ == o.counts_ && n_ == o.n_ && sum_ == o.sum_ && sumsq_ == o.sumsq_ && min() == o.min() &&
           max() == o.max();
  }

  uint64_t count() const { return n_; }
  int64_t max() const { return n_ ? max_ : 0; }
  int64_t min() const { return n_ ? min_ : 0; }
  double mean() const { return n_ ? sum_ / static_cast<double>(n_) : 0.0; }
  double sum() const { return sum_; }
  double stddev() const {
    if (n_ < 2) return 0.0;
    double m = mean();
    double var = sumsq_ / static_cast<double>(n_) - m * m;
    return var > 0 ? std::sqrt(var) : 0.0;
  }

  // Value at quantile q in [0, 1] (0.99 = p99): the midpoint of the bucket
  // holding the q-th value, clamped to [min, max].
  int64_t quantile(double q) const {
    if (n_ == 0) return 0;
    if (q <= 0) return min();
    if (q >= 1) return max();
    uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n_)));
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) {
        uint64_t lo = lower_bound(i), hi = lower_bound(i + 1);
        int64_t mid = static_cast<int64_t>(lo + (hi - lo) / 2);
        if (mid > max_) mid = max_;
        if (mid < min_) mid = min_;
        return mid;
      }
    }
    return max();
  }

 private:
  static int index(uint64_t v) {
    if (v < static_cast<uint64_t>(kSubBuckets)) return static_cast<int>(v);
    int msb = 63 - __builtin_clzll(v);  // >= kSubBits
    int shift = msb - kSubBits;
    int sub = static_cast<int>((v >> shift) & (kSubBuckets - 1));
    return (shift + 1) * kSubBuckets + sub;
  }
  static uint64_t lower_bound(int i) {
    if (i < kSubBuckets) return static_cast<uint64_t>(i);
    int shift = i / kSubBuckets - 1;
    uint64_t sub = static_cast<uint64_t>(i % kSubBuckets) | kSubBuckets;
    return sub << shift;
  }

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t n_ = 0;
  double sum_ = 0, sumsq_ = 0;
  int64_t max_ = 0;
  int64_t min_ = std::numeric_limits<int64_t>::max();
};

}  // namespace tierlab
