// Writer::write and Reader::next do not allocate in steady state.
//
// Allocations are counted per thread by support/alloc_counter.h, which
// replaces operator new/delete for the whole trace test binary: this is the
// one file of the binary that includes it.
#include "support/alloc_counter.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

using namespace tierlab::trace;

namespace {

// A sink that keeps only a count: appending never allocates.
class CountingSink : public Sink {
 public:
  void append(const void*, size_t len) override { bytes += len; }
  uint64_t bytes = 0;
};

// Record i of a mixed stream: prepared statements with a parameter, results,
// block and file I/O, samples.
struct Gen {
  char digits[32];
  Param prm[2];
  int16_t fmts[1] = {1};
  Record make(uint64_t i) {
    Nanos ts = static_cast<Nanos>(i * 997);
    uint64_t s = 1 + i % 8;
    switch (i % 6) {
      case 0: {
        int n = std::snprintf(digits, sizeof digits, "%llu", static_cast<unsigned long long>(i * 7919 % 100000));
        prm[0] = Param{0, false, std::string_view(digits, static_cast<size_t>(n))};
        prm[1] = Param{1, false, std::string_view("\x01\x02\x03", 3)};
        return Record{ts, s, Bind{"", "P0_1", std::span<const Param>(prm, 2), fmts}};
      }
      case 1: return Record{ts, s, Execute{"", 0}};
      case 2: return Record{ts, s, Result{"SELECT", true, 1}};
      case 3: return Record{ts, s, Ready{'I'}};
      case 4:
        return Record{ts, 0, BlockIo{ts + 100000, 1, (i * 7919 % 100000) * 8192, 8192, IoOp::Read, 0,
                                     static_cast<int32_t>(100 + i % 20)}};
      default: return Record{ts, 0, FileIo{static_cast<int32_t>(i % 3), "base/5/16384", i * 8192, 8192,
                                           IoOp::Read, 0, 5000}};
    }
  }
};

}  // namespace

TEST_CASE("writer and reader do not allocate per record in steady state", "[trace][alloc]") {
  // Writer: after a warm-up that interns every string and sizes every buffer,
  // a million more records (and the chunks they fill) allocate nothing.
  for (int level : {0, 1}) {
    auto sink = std::make_unique<CountingSink>();
    WriterOptions o;
    o.compression_level = level;
    o.chunk_bytes = 64 * 1024;
    Writer w(std::move(sink), o);
    Gen g;
    uint64_t i = 0;
    for (; i < 200000; ++i) w.write(g.make(i));
    uint64_t before = tierlab::test::allocations_this_thread();
    for (; i < 1200000; ++i) w.write(g.make(i));
    uint64_t during = tierlab::test::allocations_this_thread() - before;
    INFO("zstd level " << level);
    CHECK(during == 0);
  }

  // Reader: the same for next(), across chunk loads.
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  std::vector<uint8_t> bytes;
  {
    WriterOptions o;
    o.chunk_bytes = 64 * 1024;
    Writer w(std::move(sink), o);
    Gen g;
    for (uint64_t i = 0; i < 1200000; ++i) w.write(g.make(i));
    w.close();
    bytes = mem->bytes();
  }
  Reader r(memory_source(std::move(bytes)));
  Record rec;
  uint64_t n = 0;
  for (; n < 200000; ++n) REQUIRE(r.next(rec));
  uint64_t before = tierlab::test::allocations_this_thread();
  while (r.next(rec)) ++n;
  uint64_t during = tierlab::test::allocations_this_thread() - before;
  CHECK(n == 1200000);
  CHECK(during == 0);
}

TEST_CASE("the allocation counter sees allocations", "[trace][alloc]") {
  uint64_t before = tierlab::test::allocations_this_thread();
  auto* v = new std::vector<int>(100);
  delete v;
  CHECK(tierlab::test::allocations_this_thread() - before >= 2);
}
