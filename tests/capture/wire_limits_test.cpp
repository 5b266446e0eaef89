// The protocol decoder's memory follows the bytes that arrived, not the
// lengths their headers claim.
#include "capture/wire.h"
#include "wire_builder.h"

#include "support/support.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <variant>
#include <vector>
#include <string>

namespace {

using namespace tierlab;

using test::peak_rss;

struct CountSink : capture::RecordSink {
  uint64_t n = 0;
  void record(const trace::Record&) override { ++n; }
};

}  // namespace

TEST_CASE("a Query header claiming 256 MiB costs no memory until its bytes arrive", "[wire]") {
  CountSink sink;
  capture::SessionDecoder dec(sink);
  capture::JoinInfo info;
  info.user = "u";
  info.database = "d";
  dec.join(1, info, 1);
  // Two complete messages let the joined stream find its boundary, then a
  // Query whose length field claims 256 MiB and 100 bytes of it.
  std::vector<uint8_t> in = {'S', 0, 0, 0, 4, 'S', 0, 0, 0, 4};
  const uint32_t len = (256u << 20) + 4;
  in.push_back('Q');
  for (int s = 24; s >= 0; s -= 8) in.push_back(static_cast<uint8_t>(len >> s));
  uint64_t before = peak_rss();
  REQUIRE(before > 0);
  REQUIRE(dec.feed(capture::Direction::Frontend, in.data(), in.size(), 2));
  std::vector<uint8_t> body(100, 'x');
  REQUIRE(dec.feed(capture::Direction::Frontend, body.data(), body.size(), 3));
  CHECK_FALSE(dec.at_boundary(capture::Direction::Frontend));
  CHECK(peak_rss() - before < (64u << 20));
}

namespace {

// Counts the Query records (and their sizes) and the stream gaps.
struct QuerySink : capture::RecordSink {
  std::vector<size_t> queries;
  uint64_t gaps = 0, gap_bytes = 0;
  void record(const trace::Record& r) override {
    if (const auto* q = std::get_if<trace::Query>(&r.body)) queries.push_back(q->sql.size());
    if (const auto* l = std::get_if<trace::Loss>(&r.body); l && l->what == trace::LossKind::StreamGap) {
      ++gaps;
      gap_bytes += l->count;
    }
  }
};

// A Query message of `n` bytes of SQL.
std::vector<uint8_t> big_query(size_t n) { return wiretest::query(std::string(n, 'x')); }

void feed(capture::SessionDecoder& dec, const std::vector<uint8_t>& b, size_t from, size_t to) {
  REQUIRE(dec.feed(capture::Direction::Frontend, b.data() + from, to - from, 5));
}

}  // namespace

TEST_CASE("the decoders' memory is capped across sessions: a message beyond it is a counted stream gap",
          "[wire]") {
  capture::BufferBudget budget(1u << 20);  // 1 MiB for every session together
  capture::WireLimits limits;
  limits.budget = &budget;
  QuerySink sa, sb;
  capture::SessionDecoder a(sa, limits), b(sb, limits);
  const auto start = wiretest::startup("u", "d");
  for (auto* dec : {&a, &b}) {
    dec->begin(dec == &a ? 1 : 2, "127.0.0.1:5000", 0, 1);
    REQUIRE(dec->feed(capture::Direction::Frontend, start.data(), start.size(), 2));
  }
  // Two queries of 900 KiB arriving in halves: the first halves fit (about
  // 386 KiB each beyond the 64 KiB free per direction), the second half of
  // the second does not while the first is still being reassembled.
  const auto qa = big_query(900 << 10), qb = big_query(900 << 10);
  const size_t half = qa.size() / 2;
  feed(a, qa, 0, half);
  feed(b, qb, 0, half);
  CHECK(budget.held.load() > 0);
  CHECK(budget.held.load() <= budget.cap);
  feed(b, qb, half, qb.size());
  CHECK(budget.refused.load() == 1);
  CHECK(budget.refused_bytes.load() == qb.size() - 5);
  CHECK(sb.queries.empty());
  CHECK(sb.gaps == 1);
  CHECK(sb.gap_bytes == qb.size() - 5);
  // The first completes and gives back what it took.
  feed(a, qa, half, qa.size());
  REQUIRE(sa.queries.size() == 1);
  CHECK(sa.queries[0] == (900u << 10));
  CHECK(budget.held.load() == 0);
  // The refused session goes on: a small query and, with room again, a
  // large one are recorded.
  const auto small = wiretest::query("SELECT 1");
  feed(b, small, 0, small.size());
  const auto again = big_query(900 << 10);
  feed(b, again, 0, half);
  feed(b, again, half, again.size());
  REQUIRE(sb.queries.size() == 2);
  CHECK(sb.queries[1] == (900u << 10));
  CHECK(budget.held.load() == 0);
  CHECK(budget.refused.load() == 1);
  CHECK_FALSE(a.failed());
  CHECK_FALSE(b.failed());
}
