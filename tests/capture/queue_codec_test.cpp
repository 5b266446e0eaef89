// The in-process queue codec (capture/queue_impl.h), derived from the field
// lists of trace/fields.h: every record kind, every field, survives it.
#include "capture/queue_impl.h"
#include "trace/trace_test_util.h"

#include <catch2/catch.hpp>

#include <vector>

using namespace tierlab;
using namespace tierlab::capture::detail;

TEST_CASE("queue codec: every record kind and field survives encode and decode", "[proxy][queue]") {
  trace::testutil::Corpus c;
  trace::testutil::fill_every_kind(c, 3000);
  RecordDecoder dec;
  for (const auto& r : c.records) {
    INFO(trace::testutil::canon(r).substr(0, 200));
    std::vector<uint8_t> buf(encoded_size(r));
    REQUIRE(encode(r, buf.data()) == buf.data() + buf.size());
    trace::Record back;
    REQUIRE(dec.decode(buf.data(), buf.size(), back));
    CHECK(trace::testutil::canon(back) == trace::testutil::canon(r));
    CHECK_FALSE(dec.decode(buf.data(), buf.size() - 1, back));
    buf.push_back(0);
    CHECK_FALSE(dec.decode(buf.data(), buf.size(), back));
  }
}

TEST_CASE("queue codec: a count larger than the entry is refused, not allocated", "[proxy][queue]") {
  std::vector<uint32_t> types{23, 25};
  trace::Record r{5, 1, trace::Parse{"s", "SELECT $1, $2", types}};
  std::vector<uint8_t> buf(encoded_size(r));
  encode(r, buf.data());
  // kind, ts, session, "s" (4 + 1), sql (4 + 13), then the count.
  size_t at = 1 + 8 + 8 + 5 + 17;
  uint32_t huge = 0x7fffffff;
  std::memcpy(buf.data() + at, &huge, 4);
  RecordDecoder dec;
  trace::Record back;
  CHECK_FALSE(dec.decode(buf.data(), buf.size(), back));
}
