// capture sniff against a real PostgreSQL on 127.0.0.1: live loopback capture
// of pgbench in every protocol mode, a tcpdump pcap converted afterwards, and a
// session that was open before the capture started. Loopback capture needs
// root (CAP_NET_RAW); without it these tests skip.
#include "support/background.h"
#include "support/support.h"

#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <libpq-fe.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;

namespace {

using tierlab::test::Background;

// Runs `sql` on `c`, which must succeed; returns the first column of its
// rows, comma-separated.
std::string exec(PGconn* c, const char* sql) {
  PGresult* res = PQexec(c, sql);
  INFO(sql << ": " << PQerrorMessage(c));
  REQUIRE((PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK));
  std::string v;
  for (int i = 0; i < PQntuples(res); ++i) v += std::string(i ? "," : "") + PQgetvalue(res, i, 0);
  PQclear(res);
  return v;
}

struct SessionCounts {
  std::string user, database, client;
  uint32_t flags = 0;
  uint64_t statements = 0, transactions = 0, gaps = 0, gap_bytes = 0, unit = 0;
  bool ended = false;
};

struct TraceCounts {
  std::map<uint64_t, SessionCounts> sessions;
  uint64_t statements = 0, transactions = 0, stream_gaps = 0, packet_drops = 0, unsupported = 0;
  std::map<std::string, std::string> meta;
  trace::Nanos min_ts = INT64_MAX, max_ts = INT64_MIN;
  trace::Header header;
};

TraceCounts count_trace(const std::string& path) {
  auto reader = trace::open_reader(path);
  TraceCounts t;
  t.header = reader->header();
  trace::Record r;
  while (reader->next(r)) {
    t.min_ts = std::min(t.min_ts, r.ts);
    t.max_ts = std::max(t.max_ts, r.ts);
    SessionCounts* s = r.session ? &t.sessions[r.session] : nullptr;
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, trace::SessionBegin>) {
            s->user = b.user;
            s->database = b.database;
            s->client = b.client_addr;
            s->flags = b.flags;
          } else if constexpr (std::is_same_v<T, trace::Query> ||
                               std::is_same_v<T, trace::Execute>) {
            ++s->statements;
            ++s->unit;
            ++t.statements;
          } else if constexpr (std::is_same_v<T, trace::Ready>) {
            if (b.status == 'I' && s->unit > 0) {
              ++s->transactions;
              ++t.transactions;
            }
            if (b.status == 'I') s->unit = 0;
          } else if constexpr (std::is_same_v<T, trace::SessionEnd>) {
            s->ended = true;
          } else if constexpr (std::is_same_v<T, trace::Loss>) {
            if (b.what == trace::LossKind::StreamGap) {
              ++t.stream_gaps;
              if (s) {
                ++s->gaps;
                s->gap_bytes += b.count;
              }
            }
            if (b.what == trace::LossKind::PacketDrop) t.packet_drops += b.count;
            if (b.what == trace::LossKind::Unsupported) t.unsupported += b.count;
          } else if constexpr (std::is_same_v<T, trace::Meta>) {
            t.meta[std::string(b.key)] = std::string(b.value);
          }
        },
        r.body);
  }
  return t;
}

uint64_t summary_number(const std::string& out, const std::string& label) {
  std::smatch m;
  std::regex re(label + ": ([0-9]+)");
  REQUIRE(std::regex_search(out, m, re));
  return std::stoull(m[1]);
}

// pgbench's "number of transactions actually processed: N/M".
uint64_t pgbench_processed(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("actually processed: ([0-9]+)")));
  return std::stoull(m[1]);
}

void init_sniff_pgbench(const pgtmp::Server& pg) {
  std::string out;
  int rc = pg.run_tool("pgbench", {"-i", "-q", "-s", "1"}, &out);
  INFO(out);
  REQUIRE(rc == 0);
}

constexpr int kSniffClients = 4;
constexpr int kSniffTxPerClient = 150;
constexpr uint64_t kSniffStatementsPerTx = 7;  // tpcb-like: BEGIN, 3 UPDATE, SELECT, INSERT, END

// pgbench clients are the sessions that ran transactions of 7 statements;
// pgbench's own setup connection runs a couple of single queries.
void check_pgbench_sessions(const TraceCounts& t, uint64_t processed) {
  uint64_t client_sessions = 0, tx = 0, st = 0;
  for (const auto& [id, s] : t.sessions) {
    INFO("session " << id << " " << s.client << ": " << s.statements << " statements, "
                    << s.transactions << " transactions");
    if (s.transactions == static_cast<uint64_t>(kSniffTxPerClient)) {
      ++client_sessions;
      tx += s.transactions;
      st += s.statements;
      CHECK(s.statements == kSniffTxPerClient * kSniffStatementsPerTx);
      CHECK(s.user == "postgres");
      CHECK(s.database == "postgres");
      CHECK((s.flags & trace::kSessionUnknownStartup) == 0);
    } else {
      CHECK(s.statements <= 4);  // the setup connection
    }
    CHECK(s.gaps == 0);
    CHECK(s.ended);
  }
  CHECK(client_sessions == static_cast<uint64_t>(kSniffClients));
  CHECK(tx == processed);
  CHECK(st == processed * kSniffStatementsPerTx);
  CHECK(t.stream_gaps == 0);
}

}  // namespace

TEST_CASE("sniff on loopback records pgbench in each protocol mode", "[integration][sniff]") {
  test::require_root("loopback packet capture");
  auto& pg = test::shared_server();
  init_sniff_pgbench(pg);
  for (const char* mode : {"simple", "extended", "prepared"}) {
    SECTION(mode) {
      test::TempDir dir;
      std::string trace_path = dir.file("sniff.tlt");
      Background sniff({TIERLAB_BINARY, "capture", "sniff", "--interface", "lo", "--port",
                        std::to_string(pg.port()), "--host", "127.0.0.1", "--out", trace_path},
                       dir.file("sniff.out"));
      REQUIRE(sniff.wait_for("capturing on"));
      trace::Nanos before = now_ns();
      std::string out;
      int rc = pg.run_tool("pgbench", {"-n", "-M", mode, "-c", std::to_string(kSniffClients), "-t",
                                       std::to_string(kSniffTxPerClient)},
                           &out);
      INFO(out);
      REQUIRE(rc == 0);
      uint64_t processed = pgbench_processed(out);
      REQUIRE(processed == static_cast<uint64_t>(kSniffClients * kSniffTxPerClient));
      REQUIRE(sniff.stop(SIGINT) == 0);
      trace::Nanos after = now_ns();
      std::string summary = sniff.out();
      INFO(summary << sniff.err());

      TraceCounts t = count_trace(trace_path);
      check_pgbench_sessions(t, processed);
      // The summary agrees with the trace.
      CHECK(summary_number(summary, "statements") == t.statements);
      CHECK(summary_number(summary, "transactions") == t.transactions);
      CHECK(summary_number(summary, "stream gaps") == 0);
      CHECK(summary_number(summary, "kernel drops") == 0);
      CHECK(t.meta["time_source"] == "kernel");
      // Packet times were converted to CLOCK_MONOTONIC.
      CHECK(t.min_ts >= before - 2'000'000'000);
      CHECK(t.max_ts <= after);
    }
  }
}

TEST_CASE("a tcpdump pcap of pgbench converts to a trace with the same counts",
          "[integration][sniff]") {
  test::require_root("tcpdump on loopback");
  if (access("/usr/bin/tcpdump", X_OK) != 0 && access("/usr/sbin/tcpdump", X_OK) != 0)
    test::skip("tcpdump is not installed");
  const char* tcpdump = access("/usr/bin/tcpdump", X_OK) == 0 ? "/usr/bin/tcpdump"
                                                               : "/usr/sbin/tcpdump";
  auto& pg = test::shared_server();
  init_sniff_pgbench(pg);
  test::TempDir dir;
  std::string pcap = dir.file("pg.pcap");
  Background dump({tcpdump, "-i", "lo", "-n", "-Z", "root", "-s", "0", "-w", pcap, "tcp", "port",
                   std::to_string(pg.port())},
                  dir.file("tcpdump.out"));
  REQUIRE(dump.wait_for("listening on"));
  std::string out;
  int rc = pg.run_tool("pgbench", {"-n", "-M", "extended", "-c", std::to_string(kSniffClients), "-t",
                                   std::to_string(kSniffTxPerClient)},
                       &out);
  INFO(out);
  REQUIRE(rc == 0);
  uint64_t processed = pgbench_processed(out);
  // tcpdump hands over packets when a ring block fills or times out (1 s);
  // on SIGINT it writes what it has.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  dump.stop(SIGINT);
  INFO(dump.err());
  REQUIRE(std::regex_search(dump.err(), std::regex("(^|\n)0 packets dropped by kernel")));

  std::string trace_path = dir.file("from-pcap.tlt");
  auto r = test::run_tierlab({"capture", "sniff", "--pcap", pcap, "--port",
                              std::to_string(pg.port()), "--out", trace_path});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  TraceCounts t = count_trace(trace_path);
  check_pgbench_sessions(t, processed);
  CHECK(summary_number(r.out, "statements") == t.statements);
  CHECK(t.meta["time_source"] == "pcap");
  // Record times map back to the packets' wall-clock time through the header.
  auto now_rt = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  CHECK(t.min_ts + t.header.realtime_offset_ns <= now_rt);
  CHECK(t.min_ts + t.header.realtime_offset_ns > now_rt - 600'000'000'000);
}

TEST_CASE("a session opened before the capture is joined at a message boundary",
          "[integration][sniff]") {
  test::require_root("loopback packet capture");
  auto& pg = test::shared_server();
  PGconn* c = PQconnectdb(pg.conninfo().c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  exec(c, "create table if not exists sniff_join (id int)");
  std::string port = exec(c, "select inet_client_port()");

  test::TempDir dir;
  {
    std::ofstream map(dir.file("sessions.map"));
    map << "# client user database\n127.0.0.1:" << port << " app_user app_db psql\n";
  }
  std::string trace_path = dir.file("join.tlt");
  Background sniff({TIERLAB_BINARY, "capture", "sniff", "--interface", "lo", "--port",
                    std::to_string(pg.port()), "--out", trace_path, "--session-map",
                    dir.file("sessions.map")},
                   dir.file("sniff.out"));
  REQUIRE(sniff.wait_for("capturing on"));

  exec(c, "select 1");
  exec(c, "select 2");
  exec(c, "select 3");
  const char* params[1] = {"42"};
  PGresult* res = PQexecParams(c, "select $1::int", 1, nullptr, params, nullptr, nullptr, 0);
  REQUIRE(PQresultStatus(res) == PGRES_TUPLES_OK);
  PQclear(res);
  exec(c, "begin");
  exec(c, "insert into sniff_join values (1)");
  exec(c, "commit");
  REQUIRE(sniff.stop(SIGINT) == 0);
  PQfinish(c);
  INFO(sniff.out() << sniff.err());

  TraceCounts t = count_trace(trace_path);
  REQUIRE(t.sessions.size() == 1);
  const SessionCounts& s = t.sessions.begin()->second;
  CHECK((s.flags & trace::kSessionUnknownStartup) != 0);
  CHECK(s.user == "app_user");
  CHECK(s.database == "app_db");
  CHECK(s.client == "127.0.0.1:" + port);
  CHECK(s.statements == 7);
  CHECK(s.transactions == 5);
  CHECK(s.gaps == 0);
  CHECK(summary_number(sniff.out(), "sessions") == 1);
  CHECK(sniff.out().find("1 joined mid-stream") != std::string::npos);
}

TEST_CASE("a session the capture joined inside a transaction replays from its next idle point",
          "[integration][sniff][replay]") {
  test::require_root("loopback packet capture");
  auto& pg = test::shared_server();
  PGconn* c = PQconnectdb(pg.conninfo().c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  exec(c, "drop table if exists sniff_tail");
  exec(c, "create table sniff_tail (id int)");
  // The capture starts inside this transaction: it sees an INSERT and the
  // ROLLBACK that undoes it, then an INSERT on its own.
  exec(c, "begin");
  exec(c, "insert into sniff_tail values (1)");
  test::TempDir dir;
  std::string trace_path = dir.file("tail.tlt");
  Background sniff({TIERLAB_BINARY, "capture", "sniff", "--interface", "lo", "--port",
                    std::to_string(pg.port()), "--out", trace_path},
                   dir.file("sniff.out"));
  REQUIRE(sniff.wait_for("capturing on"));
  exec(c, "insert into sniff_tail values (2)");
  exec(c, "rollback");
  exec(c, "insert into sniff_tail values (3)");
  REQUIRE(sniff.stop(SIGINT) == 0);
  INFO(sniff.out() << sniff.err());
  exec(c, "truncate sniff_tail");

  auto dry = test::run_tierlab({"replay", trace_path, "--dry-run"});
  INFO(dry.out << dry.err);
  REQUIRE(dry.status == 0);
  CHECK(dry.out.find("sessions joined inside a transaction: 1") != std::string::npos);
  CHECK(dry.out.find("statements: 1\n") != std::string::npos);

  // The replay commits nothing the capture rolled back.
  auto r = test::run_tierlab({"replay", trace_path, "--db", pg.conninfo(), "--max-speed"});
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.err.find("sessions the capture joined inside a transaction: 1; each replays from its next idle point") !=
        std::string::npos);
  CHECK(exec(c, "select id from sniff_tail order by id") == "3");
  exec(c, "drop table sniff_tail");
  PQfinish(c);
}

TEST_CASE("packets the kernel dropped from a full ring are in the summary and the trace",
          "[integration][sniff]") {
  test::require_root("loopback packet capture");
  auto& pg = test::shared_server();
  init_sniff_pgbench(pg);
  test::TempDir dir;
  std::string trace_path = dir.file("drops.tlt");
  Background sniff({TIERLAB_BINARY, "capture", "sniff", "--interface", "lo", "--port",
                    std::to_string(pg.port()), "--host", "127.0.0.1", "--buffer-size", "256k",
                    "--out", trace_path},
                   dir.file("sniff.out"));
  REQUIRE(sniff.wait_for("capturing on"));
  // A session the capture sees before, during and after the overflow.
  PGconn* c = PQconnectdb(pg.conninfo().c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  exec(c, "select 1");
  // A stopped capture reads nothing: two seconds of select-only traffic
  // (megabytes of packets) overflow a 256 KiB ring, and the session's
  // megabyte answer is lost with them.
  sniff.signal(SIGSTOP);
  std::string out;
  int rc = pg.run_tool("pgbench", {"-n", "-S", "-c", "2", "-T", "2"}, &out);
  exec(c, "select repeat('x', 1000000)");
  sniff.signal(SIGCONT);
  INFO(out);
  REQUIRE(rc == 0);
  // Once the capture has read the ring, the session's next answer comes
  // after the bytes it lost: a hole in its stream (the pgbench sessions
  // ended while the ring was full, and their losses may show as none).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  exec(c, "select 2");
  REQUIRE(sniff.stop(SIGINT) == 0);
  PQfinish(c);
  std::string summary = sniff.out();
  INFO(summary << sniff.err());

  uint64_t drops = summary_number(summary, "kernel drops");
  CHECK(drops > 0);
  CHECK(summary.find("the capture ring (256.0 KiB) overflowed") != std::string::npos);
  CHECK(summary.find("larger --buffer-size") != std::string::npos);
  TraceCounts t = count_trace(trace_path);
  CHECK(t.packet_drops == drops);
  // The lost packets left holes in the sessions they belonged to: counted,
  // in the summary and in the trace, and the sessions were still recorded.
  CHECK(t.stream_gaps > 0);
  CHECK(summary_number(summary, "stream gaps") == t.stream_gaps);
  CHECK(t.sessions.size() >= 2);
  CHECK(t.statements > 0);
}

TEST_CASE("capture sniff says in one line that unix sockets cannot be sniffed",
          "[integration][sniff]") {
  auto r = test::run_tierlab({"capture", "sniff", "--interface", "/var/run/postgresql", "--out",
                              "/tmp/unused.tlt"});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("cannot be sniffed") != std::string::npos);
}
