// tierlab capture log against the logs of a real PostgreSQL: pgbench in each
// protocol mode, with log_statement = all and log_min_duration_statement =
// 0, logged as stderr (default and RDS prefix), csvlog and jsonlog, each log
// (and pgreplay's replay file of the csvlog) read into a trace that counts
// what pgbench ran and replays it without errors.
#include "pgtmp/pgtmp.h"
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <thread>

using tierlab::test::TempDir;

namespace {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// pgbench's built-in TPC-B-like script, as a file: pgbench then runs no
// statement of its own (a built-in script makes it ask for the scale first).
const char* kTpcb =
    "\\set aid random(1, 100000 * :scale)\n"
    "\\set bid random(1, 1 * :scale)\n"
    "\\set tid random(1, 10 * :scale)\n"
    "\\set delta random(-5000, 5000)\n"
    "BEGIN;\n"
    "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n"
    "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n"
    "UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;\n"
    "UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;\n"
    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);\n"
    "END;\n";
constexpr int kTpcbStatements = 7;

// Two integer parameters added: the server infers $3's type from $4's cast,
// so it works only when the replay sends the values with type 0 (unknown),
// as pgbench did, not as text.
const char* kArith =
    "\\set a random(1, 1000)\n"
    "\\set b random(1, 1000)\n"
    "INSERT INTO arith (a, b, s) VALUES (:a, :b, :a + :b::integer);\n";

// Runs pgbench; returns the transactions it reports processed.
long pgbench(const tierlab::pgtmp::Server& pg, const std::vector<std::string>& args) {
  std::string out;
  int rc = pg.run_tool("pgbench", args, &out);
  INFO(out);
  REQUIRE(rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("number of transactions actually processed: (\\d+)/")));
  REQUIRE(out.find("number of failed transactions: 0 ") != std::string::npos);
  return std::stol(m[1]);
}

// PostgreSQL's default log_line_prefix, and RDS and Aurora's.
const char* kDefaultPrefix = "%m [%p] ";
const char* kRdsPrefix = "%t:%r:%u@%d:[%p]:";

// Points the server's log at files named `name` (.csv, .json beside) from
// now on, the stderr one with `prefix`.
void log_to(const tierlab::pgtmp::Server& pg, const std::string& name, const std::string& statement,
            const std::string& min_duration, const std::string& prefix = kDefaultPrefix) {
  // First to a file of its own: what the server logs between the reload and
  // the rotation goes to the file it was writing, already with the new
  // prefix, which the finished log must not get.
  pg.sql("ALTER SYSTEM SET log_filename = 'switching'");
  pg.sql("SELECT pg_reload_conf()");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pg.sql("SELECT pg_rotate_logfile()");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pg.sql("ALTER SYSTEM SET log_filename = '" + name + "'");
  pg.sql("ALTER SYSTEM SET log_line_prefix = '" + prefix + "'");
  pg.sql("ALTER SYSTEM SET log_statement = '" + statement + "'");
  pg.sql("ALTER SYSTEM SET log_min_duration_statement = '" + min_duration + "'");
  pg.sql("SELECT pg_reload_conf()");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pg.sql("SELECT pg_rotate_logfile()");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

}  // namespace

TEST_CASE("capture log: pgbench in each protocol mode and log setting, stderr (default and RDS prefix), csvlog, "
          "jsonlog: counts and a clean replay",
          "[log][pg][parallel]") {
  if (geteuid() != 0) tierlab::test::skip("the throwaway server's log files belong to the postgres user: needs root");
  tierlab::pgtmp::Options o;
  o.settings = {{"logging_collector", "on"},
                {"log_destination", "stderr,csvlog,jsonlog"},
                {"log_directory", "log"},
                {"log_filename", "setup"},
                {"log_connections", "on"},
                {"log_disconnections", "on"}};
  tierlab::pgtmp::Server pg(o);
  TempDir dir;
  for (const char* db : {"capdb", "repdb"}) {
    pg.sql(std::string("CREATE DATABASE ") + db);
    std::string out;
    REQUIRE(pg.run_tool("pgbench", {"-i", "-s", "1", "-q", db}, &out) == 0);
    pg.sql("CREATE TABLE arith (a integer, b integer, s integer)", db);
  }
  const std::string tpcb = dir.file("tpcb.sql"), arith = dir.file("arith.sql");
  std::ofstream(tpcb) << kTpcb;
  std::ofstream(arith) << kArith;
  ::chmod(dir.path().c_str(), 0755);  // pgbench runs as postgres

  struct Run {
    std::string name, mode, statement, min_duration, prefix;
  };
  // Each mode with log_statement = all and then log_min_duration_statement
  // = 0, logged as stderr with the default prefix, csvlog and jsonlog; and
  // again as stderr with RDS's prefix (a server writes one stderr log).
  std::vector<Run> runs;
  for (const char* mode : {"simple", "extended", "prepared"})
    for (const char* prefix : {kDefaultPrefix, kRdsPrefix}) {
      const std::string tag = std::string(mode) + (prefix == kRdsPrefix ? "-rds" : "");
      runs.push_back({tag, mode, "all", "-1", prefix});
      runs.push_back({tag + "-duration", mode, "none", "0", prefix});
    }
  int64_t arith_rows = 0;
  for (const Run& run : runs) {
    log_to(pg, run.name, run.statement, run.min_duration, run.prefix);
    const long txns = pgbench(pg, {"-n", "-M", run.mode, "-c", "8", "-j", "2", "-t", "15", "-f", tpcb, "capdb"});
    const long arith_txns = pgbench(pg, {"-n", "-M", run.mode, "-c", "2", "-t", "10", "-f", arith, "capdb"});
    REQUIRE(txns == 8 * 15);
    const long statements = txns * kTpcbStatements + arith_txns;
    log_to(pg, "idle", "none", "-1");  // the files are complete
    const bool rds = run.prefix == kRdsPrefix;
    std::vector<std::string> exts = {""};
    if (!rds) exts = {"", ".csv", ".json"};
    if (run.statement == "all" && !rds) {
      // pgreplay's replay file of the same csvlog (pgreplay reads only
      // log_statement = all logs), read by capture log as it is.
      const std::string csv = pg.data_dir() + "/log/" + run.name + ".csv";
      const std::string replay_file = pg.data_dir() + "/log/" + run.name + ".pgreplay";
      const std::string cmd = "pgreplay -f -c -o '" + replay_file + "' '" + csv + "' >/dev/null 2>&1; echo $?";
      REQUIRE(tierlab::test::shell_output(cmd) == "0");
      exts.push_back(".pgreplay");
    }
    for (const std::string& ext : exts) {
      const std::string log = pg.data_dir() + "/log/" + run.name + ext;
      INFO("log " << log);
      const std::string trace = dir.file(run.name + ext + ".tlt");
      // The statements that switch the log files ran in database postgres.
      auto cap = tierlab::test::run_tierlab({"capture", "log", log, "--out", trace, "--database", "capdb"});
      INFO(cap.out << cap.err);
      REQUIRE(cap.status == 0);
      CHECK(cap.out.find(" 0 unparsed lines, 0 truncated") != std::string::npos);
      // A stderr log's prefix is recognised by itself.
      if (ext.empty()) CHECK(cap.out.find("log_line_prefix '" + run.prefix + "'") != std::string::npos);
      const std::string dry = dir.file("dry.json");
      REQUIRE(tierlab::test::run_tierlab({"replay", trace, "--dry-run", "--json", dry}).status == 0);
      nlohmann::json d = read_json_file(dry);
      CHECK(d["statements"] == statements);
      CHECK(d["transactions"] == txns + arith_txns);
      CHECK(d["captured_errors"] == 0);
      const std::string rep = dir.file("replay.json");
      auto r = tierlab::test::run_tierlab(
          {"replay", trace, "--db", pg.conninfo("repdb"), "--database", "repdb", "--max-speed", "--json", rep});
      INFO(r.out << r.err);
      REQUIRE(r.status == 0);
      nlohmann::json j = read_json_file(rep);
      CHECK(j["errors"] == 0);
      CHECK(j["sessions_failed"] == 0);
      CHECK(j["statements"] == statements);
      CHECK(j["transactions"] == txns + arith_txns);
      arith_rows += arith_txns;
    }
  }
  // Every replayed sum is right, and each replay inserted its rows.
  CHECK(pg.sql("SELECT count(*) FROM arith WHERE s = a + b", "repdb") == std::to_string(arith_rows));
  CHECK(pg.sql("SELECT count(*) FROM arith", "repdb") == std::to_string(arith_rows));
}

TEST_CASE("capture log: a log no known prefix matches: exit 2, one line naming file and line, no trace",
          "[log][parallel]") {
  TempDir dir;
  const std::string log = dir.file("syslog.log"), out = dir.file("t.tlt");
  {
    std::ofstream f(log);
    for (int i = 0; i < 25; ++i) f << "Dec  3 10:00:00 db1 postgres[77]: [3-1] LOG:  statement: SELECT 1\n";
  }
  auto r = tierlab::test::run_tierlab({"capture", "log", log, "--out", out});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find(log + ":1: ") != std::string::npos);
  CHECK(access(out.c_str(), F_OK) != 0);
  // With the server's prefix it reads.
  auto ok = tierlab::test::run_tierlab(
      {"capture", "log", log, "--out", out, "--log-line-prefix", "%t %h postgres[%p]: [%l-1] "});
  INFO(ok.err);
  CHECK(ok.status == 2);  // %t has a date; this syslog-style time has none
  auto ok2 = tierlab::test::run_tierlab(
      {"capture", "log", log, "--out", out, "--log-line-prefix", "Dec  3 10:00:00 db1 postgres[%p]: [%l-1] "});
  INFO(ok2.err);
  CHECK(ok2.status == 0);
  CHECK(ok2.out.find("25 queries") != std::string::npos);
}
