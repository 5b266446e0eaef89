// A host-less capture, as in front of a managed server (RDS, Aurora): the
// proxy for the transactions and PostgreSQL's own counters over SQL, with a
// role that has only pg_monitor; no process CPU, no block I/O.
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <thread>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

struct Seen {
  std::map<std::string, uint64_t> samples;  // name -> records
  std::map<std::string, std::string> meta;
  uint64_t block_ios = 0, transactions = 0;
};

Seen read_trace(const std::string& path) {
  Seen s;
  auto r = trace::open_reader(path);
  trace::Record rec;
  while (r->next(rec)) {
    if (auto* x = std::get_if<trace::Sample>(&rec.body)) ++s.samples[std::string(x->name)];
    if (auto* m = std::get_if<trace::Meta>(&rec.body)) s.meta[std::string(m->key)] = std::string(m->value);
    if (std::holds_alternative<trace::BlockIo>(rec.body)) ++s.block_ios;
    if (auto* rd = std::get_if<trace::Ready>(&rec.body); rd && rd->status == 'I') ++s.transactions;
  }
  return s;
}

// pgbench through `capture run --hostless` for `seconds`, sampled as a
// pg_monitor role; returns the capture's result.
test::RunResult hostless_capture(pgtmp::Server& pg, const std::string& trace, int seconds) {
  pg.sql("DO $$ BEGIN CREATE ROLE watcher LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$");
  pg.sql("GRANT pg_monitor TO watcher");
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "2"}, &out) == 0);
  const int port = pgtmp::free_port();
  std::vector<std::string> args = {"capture", "run", "--hostless", "--listen", "127.0.0.1:" + std::to_string(port),
                                   "--upstream", pg.host() + ":" + std::to_string(pg.port()),
                                   "--conninfo", "host=127.0.0.1 port=" + std::to_string(pg.port()) +
                                                     " dbname=postgres user=watcher",
                                   "--out", trace, "--duration", std::to_string(seconds + 2) + "s",
                                   "--sample-interval", "200ms"};
  test::RunResult capture;
  std::thread t([&] { capture = test::run_tierlab(args); });
  REQUIRE(tierlab::test::wait_listening(port));
  int rc = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", std::to_string(port), "-c", "4", "-j", "2",
                                   "-T", std::to_string(seconds)},
                       &out);
  t.join();
  INFO(out);
  REQUIRE(rc == 0);
  return capture;
}

}  // namespace

TEST_CASE("capture run --hostless: transactions through the proxy and the server's counters over SQL only",
          "[integration][hostless]") {
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("hostless.tlt");
  auto capture = hostless_capture(pg, trace, 3);
  INFO(capture.out << capture.err);
  REQUIRE(capture.status == 0);
  CHECK(capture.err.find("host-less capture of 127.0.0.1:") != std::string::npos);
  // PostgreSQL 15 has no pg_stat_io: said once, and the capture goes on.
  CHECK(occurrences(capture.err, "pg_stat_io not sampled: PostgreSQL 15 has none") == 1);
  CHECK(occurrences(capture.err, "pg_stat_statements not sampled") == 1);
  CHECK(capture.err.find("CPU samples skipped") == std::string::npos);

  Seen s = read_trace(trace);
  CHECK(s.transactions > 100);
  CHECK(s.block_ios == 0);
  CHECK(s.samples.count("cpu.user_ns") == 0);
  for (const char* name : {"pg.blks_read", "pg.blks_hit", "pg.xact_commit", "pg.xact_rollback", "pg.tup_returned",
                           "pg.tup_inserted", "pg.tup_updated", "pg.temp_bytes", "pg.wal_bytes",
                           "pg.buffers_checkpoint", "pg.bgwriter.buffers_alloc", "pg.wal.wal_records",
                           "pg.wal.wal_bytes", "pg.wal.wal_sync"}) {
    INFO(name);
    CHECK(s.samples[name] >= 10);  // every 200 ms over 5 s
  }
  CHECK(s.meta["capture.hostless"] == pg.host() + ":" + std::to_string(pg.port()));
  CHECK(s.meta["server_version"].rfind("15", 0) == 0);
  CHECK(s.meta["setting.server_version_num"].rfind("15", 0) == 0);
  for (const char* k : {"setting.shared_buffers", "setting.effective_cache_size", "setting.max_connections",
                        "setting.wal_sync_method", "setting.synchronous_commit"}) {
    INFO(k);
    CHECK(!s.meta[k].empty());
  }
  CHECK(s.meta.count("postmaster_pid") == 0);
}

TEST_CASE("capture run --hostless samples pg_stat_statements per queryid when it is installed",
          "[integration][hostless]") {
  pgtmp::Options o = test::fast_server_options();
  o.settings.push_back({"shared_preload_libraries", "pg_stat_statements"});
  pgtmp::Server pg(o);
  pg.sql("CREATE EXTENSION pg_stat_statements");
  TempDir dir;
  const std::string trace = dir.file("stmts.tlt");
  auto capture = hostless_capture(pg, trace, 2);
  INFO(capture.out << capture.err);
  REQUIRE(capture.status == 0);
  CHECK(capture.err.find("pg_stat_statements not sampled") == std::string::npos);
  Seen s = read_trace(trace);
  size_t calls = 0, texts = 0;
  for (const auto& [name, n] : s.samples)
    if (name.rfind("pg.stmt.", 0) == 0 && name.size() > 6 && name.compare(name.size() - 6, 6, ".calls") == 0) ++calls;
  for (const auto& [k, v] : s.meta)
    if (k.rfind("pg.stmt.", 0) == 0 && v.find("pgbench_accounts") != std::string::npos) ++texts;
  CHECK(calls >= 5);  // pgbench's statements, each its queryid
  CHECK(texts >= 2);  // UPDATE and SELECT of pgbench_accounts
}

namespace {

// get-metric-data's JSON for the wall-clock span of `trace`: one datapoint
// a second (a high-resolution period), newest first, as the aws CLI prints.
std::string metrics_for(const std::string& trace) {
  auto r = trace::open_reader(trace);
  const int64_t offset = r->header().realtime_offset_ns;
  trace::Record rec;
  int64_t first = INT64_MAX, last = INT64_MIN;
  while (r->next(rec)) {
    first = std::min(first, rec.ts + offset);
    last = std::max(last, rec.ts + offset);
  }
  std::vector<std::string> times;
  for (int64_t s = last / 1'000'000'000 + 1; s >= first / 1'000'000'000 - 1; --s) {
    time_t t = static_cast<time_t>(s);
    char b[40];
    std::strftime(b, sizeof b, "\"%Y-%m-%dT%H:%M:%S+00:00\"", std::gmtime(&t));
    times.push_back(b);
  }
  auto series = [&](const std::string& id, const std::string& label, double v, double wobble) {
    std::string ts, vs;
    for (size_t i = 0; i < times.size(); ++i) {
      ts += (i ? ",\n                " : "") + times[i];
      vs += (i ? ",\n                " : "") + std::to_string(v + (i % 2 ? wobble : -wobble));
    }
    return "        {\n            \"Id\": \"" + id + "\",\n            \"Label\": \"" + label +
           "\",\n            \"Timestamps\": [\n                " + ts + "\n            ],\n            \"Values\": [\n"
           "                " + vs + "\n            ],\n            \"StatusCode\": \"Complete\"\n        }";
  };
  return "{\n    \"MetricDataResults\": [\n" + series("readiops", "ReadIOPS", 3000, 5) + ",\n" +
         series("writeiops", "WriteIOPS", 300, 20) + ",\n" + series("readlatency", "ReadLatency", 0.002, 0) + ",\n" +
         series("writelatency", "WriteLatency", 0.001, 0) + ",\n" + series("m5", "DiskQueueDepth", 8, 1) + ",\n" +
         series("cpu", "CPUUtilization", 40, 2) + ",\n" + series("mem", "FreeableMemory", 2e9, 1e6) + ",\n" +
         series("net", "NetworkReceiveThroughput", 1e6, 0) + "\n    ],\n    \"Messages\": []\n}\n";
}

bool has_source(const nlohmann::json& profile, const std::string& figure, const std::string& part) {
  for (const auto& s : profile["sources"])
    if (s["figure"] == figure && s["source"].get<std::string>().find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("host-less: capture run, capture import --cloudwatch, trace merge and project from the result",
          "[integration][hostless]") {
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("hostless.tlt");
  auto capture = hostless_capture(pg, trace, 8);
  INFO(capture.out << capture.err);
  REQUIRE(capture.status == 0);

  // Without the provider's metrics: reads from pg_stat_database (PostgreSQL
  // 15 has no pg_stat_io), said to count the page cache's hits.
  auto alone = test::run_tierlab({"profile", "--json", trace});
  REQUIRE(alone.status == 0);
  auto aj = nlohmann::json::parse(alone.out);
  CHECK(has_source(aj, "device reads per transaction", "pg_stat_database blks_read (reads from the OS: page-cache hits included)"));
  CHECK(has_source(aj, "commit writes and WAL flushes", "pg_stat_wal"));
  CHECK(aj["per_transaction"]["cpu_ms"].is_null());

  // The provider's metrics of the same window, in get-metric-data's shape.
  {
    std::ofstream f(dir.file("metrics.json"));
    f << metrics_for(trace);
  }
  auto imp = test::run_tierlab({"capture", "import", "--cloudwatch", dir.file("metrics.json"), "--vcpus", "2",
                                "--memory", "4GiB", "--out", dir.file("metrics.tlt")});
  INFO(imp.out << imp.err);
  REQUIRE(imp.status == 0);
  CHECK(imp.out.find("8 metrics (7 the models use)") != std::string::npos);
  CHECK(imp.out.find("note: 'NetworkReceiveThroughput' is not a metric the models use") != std::string::npos);

  auto merge = test::run_tierlab({"trace", "merge", trace, dir.file("metrics.tlt"), "--out", dir.file("both.tlt")});
  INFO(merge.out << merge.err);
  REQUIRE(merge.status == 0);
  CHECK(merge.out.find("warning") == std::string::npos);

  auto prof = test::run_tierlab({"profile", "--json", dir.file("both.tlt")});
  INFO(prof.err);
  REQUIRE(prof.status == 0);
  auto j = nlohmann::json::parse(prof.out);
  const double tps = j["tps"].get<double>();
  REQUIRE(tps > 50);
  CHECK(j["per_transaction"]["device_reads"].get<double>() == Approx(3000 / tps).epsilon(0.02));
  CHECK(has_source(j, "device reads per transaction", "provider (cloudwatch) ReadIOPS"));
  CHECK(has_source(j, "device read latency", "ReadLatency"));
  CHECK(has_source(j, "CPU per transaction", "CPUUtilization"));
  CHECK(j["per_transaction"]["cpu_ms"].get<double>() == Approx(0.4 * 2 / tps * 1e3).epsilon(0.06));
  CHECK(has_source(j, "commit writes and WAL flushes", "pg_stat_wal wal_write and wal_sync"));
  CHECK(j["per_transaction"]["sync_writes"].get<double>() > 0);  // WAL writes (the test server runs fsync=off: no flushes)
  CHECK(j["memory_bytes"].get<double>() == 4.0 * (1ull << 30));
  // Steady at 3,000 reads a second while reads took a good part of each
  // transaction: cap-bound.
  CHECK(j["device"]["cap_bound"] == true);
  CHECK(j["device"]["cap_iops"].get<double>() == Approx(3000).epsilon(0.01));

  auto proj = test::run_tierlab({"project", dir.file("both.tlt"), "--tier", "ebs-gp3", "--tier", "nvme-local",
                                 "--json", "-"});
  INFO(proj.err);
  REQUIRE(proj.status == 0);
  auto pj = nlohmann::json::parse(proj.out);
  CHECK(pj["capture_tier"]["source"] == "detected");
  CHECK(pj["per_transaction"]["device_reads"].get<double>() == Approx(3000 / tps).epsilon(0.02));
  bool named = false;
  for (const auto& n : pj["notes"])
    named |= n.get<std::string>().rfind("source of device reads per transaction: provider (cloudwatch) ReadIOPS", 0) == 0;
  CHECK(named);
  REQUIRE(pj["tiers"].size() == 2);
  CHECK(pj["tiers"][1]["tps"].get<double>() > pj["capture"]["measured_tps"].get<double>());

  // The example of tests/data is of another day: merged, it is said not to
  // overlap, and the capture's profile goes on without it.
  const std::string example = std::string(TIERLAB_SOURCE_DIR) + "/tests/data/cloudwatch-rds-example.json";
  auto ex = test::run_tierlab({"capture", "import", "--cloudwatch", example, "--out", dir.file("example.tlt")});
  REQUIRE(ex.status == 0);
  auto other = test::run_tierlab({"trace", "merge", trace, dir.file("example.tlt"), "--out", dir.file("apart.tlt")});
  REQUIRE(other.status == 0);
  CHECK(other.out.find("warning: the traces do not all overlap in time") != std::string::npos);
  auto apart = test::run_tierlab({"profile", "--json", dir.file("apart.tlt")});
  REQUIRE(apart.status == 0);
  CHECK(has_source(nlohmann::json::parse(apart.out), "device reads per transaction", "pg_stat_database blks_read"));
}

TEST_CASE("capture run --hostless: a server that goes away stops the counters with one line, the capture goes on",
          "[integration][hostless]") {
  pgtmp::Server pg(test::fast_server_options());
  TempDir dir;
  const int port = pgtmp::free_port();
  test::RunResult capture;
  std::thread t([&] {
    capture = test::run_tierlab({"capture", "run", "--hostless", "--listen", "127.0.0.1:" + std::to_string(port),
                                 "--upstream", pg.host() + ":" + std::to_string(pg.port()), "--conninfo",
                                 pg.conninfo(), "--out", dir.file("gone.tlt"), "--duration", "4s",
                                 "--sample-interval", "100ms"});
  });
  REQUIRE(tierlab::test::wait_listening(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  pg.stop(true);
  t.join();
  INFO(capture.out << capture.err);
  CHECK(capture.status == 0);
  CHECK(occurrences(capture.err, "PostgreSQL counters stopped: the connection was lost") == 1);
  CHECK(occurrences(capture.err, " not sampled: ") == 2);  // pg_stat_io and pg_stat_statements, at the start
  Seen s = read_trace(dir.file("gone.tlt"));
  CHECK(s.samples["pg.xact_commit"] >= 5);
}
