// The wire decoder against byte sequences built by hand.
#include "capture/wire.h"
#include "wire_builder.h"

#include <catch2/catch.hpp>

#include <sstream>

using namespace tierlab;
using namespace tierlab::capture;
using namespace wiretest;

namespace wiretest {

std::string describe(const trace::Record& r) {
  std::ostringstream o;
  o << "s" << r.session << " ";
  std::visit(
      [&o](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, trace::SessionBegin>) {
          o << "begin user=" << b.user << " db=" << b.database << " app=" << b.application_name
            << " addr=" << b.client_addr << " pid=" << b.backend_pid << " flags=" << b.flags;
        } else if constexpr (std::is_same_v<T, trace::SessionEnd>) {
          o << "end " << static_cast<int>(b.reason);
        } else if constexpr (std::is_same_v<T, trace::Query>) {
          o << "query " << b.sql;
        } else if constexpr (std::is_same_v<T, trace::Parse>) {
          o << "parse " << b.statement << " [" << b.sql << "] types=";
          for (auto t : b.param_types) o << t << ",";
        } else if constexpr (std::is_same_v<T, trace::Bind>) {
          o << "bind " << b.portal << "/" << b.statement << " params=";
          for (const auto& p : b.params) {
            if (p.is_null) o << "null,";
            else o << p.format << ":" << p.value << ",";
          }
          o << " res=";
          for (auto f : b.result_formats) o << f << ",";
        } else if constexpr (std::is_same_v<T, trace::Execute>) {
          o << "execute " << b.portal << " " << b.max_rows;
        } else if constexpr (std::is_same_v<T, trace::Describe>) {
          o << "describe " << b.target << " " << b.name;
        } else if constexpr (std::is_same_v<T, trace::Close>) {
          o << "close " << b.target << " " << b.name;
        } else if constexpr (std::is_same_v<T, trace::Sync>) {
          o << "sync";
        } else if constexpr (std::is_same_v<T, trace::Flush>) {
          o << "flush";
        } else if constexpr (std::is_same_v<T, trace::CopyData>) {
          o << "copydata " << static_cast<int>(b.dir) << " " << b.data;
        } else if constexpr (std::is_same_v<T, trace::CopyDone>) {
          o << "copydone " << static_cast<int>(b.dir);
        } else if constexpr (std::is_same_v<T, trace::CopyFail>) {
          o << "copyfail " << b.message;
        } else if constexpr (std::is_same_v<T, trace::Result>) {
          o << "result " << b.tag;
          if (b.has_rows) o << " " << b.rows;
        } else if constexpr (std::is_same_v<T, trace::Error>) {
          o << "error " << b.sqlstate << " " << b.severity << " " << b.message;
        } else if constexpr (std::is_same_v<T, trace::Ready>) {
          o << "ready " << b.status;
        } else if constexpr (std::is_same_v<T, trace::Loss>) {
          o << "loss " << static_cast<int>(b.what) << " " << b.count;
        } else if constexpr (std::is_same_v<T, trace::Suspended>) {
          o << "suspended";
        } else if constexpr (std::is_same_v<T, trace::EmptyQuery>) {
          o << "empty";
        } else {
          o << "other";
        }
      },
      r.body);
  return o.str();
}

}  // namespace wiretest

namespace {

constexpr auto F = Direction::Frontend;
constexpr auto B = Direction::Backend;

struct Step {
  Direction d;
  Bytes bytes;
};

// Feeds a conversation in one piece per step, and again byte by byte, and
// checks both give the same records.
std::vector<std::string> run(const std::vector<Step>& steps, WireLimits limits = {},
                             bool check_bytewise = true) {
  LineSink whole;
  SessionDecoder dec(whole, limits);
  dec.begin(7, "127.0.0.1:5000", 0, 1);
  trace::Nanos t = 10;
  for (const auto& s : steps) {
    bool ok = dec.feed(s.d, s.bytes.data(), s.bytes.size(), t++);
    INFO(dec.error());
    REQUIRE(ok);
  }
  dec.end(dec.terminated() ? trace::EndReason::Clean : trace::EndReason::ClientAbort, t);
  if (check_bytewise) {
    LineSink bytewise;
    SessionDecoder dec2(bytewise, limits);
    dec2.begin(7, "127.0.0.1:5000", 0, 1);
    t = 10;
    for (const auto& s : steps) {
      for (uint8_t b : s.bytes) REQUIRE(dec2.feed(s.d, &b, 1, t));
      ++t;
    }
    dec2.end(dec2.terminated() ? trace::EndReason::Clean : trace::EndReason::ClientAbort, t);
    CHECK(bytewise.lines == whole.lines);
  }
  return whole.lines;
}

std::vector<Step> login() {
  return {{F, startup("alice", "shop", "pgbench")},
          {B, cat({auth_ok(), param_status("server_version", "15.4"), key_data(4242), ready('I')})}};
}

}  // namespace

TEST_CASE("wire: startup, simple query and terminate", "[wire]") {
  auto steps = login();
  steps.push_back({F, query("insert into t values (1)")});
  steps.push_back({B, cat({complete("INSERT 0 5"), ready('I')})});
  steps.push_back({F, terminate()});
  auto lines = run(steps);
  std::vector<std::string> want = {
      "s7 begin user=alice db=shop app=pgbench addr=127.0.0.1:5000 pid=4242 flags=0",
      "s7 ready I",
      "s7 query insert into t values (1)",
      "s7 result INSERT 5",
      "s7 ready I",
      "s7 end 0",
  };
  CHECK(lines == want);
}

TEST_CASE("wire: parameter status goes to the sink hook", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  dec.begin(1, "unix", trace::kSessionUnixSocket, 0);
  auto s = startup("bob", "");
  REQUIRE(dec.feed(F, s.data(), s.size(), 1));
  auto b = cat({auth_ok(), param_status("server_version", "15.4"), param_status("TimeZone", "UTC"), key_data(9), ready('I')});
  REQUIRE(dec.feed(B, b.data(), b.size(), 2));
  CHECK(sink.params == std::vector<std::string>{"server_version=15.4", "TimeZone=UTC"});
  REQUIRE(sink.lines.size() == 2);
  CHECK(sink.lines[0] == "s1 begin user=bob db=bob app= addr=unix pid=9 flags=2");
  CHECK(sink.times[0] == 1);  // the begin carries the startup time
  CHECK(dec.backend_pid() == 9);
}

TEST_CASE("wire: extended protocol with parameters and formats", "[wire]") {
  auto steps = login();
  steps.push_back({F, cat({Msg('P').str("s1").str("select $1, $2, $3").i16(3).i32(23).i32(25).i32(0),
                           Msg('B').str("p1").str("s1").i16(3).i16(0).i16(0).i16(1).i16(3)
                               .i32(2).raw("42").i32(-1).i32(3).raw("\x01\x02\x03").i16(1).i16(1),
                           Msg('D').u8('P').str("p1"), Msg('E').str("p1").i32(10),
                           Msg('C').u8('S').str("s1"), Msg('H'), sync_msg()})});
  steps.push_back({B, cat({Msg('1'), Msg('2'), Msg('T').i16(0), Msg('D').i16(1).i32(2).raw("42"),
                           complete("SELECT 1"), Msg('3'), ready('I')})});
  auto lines = run(steps);
  std::vector<std::string> want = {
      "s7 begin user=alice db=shop app=pgbench addr=127.0.0.1:5000 pid=4242 flags=0",
      "s7 ready I",
      "s7 parse s1 [select $1, $2, $3] types=23,25,0,",
      "s7 bind p1/s1 params=0:42,null,1:\x01\x02\x03, res=1,",
      "s7 describe P p1",
      "s7 execute p1 10",
      "s7 close S s1",
      "s7 flush",
      "s7 sync",
      "s7 result SELECT 1",
      "s7 ready I",
      "s7 end 1",
  };
  CHECK(lines == want);
}

TEST_CASE("wire: every answer is recorded: PortalSuspended and EmptyQueryResponse too", "[wire]") {
  auto steps = login();
  // A portal fetched 2 rows at a time (JDBC's fetch size), then an empty
  // statement, in one Sync group; then an empty simple Query.
  steps.push_back({F, cat({Msg('B').str("c1").str("s1").i16(0).i16(0).i16(0), Msg('E').str("c1").i32(2),
                           Msg('E').str("c1").i32(2), Msg('P').str("").str("").i16(0),
                           Msg('B').str("").str("").i16(0).i16(0).i16(0), Msg('E').str("").i32(0), sync_msg()})});
  steps.push_back({B, cat({Msg('2'), Msg('D').i16(1).i32(1).raw("1"), Msg('D').i16(1).i32(1).raw("2"), Msg('s'),
                           Msg('D').i16(1).i32(1).raw("3"), complete("SELECT 1"), Msg('1'), Msg('2'), Msg('I'),
                           ready('T')})});
  steps.push_back({F, Msg('Q').str("")});
  steps.push_back({B, cat({Msg('I'), ready('T')})});
  auto lines = run(steps);
  std::vector<std::string> want = {
      "s7 begin user=alice db=shop app=pgbench addr=127.0.0.1:5000 pid=4242 flags=0",
      "s7 ready I",
      "s7 bind c1/s1 params= res=",
      "s7 execute c1 2",
      "s7 execute c1 2",
      "s7 parse  [] types=",
      "s7 bind / params= res=",
      "s7 execute  0",
      "s7 sync",
      "s7 suspended",
      "s7 result SELECT 1",
      "s7 empty",
      "s7 ready T",
      "s7 query ",
      "s7 empty",
      "s7 ready T",
      "s7 end 1",
  };
  CHECK(lines == want);
}

TEST_CASE("wire: one parameter format applies to every parameter", "[wire]") {
  auto steps = login();
  steps.push_back({F, Msg('B').str("").str("").i16(1).i16(1).i16(2).i32(1).raw("a").i32(1).raw("b").i16(0)});
  auto lines = run(steps);
  CHECK(lines[2] == "s7 bind / params=1:a,1:b, res=");
}

TEST_CASE("wire: SSLRequest answered N, then startup", "[wire]") {
  std::vector<Step> steps = {{F, ssl_request()}, {B, Bytes{'N'}}};
  for (auto& s : login()) steps.push_back(s);
  auto lines = run(steps);
  CHECK(lines[0] == "s7 begin user=alice db=shop app=pgbench addr=127.0.0.1:5000 pid=4242 flags=0");
}

TEST_CASE("wire: SSLRequest accepted makes the session opaque and flagged TLS", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  dec.begin(3, "", 0, 0);
  auto s = ssl_request();
  REQUIRE(dec.feed(F, s.data(), s.size(), 1));
  uint8_t yes = 'S';
  REQUIRE(dec.feed(B, &yes, 1, 2));
  Bytes noise(100, 0xee);
  REQUIRE(dec.feed(F, noise.data(), noise.size(), 3));
  REQUIRE(dec.feed(B, noise.data(), noise.size(), 3));
  CHECK(dec.tls());
  dec.end(trace::EndReason::Clean, 4);
  CHECK(sink.lines.empty());  // no StartupMessage was ever visible
}

TEST_CASE("wire: CancelRequest records nothing", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  dec.begin(3, "", 0, 0);
  auto c = cancel_request(77, 88);
  REQUIRE(dec.feed(F, c.data(), c.size(), 1));
  CHECK(dec.cancel_request());
  dec.end(trace::EndReason::Clean, 2);
  CHECK(sink.lines.empty());
}

TEST_CASE("wire: classify_startup", "[wire]") {
  auto s = startup("u", "d");
  CHECK(classify_startup(s.data(), s.size(), 10000).kind == StartupKind::Startup);
  CHECK(classify_startup(s.data(), s.size() - 1, 10000).kind == StartupKind::Incomplete);
  CHECK(classify_startup(s.data(), 3, 10000).kind == StartupKind::Incomplete);
  auto r = ssl_request();
  CHECK(classify_startup(r.data(), r.size(), 10000).kind == StartupKind::SslRequest);
  auto g = Bytes(Msg(0).i32(80877104));
  CHECK(classify_startup(g.data(), g.size(), 10000).kind == StartupKind::GssEncRequest);
  auto c = cancel_request(1, 2);
  CHECK(classify_startup(c.data(), c.size(), 10000).kind == StartupKind::Cancel);
  auto v2 = Bytes(Msg(0).i32(0x20000).str("user").str("x").u8(0));
  CHECK(classify_startup(v2.data(), v2.size(), 10000).kind == StartupKind::Invalid);
  Bytes huge = {0, 1, 0, 0};
  CHECK(classify_startup(huge.data(), huge.size(), 10000).kind == StartupKind::Invalid);
}

TEST_CASE("wire: password and SASL messages are never recorded", "[wire]") {
  std::vector<Step> steps = {
      {F, startup("carol", "db")},
      {B, Msg('R').i32(10).str("SCRAM-SHA-256").u8(0)},
      {F, Msg('p').str("SCRAM-SHA-256").i32(20).raw("n,,n=,r=SECRETNONCE1")},
      {B, Msg('R').i32(11).raw("r=SECRETNONCE1xyz,s=c2FsdA==,i=4096")},
      {F, Msg('p').raw("c=biws,r=SECRETNONCE1xyz,p=SECRETPROOF")},
      {B, cat({Msg('R').i32(12).raw("v=SECRETSIG"), auth_ok(), key_data(5), ready('I')})},
      {F, Msg('p').str("hunter2-SECRET")},  // a cleartext password, out of turn
  };
  auto lines = run(steps);
  for (const auto& l : lines) CHECK(l.find("SECRET") == std::string::npos);
  CHECK(lines.size() == 3);  // begin, ready, end
}

TEST_CASE("wire: errors carry SQLSTATE and severity, FATAL is noticed", "[wire]") {
  auto steps = login();
  steps.push_back({F, query("select 1/0")});
  steps.push_back({B, cat({Msg('N').u8('S').str("NOTICE").u8('M').str("hi").u8(0),
                           error("ERROR", "22012", "division by zero"), ready('I')})});
  steps.push_back({B, error("FATAL", "57P01", "terminating connection due to administrator command")});
  LineSink sink;
  auto lines = run(steps);
  CHECK(lines[3] == "s7 error 22012 ERROR division by zero");
  CHECK(lines[5] == "s7 error 57P01 FATAL terminating connection due to administrator command");
  SessionDecoder dec(sink);
  dec.begin(1, "", 0, 0);
  for (auto& s : steps) dec.feed(s.d, s.bytes.data(), s.bytes.size(), 0);
  CHECK(dec.fatal_seen());
  CHECK(dec.stats().errors == 2);
}

TEST_CASE("wire: COPY in and out, both directions recorded", "[wire]") {
  auto steps = login();
  steps.push_back({F, query("copy t from stdin")});
  steps.push_back({B, Msg('G').u8(0).i16(2).i16(0).i16(0)});
  steps.push_back({F, cat({Msg('d').raw("1\ta\n"), Msg('d').raw("2\tb\n"), Msg('c')})});
  steps.push_back({B, cat({complete("COPY 2"), ready('I')})});
  steps.push_back({F, query("copy t to stdout")});
  steps.push_back({B, cat({Msg('H').u8(0).i16(2).i16(0).i16(0), Msg('d').raw("1\ta\n"), Msg('c'),
                           complete("COPY 1"), ready('I')})});
  steps.push_back({F, query("copy t from stdin")});
  steps.push_back({B, Msg('G').u8(0).i16(0)});
  steps.push_back({F, Msg('f').str("aborted by user")});
  auto lines = run(steps);
  std::vector<std::string> want = {
      "s7 query copy t from stdin", "s7 copydata 0 1\ta\n", "s7 copydata 0 2\tb\n",
      "s7 copydone 0", "s7 result COPY 2", "s7 ready I", "s7 query copy t to stdout",
      "s7 copydata 1 1\ta\n", "s7 copydone 1", "s7 result COPY 1", "s7 ready I",
      "s7 query copy t from stdin", "s7 copyfail aborted by user"};
  lines.erase(lines.begin(), lines.begin() + 2);
  lines.pop_back();
  CHECK(lines == want);
}

TEST_CASE("wire: long CopyData is recorded in the pieces it arrives in", "[wire]") {
  WireLimits lim;
  lim.copy_reassemble_max = 8;
  LineSink sink;
  SessionDecoder dec(sink, lim);
  dec.begin(1, "", 0, 0);
  auto s = startup("u", "d");
  dec.feed(F, s.data(), s.size(), 0);
  Bytes m = Msg('d').raw("0123456789abcdef");
  REQUIRE(dec.feed(F, m.data(), 10, 1));
  REQUIRE(dec.feed(F, m.data() + 10, m.size() - 10, 2));
  Bytes small = Msg('d').raw("xy");
  REQUIRE(dec.feed(F, small.data(), small.size(), 3));
  REQUIRE(sink.lines.size() == 4);
  CHECK(sink.lines[1] == "s1 copydata 0 01234");
  CHECK(sink.lines[2] == "s1 copydata 0 56789abcdef");
  CHECK(sink.lines[3] == "s1 copydata 0 xy");
  CHECK(dec.at_boundary(F));
}

TEST_CASE("wire: command tags split into tag and rows", "[wire]") {
  auto r = trace::split_command_tag("INSERT 0 5");
  CHECK(r.tag == "INSERT");
  CHECK(r.has_rows);
  CHECK(r.rows == 5);
  r = trace::split_command_tag("SELECT 12");
  CHECK((r.tag == "SELECT" && r.rows == 12));
  r = trace::split_command_tag("UPDATE 0");
  CHECK((r.tag == "UPDATE" && r.has_rows && r.rows == 0));
  r = trace::split_command_tag("CREATE TABLE");
  CHECK((r.tag == "CREATE TABLE" && !r.has_rows));
  r = trace::split_command_tag("BEGIN");
  CHECK((r.tag == "BEGIN" && !r.has_rows));
  r = trace::split_command_tag("COPY 100000");
  CHECK((r.tag == "COPY" && r.rows == 100000));
}

TEST_CASE("wire: make_error_response decodes back", "[wire]") {
  uint8_t buf[256];
  size_t n = make_error_response(buf, sizeof buf, "FATAL", "08006", "upstream lost");
  REQUIRE(n > 0);
  CHECK(make_error_response(buf, 10, "FATAL", "08006", "upstream lost") == 0);
  auto steps = login();
  steps.push_back({B, Bytes(buf, buf + n)});
  auto lines = run(steps);
  CHECK(lines[2] == "s7 error 08006 FATAL upstream lost");
}

TEST_CASE("wire: protocol errors name the message and the reason", "[wire]") {
  LineSink sink;
  WireLimits lim;
  lim.max_message = 1000;
  SessionDecoder dec(sink, lim);
  auto fresh = [&] {
    dec.begin(1, "", 0, 0);
    auto s = startup("u", "d");
    REQUIRE(dec.feed(F, s.data(), s.size(), 0));
  };

  fresh();
  Bytes unknown = Msg('%').raw("x");
  CHECK_FALSE(dec.feed(F, unknown.data(), unknown.size(), 1));
  CHECK(std::string(dec.error()) == "client message '%' at byte 27: unknown message type");
  CHECK_FALSE(dec.feed(F, unknown.data(), 1, 1));  // stays failed

  fresh();
  Bytes big = {'Q', 0, 0, 0x10, 0};
  CHECK_FALSE(dec.feed(F, big.data(), big.size(), 1));
  CHECK(std::string(dec.error()).find("exceeds the maximum message size 1000") != std::string::npos);

  fresh();
  Bytes badsync = {'S', 0, 0, 0, 5, 0};
  CHECK_FALSE(dec.feed(F, badsync.data(), badsync.size(), 1));
  CHECK(std::string(dec.error()).find("invalid length 5") != std::string::npos);

  fresh();
  Bytes trunc = Msg('B').str("").str("").i16(0).i16(1).i32(10).raw("abc").i16(0);
  CHECK_FALSE(dec.feed(F, trunc.data(), trunc.size(), 1));
  CHECK(std::string(dec.error()).find("message 'B'") != std::string::npos);

  fresh();
  Bytes noz = Msg('Q').raw("select 1");
  CHECK_FALSE(dec.feed(F, noz.data(), noz.size(), 1));
  CHECK(std::string(dec.error()).find("without terminating NUL") != std::string::npos);

  fresh();
  Bytes bad_ready = Msg('Z').u8('Q');
  CHECK_FALSE(dec.feed(B, bad_ready.data(), bad_ready.size(), 1));
  CHECK(std::string(dec.error()).find("server message 'Z'") != std::string::npos);

  dec.begin(2, "", 0, 0);
  Bytes v2 = Msg(0).i32(0x20000).str("user").str("x").u8(0);
  CHECK_FALSE(dec.feed(F, v2.data(), v2.size(), 1));
  CHECK(std::string(dec.error()).find("unsupported protocol version 2.0") != std::string::npos);

  dec.begin(2, "", 0, 0);
  Bytes huge_startup = {0, 0, 0x30, 0, 0, 3, 0, 0};
  CHECK_FALSE(dec.feed(F, huge_startup.data(), huge_startup.size(), 1));
  CHECK(std::string(dec.error()).find("startup packet at byte 0: length 12288 outside 8..10000") != std::string::npos);
}

TEST_CASE("wire: a gap inside a message body skips that message only", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  dec.begin(1, "", 0, 0);
  auto s = startup("u", "d");
  dec.feed(F, s.data(), s.size(), 0);
  Bytes q = query("select 'a long enough query'");
  Bytes q2 = query("select 2");
  REQUIRE(dec.feed(F, q.data(), 8, 1));
  dec.gap(F, 10, 2);
  REQUIRE(dec.feed(F, q.data() + 18, q.size() - 18, 3));
  REQUIRE(dec.feed(F, q2.data(), q2.size(), 4));
  REQUIRE(sink.lines.size() == 3);
  CHECK(sink.lines[1] == "s1 loss 2 10");
  CHECK(sink.lines[2] == "s1 query select 2");
}

TEST_CASE("wire: a gap across message boundaries resynchronises", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  dec.begin(1, "", 0, 0);
  auto s = startup("u", "d");
  dec.feed(F, s.data(), s.size(), 0);
  auto b1 = cat({auth_ok(), key_data(3), ready('I')});
  dec.feed(B, b1.data(), b1.size(), 0);
  // Server: half a DataRow, then a gap, then the rest of a row stream.
  Bytes row = Msg('D').i16(1).i32(6).raw("abcdef");
  Bytes part = cat({row, row, row});
  REQUIRE(dec.feed(B, part.data(), 7, 1));
  dec.gap(B, 500, 2);
  Bytes after = cat({Bytes(part.begin() + 9, part.end()), complete("SELECT 3"), ready('I')});
  REQUIRE(dec.feed(B, after.data(), after.size(), 3));
  CHECK(dec.at_boundary(B));
  REQUIRE(sink.lines.size() >= 4);
  CHECK(sink.lines[sink.lines.size() - 3] == "s1 loss 2 500");
  CHECK(sink.lines[sink.lines.size() - 2] == "s1 result SELECT 3");
  CHECK(sink.lines.back() == "s1 ready I");
  CHECK(dec.stats().hunt_discarded > 0);
}

TEST_CASE("wire: join mid-stream picks up at a validated boundary", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  JoinInfo info;
  info.user = "app";
  info.client_addr = "10.0.0.5:40000";
  dec.join(9, info, 100);
  REQUIRE(sink.lines.size() == 1);
  CHECK(sink.lines[0] == "s9 begin user=app db= app= addr=10.0.0.5:40000 pid=0 flags=1");
  // Client: the tail of a Bind, then Execute + Sync.
  Bytes bind = Msg('B').str("").str("P0_1").i16(0).i16(1).i32(4).raw("1234").i16(0);
  Bytes f = cat({Bytes(bind.begin() + 6, bind.end()), Msg('E').str("").i32(0), sync_msg()});
  REQUIRE(dec.feed(F, f.data(), f.size(), 101));
  Bytes b = cat({Bytes{0x42, 0x13}, Msg('2'), Msg('D').i16(1).i32(1).raw("x"), complete("SELECT 1"), ready('I')});
  REQUIRE(dec.feed(B, b.data(), b.size(), 102));
  std::vector<std::string> want = {"s9 execute  0", "s9 sync", "s9 result SELECT 1", "s9 ready I"};
  CHECK(std::vector<std::string>(sink.lines.begin() + 1, sink.lines.end()) == want);
  dec.end(trace::EndReason::Unknown, 103);
  CHECK(sink.lines.back() == "s9 end 5");
}

TEST_CASE("wire: the decoder resets between sessions", "[wire]") {
  LineSink sink;
  SessionDecoder dec(sink);
  for (uint64_t id = 1; id <= 3; ++id) {
    dec.begin(id, "", 0, 0);
    auto st = login();
    for (auto& s : st) REQUIRE(dec.feed(s.d, s.bytes.data(), s.bytes.size(), 0));
    Bytes half = query("select 1");
    REQUIRE(dec.feed(F, half.data(), 3, 0));  // leave a message half-read
    dec.end(trace::EndReason::ClientAbort, 0);
  }
  CHECK(sink.lines.size() == 9);
  CHECK(sink.lines[6].rfind("s3 begin", 0) == 0);
}
