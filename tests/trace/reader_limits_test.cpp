// The reader's memory is bounded by the file, not by what a chunk header
// claims.
#include "trace/crc32c.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include "support/support.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>

namespace {

using namespace tierlab;

using test::peak_rss;

void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int i = 0; i < 4; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
}

}  // namespace

TEST_CASE("a chunk header claiming 1 GiB costs no more memory than the file holds", "[trace][reader]") {
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));  // writes the file header at once
  std::vector<uint8_t> file = mem->bytes();
  REQUIRE(file.size() == 36);
  size_t h = file.size();
  put32(file, 0x4b434c54);  // chunk magic
  put32(file, 0);           // flags: stored raw
  put32(file, 1u << 30);    // stored length
  put32(file, 1u << 30);    // raw length
  put32(file, 1);           // records
  put32(file, 0);
  for (int i = 0; i < 8; ++i) file.push_back(0);  // first_ts
  put32(file, 0);           // payload CRC (never reached)
  put32(file, trace::crc32c(0, file.data() + h, 36));
  file.insert(file.end(), 10, 'x');  // then the file ends

  uint64_t before = peak_rss();
  REQUIRE(before > 0);
  trace::Reader r(trace::memory_source(file, "claims.tlt"));
  trace::Record rec;
  CHECK_FALSE(r.next(rec));
  CHECK(r.stats().recovered_tail_bytes == 40 + 10);
  CHECK(peak_rss() - before < (64u << 20));
}
