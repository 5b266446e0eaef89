// Miss-ratio curves against an exact LRU cache simulation on synthetic page
// reference streams: exact stack distances must match it exactly, SHARDS
// sampling (fixed rate and fixed size) within a mean absolute error of 0.01
// over a grid of cache sizes.
#include "models/mrc.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <list>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using namespace tierlab::models;

namespace {

// Miss ratio of a true LRU cache of `size` pages over `refs`.
double lru_miss_ratio(const std::vector<uint64_t>& refs, size_t size) {
  std::list<uint64_t> order;  // front = most recent
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  where.reserve(size * 2);
  uint64_t misses = 0;
  for (uint64_t p : refs) {
    auto it = where.find(p);
    if (it != where.end()) {
      order.splice(order.begin(), order, it->second);
      continue;
    }
    ++misses;
    order.push_front(p);
    where[p] = order.begin();
    if (order.size() > size) {
      where.erase(order.back());
      order.pop_back();
    }
  }
  return static_cast<double>(misses) / static_cast<double>(refs.size());
}

struct Zipf {
  Zipf(size_t n, double s) : cdf(n) {
    double acc = 0;
    for (size_t i = 0; i < n; ++i) cdf[i] = (acc += 1.0 / std::pow(static_cast<double>(i + 1), s));
    for (auto& c : cdf) c /= acc;
  }
  template <class R> uint64_t operator()(R& rng) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  }
  std::vector<double> cdf;
};

std::vector<uint64_t> make_trace(const std::string& kind, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> refs;
  refs.reserve(n);
  const uint64_t pages = 40000;
  Zipf zipf(pages, 0.9);
  uint64_t scan_pos = 0;
  for (size_t i = 0; i < n; ++i) {
    if (kind == "uniform") {
      refs.push_back(rng() % pages);
    } else if (kind == "zipf") {
      // Scatter ranks over the key space so hot pages are not adjacent.
      refs.push_back(zipf(rng) * 7919 % 1000003);
    } else if (kind == "scan") {
      refs.push_back(scan_pos++ % 20000);
    } else {  // mixture: zipf point reads, a repeated scan, and cold uniform pages
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      if (u < 0.6) refs.push_back(zipf(rng) * 7919 % 1000003);
      else if (u < 0.85) refs.push_back(2000000 + scan_pos++ % 15000);
      else refs.push_back(3000000 + rng() % 100000);
    }
  }
  return refs;
}

std::vector<size_t> grid(size_t max_pages, int points) {
  std::vector<size_t> g;
  for (int i = 1; i <= points; ++i) g.push_back(max_pages * static_cast<size_t>(i) / points);
  return g;
}

}  // namespace

TEST_CASE("mrc: exact stack distances equal an LRU simulation", "[mrc]") {
  for (std::string kind : {"uniform", "zipf", "scan", "mixture"}) {
    auto refs = make_trace(kind, 200000, 1);
    StackDistances sd;
    for (auto p : refs) sd.reference(p);
    auto c = sd.curve();
    CHECK(c.references() == Approx(200000));
    for (size_t size : {1ul, 10ul, 100ul, 1000ul, 5000ul, 19999ul, 20000ul, 30000ul, 60000ul}) {
      INFO(kind << " size " << size);
      CHECK(c.miss_ratio(static_cast<double>(size)) ==
            Approx(lru_miss_ratio(refs, size)).margin(1e-12));
    }
  }
}

TEST_CASE("mrc: a cyclic scan misses until the cache holds it", "[mrc]") {
  StackDistances sd;
  for (int round = 0; round < 5; ++round)
    for (uint64_t p = 0; p < 1000; ++p) sd.reference(p);
  auto c = sd.curve();
  CHECK(c.miss_ratio(999) == 1.0);
  CHECK(c.miss_ratio(1000) == Approx(0.2));  // only the first pass misses
  CHECK(c.cold_misses() == 1000);
}

TEST_CASE("mrc: SHARDS sampling stays within 0.01 mean absolute error", "[mrc]") {
  for (std::string kind : {"uniform", "zipf", "scan", "mixture"}) {
    auto refs = make_trace(kind, 600000, 2);
    StackDistances fixed_rate({.rate = 0.2, .max_pages = 0, .bucket_pages = 16});
    StackDistances fixed_size({.rate = 1.0, .max_pages = 8192, .bucket_pages = 16});
    for (auto p : refs) {
      fixed_rate.reference(p);
      fixed_size.reference(p);
    }
    CHECK(fixed_size.tracked_pages() <= 8192);
    auto cr = fixed_rate.curve();
    auto cs = fixed_size.curve();
    double err_rate = 0, err_size = 0;
    auto g = grid(60000, 25);
    for (size_t size : g) {
      double exact = lru_miss_ratio(refs, size);
      err_rate += std::abs(cr.miss_ratio(static_cast<double>(size)) - exact);
      err_size += std::abs(cs.miss_ratio(static_cast<double>(size)) - exact);
    }
    err_rate /= static_cast<double>(g.size());
    err_size /= static_cast<double>(g.size());
    INFO(kind << ": MAE fixed-rate " << err_rate << " fixed-size " << err_size
              << " (final rate " << fixed_size.rate() << ")");
    CHECK(err_rate < 0.01);
    CHECK(err_size < 0.01);
  }
}

TEST_CASE("mrc: an empty curve misses everything", "[mrc]") {
  StackDistances sd;
  CHECK(sd.curve().miss_ratio(100) == 1.0);
  CHECK(sd.curve().empty());
}
