// The protocol decoder's memory follows the bytes that arrived, not the
// lengths their headers claim.
#include "capture/wire.h"

#include "support/support.h"

#include <catch2/catch.hpp>

#include <fstream>
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
