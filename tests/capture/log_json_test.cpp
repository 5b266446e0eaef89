// capture log: jsonlog records read without a JSON document per line
// (capture/log_json.cpp) read as a JSON parser reads them; jsonlog and
// stderr logs allocate nothing per record.
#define TIERLAB_ALLOC_COUNTER_READ_ONLY
#include "support/alloc_counter.h"
#include "capture/log.h"
#include "capture/log_internal.h"

#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

using namespace tierlab;
using capture::logimpl::JsonRecord;

namespace {

// What the reader takes from a parsed document for `key` (a string's text,
// a number as printed, else "").
std::string value_of(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();
  return {};
}

const char* const kNames[JsonRecord::kKeys] = {"timestamp", "user",     "dbname",  "pid",       "remote_host",
                                               "remote_port", "session_id", "error_severity", "state_code",
                                               "message",   "detail",   "statement", "application_name"};

// A random JSON value: strings with escapes, \u, UTF-8 or raw control
// characters; integers, fractions, -0, leading zeros; literals; nesting.
std::string random_value(std::mt19937& rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  static const char* const kPieces[] = {"a",    "SELECT 1", " ",    "\\n",     "\\\"",   "\\\\", "\\/", "\\t",
                                        "\\u0041", "\xc3\xa9", "\\x",  "\t",      "$1 = '5'", ",",    ":",   "}"};
  switch (pick(10)) {
    case 0: return std::to_string(static_cast<int>(rng() % 100000) - 50000);
    case 1: {
      static const char* const kNumbers[] = {"0", "-0", "007", "1.5", "2e3", "123456789012345678901", "-", "12"};
      return kNumbers[pick(8)];
    }
    case 2: {
      static const char* const kLiterals[] = {"true", "false", "null", "[1,2]", "{\"a\":1}", "tru", "nul"};
      return kLiterals[pick(7)];
    }
    default: {
      std::string s = "\"";
      for (size_t i = pick(6); i > 0; --i) s += kPieces[pick(pick(4) == 0 ? 16 : 9)];
      return s + "\"";
    }
  }
}

class JsonDiscardSink : public trace::Sink {
 public:
  void append(const void*, size_t) override {}
};

uint64_t allocations_converting_json(const std::string& text, capture::LogFormat format) {
  std::unique_ptr<trace::Writer> w;
  const uint64_t before = tierlab::test::allocations_this_thread();
  {
    capture::LogCapture cap({}, [&](int64_t start) -> trace::Writer& {
      trace::WriterOptions wo;
      wo.start_mono_ns = 0;
      wo.realtime_offset_ns = start;
      w = std::make_unique<trace::Writer>(std::make_unique<JsonDiscardSink>(), wo);
      return *w;
    });
    cap.read_text(text, "pg.log", format);
    cap.finish();
    w->close();
    w.reset();
  }
  return tierlab::test::allocations_this_thread() - before;
}

// A jsonlog of pgbench -M prepared as PostgreSQL 15 writes it: 8 sessions,
// `txns` transactions each of BEGIN, an execution with parameters and END.
std::string pgbench_jsonlog(int txns) {
  std::string out;
  char line[700];
  int ms = 0;
  auto rec = [&](int pid, const std::string& msg, const std::string& detail) {
    ++ms;
    int n = std::snprintf(
        line, sizeof line,
        "{\"timestamp\":\"2026-12-03 10:%02d:%02d.%03d UTC\",\"user\":\"bench\",\"dbname\":\"shop\",\"pid\":%d,"
        "\"remote_host\":\"10.0.0.9\",\"remote_port\":%d,\"session_id\":\"6b11.%x\",\"line_num\":1,\"ps\":\"idle\","
        "\"error_severity\":\"LOG\",\"message\":\"%s\"%s,\"application_name\":\"pgbench\",\"query_id\":0}\n",
        ms / 60000 % 60, ms / 1000 % 60, ms % 1000, pid, 40000 + pid, pid, msg.c_str(), detail.c_str());
    out.append(line, static_cast<size_t>(n));
  };
  for (int s = 0; s < 8; ++s) rec(100 + s, "connection authorized: user=bench database=shop", "");
  for (int t = 0; t < txns; ++t)
    for (int s = 0; s < 8; ++s) {
      rec(100 + s, "execute P0_1: BEGIN;", "");
      rec(100 + s, "execute P0_2: UPDATE a SET v = v + $1 WHERE k = $2;\\nRETURNING \\\"v\\\"",
          ",\"detail\":\"parameters: $1 = '" + std::to_string(t % 5000 - 2500) + "', $2 = 'it''s'\"");
      rec(100 + s, "execute P0_3: END;", "");
    }
  for (int s = 0; s < 8; ++s) rec(100 + s, "disconnection: session time: 0:00:01.000 user=bench", "");
  return out;
}

// The same as a stderr log with the default prefix: a message and its
// DETAIL line, sessions interleaved.
std::string pgbench_stderr(int txns) {
  std::string out;
  char line[400];
  int ms = 0;
  auto rec = [&](int pid, const char* word, const std::string& msg) {
    ++ms;
    int n = std::snprintf(line, sizeof line, "2026-12-03 10:%02d:%02d.%03d UTC [%d] %s:  %s\n", ms / 60000 % 60,
                          ms / 1000 % 60, ms % 1000, pid, word, msg.c_str());
    out.append(line, static_cast<size_t>(n));
  };
  for (int s = 0; s < 8; ++s) rec(100 + s, "LOG", "connection authorized: user=bench database=shop");
  for (int t = 0; t < txns; ++t)
    for (int s = 0; s < 8; ++s) {
      rec(100 + s, "LOG", "execute P0_1: BEGIN;");
      rec(100 + s, "LOG", "execute P0_2: UPDATE a SET v = v + $1 WHERE k = $2;");
      rec(100 + s, "DETAIL", "parameters: $1 = '" + std::to_string(t % 5000 - 2500) + "', $2 = 'it''s'");
      rec(100 + s, "LOG", "execute P0_3: END;");
    }
  for (int s = 0; s < 8; ++s) rec(100 + s, "LOG", "disconnection: session time: 0:00:01.000 user=bench");
  return out;
}

}  // namespace

TEST_CASE("capture log: a jsonlog record read without a JSON document has the values a JSON parser gives",
          "[log][json]") {
  std::mt19937 rng(15);
  size_t plain = 0, lines = 0;
  JsonRecord r;
  std::string scratch;
  for (int round = 0; round < 20000; ++round) {
    std::string line = rng() % 8 == 0 ? " { " : "{";
    const int keys = static_cast<int>(rng() % 6);
    for (int k = 0; k < keys; ++k) {
      if (k) line += rng() % 8 == 0 ? " , " : ",";
      const std::string key = rng() % 4 ? kNames[rng() % JsonRecord::kKeys] : "line_num";
      line += "\"" + key + "\":" + random_value(rng);
    }
    line += rng() % 8 == 0 ? "} \r" : "}";
    if (rng() % 10 == 0) line.resize(rng() % (line.size() + 1));  // cut off
    if (rng() % 20 == 0) line += "x";                             // text after the object
    ++lines;
    if (!capture::logimpl::parse_json_plain(line, r, scratch)) continue;
    ++plain;
    INFO("line: " << line);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    REQUIRE(j.is_object());
    for (int k = 0; k < JsonRecord::kKeys; ++k) REQUIRE(std::string(r.v[k]) == value_of(j, kNames[k]));
  }
  INFO(plain << " of " << lines << " lines read without a document");
  CHECK(plain > lines / 20);
  CHECK(plain < lines);
  // What PostgreSQL writes is read without one.
  const std::string pg =
      "{\"timestamp\":\"2026-12-03 19:47:16.310 UTC\",\"user\":\"postgres\",\"pid\":15363,\"remote_port\":5432,"
      "\"session_id\":\"6b11c744.3c03\",\"error_severity\":\"ERROR\",\"state_code\":\"42601\",\"message\":"
      "\"syntax error at or near \\\"x\\\"\",\"statement\":\"SELECT\\n\\tx\",\"backend_type\":\"client backend\"}";
  REQUIRE(capture::logimpl::parse_json_plain(pg, r, scratch));
  CHECK(r.v[JsonRecord::Pid] == "15363");
  CHECK(r.v[JsonRecord::Port] == "5432");
  CHECK(r.v[JsonRecord::Message] == "syntax error at or near \"x\"");
  CHECK(r.v[JsonRecord::Statement] == "SELECT\n\tx");
  CHECK(r.v[JsonRecord::Database].empty());
}

TEST_CASE("capture log: reading a jsonlog allocates nothing per record: ten times the log, the same allocations",
          "[log][json][alloc]") {
  const uint64_t c0 = tierlab::test::allocations_this_thread();
  std::string* volatile probe = new std::string(100, 'x');
  delete probe;
  REQUIRE(tierlab::test::allocations_this_thread() > c0);

  const std::string small = pgbench_jsonlog(200), large = pgbench_jsonlog(2000);
  const uint64_t a_small = allocations_converting_json(small, capture::LogFormat::Json),
                 a_large = allocations_converting_json(large, capture::LogFormat::Json);
  INFO("allocations: " << a_small << " for 200 transactions of 8 sessions, " << a_large << " for 2,000");
  CHECK(a_large == a_small);
}

TEST_CASE("capture log: reading a stderr log allocates nothing per message: ten times the log, the same allocations",
          "[log][alloc]") {
  const uint64_t c0 = tierlab::test::allocations_this_thread();
  std::string* volatile probe = new std::string(100, 'x');
  delete probe;
  REQUIRE(tierlab::test::allocations_this_thread() > c0);

  const std::string small = pgbench_stderr(200), large = pgbench_stderr(2000);
  const uint64_t a_small = allocations_converting_json(small, capture::LogFormat::Stderr),
                 a_large = allocations_converting_json(large, capture::LogFormat::Stderr);
  INFO("allocations: " << a_small << " for 200 transactions of 8 sessions, " << a_large << " for 2,000");
  CHECK(a_large == a_small);
}
