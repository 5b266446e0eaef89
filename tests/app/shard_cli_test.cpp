// tierlab replay --shard: K/N, /N with K from the orchestrator's
// environment, and one clear line for what is wrong.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>

using tierlab::test::count_lines;
using tierlab::test::run_tierlab;

namespace {

const std::string kTrace = std::string(TIERLAB_SOURCE_DIR) + "/tests/data/trace-1.2-every-kind.tlt";

nlohmann::json dry_run(const std::vector<std::string>& extra, const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = {"replay", kTrace, "--dry-run", "--json", "-"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_tierlab(args, std::nullopt, env);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

void bad(const std::vector<std::string>& extra, const std::vector<std::string>& env, const std::string& says) {
  std::vector<std::string> args = {"replay", kTrace, "--dry-run"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_tierlab(args, std::nullopt, env);
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find(says) != std::string::npos);
}

}  // namespace

TEST_CASE("replay --shard: the dry runs of shards K/N add up to the whole trace's", "[cli][shard]") {
  const auto whole = dry_run({});
  for (int n : {2, 3}) {
    uint64_t sessions = 0, statements = 0, round_trips = 0;
    for (int k = 0; k < n; ++k) {
      const auto j = dry_run({"--shard", std::to_string(k) + "/" + std::to_string(n)});
      CHECK(j["shard"]["index"] == k);
      CHECK(j["shard"]["count"] == n);
      CHECK(j["trace_sessions"] == whole["sessions"]);
      sessions += j["sessions"].get<uint64_t>();
      statements += j["statements"].get<uint64_t>();
      round_trips += j["round_trips"].get<uint64_t>();
    }
    CHECK(sessions == whole["sessions"].get<uint64_t>());
    CHECK(statements == whole["statements"].get<uint64_t>());
    CHECK(round_trips == whole["round_trips"].get<uint64_t>());
  }
  // The text says which shard and how many of the trace's sessions.
  auto r = run_tierlab({"replay", kTrace, "--dry-run", "--shard", "1/2"});
  CHECK(r.out.find("shard: 1 of 2 (0-based): ") != std::string::npos);
}

TEST_CASE("replay --shard /N takes K from JOB_COMPLETION_INDEX, else SLURM_PROCID", "[cli][shard]") {
  CHECK(dry_run({"--shard", "/3"}, {"JOB_COMPLETION_INDEX=2"})["shard"]["index"] == 2);
  CHECK(dry_run({"--shard", "/3"}, {"SLURM_PROCID=1"})["shard"]["index"] == 1);
  // Kubernetes' index first when both are set.
  CHECK(dry_run({"--shard", "/3"}, {"SLURM_PROCID=1", "JOB_COMPLETION_INDEX=0"})["shard"]["index"] == 0);
  // An explicit K wins over the environment.
  CHECK(dry_run({"--shard", "1/3"}, {"JOB_COMPLETION_INDEX=2"})["shard"]["index"] == 1);
}

TEST_CASE("replay --shard: a bad value or environment is one line, exit 2", "[cli][shard]") {
  bad({"--shard", "3"}, {}, "--shard 3: expected K/N");
  bad({"--shard", "2/2"}, {}, "--shard 2/2: shard 2 does not exist in 2");
  bad({"--shard", "0/0"}, {}, "--shard 0/0: N must be at least 1");
  bad({"--shard", "a/2"}, {}, "--shard a/2: K is not a number");
  bad({"--shard", "/4"}, {"JOB_COMPLETION_INDEX=", "SLURM_PROCID="}, "neither JOB_COMPLETION_INDEX nor SLURM_PROCID");
  bad({"--shard", "/4"}, {"JOB_COMPLETION_INDEX=x"}, "JOB_COMPLETION_INDEX=x is not a shard index");
  bad({"--shard", "/4"}, {"JOB_COMPLETION_INDEX=4"}, "shard 4 does not exist in 4");
}
