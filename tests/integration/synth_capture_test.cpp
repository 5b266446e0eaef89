// profile synth against a real capture of the same pgbench run: a throwaway
// PostgreSQL in a cgroup v1 memory limit smaller than its data, its files on
// a device of their own (sandbox --tier --memory), pgbench -S captured with
// `capture run` (packets on lo, block I/O of that device); the device reads
// per transaction the capture's profile measures against those `profile
// synth` computes for the same scale, clients, memory and shared_buffers.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

}  // namespace

TEST_CASE("profile synth: reads per transaction within 15% of a capture under a memory limit",
          "[integration][synth]") {
  test::require_root("a memory cgroup, a device of the server's own and packet capture");
  if (::access("/sys/fs/cgroup/memory/memory.limit_in_bytes", F_OK) != 0)
    test::skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory");
  if (::access("/sys/kernel/tracing/events/block", F_OK) != 0 &&
      ::access("/sys/kernel/debug/tracing/events/block", F_OK) != 0)
    test::skip("no tracefs block events");
  TempDir dir;
  // Scale 20: 262 MiB of pgbench_accounts heap and 43 MiB of its key in a
  // 224 MiB limit with shared_buffers 64 MB (max_connections 50: the rest
  // of the shared memory is 9 MB). pgbench -S, 8 clients: 15 s to reach
  // the caches' steady state, then 15 s captured.
  const std::string trace = dir.file("run.tlt");
  const std::string script = dir.file("run.sh");
  std::ofstream(script) << "set -e\n"
                           "B=$TIERLAB_PG_BINDIR\n"
                           "$B/pgbench -n -S -c 8 -j 2 -T 15 >/dev/null\n"
                           "\"" TIERLAB_BINARY "\" capture run -i lo -p $PGPORT --host 127.0.0.1 "
                           "--device \"$TIERLAB_PG_DATA_DIR\" --no-file-io --pid $TIERLAB_PG_POSTMASTER_PID "
                           "--conninfo \"host=127.0.0.1 port=$PGPORT dbname=postgres user=postgres\" "
                           "--duration 19s -o " +
                               trace + " >" + dir.file("capture.out") +
                               " 2>&1 &\n"
                               "sleep 2\n"
                               "$B/pgbench -n -S -c 8 -j 2 -T 15\n"
                               "wait $!\n";
  auto run = test::run_tierlab({"sandbox", "--tier", "nvme-local", "--memory", "224M", "--set",
                                "shared_buffers=64MB", "--set", "max_connections=50", "--pgbench-init", "20",
                                "--", "sh", script});
  INFO(run.out << run.err << slurp(dir.file("capture.out")));
  REQUIRE(run.status == 0);

  auto prof = test::run_tierlab({"profile", "--json", trace});
  INFO(prof.err);
  REQUIRE(prof.status == 0);
  auto captured = nlohmann::json::parse(prof.out);
  REQUIRE(captured["device"]["has_block_io"] == true);
  REQUIRE(captured["transactions"].get<double>() > 10000);
  const double measured = captured["per_transaction"]["device_reads"].get<double>();

  const std::string synth_json = dir.file("synth.json");
  auto synth = test::run_tierlab({"profile", "synth", "pgbench", "--scale", "20", "--mode", "select-only",
                                  "--clients", "8", "--memory", "224M", "--shared-buffers", "64MB", "--vcpus",
                                  "2", "--calibrate", trace, "--json", synth_json});
  INFO(synth.out << synth.err);
  REQUIRE(synth.status == 0);
  const double modelled = nlohmann::json::parse(slurp(synth_json))["per_transaction"]["device_reads"].get<double>();
  // shared_buffers' misses too (PostgreSQL's blks_read), where the server's
  // counters were sampled: the first of the two caches on its own.
  const auto& blks = captured["per_transaction"]["pg_blks_read"];
  INFO("device reads per transaction: captured " << measured << ", profile synth " << modelled
                                                  << "; blks_read captured " << blks);
  // A limit that caches part of the data: reads neither ~0 nor every page.
  CHECK(measured > 0.3);
  CHECK(measured < 1.8);
  CHECK(std::abs(modelled - measured) <= 0.15 * measured);
}
