// A sharded replay on one machine: a pgbench capture replayed as 4 shards
// (4 processes, one --start-at) and merged gives what one replay gives.
#include "common/clock.h"
#include "common/histogram.h"
#include "support/support.h"
#include "tests/integration/replay_traces.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

nlohmann::json read_shard_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// `tierlab capture proxy` as a child; returns once it listens.
class ShardProxy {
 public:
  ShardProxy(const std::string& upstream, const std::string& out) {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], 2);
      execl(TIERLAB_BINARY, TIERLAB_BINARY, "capture", "proxy", "--listen", "127.0.0.1:0", "--upstream",
            upstream.c_str(), "--out", out.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    err_ = fds[0];
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (port_ == 0) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pollfd p{err_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      ssize_t n = read(err_, buf, sizeof buf);
      if (n <= 0) FAIL("capture proxy exited before listening: " << text);
      text.append(buf, static_cast<size_t>(n));
      size_t at = text.find("listening on ");
      if (at == std::string::npos) continue;
      size_t end = text.find_first_of(", \n", at + 13);
      if (end == std::string::npos) continue;
      std::string addr = text.substr(at + 13, end - at - 13);
      port_ = std::stoi(addr.substr(addr.rfind(':') + 1));
    }
  }
  ~ShardProxy() { stop(); }
  int port() const { return port_; }
  int stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    close(err_);
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int err_ = -1;
  int port_ = 0;
  int status_ = -1;
};

struct LogLine {
  uint64_t session;
  int64_t latency_ns;
};

std::vector<LogLine> read_log(const std::string& path) {
  std::vector<LogLine> v;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    uint64_t session, unit, latency_us;
    ss >> session >> unit >> latency_us;
    v.push_back({session, static_cast<int64_t>(latency_us) * 1000});
  }
  return v;
}

}  // namespace

TEST_CASE("4 shards sharing --start-at, merged, count what one replay counts, each session on one shard",
          "[replay][pg][shard]") {
  auto& pg = tierlab::test::shared_server();
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-s", "1", "-q", "postgres"}, &out) == 0);
  TempDir dir;
  const std::string trace = dir.file("bench.tlt");
  {
    ShardProxy proxy(pg.host() + ":" + std::to_string(pg.port()), trace);
    const std::string port = std::to_string(proxy.port());
    // pgbench, simple protocol (one statement per round trip, so the
    // round-trip log is a per-statement log), a new connection per
    // transaction (-C): many sessions to spread.
    std::string log;
    int rc = pg.run_tool("pgbench", {"-h", "127.0.0.1", "-p", port, "-n", "-C", "-c", "4", "-j", "2", "-t", "40",
                                     "postgres"},
                         &log);
    INFO(log);
    REQUIRE(rc == 0);
    // Sessions that fail, two SQLSTATEs: errors by SQLSTATE to add up.
    for (const char* sql : {"SELECT 1/0", "SELECT * FROM no_such_table", "SELECT 1/0"})
      pg.run_tool("psql", {"-h", "127.0.0.1", "-p", port, "-X", "-c", sql, "postgres"}, &log);
    REQUIRE(proxy.stop() == 0);
  }
  REQUIRE(tierlab::test::run_tierlab({"replay", trace, "--dry-run", "--json", dir.file("dry.json")}).status == 0);
  const auto dry = read_shard_json(dir.file("dry.json"));
  const uint64_t sessions = dry["sessions"];
  REQUIRE(sessions >= 160);

  // One replay.
  auto one = tierlab::test::run_tierlab({"replay", trace, "--db", pg.conninfo(), "--max-speed", "--threads", "1",
                                         "--max-divergence", "100%", "--json", dir.file("one.json"), "--log",
                                         dir.file("one.log")});
  INFO(one.out << one.err);
  REQUIRE(one.status == 0);
  const auto single = read_shard_json(dir.file("one.json"));
  REQUIRE(single["errors_by_sqlstate"]["22012"] == 2);
  REQUIRE(single["errors_by_sqlstate"]["42P01"] == 1);

  // pgbench -i again: the same data for the second run.
  REQUIRE(pg.run_tool("pgbench", {"-i", "-s", "1", "-q", "postgres"}, &out) == 0);
  // Four shards, one absolute start computed once, 3 s ahead.
  const int64_t start = clock_ns(CLOCK_REALTIME) + 3'000'000'000;
  char at[48];
  std::snprintf(at, sizeof at, "@%lld.%09lld", static_cast<long long>(start / 1'000'000'000),
                static_cast<long long>(start % 1'000'000'000));
  // Four processes at once, each waited for by a thread of its own.
  std::vector<tierlab::test::RunResult> runs(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    const std::string K = std::to_string(k);
    threads.emplace_back([&, k, K] {
      runs[k] = tierlab::test::run_tierlab({"replay", trace, "--db", pg.conninfo(), "--max-speed", "--threads", "1",
                                            "--max-divergence", "100%", "--shard", K + "/4", "--start-at", at, "--json",
                                            dir.file("shard-" + K + ".json"), "--log", dir.file("shard-" + K + ".log")});
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> files;
  for (int k = 0; k < 4; ++k) {
    INFO("shard " << k);
    INFO(runs[k].out << runs[k].err);
    REQUIRE(runs[k].status == 0);
    CHECK(runs[k].out.find("shard: " + std::to_string(k) + " of 4 (0-based)") != std::string::npos);
    CHECK(runs[k].out.find("start: --start-at ") != std::string::npos);
    CHECK(runs[k].out.find("(CLOCK_REALTIME, ") != std::string::npos);
    files.push_back(dir.file("shard-" + std::to_string(k) + ".json"));
    const auto j = read_shard_json(files.back());
    CHECK(j["start"]["at_ns"] == start);
    // Each began on the shared start: not before it, and late only by a
    // wake-up (generous: the machine is loaded).
    CHECK(j["start"]["offset_ns"].get<int64_t>() > -1'000'000);
    CHECK(j["start"]["offset_ns"].get<int64_t>() < 200'000'000);
    CHECK(j["sessions"].get<uint64_t>() > 0);
  }
  std::vector<std::string> args = {"report", "merge"};
  args.insert(args.end(), files.begin(), files.end());
  args.insert(args.end(), {"--json", dir.file("merged.json")});
  auto merge = tierlab::test::run_tierlab(args);
  INFO(merge.out << merge.err);
  REQUIRE(merge.status == 0);
  const auto m = read_shard_json(dir.file("merged.json"));
  for (const char* key : {"sessions", "statements", "transactions", "failed_transactions", "errors", "sessions_failed"})
    CHECK(m[key] == single[key]);
  CHECK(m["errors_by_sqlstate"] == single["errors_by_sqlstate"]);
  CHECK(m["divergence"]["error_status"] == single["divergence"]["error_status"]);
  CHECK(m["merged_shards"] == nlohmann::json::array({0, 1, 2, 3}));
  CHECK(merge.out.find("shards merged: 4 of 4 (0, 1, 2, 3)") != std::string::npos);
  CHECK(merge.out.find("number of statements: " + std::to_string(single["statements"].get<uint64_t>())) !=
        std::string::npos);

  // Each session on exactly one shard, and every session of the one replay
  // on some shard.
  std::set<uint64_t> whole;
  for (const auto& l : read_log(dir.file("one.log"))) whole.insert(l.session);
  std::map<uint64_t, int> shard_of;
  std::vector<int64_t> pooled;
  for (int k = 0; k < 4; ++k)
    for (const auto& l : read_log(dir.file("shard-" + std::to_string(k) + ".log"))) {
      auto [it, fresh] = shard_of.try_emplace(l.session, k);
      CHECK(it->second == k);
      pooled.push_back(l.latency_ns);
    }
  CHECK(shard_of.size() == whole.size());
  for (uint64_t s : whole) CHECK(shard_of.count(s) == 1);
  // One statement per round trip: the pooled log is per statement.
  REQUIRE(pooled.size() == m["statements"].get<uint64_t>());
  // The merged percentiles are the pooled log's, within one bucket (the
  // log has microseconds, and times the round trip to ReadyForQuery).
  std::sort(pooled.begin(), pooled.end());
  auto merged_hist = m["histograms"]["latency"];
  for (auto [q, key] : {std::pair{0.5, "p50"}, {0.9, "p90"}, {0.99, "p99"}}) {
    const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(pooled.size())));
    const int64_t want = pooled[rank - 1];
    const auto got = static_cast<int64_t>(std::llround(m["latency_ms"][key].get<double>() * 1e6));
    INFO(key << ": merged " << got << " ns, pooled log " << want << " ns");
    CHECK(std::abs(Histogram::bucket_of(got) - Histogram::bucket_of(want)) <= 1);
  }
}

TEST_CASE("a shard that gets no session runs, reports zeros, and merges with the others", "[replay][pg][shard]") {
  auto& pg = tierlab::test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("one-session.tlt");
  {
    // Session 1 hashes to shard 1 of 4: shards 0, 2 and 3 get nothing.
    replay_test::TraceBuilder b(trace);
    b.begin(0, 1, pg.superuser());
    b.query(10 * replay_test::kMs, 1, "SELECT 1", "SELECT", true, 1);
    b.query(20 * replay_test::kMs, 1, "SELECT 1/0", "SELECT", true, 1);
    b.end(30 * replay_test::kMs, 1);
    b.close();
  }
  std::vector<std::string> files;
  for (int k : {0, 1}) {
    const std::string json = dir.file("shard-" + std::to_string(k) + ".json");
    auto r = tierlab::test::run_tierlab({"replay", trace, "--db", pg.conninfo(), "--shard", std::to_string(k) + "/4",
                                         "--max-divergence", "100%", "--json", json});
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    const auto j = read_shard_json(json);
    CHECK(j["sessions"] == (k == 1 ? 1 : 0));
    CHECK(j["statements"] == (k == 1 ? 2 : 0));
    files.push_back(json);
  }
  auto m = tierlab::test::run_tierlab({"report", "merge", files[0], files[1], "--json", dir.file("m.json")});
  INFO(m.out << m.err);
  CHECK(m.status == 0);
  const auto j = read_shard_json(dir.file("m.json"));
  CHECK(j["sessions"] == 1);
  CHECK(j["statements"] == 2);
  CHECK(j["errors_by_sqlstate"]["22012"] == 1);
  CHECK(m.err.find("shard(s) 2, 3 of 4 not given") != std::string::npos);
}
