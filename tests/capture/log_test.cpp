// capture log: PostgreSQL server log text -> trace records.
// wire_alloc_test.cpp defines this binary's operator new replacements.
#define TIERLAB_ALLOC_COUNTER_READ_ONLY
#include "support/alloc_counter.h"
#include "capture/log.h"

#include "common/error.h"
#include "support/support.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

using namespace tierlab;

namespace {

struct Converted {
  std::vector<std::string> records;  // "s1 query SELECT 1"
  capture::LogStats stats;
  std::vector<trace::Record> raw;
  int64_t realtime_start = 0;
};

std::string describe_log_record(const trace::Record& r) {
  std::ostringstream o;
  o << "s" << r.session << " ";
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, trace::SessionBegin>)
          o << "begin " << b.user << "@" << b.database << " app=" << b.application_name << " client=" << b.client_addr
            << " pid=" << b.backend_pid << ((b.flags & trace::kSessionUnknownStartup) ? " unknown-start" : "");
        else if constexpr (std::is_same_v<T, trace::SessionEnd>)
          o << "end " << static_cast<int>(b.reason);
        else if constexpr (std::is_same_v<T, trace::Query>)
          o << "query " << b.sql;
        else if constexpr (std::is_same_v<T, trace::Parse>)
          o << "parse " << b.statement << " " << b.sql << " types=" << b.param_types.size();
        else if constexpr (std::is_same_v<T, trace::Bind>) {
          o << "bind " << b.portal << "/" << b.statement;
          for (const auto& p : b.params) o << (p.is_null ? std::string(" NULL") : " [" + std::string(p.value) + "]");
        } else if constexpr (std::is_same_v<T, trace::Execute>)
          o << "execute " << b.portal;
        else if constexpr (std::is_same_v<T, trace::Sync>)
          o << "sync";
        else if constexpr (std::is_same_v<T, trace::Error>)
          o << "error " << b.sqlstate << " " << b.severity << " " << b.message;
        else if constexpr (std::is_same_v<T, trace::Ready>)
          o << "ready " << b.status;
        else if constexpr (std::is_same_v<T, trace::Meta>)
          o << "meta " << b.key;
        else
          o << "other";
      },
      r.body);
  return o.str();
}

Converted convert_with(const capture::LogOptions& opts,
                       const std::vector<std::pair<std::string, std::string>>& files,
                       capture::LogFormat format = capture::LogFormat::Stderr, bool from_disk = false) {
  Converted c;
  trace::MemorySink* mem = nullptr;
  std::unique_ptr<trace::Writer> w;
  capture::LogCapture cap(opts, [&](int64_t start) -> trace::Writer& {
    c.realtime_start = start;
    auto sink = std::make_unique<trace::MemorySink>();
    mem = sink.get();
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    wo.realtime_offset_ns = start;
    w = std::make_unique<trace::Writer>(std::move(sink), wo);
    return *w;
  });
  for (const auto& [name, text] : files) {
    if (from_disk) cap.read_file(name);
    else cap.read_text(text, name, format);
  }
  c.stats = cap.finish();
  w->close();
  trace::Reader r(trace::memory_source(mem->bytes()));
  trace::Record rec;
  while (r.next(rec)) {
    if (rec.kind() == trace::Kind::Meta) continue;
    c.records.push_back(describe_log_record(rec));
    c.raw.push_back(rec);  // views are not kept: only ts and session used
  }
  return c;
}

Converted convert(const std::string& text, capture::LogFormat format = capture::LogFormat::Stderr,
                  const capture::LogOptions& opts = {}) {
  return convert_with(opts, {{"pg.log", text}}, format);
}

std::vector<std::string> of_session(const Converted& c, uint64_t s) {
  std::vector<std::string> out;
  std::string p = "s" + std::to_string(s) + " ";
  for (const auto& r : c.records)
    if (r.rfind(p, 0) == 0) out.push_back(r.substr(p.size()));
  return out;
}

}  // namespace

TEST_CASE("capture log: default prefix, connections, simple and multi-line statements, transactions",
          "[log]") {
  const std::string log =
      "2026-12-03 10:48:06.100 UTC [100] LOG:  connection received: host=10.0.0.5 port=40000\n"
      "2026-12-03 10:48:06.101 UTC [100] LOG:  connection authorized: user=alice database=shop application_name=psql\n"
      "2026-12-03 10:48:06.102 UTC [100] LOG:  statement: BEGIN\n"
      "2026-12-03 10:48:06.103 UTC [100] LOG:  statement: SELECT 1,\n"
      "\t2 AS two\n"
      "2026-12-03 10:48:06.104 UTC [100] LOG:  statement: COMMIT\n"
      "2026-12-03 10:48:06.110 UTC [100] LOG:  disconnection: session time: 0:00:00.010 user=alice database=shop host=10.0.0.5 port=40000\n";
  Converted c = convert(log);
  CHECK(c.stats.prefix == "%m [%p] ");
  CHECK(of_session(c, 1) == std::vector<std::string>{
                                "begin alice@shop app=psql client=10.0.0.5:40000 pid=100",
                                "query BEGIN", "ready T", "query SELECT 1,\n2 AS two", "ready T",
                                "query COMMIT", "ready I", "end 0"});
  CHECK(c.stats.queries == 3);
  CHECK(c.stats.transactions == 1);
  // Times: the trace starts at the first message; each record at its line's.
  CHECK(c.realtime_start == *capture::parse_log_time("2026-12-03 10:48:06.100 UTC") + 1'000'000);
  CHECK(c.raw[1].ts == 1'000'000);  // BEGIN, 1 ms after the authorization
}

TEST_CASE("capture log: extended protocol: a named statement is parsed once, parameters as text", "[log]") {
  const std::string log =
      "2026-12-03 10:00:00.000 UTC [7] LOG:  connection authorized: user=u database=d application_name=pgbench\n"
      "2026-12-03 10:00:00.001 UTC [7] LOG:  execute P_1: SELECT $1::int + $2::int\n"
      "2026-12-03 10:00:00.001 UTC [7] DETAIL:  parameters: $1 = '3', $2 = '4'\n"
      "2026-12-03 10:00:00.002 UTC [7] LOG:  execute P_1: SELECT $1::int + $2::int\n"
      "2026-12-03 10:00:00.002 UTC [7] DETAIL:  parameters: $1 = 'it''s, $2 = x', $2 = NULL\n"
      "2026-12-03 10:00:00.003 UTC [7] LOG:  execute <unnamed>: SELECT 1\n"
      "2026-12-03 10:00:00.004 UTC [7] LOG:  execute <unnamed>: SELECT 1\n";
  Converted c = convert(log);
  CHECK(of_session(c, 1) == std::vector<std::string>{
                                "begin u@d app=pgbench client= pid=7",
                                "parse P_1 SELECT $1::int + $2::int types=0", "bind /P_1 [3] [4]", "execute ",
                                "sync", "ready I",
                                "bind /P_1 [it's, $2 = x] NULL", "execute ", "sync", "ready I",
                                "parse  SELECT 1 types=0", "bind /", "execute ", "sync", "ready I",
                                "parse  SELECT 1 types=0", "bind /", "execute ", "sync", "ready I",
                                "end 4"});
  CHECK(c.stats.executes == 4);
  CHECK(c.stats.transactions == 4);
}

TEST_CASE("capture log: a session still open at the log's end, having sent nothing, ends after it began", "[log]") {
  const std::string log =
      "2026-12-03 10:48:06.100 UTC [100] LOG:  connection authorized: user=alice database=shop application_name=psql\n"
      "2026-12-03 10:48:06.102 UTC [100] LOG:  statement: SELECT 1\n"
      "2026-12-03 10:48:07.500 UTC [101] LOG:  connection authorized: user=bob database=shop application_name=psql\n";
  Converted c = convert(log);
  REQUIRE(of_session(c, 2) == std::vector<std::string>{"begin bob@shop app=psql client= pid=101", "end 4"});
  // Every record of the trace at or after its session's begin: a replay at
  // max speed orders sessions by when they began and ended.
  std::map<uint64_t, int64_t> begun;
  for (const auto& r : c.raw) {
    if (r.kind() == trace::Kind::SessionBegin) begun[r.session] = r.ts;
    if (r.kind() == trace::Kind::SessionEnd) {
      INFO("session " << r.session);
      CHECK(r.ts >= begun.at(r.session));
    }
  }
  CHECK(begun.size() == 2);
}

TEST_CASE("capture log: interleaved sessions, DETAIL lines found by pid, a session begun before the log",
          "[log]") {
  const std::string log =
      "2026-12-03 10:00:00.001 UTC [1] LOG:  execute P_0: UPDATE t SET v = v + $1 WHERE k = $2\n"
      "2026-12-03 10:00:00.001 UTC [2] LOG:  execute P_0: SELECT v FROM t WHERE k = $1\n"
      "2026-12-03 10:00:00.001 UTC [1] DETAIL:  parameters: $1 = '5', $2 = '1'\n"
      "2026-12-03 10:00:00.002 UTC [2] DETAIL:  parameters: $1 = '9'\n";
  Converted c = convert(log);
  CHECK(c.stats.sessions == 2);
  CHECK(c.stats.sessions_unknown_start == 2);
  auto s1 = of_session(c, 1), s2 = of_session(c, 2);
  REQUIRE(s1.size() >= 3);
  REQUIRE(s2.size() >= 3);
  CHECK(s1[0] == "begin @ app= client= pid=1 unknown-start");
  CHECK(s1[2] == "bind /P_0 [5] [1]");
  CHECK(s2[2] == "bind /P_0 [9]");
  CHECK(s1.back() == "end 4");  // CaptureEnd
}

TEST_CASE("capture log: errors with SQLSTATE (%e) fail a transaction, ROLLBACK ends it", "[log]") {
  capture::LogOptions o;
  o.prefix = "%m [%p] %e %c ";
  const std::string log =
      "2026-12-03 10:00:00.001 UTC [5] 00000 6b1148e6.5 LOG:  statement: BEGIN\n"
      "2026-12-03 10:00:00.002 UTC [5] 00000 6b1148e6.5 LOG:  statement: INSERT INTO t VALUES (1)\n"
      "2026-12-03 10:00:00.003 UTC [5] 23505 6b1148e6.5 ERROR:  duplicate key value violates unique constraint \"t_pkey\"\n"
      "2026-12-03 10:00:00.003 UTC [5] 23505 6b1148e6.5 DETAIL:  Key (k)=(1) already exists.\n"
      "2026-12-03 10:00:00.003 UTC [5] 23505 6b1148e6.5 STATEMENT:  INSERT INTO t VALUES (1)\n"
      "2026-12-03 10:00:00.004 UTC [5] 00000 6b1148e6.5 LOG:  statement: ROLLBACK\n";
  Converted c = convert(log, capture::LogFormat::Stderr, o);
  CHECK(of_session(c, 1) ==
        std::vector<std::string>{"begin @ app= client= pid=5 unknown-start", "query BEGIN", "ready T",
                                 "query INSERT INTO t VALUES (1)",
                                 "error 23505 ERROR duplicate key value violates unique constraint \"t_pkey\"",
                                 "ready E", "query ROLLBACK", "ready I", "end 4"});
  CHECK(c.stats.errors == 1);
  CHECK(c.stats.transactions == 1);
}

TEST_CASE("capture log: RDS prefix recognised by itself, and pgreplay's too", "[log]") {
  Converted c = convert(
      "2026-12-03 10:00:00 UTC:10.1.2.3(5432):app@orders:[42]:LOG:  statement: SELECT now()\n"
      "2026-12-03 10:00:01 UTC:10.1.2.3(5432):app@orders:[42]:LOG:  disconnection: session time: 0:00:01.000 user=app database=orders host=10.1.2.3 port=5432\n");
  CHECK(c.stats.prefix == "%t:%r:%u@%d:[%p]:");
  CHECK(of_session(c, 1) == std::vector<std::string>{"begin app@orders app= client=10.1.2.3:5432 pid=42 unknown-start",
                                                     "query SELECT now()", "ready I", "end 0"});
  Converted p = convert("2026-12-03 10:00:00.000 UTC|app|orders|6b1148e6.2a|LOG:  statement: SELECT 2\n");
  CHECK(p.stats.prefix == "%m|%u|%d|%c|");
  CHECK(of_session(p, 1).at(1) == "query SELECT 2");
}

TEST_CASE("capture log: a log no prefix matches fails in one line naming file and line", "[log]") {
  std::string log;
  for (int i = 0; i < 30; ++i) log += "Dec  3 10:00:00 host postgres[12]: [1-1] LOG:  statement: SELECT 1\n";
  try {
    convert(log);
    FAIL("no error");
  } catch (const SettingError& e) {
    // The library names the setting; `capture log` adds its flag.
    std::string m = e.what();
    CHECK(e.setting() == "log_line_prefix");
    CHECK(m.find("pg.log:1: ") == 0);
    CHECK(m.find("--") == std::string::npos);
  }
  // The right prefix reads it (%q: none; the escapes the syslog-like text has).
  capture::LogOptions o;
  o.prefix = "Dec  3 10:00:00 host postgres[%p]: [%l-1] ";
  CHECK_THROWS_AS(convert("x\n", capture::LogFormat::Stderr, o), InputError);
  o.prefix = "%Z";
  CHECK_THROWS_WITH(convert("x\n", capture::LogFormat::Stderr, o), Catch::Contains("unknown escape %Z"));
}

TEST_CASE("capture log: unparsable and truncated lines are counted and skipped", "[log]") {
  Converted c = convert(
      "2026-12-03 10:00:00.000 UTC [9] LOG:  statement: SELECT 1\n"
      "garbage in the middle\n"
      "2026-12-03 10:00:00.001 UTC [9] LOG:  checkpoint starting: time\n"
      "2026-12-03 10:00:00.002 UTC [9] LOG:  statement: SELECT 2\n"
      "2026-12-03 10:00:00.003 UTC [9] LOG:  statement: SELE");
  CHECK(c.stats.unparsed == 1);
  CHECK(c.stats.truncated == 1);
  CHECK(c.stats.other == 1);
  CHECK(c.stats.queries == 2);
}

TEST_CASE("capture log: log_min_duration_statement: statements at their start, duration from the log", "[log]") {
  Converted c = convert(
      "2026-12-03 10:00:00.010 UTC [9] LOG:  duration: 1.500 ms  statement: SELECT 1\n"
      "2026-12-03 10:00:00.020 UTC [9] LOG:  duration: 0.020 ms  parse <unnamed>: SELECT $1\n"
      "2026-12-03 10:00:00.020 UTC [9] LOG:  duration: 0.020 ms  bind <unnamed>: SELECT $1\n"
      "2026-12-03 10:00:00.020 UTC [9] DETAIL:  parameters: $1 = '7'\n"
      "2026-12-03 10:00:00.030 UTC [9] LOG:  duration: 2.000 ms  execute <unnamed>: SELECT $1\n"
      "2026-12-03 10:00:00.030 UTC [9] DETAIL:  parameters: $1 = '7'\n");
  CHECK(c.stats.queries == 1);
  CHECK(c.stats.executes == 1);
  CHECK(c.stats.durations == 2);
  // ts 0 is the first record's time: the start of SELECT 1, 8.5 ms into the second.
  REQUIRE(c.records.size() >= 4);
  CHECK(c.records[1] == "s1 query SELECT 1");
  CHECK(c.raw[1].ts == 0);
  CHECK(c.records[2] == "s1 ready I");
  CHECK(c.raw[2].ts == 1'500'000);
  CHECK(c.records[3] == "s1 parse  SELECT $1 types=0");
  CHECK(c.raw[3].ts == 19'500'000);
}

TEST_CASE("capture log: csvlog and jsonlog, multi-line fields, SQLSTATE, application", "[log]") {
  const std::string csv =
      "2026-12-03 10:48:06.237 UTC,\"bob\",\"db1\",18769,\"[local]\",6b1148e6.4951,3,\"BEGIN\",2026-12-03 10:48:06 UTC,4/5,0,LOG,00000,\"statement: SELECT 'a,\n"
      "\"\"b\"\"'\",,,,,,,,,\"app one\",\"client backend\",,0\n"
      "2026-12-03 10:48:06.240 UTC,\"bob\",\"db1\",18769,\"[local]\",6b1148e6.4951,4,\"idle\",2026-12-03 10:48:06 UTC,4/6,0,ERROR,42P01,\"relation \"\"nope\"\" does not exist\",,,,,,\"SELECT * FROM nope\",15,,\"app one\",\"client backend\",,0\n";
  Converted c = convert(csv, capture::LogFormat::Csv);
  CHECK(of_session(c, 1) ==
        std::vector<std::string>{"begin bob@db1 app=app one client=unix pid=18769 unknown-start",
                                 "query SELECT 'a,\n\"b\"'", "ready I", "query SELECT * FROM nope",
                                 "error 42P01 ERROR relation \"nope\" does not exist", "ready I", "end 4"});
  CHECK(c.stats.unlogged_statements == 1);
  const std::string json =
      "{\"timestamp\":\"2026-12-03 10:48:06.187 UTC\",\"user\":\"bob\",\"dbname\":\"db1\",\"pid\":18754,\"remote_host\":\"10.0.0.9\",\"remote_port\":5555,\"session_id\":\"6b1148e6.4942\",\"error_severity\":\"LOG\",\"message\":\"execute P_1: UPDATE a SET x = x + $1 WHERE k = $2;\",\"detail\":\"parameters: $1 = '2105', $2 = '17333'\",\"application_name\":\"pgbench\"}\n"
      "{\"timestamp\":\"2026-12-03 10:48:06.188 UTC\",\"user\":\"bob\",\"dbname\":\"db1\",\"pid\":18754,\"session_id\":\"6b1148e6.4942\",\"error_severity\":\"LOG\",\"message\":\"disconnection: session time: 0:00:00.017 user=bob database=db1 host=10.0.0.9 port=5555\"}\n"
      "{\"timestamp\":\"2026-12-03 10:48:06.1";
  Converted j = convert(json, capture::LogFormat::Json);
  CHECK(of_session(j, 1) == std::vector<std::string>{
                                "begin bob@db1 app=pgbench client=10.0.0.9:5555 pid=18754 unknown-start",
                                "parse P_1 UPDATE a SET x = x + $1 WHERE k = $2; types=0",
                                "bind /P_1 [2105] [17333]", "execute ", "sync", "ready I", "end 0"});
  CHECK(j.stats.truncated == 1);
  CHECK_THROWS_WITH(convert("not,a,csv\n", capture::LogFormat::Csv), Catch::StartsWith("pg.log:1: not a csvlog record"));
  CHECK_THROWS_WITH(convert("{}\n", capture::LogFormat::Json), Catch::StartsWith("pg.log:1: not a jsonlog record"));
}

TEST_CASE("capture log: --database and --user leave other sessions out", "[log]") {
  capture::LogOptions o;
  o.database = "shop";
  Converted c = convert(
      "2026-12-03 10:00:00.000 UTC [1] LOG:  connection authorized: user=a database=shop\n"
      "2026-12-03 10:00:00.000 UTC [2] LOG:  connection authorized: user=a database=other\n"
      "2026-12-03 10:00:00.001 UTC [1] LOG:  statement: SELECT 1\n"
      "2026-12-03 10:00:00.001 UTC [2] LOG:  statement: SELECT 2\n",
      capture::LogFormat::Stderr, o);
  CHECK(c.stats.sessions == 1);
  CHECK(c.stats.filtered == 1);
  CHECK(c.stats.queries == 1);
  o.prefix = "%m [%p] ";
  CHECK_THROWS_WITH(convert("", capture::LogFormat::Stderr, o), Catch::Contains("has no %d"));
}

TEST_CASE("capture log: a gzip'd log and rotated files, sessions carried across", "[log]") {
  tierlab::test::TempDir dir;
  std::string first = dir.file("postgresql-1.log.gz"), second = dir.file("postgresql-2.log");
  const std::string a =
      "2026-12-03 10:00:00.000 UTC [3] LOG:  connection authorized: user=u database=d\n"
      "2026-12-03 10:00:00.001 UTC [3] LOG:  statement: BEGIN\n";
  gzFile gz = gzopen(first.c_str(), "wb");
  REQUIRE(gz);
  gzwrite(gz, a.data(), static_cast<unsigned>(a.size()));
  gzclose(gz);
  {
    std::ofstream(second) << "2026-12-03 10:00:00.002 UTC [3] LOG:  statement: COMMIT\n";
  }
  Converted c = convert_with({}, {{first, ""}, {second, ""}}, capture::LogFormat::Auto, true);
  CHECK(of_session(c, 1) == std::vector<std::string>{"begin u@d app= client= pid=3", "query BEGIN", "ready T",
                                                     "query COMMIT", "ready I", "end 4"});
  CHECK(c.stats.files == 2);
}

TEST_CASE("capture log: padded escapes (%-6p, %10u) and %q for processes without a session", "[log]") {
  capture::LogOptions o;
  o.prefix = "%m [%-6p] %q%10u@%d ";
  Converted c = convert(
      "2026-12-03 10:00:00.000 UTC [12    ] LOG:  checkpoint starting: time\n"
      "2026-12-03 10:00:00.001 UTC [345   ]      alice@shop LOG:  statement: SELECT 1\n",
      capture::LogFormat::Stderr, o);
  CHECK(c.stats.unparsed == 0);
  CHECK(c.stats.other == 1);
  CHECK(of_session(c, 1) == std::vector<std::string>{"begin alice@shop app= client= pid=345 unknown-start",
                                                     "query SELECT 1", "ready I", "end 4"});
}

namespace {

// pgreplay's replay file encoding (pgreplay -f), network byte order.
struct ReplayFile {
  std::string bytes;
  void u32(uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes += static_cast<char>((v >> s) & 0xff);
  }
  void str(const std::optional<std::string>& s) {
    u32(s ? static_cast<uint32_t>(s->size()) : 0x80000000u);
    if (s) bytes += *s;
  }
  void head(uint32_t secs, uint32_t usecs, uint32_t session, uint8_t type) {
    u32(secs);
    u32(usecs);
    u32(0x6b1148e5);
    u32(session);
    bytes += static_cast<char>(type);
  }
};

}  // namespace

TEST_CASE("capture log: pgreplay replay files: connect, statements, prepares and executions", "[log]") {
  ReplayFile f;
  const uint32_t t = 849'610'085;  // 2026-12-03 10:48:05 UTC, in seconds since 2000
  f.head(t, 0, 1, 0), f.str("alice"), f.str("shop"), f.bytes += '\n';
  f.head(t, 1000, 1, 2), f.str("BEGIN"), f.bytes += '\n';
  f.head(t, 2000, 1, 3), f.str("SELECT $1::int + $2"), f.str("S_1"), f.bytes += '\n';
  f.head(t, 3000, 1, 4), f.str("S_1");
  f.bytes += std::string("\0\2", 2);
  f.str("3"), f.str(std::nullopt), f.bytes += '\n';
  f.head(t, 4000, 1, 4), f.str("S_1");
  f.bytes += std::string("\0\2", 2);
  f.str("5"), f.str("6"), f.bytes += '\n';
  f.head(t, 5000, 1, 2), f.str("COMMIT"), f.bytes += '\n';
  f.head(t, 6000, 1, 5), f.bytes += '\n';  // a cancel request
  f.head(t, 7000, 1, 1), f.bytes += '\n';
  Converted c = convert(f.bytes, capture::LogFormat::Auto);
  CHECK(of_session(c, 1) == std::vector<std::string>{"begin alice@shop app= client= pid=0", "query BEGIN", "ready T",
                                                     "parse S_1 SELECT $1::int + $2 types=0", "bind /S_1 [3] NULL",
                                                     "execute ", "sync", "ready T", "bind /S_1 [5] [6]", "execute ",
                                                     "sync", "ready T", "query COMMIT", "ready I", "end 0"});
  CHECK(c.realtime_start == int64_t(1'796'294'885) * 1'000'000'000);
  CHECK(c.stats.other == 1);
  CHECK(c.stats.transactions == 1);
  // Cut inside a record: what came before stays, the cut is counted.
  Converted cut = convert(f.bytes.substr(0, f.bytes.size() - 20), capture::LogFormat::Pgreplay);
  CHECK(cut.stats.truncated == 1);
  CHECK(cut.stats.queries == 2);
  CHECK_THROWS_WITH(convert(std::string("\1\2\3\0garbage", 11), capture::LogFormat::Pgreplay),
                    Catch::StartsWith("pg.log: byte 0: not a pgreplay replay file record"));
}

TEST_CASE("capture log: log_min_duration_statement: an error after a completed statement is its own statement",
          "[log]") {
  // The failing statement is never logged as completed: only its error,
  // though its text is the same as the statement before.
  Converted c = convert(
      "2026-12-03 10:00:00.010 UTC [9] LOG:  duration: 0.500 ms  statement: INSERT INTO t VALUES (1)\n"
      "2026-12-03 10:00:00.020 UTC [9] ERROR:  duplicate key value violates unique constraint \"t_pkey\"\n"
      "2026-12-03 10:00:00.020 UTC [9] STATEMENT:  INSERT INTO t VALUES (1)\n");
  CHECK(of_session(c, 1) == std::vector<std::string>{"begin @ app= client= pid=9 unknown-start",
                                                     "query INSERT INTO t VALUES (1)", "ready I",
                                                     "query INSERT INTO t VALUES (1)",
                                                     "error  ERROR duplicate key value violates unique constraint \"t_pkey\"",
                                                     "ready I", "end 4"});
  CHECK(c.stats.queries == 2);
  CHECK(c.stats.unlogged_statements == 1);
}

namespace {

// A csvlog of pgbench -M prepared: 8 sessions, `txns` transactions each of
// BEGIN, three executions with parameters and END, then the disconnections.
std::string pgbench_csvlog(int txns) {
  std::string out;
  char line[640];
  auto rec = [&](int ms, int pid, const char* sev, const std::string& msg, const std::string& detail) {
    int n = std::snprintf(line, sizeof line,
                          "2026-12-03 10:%02d:%02d.%03d UTC,\"bench\",\"shop\",%d,\"[local]\",6b11.%x,1,\"idle\","
                          "2026-12-03 10:00:00 UTC,3/1,0,%s,00000,\"%s\",%s,,,,,,,,\"pgbench\",\"client backend\",,0\n",
                          ms / 60000 % 60, ms / 1000 % 60, ms % 1000, pid, pid, sev, msg.c_str(), detail.c_str());
    out.append(line, static_cast<size_t>(n));
  };
  for (int s = 0; s < 8; ++s)
    rec(s, 100 + s, "LOG", "connection authorized: user=bench database=shop application_name=pgbench", "");
  int ms = 10;
  for (int t = 0; t < txns; ++t) {
    for (int s = 0; s < 8; ++s) {
      const int pid = 100 + s;
      rec(ms++, pid, "LOG", "execute P0_1: BEGIN;", "");
      rec(ms++, pid, "LOG", "execute P0_2: UPDATE a SET v = v + $1 WHERE k = $2;",
          "\"parameters: $1 = '" + std::to_string(t * 7 % 5000 - 2500) + "', $2 = '" + std::to_string(t * 13 % 100000) +
              "'\"");
      rec(ms++, pid, "LOG", "execute P0_3: SELECT v FROM a WHERE k = $1;",
          "\"parameters: $1 = '" + std::to_string(t * 13 % 100000) + "'\"");
      rec(ms++, pid, "LOG", "execute P0_4: INSERT INTO h VALUES ($1, 'it''s');",
          "\"parameters: $1 = 'o''" + std::to_string(t) + "'\"");
      rec(ms++, pid, "LOG", "execute P0_5: END;", "");
    }
  }
  for (int s = 0; s < 8; ++s) rec(ms++, 100 + s, "LOG", "disconnection: session time: 0:00:01.000 user=bench", "");
  return out;
}

}  // namespace

TEST_CASE("capture log: a csvlog file read in blocks: records across block edges and longer than a block, "
          "CRLF line ends, a cut-off last record",
          "[log]") {
  tierlab::test::TempDir dir;
  const std::string path = dir.file("big.csv");
  // 3,000 transactions of 8 sessions (about 12 MB), a statement of 3 MiB
  // (longer than a read block) over two lines, CRLF line ends, and a last
  // record cut off inside a quoted field.
  std::string log = pgbench_csvlog(3000);
  const std::string long_sql = "SELECT '" + std::string(3u << 20, 'x') + "\n" + std::string(1000, 'y') + "'";
  log += "2026-12-03 11:00:00.000 UTC,\"bench\",\"shop\",200,\"[local]\",6b11.c8,1,\"idle\",2026-12-03 10:00:00 UTC,"
         "3/1,0,LOG,00000,\"statement: " + long_sql + "\",,,,,,,,,\"psql\",\"client backend\",,0\r\n";
  log += "2026-12-03 11:00:00.001 UTC,\"bench\",\"shop\",200,\"[local]\",6b11.c8,2,\"idle\",2026-12-03 10:00:00 UTC,"
         "3/1,0,LOG,00000,\"statement: SELECT \"\"a\"\"\r\n\",,,,,,,,,\"psql\",\"client backend\",,0\r\n";
  const uint64_t whole_lines = static_cast<uint64_t>(std::count(log.begin(), log.end(), '\n'));
  log += "2026-12-03 11:00:00.002 UTC,\"bench\",\"shop\",200,\"[local]\",6b11.c8,3,\"idle\",2026-12-03 10:00:00 UTC,"
         "3/1,0,LOG,00000,\"statement: SELECT\n1";
  { std::ofstream(path, std::ios::binary) << log; }
  Converted c = convert_with({}, {{path, ""}}, capture::LogFormat::Auto, true);
  CHECK(c.stats.executes == 3000u * 8 * 5);
  CHECK(c.stats.transactions == 3000u * 8 + 2);  // and the two psql statements
  CHECK(c.stats.queries == 2);
  CHECK(c.stats.truncated == 1);
  CHECK(c.stats.unparsed == 0);
  CHECK(c.stats.lines == whole_lines + 2);  // the cut-off record's two lines
  std::vector<std::string> s9 = of_session(c, 9);
  REQUIRE(s9.size() >= 4);
  CHECK(s9[1] == "query " + long_sql);
  CHECK(s9[3] == "query SELECT \"a\"\r\n");  // a CR inside quotes is the field's
  // Parameters with doubled quotes are unquoted; the others are as logged.
  std::vector<std::string> s1 = of_session(c, 1);
  REQUIRE(s1.size() >= 20);
  CHECK(s1[1] == "parse P0_1 BEGIN; types=0");
  CHECK(s1[7] == "bind /P0_2 [-2500] [0]");
  CHECK(s1[17] == "bind /P0_4 [o'0]");
}


namespace {

class LogDiscardSink : public trace::Sink {
 public:
  void append(const void*, size_t) override {}
};

// Heap allocations made converting `text` (csvlog) into a trace.
uint64_t allocations_converting(const std::string& text) {
  std::unique_ptr<trace::Writer> w;
  const uint64_t before = tierlab::test::allocations_this_thread();
  {
    capture::LogCapture cap({}, [&](int64_t start) -> trace::Writer& {
      trace::WriterOptions wo;
      wo.start_mono_ns = 0;
      wo.realtime_offset_ns = start;
      w = std::make_unique<trace::Writer>(std::make_unique<LogDiscardSink>(), wo);
      return *w;
    });
    cap.read_text(text, "pg.csv", capture::LogFormat::Csv);
    cap.finish();
    w->close();
    w.reset();
  }
  return tierlab::test::allocations_this_thread() - before;
}

}  // namespace

TEST_CASE("capture log: reading a csvlog allocates nothing per record: ten times the log, the same allocations",
          "[log][alloc]") {
  // The counter counts in this binary (or the test could not fail).
  const uint64_t c0 = tierlab::test::allocations_this_thread();
  std::string* volatile probe = new std::string(100, 'x');
  delete probe;
  REQUIRE(tierlab::test::allocations_this_thread() > c0);

  const std::string small = pgbench_csvlog(200), large = pgbench_csvlog(2000);
  const uint64_t a_small = allocations_converting(small), a_large = allocations_converting(large);
  INFO("allocations: " << a_small << " for 200 transactions of 8 sessions, " << a_large << " for 2,000");
  CHECK(a_large == a_small);
}
