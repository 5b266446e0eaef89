// Profiles of host-less captures: device, CPU and cap figures from counters
// (a provider's metrics, pg_stat_io, pg_stat_database, pg_stat_wal), each
// with its source named.
#include "models/profile.h"
#include "models/project.h"
#include "models/synth.h"

#include <catch2/catch.hpp>

#include <sstream>
#include <string>

using namespace tierlab;
using namespace tierlab::models;
using trace::Nanos;

namespace {

constexpr Nanos kSec = 1'000'000'000;
constexpr int kSessions = 10;
constexpr Nanos kTx = 100'000'000;  // each transaction 100 ms, back to back: 100 tps

// Ten sessions running transactions back to back for `seconds`, and
// whatever samples `samples` adds once a second (t = 0 .. seconds).
template <class F>
Profile build(int seconds, F samples, std::vector<std::pair<std::string, std::string>> meta = {}) {
  ProfileBuilder b;
  for (const auto& [k, v] : meta) b.add({0, 0, trace::Meta{k, v}});
  for (int s = 1; s <= kSessions; ++s) b.add({0, static_cast<uint64_t>(s), trace::SessionBegin{"u", "d", "", "", 0, 0}});
  for (int sec = 0; sec <= seconds; ++sec) {
    samples(b, sec * kSec, sec);
    if (sec == seconds) break;
    for (Nanos t = sec * kSec; t < (sec + 1) * kSec; t += kTx)
      for (int s = 1; s <= kSessions; ++s) {
        b.add({t + 1, static_cast<uint64_t>(s), trace::Query{"select 1"}});
        b.add({t + kTx, static_cast<uint64_t>(s), trace::Ready{'I'}});
      }
  }
  return b.finish("synthetic");
}

std::string source_of(const Profile& p, const std::string& figure) {
  for (const auto& [f, s] : p.sources)
    if (f == figure) return s;
  return "";
}

void sample(ProfileBuilder& b, Nanos ts, const char* name, double v) { b.add({ts, 0, trace::Sample{name, v}}); }

}  // namespace

TEST_CASE("profile: a host-less capture with the provider's metrics takes its figures from them",
          "[profile][counters]") {
  auto p = build(
      10,
      [](ProfileBuilder& b, Nanos ts, int sec) {
        sample(b, ts, "provider.read_iops", 3000 + (sec % 2 ? 10 : -10));  // steady at a ceiling
        sample(b, ts, "provider.write_iops", 400);
        sample(b, ts, "provider.read_latency_s", 0.002);
        sample(b, ts, "provider.write_latency_s", 0.001);
        sample(b, ts, "provider.read_bytes_per_s", 3000 * 8192.0);
        sample(b, ts, "provider.cpu_percent", 50);
        sample(b, ts, "pg.wal.wal_write", 100.0 * sec);  // 1 per transaction
        sample(b, ts, "pg.wal.wal_sync", 50.0 * sec);    // 0.5 per transaction
        sample(b, ts, "pg.wal.wal_bytes", 100.0 * 4096 * sec);
        sample(b, ts, "pg.blks_read", 5000.0 * sec);
      },
      {{"provider", "cloudwatch"}, {"provider.period_s", "1"}, {"cpu.count", "4"}});
  REQUIRE(p.tps == Approx(100).epsilon(0.01));
  CHECK_FALSE(p.has_block_io);
  CHECK(p.io_from_counters);
  // Reads: the provider's ReadIOPS, not pg_stat_database's larger blks_read.
  CHECK(p.reads_per_tx == Approx(30).epsilon(0.01));
  CHECK(p.device_read_iops == Approx(3000).epsilon(0.01));
  CHECK(source_of(p, "device reads per transaction") ==
        "provider (cloudwatch) ReadIOPS, mean over the window / TPS (the volume's reads)");
  CHECK(p.native_read.mean_s == Approx(0.002));
  CHECK(p.latency_holds_cap_wait);
  CHECK(source_of(p, "device read latency").find("ReadLatency") != std::string::npos);
  // CPU: CPUUtilization x vCPUs.
  REQUIRE(p.has_cpu);
  CHECK(p.cpu_cores_busy == Approx(2));
  CHECK(p.cpu_s_per_tx == Approx(0.02).epsilon(0.01));
  CHECK(source_of(p, "CPU per transaction") ==
        "provider (cloudwatch) CPUUtilization 50.0% x 4 vCPUs / TPS (the whole instance's CPU)");
  // The WAL from pg_stat_wal; the background writes are WriteIOPS less it.
  CHECK(p.sync_writes_per_tx == Approx(1).epsilon(0.02));
  CHECK(p.flushes_per_tx == Approx(0.5).epsilon(0.02));
  CHECK(source_of(p, "commit writes and WAL flushes") == "pg_stat_wal wal_write and wal_sync (all of the server's)");
  CHECK(p.native_flush.mean_s == Approx(0.001));
  CHECK(p.background_writes_per_s == Approx(400 - 150).epsilon(0.03));
  CHECK(p.knows_server_processes);
  // Reads took 60 ms of each 100 ms transaction at a steady 3,000/s: capped.
  CHECK(p.cap_bound);
  CHECK(p.cap_op == "read");
  CHECK(p.cap_iops == Approx(3000).epsilon(0.01));
  INFO(source_of(p, "IOPS cap"));
  CHECK(source_of(p, "IOPS cap").find("ReadIOPS steady at ~300") != std::string::npos);

  std::ostringstream text;
  print_profile(text, p);
  CHECK(text.str().find("device (from counters): 3000 read IOPS") != std::string::npos);
  CHECK(text.str().find("\nsources:\n  CPU per transaction: provider (cloudwatch) CPUUtilization") != std::string::npos);
  CHECK(text.str().find("no block I/O in the trace") == std::string::npos);
  CHECK(profile_json(p).find("\"figure\": \"device reads per transaction\"") != std::string::npos);

  // Projected upward: the capture's tier is the detected cap, its wait is
  // in the provider's latency (storage time), so a tier without the cap
  // and with a shorter latency gains.
  Tier capped, nvme;
  capped.name = "capped";
  capped.read = capped.write = capped.flush = {LatencyDist::Fixed, 2'000'000, 0};
  capped.read_iops = 3000;
  nvme.name = "nvme";
  nvme.read = nvme.write = nvme.flush = {LatencyDist::Fixed, 100'000, 0};
  auto pr = project(p, {capped, nvme}, ProjectOptions{});
  CHECK(pr.capture_tier_source == "detected");
  CHECK(pr.capture_capped);
  CHECK(pr.tiers[0].tps == Approx(100).epsilon(0.05));
  CHECK(pr.tiers[1].tps > 150);
  for (const auto& n : pr.notes) CHECK(n.find("a lower bound") == std::string::npos);

  // `profile --json` read back by `project FILE.json` keeps all of it.
  Profile back = profile_from_json(profile_json(p), "p.json");
  CHECK(back.io_from_counters);
  CHECK(back.latency_holds_cap_wait);
  CHECK(back.sources == p.sources);
  CHECK(back.vcpus == 4);
  CHECK(back.cap_op == "read");
  auto pr2 = project(back, {capped, nvme}, ProjectOptions{});
  CHECK(pr2.tiers[1].tps == Approx(pr.tiers[1].tps).epsilon(0.01));
  for (const auto& n : pr2.notes) CHECK(n.find("a lower bound") == std::string::npos);
}

TEST_CASE("profile: without the provider's metrics, reads come from pg_stat_io or blks_read and say so",
          "[profile][counters]") {
  SECTION("pg_stat_io") {
    auto p = build(5, [](ProfileBuilder& b, Nanos ts, int sec) {
      sample(b, ts, "pg.io.client_backend.relation.normal.reads", 150.0 * sec);
      sample(b, ts, "pg.io.autovacuum_worker.relation.normal.reads", 50.0 * sec);
      sample(b, ts, "pg.io.client_backend.relation.normal.read_time", 20.0 * sec);  // ms: 0.1 ms a read
      sample(b, ts, "pg.io.checkpointer.relation.normal.writes", 30.0 * sec);
      sample(b, ts, "pg.blks_read", 999.0 * sec);
    });
    CHECK(p.io_from_counters);
    CHECK(p.reads_per_tx == Approx(2).epsilon(0.02));  // 200 a second, 100 tps
    CHECK(source_of(p, "device reads per transaction") ==
          "pg_stat_io reads of relations, all backends (reads from the OS: page-cache hits included)");
    CHECK(p.native_read.mean_s == Approx(0.0001).epsilon(0.01));
    CHECK(source_of(p, "device read latency").find("track_io_timing") != std::string::npos);
    CHECK(p.background_writes_per_s == Approx(30).epsilon(0.01));
    CHECK(source_of(p, "background writes").find("pg_stat_io writes of the checkpointer") != std::string::npos);
    CHECK_FALSE(p.has_cpu);
  }
  SECTION("pg_stat_database") {
    auto p = build(5, [](ProfileBuilder& b, Nanos ts, int sec) { sample(b, ts, "pg.blks_read", 300.0 * sec); });
    CHECK(p.reads_per_tx == Approx(3).epsilon(0.02));
    CHECK(source_of(p, "device reads per transaction") ==
          "pg_stat_database blks_read (reads from the OS: page-cache hits included)");
    bool latency_note = false;
    for (const auto& n : p.notes) latency_note |= n.find("device read latency at capture unknown") != std::string::npos;
    CHECK(latency_note);
    CHECK_FALSE(p.cap_bound);  // steady, but nothing says the transactions waited
  }
}

TEST_CASE("profile: a capture with block I/O and process CPU keeps them, and names them as sources",
          "[profile][counters]") {
  auto p = build(3, [](ProfileBuilder& b, Nanos ts, int sec) {
    sample(b, ts, "cpu.user_ns", 1e8 * sec);
    sample(b, ts, "provider.cpu_percent", 90);
    sample(b, ts, "pg.blks_read", 300.0 * sec);
    if (sec < 3) b.add({ts + 5, 0, trace::BlockIo{ts + 100'000, 1, 0, 8192, trace::IoOp::Read, 0, 99, 0}});
  }, {{"cpu.count", "4"}});
  CHECK(p.has_block_io);
  CHECK_FALSE(p.io_from_counters);
  CHECK(p.cpu_s_per_tx == Approx(0.001).epsilon(0.02));  // the process CPU, not 90% of 4 vCPUs
  CHECK(source_of(p, "CPU per transaction").find("/proc") != std::string::npos);
  CHECK(source_of(p, "device reads per transaction") == "block I/O of the transactions' backends");
}
