// tierlab replay from the command line: how a replay ends short of its
// trace (a stop, sessions that fail, a target that does not answer), how
// failed transactions count, where sessions connect, and input it refuses.
#include "support/background.h"
#include "support/support.h"
#include "tests/integration/replay_traces.h"

#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>

using namespace tierlab;
using namespace replay_test;
using tierlab::test::TempDir;

namespace {

nlohmann::json read_cli_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A TCP listener on 127.0.0.1 that accepts connections into its backlog
// and never answers: a target that hangs.
struct SilentListener {
  int fd = -1;
  int port = 0;
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(fd, 16) == 0);
    socklen_t len = sizeof a;
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { close(fd); }
};

}  // namespace

TEST_CASE("SIGINT or SIGTERM stops a replay: the report and JSON cover what ran, exit 128 + signal",
          "[replay][pg][cli][stop]") {
  auto& pg = tierlab::test::shared_server();
  TempDir dir;
  std::string path = dir.file("long.tlt");
  {
    // Two sessions, a statement every 50 ms for 20 s each.
    TraceBuilder b(path);
    for (uint64_t s = 1; s <= 2; ++s) {
      b.begin(0, s, pg.superuser());
      for (int i = 0; i < 400; ++i)
        b.query((i + 1) * 50 * kMs, s, "SELECT " + std::to_string(i), "SELECT", true, 1);
      b.end(20100 * kMs, s);
    }
    b.close();
  }
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    INFO(name);
    std::string json = dir.file("stop.json");
    std::ofstream(json) << "{\"earlier\": true}\n";
    tierlab::test::Background bg({TIERLAB_BINARY, "replay", path, "--db", pg.conninfo(), "-P", "0.2", "--json",
                                  json},
                                 dir.file("stop.out"));
    REQUIRE(bg.wait_for("progress: 0.4 s"));
    auto t0 = std::chrono::steady_clock::now();
    int status = bg.stop(sig);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string out = bg.out();
    INFO(out << bg.err());
    CHECK(status == 128 + sig);
    CHECK(took < 3);
    CHECK(out.find("stopped by " + name + " after ") != std::string::npos);
    CHECK(out.find("number of sessions: 2 (2 cut short by " + name + ")") != std::string::npos);
    CHECK(out.find("errors by SQLSTATE: none") != std::string::npos);
    CHECK(bg.err().find("tierlab: replay: stopped by " + name + "; the report covers what ran before it") !=
          std::string::npos);
    auto j = read_cli_json(json);
    CHECK(j["stopped"] == name);
    CHECK(j["sessions_stopped"] == 2);
    CHECK(j["transactions"].get<uint64_t>() >= 12);   // at least 0.4 s of two sessions at 20 per second
    CHECK(j["transactions"].get<uint64_t>() < 400);   // well short of 800
    CHECK(j["duration_s"].get<double>() < 10);
    CHECK(j["errors"] == 0);
  }
  // The sessions' connections are closed, not left behind.
  std::string left;
  for (int i = 0; i < 50; ++i) {
    left = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'replay-test'");
    while (!left.empty() && (left.back() == '\n' || left.back() == ' ')) left.pop_back();
    if (left == "0") break;
    usleep(100 * 1000);
  }
  CHECK(left == "0");
}

TEST_CASE("a replay whose sessions failed reports them and exits 1", "[replay][pg][cli][stop]") {
  auto& pg = tierlab::test::shared_server();
  TempDir dir;
  std::string path = dir.file("roles.tlt");
  {
    TraceBuilder b(path);
    b.begin(0, 1, pg.superuser());
    b.begin(5 * kMs, 2, "captured_other");
    for (uint64_t s = 1; s <= 2; ++s) {
      for (int i = 0; i < 5; ++i)
        b.query((10 + i * 5) * kMs, s, "SELECT " + std::to_string(i), "SELECT", true, 1);
      b.end(60 * kMs, s);
    }
    b.close();
  }
  std::string map = dir.file("users.map");
  std::ofstream(map) << "captured_other = tierlab_no_such_role\n";
  std::string json = dir.file("r.json");
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo(), "--user-map", map, "--json", json});
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK(r.out.find("number of sessions: 2 (1 failed: ") != std::string::npos);
  CHECK(r.out.find("number of transactions actually processed: 5\n") != std::string::npos);
  CHECK(r.err.find("tierlab: replay: 1 of 2 sessions failed (") != std::string::npos);
  CHECK(r.err.find("tierlab_no_such_role") != std::string::npos);
  CHECK(r.err.find("; the results are incomplete") != std::string::npos);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  auto j = read_cli_json(json);
  CHECK(j["sessions_failed"] == 1);
  CHECK(j["transactions"] == 5);
}

TEST_CASE("failed transactions are counted apart, as pgbench does, and tps counts the others",
          "[replay][pg][cli]") {
  auto& pg = tierlab::test::shared_server();
  TempDir dir;
  std::string path = dir.file("failed.tlt");
  {
    TraceBuilder b(path);
    b.begin(0, 1, pg.superuser());
    Nanos t = 10 * kMs;
    for (int i = 0; i < 6; ++i, t += 5 * kMs) b.query(t, 1, "SELECT " + std::to_string(i), "SELECT", true, 1);
    // An autocommit statement that fails: a failed transaction.
    b.query_error(t, 1, "SELECT * FROM tierlab_missing_table", "42P01");
    t += 5 * kMs;
    // BEGIN; a failing statement; a skipped one; ROLLBACK: one failed transaction.
    b.query(t, 1, "BEGIN", "BEGIN", false, 0, kMs, 'T');
    t += 5 * kMs;
    b.query_error(t, 1, "SELECT * FROM tierlab_missing_table", "42P01");
    t += 5 * kMs;
    b.query_error(t, 1, "SELECT 1", "25P02");
    t += 5 * kMs;
    b.query(t, 1, "ROLLBACK", "ROLLBACK", false, 0);
    t += 5 * kMs;
    // BEGIN; SELECT; COMMIT: processed.
    b.query(t, 1, "BEGIN", "BEGIN", false, 0, kMs, 'T');
    b.query(t + 5 * kMs, 1, "SELECT 7", "SELECT", true, 1, kMs, 'T');
    b.query(t + 10 * kMs, 1, "COMMIT", "COMMIT", false, 0);
    b.end(t + 20 * kMs, 1);
    b.close();
  }
  std::string json = dir.file("r.json");
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo(), "--json", json});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("number of transactions actually processed: 7\n") != std::string::npos);
  CHECK(r.out.find("number of failed transactions: 2 (22.222%)\n") != std::string::npos);
  CHECK(r.out.find("divergence: 0 error status") != std::string::npos);
  auto j = read_cli_json(json);
  CHECK(j["transactions"] == 7);
  CHECK(j["failed_transactions"] == 2);
  CHECK(j["tps"].get<double>() == Approx(7 / j["duration_s"].get<double>()).epsilon(0.001));
}

TEST_CASE("a target that does not answer: connect_timeout gives up, a stop ends the wait", "[replay][cli][stop]") {
  SilentListener target;
  TempDir dir;
  std::string path = dir.file("one.tlt");
  {
    TraceBuilder b(path);
    b.begin(0, 1, "postgres");
    b.query(10 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(20 * kMs, 1);
    b.close();
  }
  const std::string db = "host=127.0.0.1 port=" + std::to_string(target.port) + " sslmode=disable gssencmode=disable";
  auto t0 = std::chrono::steady_clock::now();
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", db + " connect_timeout=2"});
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("timeout expired (connect_timeout)") != std::string::npos);
  CHECK(took >= 1.9);
  CHECK(took < 6);
  // From the environment too; a value that is not a number is refused.
  r = tierlab::test::run_tierlab({"replay", path, "--db", db}, std::nullopt, {"PGCONNECT_TIMEOUT=x"});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: connect_timeout x: not a whole number of seconds\n");

  tierlab::test::Background bg({TIERLAB_BINARY, "replay", path, "--db", db}, dir.file("hang.out"));
  usleep(500 * 1000);
  int status = bg.stop(SIGINT);
  INFO(bg.err());
  CHECK(status == 128 + SIGINT);
  CHECK(bg.err().find("tierlab: replay: stopped by SIGINT while connecting to ") != std::string::npos);
  CHECK(bg.err().find("nothing was replayed") != std::string::npos);
}

TEST_CASE("sessions connect to their captured databases, --database moves them, and a dbname in --db is noted",
          "[replay][pg][cli]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("DROP DATABASE IF EXISTS tierlab_dbx");
  pg.sql("CREATE DATABASE tierlab_dbx");
  pg.sql("CREATE TABLE dbx_t (x int)", "tierlab_dbx");
  TempDir dir;
  std::string path = dir.file("db.tlt");
  {
    // Captured on database postgres, where dbx_t does not exist.
    TraceBuilder b(path);
    b.begin(0, 1, pg.superuser(), "postgres");
    b.query(5 * kMs, 1, "INSERT INTO dbx_t VALUES (1)", "INSERT 0 1", false, 1);
    b.end(10 * kMs, 1);
    b.close();
  }
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo("tierlab_dbx")});
  INFO(r.out << r.err);
  // The INSERT succeeded at capture and fails there: divergence, exit 1.
  CHECK(r.status == 1);
  CHECK(r.out.find("errors by SQLSTATE: 42P01=1") != std::string::npos);
  CHECK(r.err.find("tierlab: replay: divergence 100.00% of statements above --max-divergence 0% (1 of 1 failed") !=
        std::string::npos);
  CHECK(r.err.find("tierlab: replay: --db names dbname=tierlab_dbx, but sessions connect to their captured "
                   "databases (postgres); --database tierlab_dbx sends every session there\n") != std::string::npos);
  r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo("tierlab_dbx"), "--database", "tierlab_dbx"});
  CHECK(r.status == 0);
  CHECK(r.out.find("errors by SQLSTATE: none") != std::string::npos);
  CHECK(r.err.find("--db names") == std::string::npos);
  CHECK(pg.sql("SELECT count(*) FROM dbx_t", "tierlab_dbx") == "1");
  pg.sql("DROP DATABASE tierlab_dbx");
}

TEST_CASE("replay refuses bad numbers, an unschedulable speed and a trace with nothing to replay",
          "[replay][cli]") {
  TempDir dir;
  std::string path = dir.file("one.tlt");
  {
    TraceBuilder b(path);
    b.begin(0, 1, "postgres");
    b.query(10 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(2000 * kMs, 1);
    b.close();
  }
  // Two sessions with 3 s between them.
  std::string gap = dir.file("gap.tlt");
  {
    TraceBuilder b(gap);
    b.begin(0, 1, "postgres");
    b.query(10 * kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.end(2000 * kMs, 1);
    b.begin(5000 * kMs, 2, "postgres");
    b.query(5010 * kMs, 2, "SELECT 1", "SELECT", true, 1);
    b.end(6000 * kMs, 2);
    b.close();
  }
  const std::string down = "host=127.0.0.1 port=1";
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  for (const Case& c : std::vector<Case>{
           {{"--speed", "0"}, "tierlab: --speed: 0 is not a number greater than 0\n"},
           {{"--speed", "-2"}, "tierlab: --speed: -2 is not a number greater than 0\n"},
           {{"--speed", "nan"}, "tierlab: --speed: nan is not a number greater than 0\n"},
           {{"--speed", "fast"}, "tierlab: --speed: fast is not a number greater than 0\n"},
           {{"-P", "nan"}, "tierlab: --progress: nan is not a number of 0 or more\n"},
           {{"--speed", "1e-12"}, "tierlab: --speed 1e-12: the captured 2.000 s would take more than 146 years\n"},
           {{"--begin", "1h"}, "tierlab: --begin 1h is past the end of the trace: " + path + " is 2.000 s long\n"},
           {{"--begin", "2.5s", "--dry-run"},
            "tierlab: --begin 2.5s is past the end of the trace: " + path + " is 2.000 s long\n"},
           {{"--begin", "2.5s", "--end", "4s"},
            "tierlab: " + gap + ": nothing to replay: no client session sends anything in the window (--begin 2.5s, "
                                "--end 4s)\n"},
           {{"--max-divergence", "5"}, "tierlab: --max-divergence: 5 is not a fraction from 0 to 1 or a percentage "
                                       "from 0% to 100%\n"},
           {{"--max-divergence", "150%"}, "tierlab: --max-divergence: 150% is not a fraction from 0 to 1 or a "
                                          "percentage from 0% to 100%\n"},
           {{"--max-divergence", "-1%"}, "tierlab: --max-divergence: -1% is not a fraction from 0 to 1 or a "
                                         "percentage from 0% to 100%\n"},
           {{"--max-divergence", "some"}, "tierlab: --max-divergence: some is not a fraction from 0 to 1 or a "
                                          "percentage from 0% to 100%\n"},
       }) {
    std::vector<std::string> args{"replay", c.args[1] == "2.5s" && c.args.size() == 4 ? gap : path, "--db", down};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = tierlab::test::run_tierlab(args);
    INFO(c.args[0] << " " << c.args[1]);
    CHECK(r.status == 2);
    CHECK(r.err == c.err);
    CHECK(r.out.empty());
  }
  // A trace of no session at all (block I/O only, say).
  std::string empty = dir.file("empty.tlt");
  TraceBuilder(empty).close();
  auto r = tierlab::test::run_tierlab({"replay", empty, "--db", down});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: " + empty + ": nothing to replay: the trace holds no client session\n");

  // --dry-run --json writes the summary.
  std::string json = dir.file("dry.json");
  r = tierlab::test::run_tierlab({"replay", path, "--dry-run", "--json", json});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = read_cli_json(json);
  CHECK(j["sessions"] == 1);
  CHECK(j["statements"] == 1);
  CHECK(j["transactions"] == 1);
  CHECK(j["round_trips"] == 1);
  CHECK(j["duration_s"].get<double>() == Approx(2.0));
  // And '-' is standard output, alone: the text goes to standard error.
  r = tierlab::test::run_tierlab({"replay", path, "--dry-run", "--json", "-"});
  CHECK(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["round_trips"] == 1);
  CHECK(r.err.find("round trips: 1\n") != std::string::npos);
}

TEST_CASE("statements that fail but succeeded at capture fail the replay after its report, up to --max-divergence",
          "[replay][pg][cli][divergence]") {
  // The capture's database had the table; the target has none (the report
  // of a replay against an empty database, made small): per session one
  // transaction that works and five pgbench-like ones that now fail.
  auto& pg = tierlab::test::shared_server();
  pg.sql("DROP TABLE IF EXISTS tierlab_div_accounts");
  TempDir dir;
  std::string path = dir.file("div.tlt");
  {
    TraceBuilder b(path);
    for (uint64_t s = 1; s <= 3; ++s) {
      b.begin(0, s, pg.superuser());
      Nanos t = static_cast<Nanos>(s) * kMs;
      b.query(t, s, "SELECT 1", "SELECT", true, 1);
      for (int i = 0; i < 5; ++i) {
        t += 100 * kMs;
        const std::string aid = std::to_string(i * 10 + static_cast<int>(s));
        b.query(t, s, "BEGIN", "BEGIN", false, 0, kMs, 'T');
        // 20 ms each at capture: answered at once with an error now, they
        // would top the "sped up" list if failures counted.
        b.query(t + 2 * kMs, s, "UPDATE tierlab_div_accounts SET abalance = abalance + 5 WHERE aid = " + aid,
                "UPDATE", true, 1, 20 * kMs, 'T');
        b.query(t + 30 * kMs, s, "SELECT abalance FROM tierlab_div_accounts WHERE aid = " + aid, "SELECT", true, 1,
                20 * kMs, 'T');
        b.query(t + 60 * kMs, s, "END", "COMMIT", false, 0);
      }
      b.end(700 * kMs, s);
    }
    b.close();
  }
  for (std::string wire : {"direct", "libpq"}) {
    INFO("--wire " << wire);
    std::string json = dir.file("div-" + wire + ".json");
    auto r = tierlab::test::run_tierlab(
        {"replay", path, "--db", pg.conninfo(), "--max-speed", "--threads", "2", "--wire", wire, "--json", json});
    INFO(r.out << r.err);
    CHECK(r.status == 1);
    // The whole report first, then one line saying why the replay failed.
    CHECK(r.out.find("number of transactions actually processed: 3\n") != std::string::npos);
    CHECK(r.out.find("number of failed transactions: 15 (83.333%)\n") != std::string::npos);
    CHECK(r.out.find("errors by SQLSTATE: 25P02=15 42P01=15\n"
                     "  25P02 first: current transaction is aborted, commands ignored until end of transaction "
                     "block\n"
                     "    in: select abalance from tierlab_div_accounts where aid=?\n"
                     "  42P01 first: relation \"tierlab_div_accounts\" does not exist\n"
                     "    in: update tierlab_div_accounts set abalance=abalance+? where aid=?\n"
                     "divergence: 30 error status, 0 row count; 30 of 63 statements failed that succeeded at "
                     "capture (47.62%)\n") != std::string::npos);
    const size_t lists = r.out.find("slowed down most (mean, captured -> replay):");
    REQUIRE(lists != std::string::npos);
    CHECK(r.out.find("tierlab_div", lists) == std::string::npos);
    CHECK(r.out.find("us per transaction, failed ones included)") != std::string::npos);
    CHECK(r.err == "tierlab: replay: divergence 47.62% of statements above --max-divergence 0% (30 of 63 failed "
                   "that succeeded at capture; errors by SQLSTATE above)\n");
    auto j = read_cli_json(json);
    CHECK(j["first_errors"]["42P01"]["message"] == "relation \"tierlab_div_accounts\" does not exist");
    CHECK(j["first_errors"]["42P01"]["statement"] ==
          "update tierlab_div_accounts set abalance=abalance+? where aid=?");
    CHECK(j["first_errors"]["25P02"]["statement"] == "select abalance from tierlab_div_accounts where aid=?");
    CHECK(j["divergence"]["failed_ok_at_capture"] == 30);
    CHECK(j["divergence"]["rate"].get<double>() == Approx(30.0 / 63));
    CHECK(j["divergence"]["max_rate"] == 0);
    // The replayer's CPU over the 18 transactions that ended, not the 3 that
    // did not fail.
    CHECK(j["cpu_us_per_transaction"].get<double>() == Approx(j["cpu_s"].get<double>() * 1e6 / 18));
    for (const auto& d : j["sped_up"]) CHECK(d["sql"].get<std::string>().find("tierlab_div") == std::string::npos);
    for (const auto& d : j["slowed"]) CHECK(d["sql"].get<std::string>().find("tierlab_div") == std::string::npos);
  }
  // --max-divergence allows up to a fraction or a percentage of the statements.
  for (const char* allowed : {"0.5", "47.62%", "100%"}) {
    INFO("--max-divergence " << allowed);
    std::string json = dir.file("allowed.json");
    auto r = tierlab::test::run_tierlab(
        {"replay", path, "--db", pg.conninfo(), "--max-speed", "--max-divergence", allowed, "--json", json});
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK(r.err.empty());
    CHECK(read_cli_json(json)["divergence"]["max_rate"].get<double>() > 0.47);
  }
  auto r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo(), "--max-speed", "--max-divergence", "0.4"});
  CHECK(r.status == 1);
  CHECK(r.err.find("divergence 47.62% of statements above --max-divergence 40% (30 of 63") != std::string::npos);
  // With the table there, nothing diverges: exit 0.
  pg.sql("CREATE TABLE tierlab_div_accounts (aid int PRIMARY KEY, abalance int)");
  pg.sql("INSERT INTO tierlab_div_accounts SELECT g, 0 FROM generate_series(1, 60) g");
  r = tierlab::test::run_tierlab({"replay", path, "--db", pg.conninfo(), "--max-speed"});
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.out.find("errors by SQLSTATE: none\n") != std::string::npos);
  CHECK(r.out.find("0 of 63 statements failed that succeeded at capture (0%)\n") != std::string::npos);
  pg.sql("DROP TABLE tierlab_div_accounts");
}
