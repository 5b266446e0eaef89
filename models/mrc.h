// Miss-ratio curves from page reference streams (private to models/).
//
// A reference is a 64-bit page key (file or device, and the 8 KiB page in
// it). StackDistances computes Mattson LRU stack distances exactly: the
// distance of a reference is the number of distinct other pages touched since
// the previous reference to the same page, so an LRU cache of C pages hits it
// iff distance < C. One Fenwick tree over reference times, with a hash map
// from page to the time of its last reference, gives O(log n) per reference:
// a page's distance is the number of "last references" after its own.
//
// With sampling (SHARDS, Waldspurger et al., FAST '15) only pages whose hash
// falls under a threshold T of modulus P are tracked, a rate R = T/P; each
// sampled distance is scaled by 1/R and each sampled reference stands for 1/R
// references. The fixed-size variant bounds the tracked pages to `max_pages`:
// when the set overflows, the page with the largest hash is evicted and T
// drops to that hash, and the counts gathered so far are rescaled by
// R_new/R_old. The "adj" correction of the paper puts the difference between
// the expected (n*R) and the actual number of sampled references into the
// distance-0 bucket, which removes most of the sampling bias for small caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tierlab::models {

// A miss-ratio curve: miss ratio of an LRU cache as a function of its size in
// pages, kept as a histogram of stack distances in buckets of `bucket_pages`.
class MissRatioCurve {
 public:
  MissRatioCurve() = default;
  MissRatioCurve(uint64_t bucket_pages, std::vector<double> bucket_counts, double cold,
                 double total)
      : bucket_pages_(bucket_pages), counts_(std::move(bucket_counts)), cold_(cold), total_(total) {}

  // Miss ratio of an LRU cache of `pages` pages, in [0, 1]. 1 for an empty
  // curve. Between bucket edges the curve is interpolated linearly.
  double miss_ratio(double pages) const;

  double references() const { return total_; }
  double cold_misses() const { return cold_; }
  uint64_t bucket_pages() const { return bucket_pages_; }
  const std::vector<double>& buckets() const { return counts_; }
  // Pages past which the curve is flat (largest finite distance seen).
  uint64_t max_distance_pages() const { return bucket_pages_ * counts_.size(); }
  bool empty() const { return total_ <= 0; }

 private:
  uint64_t bucket_pages_ = 1;
  std::vector<double> counts_;  // counts_[i]: distances in [i*b, (i+1)*b)
  double cold_ = 0;             // first references (infinite distance)
  double total_ = 0;
};

struct StackOptions {
  // Sampling rate in (0, 1]; 1 = exact (every page tracked).
  double rate = 1.0;
  // Fixed-size SHARDS: at most this many tracked pages (0 = unbounded).
  // The rate then starts at `rate` and drops as needed.
  size_t max_pages = 0;
  // Histogram bucket width in pages.
  uint64_t bucket_pages = 1;
};

class StackDistances {
 public:
  explicit StackDistances(StackOptions opts = {});

  // Records one reference to `page`.
  void reference(uint64_t page);

  // The curve of everything referenced so far.
  MissRatioCurve curve() const;

  uint64_t references() const { return refs_; }
  uint64_t sampled() const { return sampled_; }
  double rate() const;
  size_t tracked_pages() const { return last_.size(); }

  // The hash used for spatial sampling (exposed for tests).
  static uint64_t hash(uint64_t page);

 private:
  static constexpr uint64_t kModulus = uint64_t{1} << 24;

  void fenwick_add(size_t i, int delta);
  uint64_t fenwick_prefix(size_t i) const;  // sum of [0, i]
  void compact();
  void add_distance(double scaled, double weight);
  void evict_largest();

  StackOptions opts_;
  uint64_t threshold_;  // sample iff hash(page) % kModulus < threshold_
  std::vector<int32_t> tree_;            // Fenwick tree, 1-based inside
  std::vector<uint64_t> time_page_;      // page whose last reference is at time t
  std::unordered_map<uint64_t, uint64_t> last_;  // page -> time of last reference
  std::priority_queue<std::pair<uint64_t, uint64_t>> by_hash_;  // (hash, page), fixed-size
  uint64_t now_ = 0;
  uint64_t live_ = 0;
  uint64_t refs_ = 0;
  uint64_t sampled_ = 0;
  std::vector<double> counts_;
  double cold_ = 0;
};

}  // namespace tierlab::models
