// capture log on input built to break it (found by tests/fuzz/server_log):
// times past what int64_t nanoseconds hold, or before the epoch, and a pgreplay record claiming a
// string far longer than the file.
#include "capture/log.h"

#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <memory>

using namespace tierlab;

TEST_CASE("capture log: times past what int64_t nanoseconds hold are not times", "[log]") {
  CHECK(capture::parse_log_time("2261-12-31 23:59:59 UTC").has_value());
  CHECK(capture::parse_log_time("1970-01-01 00:00:00").has_value());
  // Before the epoch: two such times could be further apart than int64_t
  // nanoseconds reach (a log of 1714 and 2026 overflowed ts - start).
  CHECK_FALSE(capture::parse_log_time("1714-01-02 00:00:00").has_value());
  CHECK_FALSE(capture::parse_log_time("1969-12-31 23:59:59 UTC").has_value());
  CHECK_FALSE(capture::parse_log_time("4052-12-03 10:00:00.001 UTC").has_value());
  CHECK_FALSE(capture::parse_log_time("9999-12-31 23:59:59").has_value());
  CHECK_FALSE(capture::parse_log_time("0000-01-01 00:00:00").has_value());
  CHECK(capture::parse_log_time("1764758886.190") == int64_t{1'764'758'886'190'000'000});
  CHECK_FALSE(capture::parse_log_time("99999999999").has_value());
  CHECK_FALSE(capture::parse_log_time("99999999999999999999999999.5").has_value());
}

TEST_CASE("capture log: a pgreplay record claiming an 800 MB string in a short file costs what the file holds",
          "[log]") {
  // A statement record (type 2), then one whose SQL claims 0x31000000 bytes; 20 follow.
  std::string f;
  auto u32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) f += static_cast<char>((v >> s) & 0xff);
  };
  u32(849'610'085), u32(0), u32(0x6b1148e5), u32(1), f += '\2';
  u32(8), f += "SELECT 1\n";
  u32(849'610'085), u32(1000), u32(0x6b1148e5), u32(1), f += '\2';
  u32(0x31000000);
  f += std::string(20, 'x');
  std::unique_ptr<trace::Writer> w;
  const uint64_t rss_before = test::peak_rss();
  capture::LogCapture cap({}, [&](int64_t start) -> trace::Writer& {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    wo.realtime_offset_ns = start;
    w = std::make_unique<trace::Writer>(std::make_unique<trace::MemorySink>(), wo);
    return *w;
  });
  cap.read_text(f, "cut.pgreplay", capture::LogFormat::Pgreplay);
  const capture::LogStats st = cap.finish();
  CHECK(st.truncated == 1);
  CHECK(st.queries == 1);
  CHECK(test::peak_rss() - rss_before < (64u << 20));
}

TEST_CASE("capture log: a process id past int32_t is a line no prefix matches", "[log]") {
  std::unique_ptr<trace::Writer> w;
  capture::LogCapture cap({}, [&](int64_t start) -> trace::Writer& {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    wo.realtime_offset_ns = start;
    w = std::make_unique<trace::Writer>(std::make_unique<trace::MemorySink>(), wo);
    return *w;
  });
  cap.read_text("2026-12-03 10:00:00.000 UTC [9] LOG:  statement: SELECT 1\n"
                "2026-12-03 10:00:00.001 UTC [10177777777] LOG:  statement: SELECT 2\n",
                "pg.log", capture::LogFormat::Stderr);
  const capture::LogStats st = cap.finish();
  CHECK(st.queries == 1);
  CHECK(st.unparsed == 1);
}
