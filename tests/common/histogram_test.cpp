#include "common/histogram.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

using tierlab::Histogram;

TEST_CASE("histogram quantiles stay within the bucket error", "[histogram]") {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> exp(1.0 / 250000.0);  // mean 250 us
  std::vector<int64_t> values;
  Histogram h;
  for (int i = 0; i < 200000; ++i) {
    auto v = static_cast<int64_t>(exp(rng));
    values.push_back(v);
    h.record(v);
  }
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    auto exact = values[static_cast<size_t>(q * values.size()) - 1];
    auto got = h.quantile(q);
    CHECK(std::abs(got - exact) <= exact / 30 + 1);
  }
  CHECK(h.max() == values.back());
  CHECK(h.min() == values.front());
  CHECK(h.count() == values.size());
}

TEST_CASE("histogram small values are exact and merge adds counts", "[histogram]") {
  Histogram a, b;
  for (int i = 0; i < 10; ++i) a.record(i);
  for (int i = 10; i < 20; ++i) b.record(i);
  a.merge(b);
  CHECK(a.count() == 20);
  CHECK(a.quantile(0.5) == 9);
  CHECK(a.mean() == Approx(9.5));
  CHECK(a.max() == 19);
  Histogram empty;
  CHECK(empty.quantile(0.99) == 0);
  CHECK(empty.mean() == 0);
}

TEST_CASE("histogram buckets carry it whole: rebuilt and merged shards equal the pooled histogram",
          "[histogram][merge]") {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> lat(12.0, 1.5);  // ~160 us, a long tail
  Histogram pooled;
  std::vector<Histogram> shards(4);
  for (int i = 0; i < 100000; ++i) {
    auto v = static_cast<int64_t>(lat(rng));
    pooled.record(v);
    shards[static_cast<size_t>(rng() % 4)].record(v);
  }
  Histogram merged;
  for (const Histogram& s : shards) {
    // Through its sparse buckets and moments, as a report file holds it.
    auto copy = Histogram::from_buckets(s.buckets(), s.sum(), s.sum_squares(), s.min(), s.max());
    REQUIRE(copy);
    CHECK(*copy == s);
    merged.merge(*copy);
  }
  CHECK(merged.count() == pooled.count());
  CHECK(merged.buckets() == pooled.buckets());
  CHECK(merged.min() == pooled.min());
  CHECK(merged.max() == pooled.max());
  for (double q : {0.5, 0.9, 0.99, 0.999}) CHECK(merged.quantile(q) == pooled.quantile(q));
  CHECK(merged.mean() == Approx(pooled.mean()).epsilon(1e-12));
  CHECK(merged.stddev() == Approx(pooled.stddev()).epsilon(1e-9));
  // Sparse: about a quarter of the 3776 buckets for values over six decades.
  CHECK(pooled.buckets().size() < 1200);
}

TEST_CASE("histogram from_buckets refuses what no histogram holds", "[histogram][merge]") {
  CHECK_FALSE(Histogram::from_buckets({{Histogram::kBuckets, 1}}, 1, 1, 1, 1));
  CHECK_FALSE(Histogram::from_buckets({{-1, 1}}, 1, 1, 1, 1));
  CHECK_FALSE(Histogram::from_buckets({{5, 1}}, 5, 25, 6, 5));  // min above max
  CHECK_FALSE(Histogram::from_buckets({}, 0, 0, 3, 3));         // empty with a min
  auto empty = Histogram::from_buckets({}, 0, 0, 0, 0);
  REQUIRE(empty);
  CHECK(*empty == Histogram{});
  // bucket_of and bucket_lower agree: each value lies in its bucket.
  for (int64_t v : {0LL, 1LL, 63LL, 64LL, 65LL, 1000LL, 123456789LL, (1LL << 62) + 5}) {
    const int i = Histogram::bucket_of(v);
    CHECK(Histogram::bucket_lower(i) <= static_cast<uint64_t>(v));
    CHECK(static_cast<uint64_t>(v) < Histogram::bucket_lower(i + 1));
  }
}
