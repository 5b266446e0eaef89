#include "models/mrc.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace tierlab::models {

double MissRatioCurve::miss_ratio(double pages) const {
  if (total_ <= 0) return 1.0;
  if (pages <= 0) return 1.0;
  double hits = 0;
  double b = static_cast<double>(bucket_pages_);
  for (size_t i = 0; i < counts_.size(); ++i) {
    double lo = static_cast<double>(i) * b;
    if (lo >= pages) break;
    double hi = lo + b;
    if (hi <= pages) {
      hits += counts_[i];
    } else {
      hits += counts_[i] * (pages - lo) / b;
      break;
    }
  }
  double m = 1.0 - hits / total_;
  return std::clamp(m, 0.0, 1.0);
}

uint64_t StackDistances::hash(uint64_t page) {
  // splitmix64 finaliser: a cheap, well-mixed 64-bit hash.
  uint64_t z = page + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

StackDistances::StackDistances(StackOptions opts) : opts_(opts) {
  if (!(opts_.rate > 0) || opts_.rate > 1) opts_.rate = 1.0;
  if (opts_.bucket_pages == 0) opts_.bucket_pages = 1;
  threshold_ = static_cast<uint64_t>(std::llround(opts_.rate * static_cast<double>(kModulus)));
  if (threshold_ == 0) threshold_ = 1;
  size_t cap = 1024;
  tree_.assign(cap + 1, 0);
  time_page_.assign(cap, 0);
}

double StackDistances::rate() const {
  return static_cast<double>(threshold_) / static_cast<double>(kModulus);
}

void StackDistances::fenwick_add(size_t i, int delta) {
  for (size_t k = i + 1; k < tree_.size(); k += k & (~k + 1)) tree_[k] += delta;
}

uint64_t StackDistances::fenwick_prefix(size_t i) const {
  int64_t s = 0;
  for (size_t k = i + 1; k > 0; k -= k & (~k + 1)) s += tree_[k];
  return static_cast<uint64_t>(s);
}

// Renumbers the live last-reference times 0..live-1 (keeping their order) and
// rebuilds the tree with room for at least as many new references again.
void StackDistances::compact() {
  std::vector<uint64_t> pages;
  pages.reserve(live_);
  for (uint64_t t = 0; t < now_; ++t) {
    uint64_t p = time_page_[t];
    auto it = last_.find(p);
    if (it != last_.end() && it->second == t) pages.push_back(p);
  }
  assert(pages.size() == live_);
  size_t cap = std::max<size_t>(1024, 2 * pages.size() + 1024);
  tree_.assign(cap + 1, 0);
  time_page_.assign(cap, 0);
  for (size_t t = 0; t < pages.size(); ++t) {
    time_page_[t] = pages[t];
    last_[pages[t]] = t;
    // Linear-time build: add then push to the parent.
    tree_[t + 1] += 1;
  }
  for (size_t k = 1; k < tree_.size(); ++k) {
    size_t parent = k + (k & (~k + 1));
    if (parent < tree_.size()) tree_[parent] += tree_[k];
  }
  now_ = pages.size();
}

void StackDistances::add_distance(double scaled, double weight) {
  auto idx = static_cast<size_t>(scaled / static_cast<double>(opts_.bucket_pages));
  if (idx >= counts_.size()) counts_.resize(std::max(idx + 1, counts_.size() * 2), 0.0);
  counts_[idx] += weight;
}

void StackDistances::evict_largest() {
  // The page with the largest hash leaves; the threshold drops to its hash so
  // that it (and every larger one) is no longer sampled.
  auto [h, page] = by_hash_.top();
  uint64_t new_threshold = h % kModulus;
  // Pop every tracked page at that hash value (collisions in the modulus).
  while (!by_hash_.empty() && by_hash_.top().first % kModulus >= new_threshold) {
    uint64_t p = by_hash_.top().second;
    by_hash_.pop();
    auto it = last_.find(p);
    if (it != last_.end()) {
      fenwick_add(it->second, -1);
      --live_;
      last_.erase(it);
    }
  }
  (void)page;
  if (new_threshold == 0) new_threshold = 1;
  double scale = static_cast<double>(new_threshold) / static_cast<double>(threshold_);
  for (auto& c : counts_) c *= scale;
  cold_ *= scale;
  threshold_ = new_threshold;
}

void StackDistances::reference(uint64_t page) {
  ++refs_;
  uint64_t h = hash(page);
  if (h % kModulus >= threshold_) return;
  ++sampled_;
  // Compact before touching any marker, so last_ and the tree agree.
  if (now_ == time_page_.size()) compact();
  double inv_rate = 1.0 / rate();
  auto it = last_.find(page);
  if (it == last_.end()) {
    cold_ += 1.0;
  } else {
    uint64_t t = it->second;
    uint64_t d = live_ - fenwick_prefix(t);  // live last-references after t
    add_distance(static_cast<double>(d) * inv_rate, 1.0);
    fenwick_add(t, -1);
    --live_;
  }
  // Invariant: now_ < capacity, and every live page has exactly one marker.
  assert(now_ < time_page_.size());
  time_page_[now_] = page;
  fenwick_add(now_, +1);
  ++live_;
  bool fresh = (it == last_.end());
  last_[page] = now_;
  ++now_;
  if (fresh && opts_.max_pages > 0) {
    by_hash_.push({h % kModulus, page});
    while (last_.size() > opts_.max_pages) evict_largest();
  }
}

MissRatioCurve StackDistances::curve() const {
  // Counts are in "sampled references at the current rate"; the adj
  // correction makes their total the expected number refs * R.
  double r = rate();
  std::vector<double> counts = counts_;
  double expected = static_cast<double>(refs_) * r;
  double actual = cold_;
  for (double c : counts) actual += c;
  if (counts.empty()) counts.push_back(0.0);
  if (r < 1.0) counts[0] += expected - actual;
  double inv = 1.0 / r;
  for (auto& c : counts) c *= inv;
  while (counts.size() > 1 && counts.back() == 0.0) counts.pop_back();
  return MissRatioCurve(opts_.bucket_pages, std::move(counts), cold_ * inv,
                        static_cast<double>(refs_));
}

}  // namespace tierlab::models
