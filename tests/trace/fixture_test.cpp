// Traces written before a change to the codec still read, and the same
// records still write the same bytes: tests/data/trace-1.2-every-kind.tlt was
// written by the writer before the record kinds were described once
// (trace/fields.h), from testutil::fill_every_kind(c, 0) with the options of
// fixture_options() below, and its dump, jsonl and csv beside it by that
// build's `tierlab trace`.
#include "support/support.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::trace;
using tierlab::test::run_tierlab;

namespace {

std::string data(const std::string& name) {
  return std::string(TIERLAB_SOURCE_DIR) + "/tests/data/" + name;
}

WriterOptions fixture_options() {
  WriterOptions o;
  o.compression_level = 0;  // bytes independent of the zstd version
  o.chunk_bytes = 1024;
  o.start_mono_ns = 999'999'000'000;
  o.realtime_offset_ns = 1'780'000'000'000'000'000;
  return o;
}

std::string text_of(const std::string& path) {
  auto b = testutil::read_file(path);
  return std::string(b.begin(), b.end());
}

}  // namespace

TEST_CASE("a trace of every kind written before reads back as the records written", "[trace][fixture]") {
  testutil::Corpus c;
  testutil::fill_every_kind(c, 0);
  auto r = open_reader(data("trace-1.2-every-kind.tlt"));
  CHECK(r->header().major == 1);
  CHECK(r->header().minor == 2);
  auto got = testutil::read_all(*r);
  REQUIRE(got.size() == c.records.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("record " << i);
    CHECK(got[i] == testutil::canon(c.records[i]));
  }
  CHECK(r->stats().terminated);
}

TEST_CASE("the writer writes every kind byte for byte as before", "[trace][fixture]") {
  testutil::Corpus c;
  testutil::fill_every_kind(c, 0);
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  Writer w(std::move(sink), fixture_options());
  for (const auto& r : c.records) w.write(r);
  w.close();
  auto want = testutil::read_file(data("trace-1.2-every-kind.tlt"));
  REQUIRE(!want.empty());
  CHECK(mem->bytes().size() == want.size());
  CHECK(testutil::hex(std::string_view(reinterpret_cast<const char*>(mem->bytes().data()), mem->bytes().size())) ==
        testutil::hex(std::string_view(reinterpret_cast<const char*>(want.data()), want.size())));
}

TEST_CASE("trace dump and export print a trace of every kind as before", "[trace][fixture][cli]") {
  const std::string tlt = data("trace-1.2-every-kind.tlt");
  struct Case {
    std::vector<std::string> args;
    std::string golden;
  };
  for (const Case& k : {Case{{"trace", "dump", tlt}, "trace-1.2-every-kind.dump"},
                        Case{{"trace", "export", tlt, "--format", "jsonl"}, "trace-1.2-every-kind.jsonl"},
                        Case{{"trace", "export", tlt, "--format", "csv"}, "trace-1.2-every-kind.csv"}}) {
    INFO(k.golden);
    auto r = run_tierlab(k.args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    std::string want = text_of(data(k.golden));
    REQUIRE(!want.empty());
    CHECK(r.out == want);
  }
}
