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
