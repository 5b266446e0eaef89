// replay --sync commit against a throwaway PostgreSQL: work that followed
// another session's commit at capture waits for that commit in the replay,
// at max speed and at speed 4 (a DDL session then DML sessions, an insert
// read back by a later session, a sequence's values), and without it
// (--sync none) the DML overtakes the DDL. A predecessor that fails counts
// as done at once; one that is slow is waited for up to --sync-timeout.
//
// The traces are written with the trace writer: each makes the session
// whose commit the others need busy first (pg_sleep, quick at capture or
// not), so that without the commit order the others reliably go first.
#include "replay/replay.h"
#include "support/io_env.h"
#include "support/support.h"
#include "tests/integration/replay_traces.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>

using namespace tierlab;
using namespace replay_test;
using tierlab::test::TempDir;

namespace {

replay::Workload load_sync_file(const std::string& path) {
  auto r = trace::open_reader(path);
  return replay::load(*r);
}

replay::Options sync_opts_for(const pgtmp::Server& pg, bool sync, bool max_speed) {
  replay::Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.threads = 2;
  o.sync = sync;
  o.max_speed = max_speed;
  o.speed = 4;
  o.io = tierlab::test::replay_io();
  return o;
}

// Session 1 sleeps 0.5 s (a read: no commit point), creates sync_ddl at
// 600 ms and stays open until 2 s; sessions 2 and 3 start at 700 ms, after
// the CREATE committed, and each insert 3 rows (a transaction and an
// autocommit INSERT) and count them.
std::string write_ddl_trace(const TempDir& dir) {
  std::string path = dir.file("ddl.tlt");
  TraceBuilder b(path);
  b.begin(0, 1, "postgres");
  b.query(1 * kMs, 1, "SELECT pg_sleep(0.5)", "SELECT", true, 1, 500 * kMs);
  b.query(600 * kMs, 1, "CREATE TABLE sync_ddl(s int, a int)", "CREATE TABLE", false, 0);
  b.query(1900 * kMs, 1, "SELECT 1", "SELECT", true, 1);
  b.end(2000 * kMs, 1);
  for (uint64_t s = 2; s <= 3; ++s) {
    const std::string n = std::to_string(s);
    const Nanos t = 700 * kMs + static_cast<Nanos>(s) * kMs;
    b.begin(t, s, "postgres");
    b.query(t + 10 * kMs, s, "BEGIN", "BEGIN", false, 0, kMs, 'T');
    b.query(t + 20 * kMs, s, "INSERT INTO sync_ddl VALUES (" + n + ", 1)", "INSERT", true, 1, kMs, 'T');
    b.query(t + 30 * kMs, s, "INSERT INTO sync_ddl VALUES (" + n + ", 2)", "INSERT", true, 1, kMs, 'T');
    b.query(t + 40 * kMs, s, "COMMIT", "COMMIT", false, 0);
    b.query(t + 50 * kMs, s, "INSERT INTO sync_ddl VALUES (" + n + ", 3)", "INSERT", true, 1);
    b.query(t + 60 * kMs, s, "SELECT a FROM sync_ddl WHERE s = " + n, "SELECT", true, 3);
    b.end(t + 100 * kMs, s);
  }
  b.close();
  return path;
}

}  // namespace

TEST_CASE("replay --sync commit: DML sessions wait for the DDL session's CREATE, --sync none lets them overtake it",
          "[replay][pg][sync]") {
  auto& pg = tierlab::test::shared_server();
  TempDir dir;
  const replay::Workload w = load_sync_file(write_ddl_trace(dir));
  CHECK(w.summary().commit_points == 5);  // the CREATE, two COMMITs, two autocommit INSERTs
  const bool max_speed = GENERATE(true, false);
  const std::string way = GENERATE(std::string("direct"), std::string("libpq"));
  INFO((max_speed ? "max speed" : "speed 4") << ", " << way);
  replay::Options o = sync_opts_for(pg, true, max_speed);
  o.direct = way == "direct";
  pg.sql("DROP TABLE IF EXISTS sync_ddl");
  replay::Report r = replay::run(w, o);
  INFO(r.first_session_error);
  CHECK(r.sessions_failed == 0);
  CHECK(r.errors == 0);
  CHECK(r.divergence_error_status == 0);
  CHECK(r.divergence_row_count == 0);
  CHECK(r.sync);
  CHECK(r.commit_points == 5);
  // The two DML sessions (at speed 4: their starts) waited for the CREATE,
  // about the 0.5 s the DDL session sleeps first.
  CHECK(r.sync_waits >= 2);
  CHECK(r.sync_wait_max_ms > 200);
  CHECK(r.sync_timeouts == 0);
  CHECK(pg.sql("SELECT count(*) FROM sync_ddl") == "6");

  // Without the commit order the inserts run while the CREATE is still to
  // come: they fail (42P01, then 25P02 in the transaction), and the
  // DDL session's CREATE succeeds on an empty table.
  o.sync = false;
  pg.sql("DROP TABLE IF EXISTS sync_ddl");
  r = replay::run(w, o);
  CHECK_FALSE(r.sync);
  CHECK(r.sync_waits == 0);
  CHECK(r.divergence_new_errors >= 4);
  CHECK(pg.sql("SELECT count(*) FROM sync_ddl") == "0");
}

TEST_CASE("replay --sync commit: rows one session inserted are there for a later session's select, as captured",
          "[replay][pg][sync]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("CREATE TABLE IF NOT EXISTS sync_rows(a int)");
  TempDir dir;
  std::string path = dir.file("rows.tlt");
  {
    TraceBuilder b(path);
    // Session 1 (writer): busy 0.3 s, then inserts 100 rows at 400 ms.
    b.begin(0, 1, "postgres");
    b.query(1 * kMs, 1, "SELECT pg_sleep(0.3)", "SELECT", true, 1, 300 * kMs);
    b.query(400 * kMs, 1, "INSERT INTO sync_rows SELECT generate_series(1, 100)", "INSERT", true, 100);
    b.query(1500 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(1600 * kMs, 1);
    // Session 2 (reader), open from the start: reads them at 500 ms, and
    // once more inside a transaction begun after the insert.
    b.begin(2 * kMs, 2, "postgres");
    b.query(3 * kMs, 2, "SELECT 1", "SELECT", true, 1);
    b.query(500 * kMs, 2, "SELECT a FROM sync_rows", "SELECT", true, 100);
    b.query(510 * kMs, 2, "BEGIN", "BEGIN", false, 0, kMs, 'T');
    b.query(520 * kMs, 2, "SELECT count(*) FROM sync_rows WHERE a > 50", "SELECT", true, 1, kMs, 'T');
    b.query(530 * kMs, 2, "SELECT a FROM sync_rows WHERE a > 50", "SELECT", true, 50, kMs, 'T');
    b.query(540 * kMs, 2, "COMMIT", "COMMIT", false, 0);
    b.end(600 * kMs, 2);
    b.close();
  }
  const replay::Workload w = load_sync_file(path);
  CHECK(w.summary().commit_points == 1);  // the INSERT; the reads change nothing
  for (bool max_speed : {true, false}) {
    INFO((max_speed ? "max speed" : "speed 4"));
    pg.sql("TRUNCATE sync_rows");
    replay::Report r = replay::run(w, sync_opts_for(pg, true, max_speed));
    INFO(r.first_session_error);
    CHECK(r.errors == 0);
    CHECK(r.divergence_error_status == 0);
    CHECK(r.divergence_row_count == 0);  // 100 and 50 rows, as captured
    CHECK(r.sync_waits == 1);            // the reader's select at 500 ms
    CHECK(pg.sql("SELECT count(*) FROM sync_rows") == "100");
    // Without the order the reader finds nothing.
    pg.sql("TRUNCATE sync_rows");
    r = replay::run(w, sync_opts_for(pg, false, max_speed));
    CHECK(r.divergence_row_count >= 1);
  }
}

TEST_CASE("replay --sync commit: a sequence hands out its values in the captured order", "[replay][pg][sync]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("CREATE SEQUENCE IF NOT EXISTS sync_seq");
  pg.sql("CREATE TABLE IF NOT EXISTS sync_seqlog(who text, v bigint)");
  TempDir dir;
  std::string path = dir.file("seq.tlt");
  {
    TraceBuilder b(path);
    // Session 1 takes values 1 to 3 (an autocommit INSERT each, and a
    // plain nextval); session 2, open all along, takes the next one.
    b.begin(0, 1, "postgres");
    b.query(1 * kMs, 1, "SELECT pg_sleep(0.3)", "SELECT", true, 1, 300 * kMs);
    b.query(400 * kMs, 1, "INSERT INTO sync_seqlog SELECT 's1', nextval('sync_seq')", "INSERT", true, 1);
    b.query(410 * kMs, 1, "INSERT INTO sync_seqlog SELECT 's1', nextval('sync_seq')", "INSERT", true, 1);
    b.query(420 * kMs, 1, "SELECT nextval('sync_seq')", "SELECT", true, 1);
    b.query(1500 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(1600 * kMs, 1);
    b.begin(2 * kMs, 2, "postgres");
    b.query(3 * kMs, 2, "SELECT 1", "SELECT", true, 1);
    b.query(500 * kMs, 2, "INSERT INTO sync_seqlog SELECT 's2', nextval('sync_seq')", "INSERT", true, 1);
    b.end(600 * kMs, 2);
    b.close();
  }
  const replay::Workload w = load_sync_file(path);
  CHECK(w.summary().commit_points == 4);  // the plain nextval is one
  auto values = [&] { return pg.sql("SELECT string_agg(who || ':' || v, ',' ORDER BY v) FROM sync_seqlog"); };
  for (bool max_speed : {true, false}) {
    INFO((max_speed ? "max speed" : "speed 4"));
    pg.sql("TRUNCATE sync_seqlog");
    pg.sql("ALTER SEQUENCE sync_seq RESTART WITH 1");
    replay::Report r = replay::run(w, sync_opts_for(pg, true, max_speed));
    INFO(r.first_session_error);
    CHECK(r.errors == 0);
    CHECK(r.divergence_error_status == 0);
    CHECK(r.divergence_row_count == 0);
    CHECK(values() == "s1:1,s1:2,s2:4");
    // Without the order session 2 takes the first value.
    pg.sql("TRUNCATE sync_seqlog");
    pg.sql("ALTER SEQUENCE sync_seq RESTART WITH 1");
    replay::run(w, sync_opts_for(pg, false, max_speed));
    CHECK(values() == "s2:1,s1:2,s1:3");
  }
}

TEST_CASE("replay --sync commit: a failed predecessor is not waited for, a slow one up to --sync-timeout",
          "[replay][pg][sync]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("CREATE TABLE IF NOT EXISTS sync_wait(a int)");
  TempDir dir;
  SECTION("the session with the commit cannot connect: its commits count as done at once") {
    std::string path = dir.file("failed.tlt");
    {
      TraceBuilder b(path);
      b.begin(0, 1, "postgres");
      b.query(1 * kMs, 1, "SELECT 1", "SELECT", true, 1);
      b.end(2000 * kMs, 1);
      b.begin(1 * kMs, 2, "postgres", "sync_no_such_database");
      b.query(100 * kMs, 2, "INSERT INTO sync_wait VALUES (1)", "INSERT", true, 1);
      b.end(200 * kMs, 2);
      // A read of the table waits for the insert (another insert would not).
      b.begin(2 * kMs, 3, "postgres");
      b.query(300 * kMs, 3, "SELECT count(*) FROM sync_wait", "SELECT", true, 1);
      b.end(400 * kMs, 3);
      b.close();
    }
    replay::Options o = sync_opts_for(pg, true, true);
    o.sync_timeout_ns = 30'000'000'000;
    const auto t0 = std::chrono::steady_clock::now();
    replay::Report r = replay::run(load_sync_file(path), o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.sessions_failed == 1);
    CHECK(r.sync_timeouts == 0);
    CHECK(s < 10);  // not the 30 s timeout
    CHECK(r.divergence_new_errors == 0);
  }
  SECTION("the commit comes 2 s late: the wait gives up after --sync-timeout and is counted") {
    std::string path = dir.file("slow.tlt");
    {
      TraceBuilder b(path);
      // Quick at capture, 2 s in the replay: the transaction's pg_sleep.
      b.begin(0, 1, "postgres");
      b.query(1 * kMs, 1, "BEGIN", "BEGIN", false, 0, kMs, 'T');
      b.query(2 * kMs, 1, "INSERT INTO sync_wait VALUES (3)", "INSERT", true, 1, kMs, 'T');
      b.query(3 * kMs, 1, "SELECT pg_sleep(2)", "SELECT", true, 1, kMs, 'T');
      b.query(4 * kMs, 1, "COMMIT", "COMMIT", false, 0);
      b.end(10 * kMs, 1);
      b.begin(1 * kMs, 2, "postgres");
      b.query(20 * kMs, 2, "SELECT count(*) FROM sync_wait", "SELECT", true, 1);
      b.end(30 * kMs, 2);
      b.close();
    }
    replay::Options o = sync_opts_for(pg, true, true);
    o.sync_timeout_ns = 200'000'000;
    replay::Report r = replay::run(load_sync_file(path), o);
    CHECK(r.sync_waits == 1);
    CHECK(r.sync_timeouts == 1);
    CHECK(r.sync_wait_max_ms >= 190);
    CHECK(r.sync_wait_max_ms < 1500);
    // With no limit it waits for the commit.
    o.sync_timeout_ns = 0;
    r = replay::run(load_sync_file(path), o);
    CHECK(r.sync_timeouts == 0);
    CHECK(r.sync_wait_max_ms >= 1500);
  }
}

TEST_CASE("replay --sync commit: work on other rows and tables does not wait, work on the same row does, --sync all waits for all",
          "[replay][pg][sync]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("DROP TABLE IF EXISTS sync_rowkey");
  pg.sql("CREATE TABLE sync_rowkey(k int PRIMARY KEY, v int, t timestamptz)");
  pg.sql("CREATE TABLE IF NOT EXISTS sync_other(t timestamptz)");
  TempDir dir;
  std::string path = dir.file("rowkey.tlt");
  {
    TraceBuilder b(path);
    // Session 1: busy 0.3 s, then sets row 1 at 400 ms.
    b.begin(0, 1, "postgres");
    b.query(1 * kMs, 1, "SELECT pg_sleep(0.3)", "SELECT", true, 1, 300 * kMs);
    b.query(400 * kMs, 1, "UPDATE sync_rowkey SET v = 1, t = clock_timestamp() WHERE k = 1", "UPDATE", true, 1);
    b.query(1500 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(1600 * kMs, 1);
    // Session 2, after that commit: row 2 and another table, in a
    // transaction; then row 1, which it must find set.
    b.begin(2 * kMs, 2, "postgres");
    b.query(3 * kMs, 2, "SELECT 1", "SELECT", true, 1);
    b.query(500 * kMs, 2, "BEGIN", "BEGIN", false, 0, kMs, 'T');
    b.query(501 * kMs, 2, "UPDATE sync_rowkey SET v = 2 WHERE k = 2", "UPDATE", true, 1, kMs, 'T');
    b.query(502 * kMs, 2, "INSERT INTO sync_other VALUES (clock_timestamp())", "INSERT", true, 1, kMs, 'T');
    b.query(503 * kMs, 2, "COMMIT", "COMMIT", false, 0);
    b.query(510 * kMs, 2, "SELECT v FROM sync_rowkey WHERE k = 1 AND v = 1", "SELECT", true, 1);
    b.end(600 * kMs, 2);
    b.close();
  }
  const replay::Workload w = load_sync_file(path);
  auto reset = [&] {
    pg.sql("DELETE FROM sync_rowkey");
    pg.sql("DELETE FROM sync_other");
    pg.sql("INSERT INTO sync_rowkey VALUES (1, 0), (2, 0)");
  };
  // Whether session 2's transaction committed before session 1's update.
  auto overtook = [&] {
    return pg.sql("SELECT (SELECT max(t) FROM sync_other) < (SELECT t FROM sync_rowkey WHERE k = 1)") == "t";
  };
  for (bool max_speed : {true, false}) {
    INFO((max_speed ? "max speed" : "speed 4"));
    reset();
    replay::Report r = replay::run(w, sync_opts_for(pg, true, max_speed));
    INFO(r.first_session_error);
    CHECK(r.errors == 0);
    CHECK(r.divergence_row_count == 0);  // row 1 was set when read
    CHECK(r.sync_waits == 1);            // the read of row 1 only
    CHECK(r.sync_wait_max_ms > 100);
    CHECK_FALSE(r.sync_all);
    CHECK(overtook());                   // row 2 and sync_other did not wait
    // --sync all: the transaction waits for the update of row 1.
    reset();
    replay::Options o = sync_opts_for(pg, true, max_speed);
    o.sync_all = true;
    r = replay::run(w, o);
    CHECK(r.errors == 0);
    CHECK(r.divergence_row_count == 0);
    CHECK(r.sync_all);
    CHECK(r.sync_waits >= 1);
    CHECK(r.sync_wait_max_ms > 100);
    CHECK_FALSE(overtook());
  }
}

TEST_CASE("replay --sync and --sync-timeout: the report and JSON say what waited, bad values are refused",
          "[replay][pg][sync][cli]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("DROP TABLE IF EXISTS sync_ddl");
  TempDir dir;
  const std::string path = write_ddl_trace(dir);
  const std::string json = dir.file("r.json");
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo(), "--user", pg.superuser(),
                                       "--max-speed", "--json", json});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("commit order: kept (--sync commit), 5 commit points; ") != std::string::npos);
  std::ifstream in(json);
  auto j = nlohmann::json::parse(in);
  CHECK(j["sync"]["mode"] == "commit");
  CHECK(j["sync"]["commit_points"] == 5);
  CHECK(j["sync"]["units_waited"].get<uint64_t>() >= 2);
  CHECK(j["sync"]["wait_s"].get<double>() > 0.2);
  CHECK(j["sync"]["wait_p99_ms"].get<double>() > 200);
  CHECK(j["sync"]["timeouts"] == 0);
  CHECK(j["sync"]["timeout_s"] == 10.0);

  r = tierlab::test::run_tierlab({"replay", path, "--dry-run"});
  CHECK(r.out.find("commit points: 5 ") != std::string::npos);

  for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--sync", "always"},
                                    {"--sync-timeout", "soon"}}) {
    r = tierlab::test::run_tierlab({"replay", path, "--db", "host=127.0.0.1 port=1", flag, value});
    INFO(flag << " " << value << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind("tierlab: " + flag, 0) == 0);
    CHECK(r.err.find('\n') == r.err.size() - 1);
  }
}
