// tierlab report merge: reports through their JSON, merged without loss,
// printed as one replay's report.
#include "app/replay_json.h"
#include "common/error.h"
#include "support/support.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <sstream>

using namespace tierlab;
using tierlab::test::run_tierlab;

namespace {

// A shard's report as a replay fills it: counts, histograms, errors and
// fingerprints, and what derive() makes of them.
replay::Report shard_report(uint32_t k, uint32_t n, uint64_t seed, Histogram* pooled_lat) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> lat(12.0, 1.2);
  replay::Report r;
  r.shard = {k, n};
  r.max_speed = true;
  r.threads = 2;
  r.io = "epoll";
  r.sessions = 5 + k;
  r.sessions_direct = r.sessions;
  r.transactions = 1000 + 10 * k;
  r.failed_transactions = k;
  r.statements = 5000 + 50 * k;
  r.errors = 3 + k;
  r.errors_by_sqlstate = {{"23505", 2 + k}, {"40001", 1}};
  r.first_errors = {{"23505", 2 + k, "duplicate key value " + std::to_string(k), "insert into t values (?)"},
                    {"40001", 1, "could not serialize", "update t set v = ?"}};
  r.divergence_error_status = 2 + k;
  r.divergence_new_errors = 1 + k;
  r.duration_s = 2.0 + 0.1 * k;
  r.captured_duration_s = 3.0;
  r.cpu_s = 0.5;
  for (uint64_t i = 0; i < r.statements; ++i) {
    auto v = static_cast<int64_t>(lat(rng));
    r.lat_hist.record(v);
    pooled_lat->record(v);
  }
  r.fingerprints = {{"select v from t where id = ?", r.statements - 100, r.statements - 110, 1e6 * 3000, 1.2e6 * 3000},
                    {"insert into t values (?)", 100, 90, 5e5 * 90, 4e5 * 90}};
  replay::derive(r);
  return r;
}

std::string write(const test::TempDir& dir, const std::string& name, const nlohmann::json& j) {
  const std::string path = dir.file(name);
  std::ofstream(path) << j.dump(2);
  return path;
}

}  // namespace

TEST_CASE("report JSON: a report reads back as it was written", "[report][merge]") {
  Histogram pooled;
  replay::Report r = shard_report(1, 4, 9, &pooled);
  r.lag_hist.record(12345);
  r.own_lag_hist.record(678);
  double rate = -1;
  replay::Report back = app::report_from_json(nlohmann::json::parse(app::report_json(r, 0.25).dump()), "a.json", &rate);
  CHECK(rate == 0.25);
  CHECK(back.lat_hist == r.lat_hist);
  CHECK(back.lag_hist == r.lag_hist);
  CHECK(back.own_lag_hist == r.own_lag_hist);
  CHECK(back.lat_p99_ms == r.lat_p99_ms);
  CHECK(back.statements == r.statements);
  CHECK(back.errors_by_sqlstate == r.errors_by_sqlstate);
  CHECK(back.shard.index == 1);
  CHECK(back.shard.count == 4);
  REQUIRE(back.slowed.size() == 1);
  CHECK(back.slowed[0].sql == r.slowed[0].sql);
  std::ostringstream a, b;
  replay::print_report(a, r);
  replay::print_report(b, back);
  CHECK(a.str() == b.str());
}

TEST_CASE("report merge: counts add, percentiles are the pooled statements', errors by SQLSTATE add",
          "[report][merge]") {
  test::TempDir dir;
  Histogram pooled;
  std::vector<std::string> files;
  uint64_t statements = 0, transactions = 0, errors = 0, dup = 0, new_errors = 0;
  for (uint32_t k = 0; k < 4; ++k) {
    replay::Report r = shard_report(k, 4, 100 + k, &pooled);
    statements += r.statements;
    transactions += r.transactions;
    errors += r.errors;
    dup += r.errors_by_sqlstate[0].second;
    new_errors += r.divergence_new_errors;
    files.push_back(write(dir, "shard-" + std::to_string(k) + ".json", app::report_json(r, 0.01)));
  }
  std::vector<std::string> args = {"report", "merge"};
  args.insert(args.end(), files.begin(), files.end());
  args.insert(args.end(), {"--json", dir.file("merged.json")});
  auto run = run_tierlab(args);
  INFO(run.err);
  // The divergence (10 of 20,300 statements) is below --max-divergence 1%.
  CHECK(run.status == 0);
  std::ifstream in(dir.file("merged.json"));
  auto j = nlohmann::json::parse(in);
  CHECK(j["statements"] == statements);
  CHECK(j["transactions"] == transactions);
  CHECK(j["errors"] == errors);
  CHECK(j["errors_by_sqlstate"]["23505"] == dup);
  CHECK(j["errors_by_sqlstate"]["40001"] == 4);
  CHECK(j["divergence"]["failed_ok_at_capture"] == new_errors);
  CHECK(j["duration_s"] == 2.3);  // the longest shard's
  CHECK(j["merged_shards"] == nlohmann::json::array({0, 1, 2, 3}));
  // The merged histogram is the pooled one, bucket for bucket.
  auto merged = app::histogram_from_json(j["histograms"]["latency"]);
  REQUIRE(merged);
  CHECK(merged->buckets() == pooled.buckets());
  CHECK(j["latency_ms"]["p99"] == static_cast<double>(pooled.quantile(0.99)) / 1e6);
  CHECK(j["latency_ms"]["p50"] == static_cast<double>(pooled.quantile(0.50)) / 1e6);
  // The first message of a SQLSTATE is the first report's.
  CHECK(j["first_errors"]["23505"]["message"] == "duplicate key value 0");
  // The text is the replay's report, with the shards it holds.
  CHECK(run.out.find("shards merged: 4 of 4 (0, 1, 2, 3)\n") != std::string::npos);
  CHECK(run.out.find("number of statements: " + std::to_string(statements) + "\n") != std::string::npos);
  CHECK(run.out.find("errors by SQLSTATE: 23505=" + std::to_string(dup) + " 40001=4\n") != std::string::npos);
  CHECK(run.out.find("latency p50/p90/p99/p99.9/max = ") != std::string::npos);
  CHECK(run.err.empty());

  // A shard left out is said on stderr; the report says which it holds.
  auto three = run_tierlab({"report", "merge", files[0], files[1], files[3]});
  CHECK(three.status == 0);
  CHECK(three.out.find("shards merged: 3 of 4 (0, 1, 3)\n") != std::string::npos);
  CHECK(three.err.find("shard(s) 2 of 4 not given") != std::string::npos);
}

TEST_CASE("report merge: reports that are not shards of one replay are refused in one line", "[report][merge]") {
  test::TempDir dir;
  Histogram pooled;
  const auto a = write(dir, "a.json", app::report_json(shard_report(0, 4, 1, &pooled), 0));
  const auto b = write(dir, "b.json", app::report_json(shard_report(0, 4, 2, &pooled), 0));
  const auto c = write(dir, "c.json", app::report_json(shard_report(1, 3, 3, &pooled), 0));
  replay::Report timed = shard_report(2, 4, 4, &pooled);
  timed.max_speed = false;
  const auto d = write(dir, "d.json", app::report_json(timed, 0));
  replay::Report at = shard_report(3, 4, 5, &pooled);
  at.start_at_ns = 1'700'000'000'000'000'000;
  const auto g = write(dir, "g.json", app::report_json(at, 0));
  std::ofstream(dir.file("e.json")) << "{\"sessions\": 3}";
  std::ofstream(dir.file("f.json")) << "{not json";
  struct {
    std::vector<std::string> files;
    std::string says;
  } cases[] = {
      {{a, b}, "a.json and " + b + " are both shard 0 of 4"},
      {{a, c}, "is shard 1 of 3"},
      {{a, d}, "d.json was replayed at speed 1"},
      {{a, dir.file("e.json")}, "e.json: sessions_failed: missing"},
      {{a, dir.file("f.json")}, "f.json: not JSON"},
      // The replay's start time is a value of the reports, not a flag.
      {{a, g}, "g.json started at 2023-11-14"},
      {{a, g}, "a.json had no start time: not shards of one replay"},
  };
  for (const auto& t : cases) {
    std::vector<std::string> args = {"report", "merge"};
    args.insert(args.end(), t.files.begin(), t.files.end());
    auto r = run_tierlab(args);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find(t.says) != std::string::npos);
    CHECK(r.out.empty());
  }
}
