// Projection: the queueing model's figures on hand-built profiles.
#include "models/project.h"

#include "models/capacity.h"
#include "models/group_commit.h"

#include "common/error.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

using namespace tierlab;
using namespace tierlab::models;

namespace {

Profile base_profile() {
  Profile p;
  p.source = "synthetic";
  p.transactions = 10000;
  p.duration_s = 10;
  p.tps = 1000;
  p.clients = 4;
  p.mean_clients = 4;
  p.think_time_s = 0.001;
  p.has_cpu = true;
  p.cpu_s_per_tx = 0.0005;
  p.has_block_io = true;
  p.reads_per_tx = 2;
  p.read_bytes_per_tx = 2 * 8192;
  p.native_read = {20000, 0.0002, 0.0002, 0.0004};
  p.native_write = {1, 0.0001, 0.0001, 0.0001};
  p.native_flush = {1, 0.0001, 0.0001, 0.0001};
  p.vcpus = 2;
  // Measured latency 1.2 ms: the model's 0.5 + 0.4 leave 0.3 ms of "other"
  // at 4 clients (plus queueing).
  p.latency = {10000, 0.0012, 0.001, 0.003};
  return p;
}

// One template, all transactions, whose backends write `writes` per
// transaction (the WAL at commit).
void one_writing_template(Profile& p, double writes) {
  TemplateStats t;
  t.count = p.transactions;
  t.share = 1;
  t.writes_per_tx = writes;
  p.templates = {t};
}

Tier fixed_tier(const std::string& name, double read_ms, double iops) {
  Tier t;
  t.name = name;
  t.read = {LatencyDist::Fixed, static_cast<Nanos>(read_ms * 1e6), 0};
  t.write = t.read;
  t.flush = t.read;
  t.total_iops = iops;
  return t;
}


// A tier whose only cap is on reads.
Tier read_capped(const std::string& name, double read_ms, double read_iops) {
  Tier t = fixed_tier(name, read_ms, 0);
  t.read_iops = read_iops;
  return t;
}

Projection plan(const Profile& p, const std::vector<Tier>& tiers, const ProjectOptions& o, const CapacityOptions& c) {
  Projection pr = project(p, tiers, o);
  add_capacity(pr, p, tiers, o, c);
  return pr;
}

constexpr double kMiB = 1024.0 * 1024;

}  // namespace

TEST_CASE("project: one client is the sum of its demands", "[project]") {
  Profile p = base_profile();
  ProjectOptions o;
  o.clients_lo = o.clients_hi = 1;
  auto pr = project(p, {fixed_tier("fast", 0.1, 0)}, o);
  REQUIRE(pr.tiers.size() == 1);
  const auto& t = pr.tiers[0];
  double r = 0.0005 + 2 * 0.0001 + pr.other_s;
  CHECK(t.latency_s == Approx(r));
  CHECK(t.tps == Approx(1.0 / (r + 0.001)));
  CHECK(t.split.cpu_s == Approx(0.0005));
  CHECK(t.split.storage_s == Approx(0.0002));
  CHECK(t.read_iops == Approx(2 * t.tps));
  CHECK(t.p99_s > t.latency_s);
}

TEST_CASE("project: calibration reproduces the capture on the captured device", "[project]") {
  Profile p = base_profile();
  auto pr = project(p, {fixed_tier("native", 0.2, 0)}, {});
  CHECK(pr.other_s > 0);
  // On the captured device at the captured client count the model gives the
  // measured latency, so throughput follows from the response time law.
  CHECK(pr.tiers[0].latency_s == Approx(p.latency.mean_s).epsilon(1e-6));
  CHECK(pr.modelled_capture_tps == Approx(4 / (0.0012 + 0.001)).epsilon(1e-6));
}

TEST_CASE("project: the cores the capture took are given back to the server", "[project]") {
  Profile p = base_profile();
  const Tier native = fixed_tier("native", 0.2, 0);
  auto without = project(p, {native}, {});
  p.capture_cores_busy = 0.5;
  auto with = project(p, {native}, {});
  CHECK(without.capture_cores == 0);
  CHECK(with.capture_cores == 0.5);
  // Calibrated on the capture either way ...
  CHECK(with.modelled_capture_tps == Approx(without.modelled_capture_tps).epsilon(1e-6));
  // ... where the server's CPU queued behind the capture's: less of the
  // captured latency is "other", and the tier, without the capture, is faster.
  CHECK(with.other_s < without.other_s);
  CHECK(with.tiers[0].tps > without.tiers[0].tps);
  CHECK(with.tiers[0].split.cpu_s == Approx(without.tiers[0].split.cpu_s).epsilon(0.2));
  // Saturated, the server has both cores: 2 / 0.5 ms.
  ProjectOptions o;
  o.clients_lo = o.clients_hi = 256;
  CHECK(project(p, {native}, o).tiers[0].tps == Approx(4000).epsilon(0.01));
}

TEST_CASE("project: more vCPUs never lower throughput, and other is calibrated on the captured vCPUs", "[project]") {
  // A CPU-bound read-only capture on 2 vCPUs (pgbench -S -c 8 like): 8
  // clients at 14,500 tps, 0.12 ms of CPU per transaction, 87% busy.
  Profile p = base_profile();
  p.clients = 8;
  p.mean_clients = 8;
  p.tps = 14500;
  p.cpu_s_per_tx = 0.00012;
  p.reads_per_tx = 0;
  p.read_bytes_per_tx = 0;
  p.think_time_s = 0.00005;
  p.latency = {100000, 8 / 14500.0 - 0.00005, 0.0004, 0.002};
  p.vcpus = 2;
  const Tier native = fixed_tier("native", 0.2, 0);
  ProjectOptions o;
  auto as_captured = project(p, {native}, o);
  REQUIRE(as_captured.vcpus == 2);
  REQUIRE(as_captured.capture_vcpus == 2);
  REQUIRE(as_captured.other_s > 0);
  CHECK(as_captured.tiers[0].tps == Approx(14500).epsilon(1e-6));
  double last = 0;
  for (int v : {1, 2, 3, 4, 8, 16}) {
    o.vcpus = v;
    auto pr = project(p, {native}, o);
    INFO("vcpus " << v);
    CHECK(pr.vcpus == v);
    CHECK(pr.capture_vcpus == 2);
    // The capture is the same whatever the target: same "other", and the
    // model still reproduces it.
    CHECK(pr.other_s == Approx(as_captured.other_s).epsilon(1e-9));
    CHECK(pr.modelled_capture_tps == Approx(14500).epsilon(1e-6));
    if (v == 1) CHECK(pr.tiers[0].tps < as_captured.tiers[0].tps * 0.99);
    if (v > 2) CHECK(pr.tiers[0].tps > as_captured.tiers[0].tps * 1.01);
    CHECK(pr.tiers[0].tps >= last);
    CHECK(pr.tiers[0].split.other_s == Approx(as_captured.other_s).epsilon(1e-9));
    last = pr.tiers[0].tps;
    std::ostringstream text;
    print_projection(text, pr);
    CHECK(text.str().find(v == 2 ? "vcpus 2\n" : "vcpus " + std::to_string(v) + " (2 at capture)\n") !=
          std::string::npos);
  }
  // The capture's own cores, with another target.
  p.capture_cores_busy = 0.25;
  o.vcpus = 4;
  std::ostringstream text;
  print_projection(text, project(p, {native}, o));
  CHECK(text.str().find("vcpus 4 (2 at capture, of which the capture took 0.25: projected without it)") !=
        std::string::npos);
  p.capture_cores_busy = 0;
  // Without a CPU count in the trace the capture is taken to have run on
  // this machine, and the note says so; --vcpus still sets only the target.
  p.vcpus = 0;
  o.vcpus = 64;
  auto unknown = project(p, {native}, o);
  CHECK(unknown.vcpus == 64);
  CHECK(unknown.capture_vcpus >= 1);
  CHECK(unknown.modelled_capture_tps == Approx(14500).epsilon(1e-6));
  bool noted = false;
  for (const auto& n : unknown.notes) noted = noted || n.find("cpu.count") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("project: without CPU samples the CPU is no resource and its time is in other", "[project]") {
  Profile p = base_profile();
  p.has_cpu = false;
  p.cpu_s_per_tx = 0.0005;  // ignored: not measured
  Tier t = fixed_tier("native", 0.2, 0);
  t.parallelism = 4;
  ProjectOptions o;
  o.vcpus = 1;
  auto pr = project(p, {t}, o);
  CHECK_FALSE(pr.cpu_modelled);
  CHECK(pr.cpu_s_per_tx == 0);
  CHECK(pr.tiers[0].split.cpu_s == 0);
  // The model still gives the measured latency: what the reads do not
  // explain is "other", the CPU's time with it.
  CHECK(pr.tiers[0].latency_s == Approx(p.latency.mean_s).epsilon(1e-6));
  CHECK(pr.other_s > 0.0012 - 2 * 0.0002 - 1e-9);
  // The busiest resource is the storage, never a CPU with no demand.
  CHECK(pr.tiers[0].busiest == "storage");
  std::ostringstream text;
  print_projection(text, pr);
  CHECK(text.str().find("cpu not sampled (in other)") != std::string::npos);
  CHECK(text.str().find("its time is in 'other'") != std::string::npos);
  CHECK(projection_json(pr).find("\"cpu_ms\": null") != std::string::npos);

  // Without device I/O either, nothing the network serves has any demand:
  // throughput follows the clients' cycle.
  p.has_block_io = false;
  p.reads_per_tx = 0;
  p.read_bytes_per_tx = 0;
  auto none = project(p, {t}, o);
  CHECK(none.tiers[0].busiest.empty());
  CHECK(busiest_text(none.tiers[0]) == "-");
  CHECK(none.tiers[0].bottleneck.empty());
  CHECK(bottleneck_text(none.tiers[0]) == "none");
  CHECK(none.tiers[0].tps == Approx(4 / (0.0012 + 0.001)).epsilon(1e-6));
}

TEST_CASE("project: an IOPS cap bounds throughput and is the bottleneck", "[project]") {
  Profile p = base_profile();
  ProjectOptions o;
  o.clients_lo = 1;
  o.clients_hi = 64;
  auto pr = project(p, {fixed_tier("uncapped", 0.2, 0), fixed_tier("capped", 0.2, 1000)}, o);
  const auto& free = pr.tiers[0];
  const auto& capped = pr.tiers[1];
  // 2 reads per transaction under 1,000 IOPS: at most 500 tps.
  CHECK(capped.tps <= 500.0 * (1 + 1e-9));
  CHECK(capped.tps == Approx(500).epsilon(0.02));
  CHECK(capped.bottleneck == "IOPS cap");
  CHECK(bottleneck_text(capped) == "IOPS cap 100%");
  CHECK(capped.read_iops == Approx(2 * capped.tps));
  CHECK(free.bottleneck == "cpu");  // 64 clients on 2 vCPUs: saturated
  CHECK(free.bottleneck_utilisation >= kSaturated);
  CHECK(free.tps == Approx(2 / 0.0005).epsilon(0.05));
  CHECK(capped.ratio == Approx(capped.tps / free.tps));
  REQUIRE(capped.curve.size() == 64);
  for (size_t i = 1; i < capped.curve.size(); ++i) CHECK(capped.curve[i].tps >= capped.curve[i - 1].tps * (1 - 1e-12));
}

TEST_CASE("project: separate read and write caps, background writes", "[project]") {
  Profile p = base_profile();
  p.sync_writes_per_tx = 1;
  p.write_bytes_per_tx = 8192;
  p.background_writes_per_s = 1000;  // one more write per transaction at capture
  Tier t = fixed_tier("split", 0.2, 0);
  t.read_iops = 4000;
  t.write_iops = 1000;
  ProjectOptions o;
  o.clients_lo = o.clients_hi = 256;
  auto pr = project(p, {t}, o);
  CHECK(pr.tiers[0].bottleneck == "write IOPS cap");
  CHECK(pr.tiers[0].tps == Approx(500).epsilon(0.02));
  o.kernel_writes_uncapped = true;
  pr = project(p, {t}, o);
  // Now the reads (2 per tx at 4,000) and the commit write (1 at 1,000)
  // tie at 1,000 tps, and the CPU (2 vcpus, 0.5 ms) too: below 1,000.
  CHECK(pr.tiers[0].tps <= 1000.0);
  CHECK(pr.tiers[0].tps > 900.0);
}

TEST_CASE("project: background writes per transaction, the server's up to their captured rate", "[project]") {
  Profile p = base_profile();
  p.sync_writes_per_tx = 1;
  p.write_bytes_per_tx = 8192;
  p.knows_server_processes = true;
  p.background_writes_per_s = 700;  // 400/s by the kernel, 300/s by the background writer
  p.background_write_bytes_per_s = 700 * 8192;
  p.server_writes_per_s = 300;
  p.server_write_bytes_per_s = 300 * 8192;
  Tier t = fixed_tier("w", 0.2, 0);
  t.write_iops = 1000;
  ProjectOptions o;
  o.clients_lo = o.clients_hi = 256;
  // Every background write counted: 0.7 per transaction besides the
  // commit write, 1000 / 1.7.
  auto pr = project(p, {t}, o);
  CHECK(pr.tiers[0].bottleneck == "write IOPS cap");
  CHECK(pr.tiers[0].tps == Approx(1000 / 1.7).epsilon(1e-6));
  CHECK(pr.tiers[0].write_iops == Approx(1000).epsilon(1e-6));
  // The kernel's writeback left out (cgroup v1 blkio): the background
  // writer at its captured 300/s (0.7 x 700 tps would be more than it
  // managed), (1000 - 300) / 1.
  o.kernel_writes_uncapped = true;
  pr = project(p, {t}, o);
  CHECK(pr.tiers[0].tps == Approx(700).epsilon(1e-6));
  CHECK(pr.tiers[0].write_iops == Approx(1000).epsilon(1e-6));
  {
    // Under a tighter cap the background writer keeps up with everything
    // the transactions dirty (0.7 each): 400 / 1.7, not (400 - 300) / 1.
    Tier tight = t;
    tight.write_iops = 400;
    auto pt = project(p, {tight}, o);
    CHECK(pt.tiers[0].tps == Approx(400 / 1.7).epsilon(1e-6));
    CHECK(pt.tiers[0].write_iops == Approx(400).epsilon(1e-6));
  }
  // A tier that counts flushes: one WAL flush per two transactions at
  // capture (two commit writes and a flush a cycle, 3 of the cap's I/Os).
  // Where the cap binds, it paces the cycles and 256 clients waiting on it
  // share each flush: the batch grows until the cap no longer binds and the
  // CPU (0.5 ms on 2 vCPUs) does.
  p.flushes_per_tx = 0.5;
  one_writing_template(p, 1);
  t.count_flushes = true;
  t.write = t.flush = p.native_write.count ? Latency{LatencyDist::Fixed, 100000, 0} : t.write;
  pr = project(p, {t}, o);
  CHECK(pr.tiers[0].tps > 700 / 1.5);
  CHECK(pr.tiers[0].flushes_per_tx < 0.1);
  CHECK(pr.tiers[0].write_iops <= 1000 * (1 + 1e-6));
  // Background writes the server's processes managed beyond the cap at
  // capture (3 per transaction): under the cap they write only what the
  // transactions dirty, and the cap binds: 3 per transaction plus the
  // flush cycles' 3 I/Os each take all of it.
  p.background_writes_per_s = 3000;
  p.background_write_bytes_per_s = 3000 * 8192;
  p.server_writes_per_s = 3000;
  p.server_write_bytes_per_s = 3000 * 8192;
  pr = project(p, {t}, o);
  CHECK(pr.tiers[0].bottleneck == "write IOPS cap");
  CHECK(pr.tiers[0].tps * (3 + 3 * pr.tiers[0].flushes_per_tx) == Approx(1000).epsilon(1e-6));
  CHECK(pr.tiers[0].write_iops == Approx(1000).epsilon(1e-6));
  CHECK(pr.tiers[0].flushes_per_tx < 0.5 / 10);  // 256 clients share a flush
}

TEST_CASE("project: WAL flushes per transaction follow the flush cycle", "[project]") {
  Profile p = base_profile();
  p.sync_writes_per_tx = 0.5;
  p.write_bytes_per_tx = 0.5 * 8192;
  p.flushes_per_tx = 0.5;  // two commits per flush at 1,000 tps, 4 clients
  ProjectOptions o;
  // No template wrote: the flushes are not commits' (a read-only workload's
  // stray flushes), kept as a fixed demand per transaction.
  auto pn = project(p, {fixed_tier("same", 0.1, 0)}, o);
  CHECK_FALSE(pn.group_commit);
  CHECK(pn.tiers[0].flushes_per_tx == 0.5);
  one_writing_template(p, 0.5);
  auto pr = project(p, {fixed_tier("same", 0.1, 0), fixed_tier("slow flush", 0.1, 0)}, o);
  REQUIRE(pr.group_commit);
  // 1000 F + exp(-1000 F) = 2.
  CHECK(pr.cycle_s == Approx(0.0018414).epsilon(1e-3));
  CHECK(pr.cycle_device_s == Approx(0.0002));
  // On the captured latencies at the captured client count: the batch the
  // cycle gives at the modelled rate, near the captured one.
  const auto& same = pr.tiers[0];
  CHECK(same.flushes_per_tx == Approx(1 / group_commit_batch(same.tps, pr.cycle_s, 4)).epsilon(1e-6));
  CHECK(same.flushes_per_tx == Approx(0.5).epsilon(0.1));
  // One client: every commit flushes alone.
  o.clients_lo = o.clients_hi = 1;
  pr = project(p, {fixed_tier("same", 0.1, 0)}, o);
  CHECK(pr.tiers[0].flushes_per_tx == Approx(1.0));
  // A slower flush on a tier lengthens the cycle: more commits share one.
  o = {};
  Tier slow = fixed_tier("slow flush", 0.1, 0);
  slow.flush = {LatencyDist::Fixed, 1000000, 0};
  pr = project(p, {fixed_tier("same", 0.1, 0), slow}, o);
  CHECK(pr.tiers[1].flushes_per_tx < pr.tiers[0].flushes_per_tx);
  CHECK(pr.tiers[1].flushes_per_tx >= 1.0 / 4);
  CHECK(pr.tiers[1].tps < pr.tiers[0].tps);
  // Half the transactions read-only: commits arrive at half the rate, one
  // per flush for the writing half, so the same 0.5 per transaction needs no
  // sharing at capture: the cycle is the device's writes and flush, and
  // sharing only begins as commits overlap it.
  TemplateStats ro;
  ro.share = 0.5;
  p.templates[0].share = 0.5;
  p.templates[0].writes_per_tx = 1;
  p.templates.push_back(ro);
  pr = project(p, {fixed_tier("same", 0.1, 0)}, o);
  CHECK(pr.committing_share == 0.5);
  CHECK(pr.cycle_s > 0);
  CHECK(pr.cycle_s == Approx(pr.cycle_device_s));
  CHECK(pr.tiers[0].flushes_per_tx == Approx(0.5).epsilon(0.05));
}

TEST_CASE("project: more memory means fewer reads along the curve", "[project]") {
  Profile p = base_profile();
  p.memory_bytes = 1024.0 * 1024 * 1024;
  p.shared_buffers_bytes = 128.0 * 1024 * 1024;
  p.mrc.source = "file_io";
  // Miss ratio falls linearly from 1 at 0 to 0 at 2 GiB of cache.
  p.mrc.points = {{0, 1.0}, {2048.0 * 1024 * 1024, 0.0}};
  ProjectOptions o;
  o.memory_bytes = 1024.0 * 1024 * 1024 + 512.0 * 1024 * 1024;
  auto pr = project(p, {fixed_tier("x", 0.2, 1000)}, o);
  // Cache 896 MiB -> 1408 MiB: miss 0.5625 -> 0.3125.
  CHECK(pr.read_factor == Approx(0.3125 / 0.5625));
  CHECK(pr.reads_per_tx == Approx(2 * 0.3125 / 0.5625));
  o.memory_bytes = 0;
  CHECK(project(p, {fixed_tier("x", 0.2, 1000)}, o).read_factor == 1.0);
  Profile q = base_profile();
  o.memory_bytes = 1e9;
  CHECK_THROWS_AS(project(q, {fixed_tier("x", 0.2, 1000)}, o), InputError);
}

TEST_CASE("project: latency distributions' means match their definitions", "[project]") {
  CHECK(mean_latency_s({LatencyDist::Fixed, 500000, 0}) == Approx(0.0005));
  CHECK(mean_latency_s({LatencyDist::Exponential, 693147, 0}) == Approx(0.001).epsilon(1e-5));
  // Lognormal with p99 = p50: no spread.
  double m = mean_latency_s({LatencyDist::Lognormal, 100000, 1000000});
  CHECK(m > 0.0001);
  CHECK(m < 0.0002);
}

TEST_CASE("project: bad input and reports", "[project]") {
  Profile p = base_profile();
  CHECK_THROWS_AS(project(p, {}, {}), InputError);
  ProjectOptions o;
  o.clients_lo = 5;
  o.clients_hi = 2;
  CHECK_THROWS_AS(project(p, {fixed_tier("x", 0.2, 0)}, o), InputError);
  o.clients_lo = 1;
  o.clients_hi = 16;
  auto pr = project(p, {fixed_tier("nvme <fast>", 0.1, 0), fixed_tier("capped", 0.5, 2000)}, o);
  std::string html = projection_html(pr, p);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("<polyline") != std::string::npos);
  CHECK(html.find("nvme &lt;fast&gt;") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http") == std::string::npos);
  CHECK(html.find("@font-face") == std::string::npos);
  std::ostringstream text;
  print_projection(text, pr);
  CHECK(text.str().find("tps by clients") != std::string::npos);
  CHECK(projection_json(pr).find("\"bottleneck\"") != std::string::npos);
}

TEST_CASE("project: p99 of an exponential response is ln(100) times its mean", "[project]") {
  Profile p = base_profile();
  p.reads_per_tx = 0;
  p.read_bytes_per_tx = 0;
  p.latency = {100, 0.0001, 0.0001, 0.0001};  // below the model: no "other"
  ProjectOptions o;
  o.clients_lo = o.clients_hi = 1;
  o.vcpus = 1;
  auto pr = project(p, {fixed_tier("x", 0.1, 0)}, o);
  REQUIRE(pr.other_s == 0);
  // One queueing station (the CPU) alone: exponential, gamma shape 1.
  CHECK(pr.tiers[0].latency_s == Approx(0.0005));
  CHECK(pr.tiers[0].p99_s == Approx(0.0005 * std::log(100.0)).epsilon(1e-6));
  // Heavy-tailed device time (shape far below 1) still gives a p99 above the mean.
  Profile q = base_profile();
  Tier slow = fixed_tier("slow", 0.1, 0);
  slow.read = {LatencyDist::Lognormal, 100000, 50000000};
  auto pq = project(q, {slow}, o);
  CHECK(pq.tiers[0].p99_s > pq.tiers[0].latency_s);
}

TEST_CASE("project: a resource is the bottleneck only near saturation and the time split says where the time goes",
          "[project]") {
  // 4 clients, 0.5 ms of CPU on 2 vCPUs, 2 reads of 2 ms each: the CPU is
  // the busiest resource but far from saturated, and storage wait is most of
  // a transaction's time.
  Profile p = base_profile();
  Tier slow = fixed_tier("slow", 2, 0);
  auto pr = project(p, {slow}, ProjectOptions{});
  const auto& t = pr.tiers[0];
  CHECK(t.busiest == "cpu");
  CHECK(t.busiest_utilisation > 0.05);
  CHECK(t.busiest_utilisation < kSaturated);
  CHECK(t.bottleneck.empty());
  CHECK(bottleneck_text(t) == "none");
  CHECK(busiest_text(t).rfind("cpu ", 0) == 0);
  const std::string split = time_split_text(t, true);
  INFO(split);
  CHECK(split.rfind("storage wait ", 0) == 0);  // largest first
  CHECK(split.find("cpu ") != std::string::npos);
  CHECK(split.find("other ") != std::string::npos);
  CHECK(t.split.storage_s / t.latency_s > 0.6);

  std::ostringstream text;
  print_projection(text, pr);
  INFO(text.str());
  CHECK(text.str().find("where a transaction's time goes at 4 clients") != std::string::npos);
  CHECK(text.str().find("slow                   storage wait ") != std::string::npos);
  CHECK(text.str().find(busiest_text(t) + " ") != std::string::npos);
  CHECK(text.str().find(" none\n") != std::string::npos);
  auto j = nlohmann::json::parse(projection_json(pr));
  CHECK(j["tiers"][0]["bottleneck"].is_null());
  CHECK(j["tiers"][0]["busiest"] == "cpu");
  CHECK(j["tiers"][0]["time_share"]["storage"].get<double>() == Approx(t.split.storage_s / t.latency_s));
}

TEST_CASE("project: a burst tier is projected at its burst while credits last, then at its baseline",
          "[project]") {
  Profile p = base_profile();  // 2 reads per transaction, CPU-bound near 4,000 tps
  ProjectOptions o;
  o.clients_hi = 16;
  Tier gp2 = tiers::load_catalog("").get("ebs-gp2-100g");
  REQUIRE(gp2.burst.enabled());
  REQUIRE(gp2.burst.burst_iops == 3000);
  REQUIRE(gp2.burst.refill_iops == 300);
  auto pr = project(p, {fixed_tier("free", 0.2, 0), gp2}, o);
  const auto& t = pr.tiers[1];
  // While credits last: 3,000 IOPS / 2 reads = 1,500 tps.
  CHECK(t.tps == Approx(1500).epsilon(0.01));
  CHECK(t.burst_iops == 3000);
  CHECK(t.baseline_iops == 300);
  CHECK(t.bottleneck == "IOPS cap");
  // The bucket drains at 3,000 - 300 counted I/Os per second.
  CHECK(t.burst_lasts_s == Approx(gp2.burst.credits / (t.read_iops + t.write_iops - 300)));
  CHECK(t.burst_lasts_s == Approx(5.4e6 / 2700).epsilon(0.01));
  REQUIRE(t.after_burst.size() == 1);
  const auto& a = t.after_burst.front();
  CHECK(a.tps == Approx(150).epsilon(0.01));
  CHECK(a.ratio == Approx(a.tps / pr.tiers[0].tps));
  CHECK(t.ratio == Approx(t.tps / pr.tiers[0].tps));

  std::ostringstream text;
  print_projection(text, pr);
  INFO(text.str());
  CHECK(text.str().find("ebs-gp2-100g: burst 3000 IOPS for 33 min at the projected rate") != std::string::npos);
  CHECK(text.str().find("then 300 IOPS baseline: 150.0 tps") != std::string::npos);
  auto j = nlohmann::json::parse(projection_json(pr));
  CHECK(j["tiers"][1]["burst"]["lasts_s"].get<double>() == Approx(t.burst_lasts_s));
  CHECK(j["tiers"][1]["burst"]["after_burst"]["tps"].get<double>() == Approx(a.tps));

  // A workload under the baseline never runs out of credits: one figure.
  p.reads_per_tx = 0.01;
  p.read_bytes_per_tx = 0.01 * 8192;
  o.clients_hi = 1;
  auto light = project(p, {gp2}, o);
  CHECK(light.tiers[0].read_iops < 300);
  CHECK(std::isinf(light.tiers[0].burst_lasts_s));
  CHECK(light.tiers[0].after_burst.empty());
  std::ostringstream lt;
  print_projection(lt, light);
  CHECK(lt.str().find("the credits never run out") != std::string::npos);
  CHECK(nlohmann::json::parse(projection_json(light))["tiers"][0]["burst"]["lasts_s"].is_null());
}

TEST_CASE("capacity: a load multiple shortens the think time, then adds clients", "[capacity]") {
  // Cycle 1 ms think + 1 ms response: 2x takes the think time to 0.
  auto c = load_config(2, 4, 0.001, 0.001, LoadBy::Think);
  CHECK(c.clients == 4);
  CHECK(c.think_s == Approx(0).margin(1e-15));
  c = load_config(1.5, 4, 0.001, 0.001, LoadBy::Think);
  CHECK(c.clients == 4);
  CHECK(c.think_s == Approx(0.002 / 1.5 - 0.001));
  c = load_config(0.5, 4, 0.001, 0.001, LoadBy::Think);
  CHECK(c.think_s == Approx(0.003));
  // 4x: every client offers 1 / 1 ms with no think time, so 8 of them.
  c = load_config(4, 4, 0.001, 0.001, LoadBy::Think);
  CHECK(c.clients == 8);
  CHECK(c.think_s == 0);
  c = load_config(3, 4, 0.001, 0.001, LoadBy::Think);
  CHECK(c.clients == 6);
  // No think time at all: only clients.
  CHECK(load_config(3, 4, 0, 0.001, LoadBy::Think).clients == 12);
  c = load_config(1.5, 4, 0.001, 0.001, LoadBy::Clients);
  CHECK(c.clients == 6);
  CHECK(c.think_s == 0.001);
  CHECK(load_config(0.1, 4, 0.001, 0.001, LoadBy::Clients).clients == 1);
  CHECK_THROWS_AS(load_config(0, 4, 0.001, 0.001, LoadBy::Think), InputError);
  CHECK_THROWS_AS(load_config(-1, 4, 0.001, 0.001, LoadBy::Clients), InputError);
  CHECK_THROWS_AS(load_config(NAN, 4, 0.001, 0.001, LoadBy::Clients), InputError);
}

TEST_CASE("capacity: throughput and latency grow with load on every tier", "[capacity]") {
  Profile p = base_profile();
  const std::vector<Tier> tiers = {read_capped("fast", 0.1, 0), read_capped("slow", 2, 0),
                                   read_capped("capped", 0.1, 2500)};
  for (LoadBy by : {LoadBy::Think, LoadBy::Clients}) {
    CapacityOptions c;
    c.by = by;
    c.loads = {0.5, 1, 1.5, 2, 3, 5, 8};
    auto pr = plan(p, tiers, {}, c);
    REQUIRE(pr.loads.size() == 7);
    // Load 1 is the projection itself.
    for (size_t i = 0; i < tiers.size(); ++i) CHECK(pr.loads[1].tiers[i].tps == Approx(pr.tiers[i].tps));
    for (size_t k = 1; k < pr.loads.size(); ++k)
      for (size_t i = 0; i < tiers.size(); ++i) {
        INFO("load " << pr.loads[k].load << " tier " << tiers[i].name);
        CHECK(pr.loads[k].tiers[i].tps >= pr.loads[k - 1].tiers[i].tps * (1 - 1e-9));
        CHECK(pr.loads[k].tiers[i].latency_s >= pr.loads[k - 1].tiers[i].latency_s * (1 - 1e-9));
      }
    // Where nothing saturates, the tier carries the load it is offered.
    CHECK(pr.loads[0].tiers[0].tps == Approx(0.5 * pr.loads[1].tiers[0].tps).epsilon(0.1));
  }
}

TEST_CASE("capacity: a capped tier's headroom is where its cap's bound is reached", "[capacity]") {
  Profile p = base_profile();
  // 2 reads per transaction under 5,000 read IOPS: at most 2,500 tps,
  // above today's load on this tier (about 1,900 tps).
  const std::vector<Tier> tiers = {read_capped("fast", 0.1, 0), read_capped("capped", 0.1, 5000)};
  CapacityOptions c;
  c.loads = {1, 2};
  auto pr = plan(p, tiers, {}, c);
  const auto& capped = pr.tiers[1];
  REQUIRE(std::isfinite(capped.headroom));
  CHECK(capped.headroom > 1);
  CHECK(capped.headroom_by == "read IOPS cap");
  CHECK(pr.loads[0].tiers[1].tps < 2500);
  CHECK(capped.headroom_tps == Approx(2500).epsilon(0.001));
  CHECK(capped.headroom_iops == Approx(5000).epsilon(0.001));
  // Just below the headroom the cap's bound is not reached (a cap 90% used
  // is named the bottleneck, but it delays nothing yet).
  ProjectOptions below;
  auto cfg = load_config(capped.headroom * (1 - 2 * kHeadroomPrecision), 4, p.think_time_s, p.latency.mean_s,
                         LoadBy::Think);
  below.clients_lo = below.clients_hi = cfg.clients;
  below.think_s = cfg.think_s;
  auto b = project(p, {tiers[1]}, below);
  CHECK(b.tiers[0].bottleneck_utilisation < 1);
  CHECK(b.tiers[0].tps < 2500);
  // The uncapped tier runs on until its CPU is 90% busy (2 vCPUs, 0.5 ms
  // each: 4,000 tps at most), well past the cap.
  const auto& fast = pr.tiers[0];
  REQUIRE(std::isfinite(fast.headroom));
  CHECK(fast.headroom > capped.headroom);
  CHECK(fast.headroom_by == "cpu");
  CHECK(fast.headroom_tps >= 0.85 * 4000);
  CHECK(fast.headroom_tps <= 4000);
  CHECK(headroom_line(capped).rfind("capped: saturates at ", 0) == 0);
  CHECK(headroom_line(capped).find("x today's load (read IOPS cap)") != std::string::npos);
  std::ostringstream out;
  print_capacity(out, pr, 0);
  CHECK(out.str().find("  fast: saturates at ") != std::string::npos);
  CHECK(out.str().find("  capped: saturates at ") != std::string::npos);
  CHECK(out.str().find("tps against load") == std::string::npos);  // no terminal: no plot
  auto j = nlohmann::json::parse(projection_json(pr));
  CHECK(j["tiers"][1]["headroom"]["by"] == "read IOPS cap");
  CHECK(j["tiers"][1]["headroom"]["load"].get<double>() == Approx(capped.headroom));
  REQUIRE(j["loads"].size() == 2);
  CHECK(j["loads"][1]["tiers"][1]["tps"].get<double>() == Approx(pr.loads[1].tiers[1].tps));
}

TEST_CASE("capacity: today's load already saturating, an SLO, and a tier that never saturates", "[capacity]") {
  Profile p = base_profile();
  CapacityOptions c;
  // 2 reads under 1,000 IOPS: 500 tps, a quarter of what today's load
  // asks of this tier.
  auto pr = plan(p, {read_capped("tight", 0.1, 1000)}, {}, c);
  CHECK(pr.tiers[0].headroom < 1);
  CHECK(pr.tiers[0].headroom > 0.1);
  CHECK(pr.tiers[0].headroom_tps == Approx(500).epsilon(0.001));
  CHECK(headroom_line(pr.tiers[0]).find("today's load already saturates it") != std::string::npos);
  // A p99 target below what the tier gives at 2x ends its headroom there.
  const Tier slow = read_capped("slow", 1, 0);
  auto free = plan(p, {slow}, {}, c);
  REQUIRE(std::isfinite(free.tiers[0].headroom));
  c.loads = {2};
  c.slo_p99_s = 0;
  auto at2 = plan(p, {slow}, {}, c);
  c.slo_p99_s = at2.loads[0].tiers[0].p99_s * 0.9;
  auto slo = plan(p, {slow}, {}, c);
  CHECK(slo.tiers[0].headroom < 2);
  CHECK(slo.tiers[0].headroom < free.tiers[0].headroom);
  CHECK(slo.tiers[0].headroom_by.rfind("p99 over ", 0) == 0);
  // No CPU samples, no device I/O: nothing saturates, only clients grow.
  Profile idle = base_profile();
  idle.has_cpu = false;
  idle.has_block_io = false;
  idle.reads_per_tx = 0;
  idle.read_bytes_per_tx = 0;
  c = {};
  auto none = plan(idle, {slow}, {}, c);
  CHECK(std::isinf(none.tiers[0].headroom));
  CHECK(headroom_line(none.tiers[0]).find("does not saturate within 1000x") != std::string::npos);
}

TEST_CASE("capacity: data growth reads the miss-ratio curve at memory / growth", "[capacity][memory]") {
  Profile p = base_profile();
  p.memory_bytes = 1024 * kMiB;
  p.shared_buffers_bytes = 128 * kMiB;
  p.mrc.source = "file_io";
  // Miss ratio falls linearly from 1 at 0 to 0 at 2 GiB of OS cache.
  p.mrc.points = {{0, 1.0}, {2048 * kMiB, 0.0}};
  p.mrc.references = 10000 * 8;  // 8 file reads per transaction
  ProjectOptions o;
  o.memory_bytes = 2048 * kMiB;
  auto today = project(p, {read_capped("x", 0.2, 0)}, o);
  // OS cache 1920 MiB, against 896 MiB at capture: miss 0.0625 / 0.5625.
  CHECK(today.read_factor == Approx(0.0625 / 0.5625));
  o.data_growth = 2;
  // 2 GiB caches what 1 GiB does today: the capture's own miss ratio.
  auto doubled = project(p, {read_capped("x", 0.2, 0)}, o);
  CHECK(doubled.data_growth == 2);
  CHECK(doubled.read_factor == Approx(1.0));
  CHECK(doubled.reads_per_tx == Approx(2));
  bool stated = false;
  for (const auto& n : doubled.notes) stated = stated || n.rfind("data growth 2x: ", 0) == 0;
  CHECK(stated);
  // 4x: 512 MiB today, an OS cache of 384 MiB: miss 0.8125, more than the
  // capture's, so its 8 file reads per transaction add reads.
  o.data_growth = 4;
  auto quadrupled = project(p, {read_capped("x", 0.2, 0)}, o);
  CHECK(quadrupled.reads_per_tx == Approx(2 + 8 * (0.8125 - 0.5625)));
  // Reads never fall and throughput never rises as the data grows.
  double reads = 0, tps = 1e18;
  for (double g : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0}) {
    o.data_growth = g;
    auto pr = project(p, {read_capped("x", 0.2, 0)}, o);
    INFO("growth " << g);
    CHECK(pr.reads_per_tx >= reads * (1 - 1e-12));
    CHECK(pr.tiers[0].tps <= tps * (1 + 1e-12));
    reads = pr.reads_per_tx;
    tps = pr.tiers[0].tps;
  }
  // Growth alone, at the capture's memory; and without a curve it cannot be
  // projected.
  o.memory_bytes = 0;
  o.data_growth = 2;
  CHECK(project(p, {read_capped("x", 0.2, 0)}, o).reads_per_tx > 2);
  p.mrc = {};
  try {
    project(p, {read_capped("x", 0.2, 0)}, o);
    FAIL("no curve: data growth cannot be projected");
  } catch (const SettingError& e) {
    // The app puts the flag in front: "--data-growth cannot be projected: ...".
    CHECK(e.setting() == "data_growth");
    CHECK(std::string(e.what()).rfind("cannot be projected: ", 0) == 0);
    CHECK(std::string(e.what()).find("--") == std::string::npos);
  }
  // A synthetic profile has no curve: the message points at profile synth's
  // own flags.
  p.source = "synth: pgbench select-only scale 100";
  try {
    project(p, {read_capped("x", 0.2, 0)}, o);
    FAIL("a synthetic profile: data growth cannot be projected");
  } catch (const SettingError& e) {
    CHECK(e.setting() == "data_growth");
    CHECK(std::string(e.what()).find("at the grown scale") != std::string::npos);
    CHECK(std::string(e.what()).find("capture run") == std::string::npos);
  }
  o.data_growth = 0;
  CHECK_THROWS_AS(project(base_profile(), {read_capped("x", 0.2, 0)}, o), InputError);
}

TEST_CASE("project: at its cap, a capture's COMMIT statements measure the commit station and stay out of 'other'",
          "[project][capped]") {
  Profile p = base_profile();
  p.sync_writes_per_tx = 0.5;
  p.write_bytes_per_tx = 0.5 * 8192;
  p.flushes_per_tx = 0.5;
  one_writing_template(p, 0.5);
  // 4 clients, 1 ms of think and 8 ms of latency (444 tps), of which the
  // COMMIT statements took 7 ms (flushes the cap held, and the lock behind
  // them).
  p.tps = 4 / 0.009;
  p.duration_s = p.transactions / p.tps;
  p.latency = {10000, 0.008, 0.002, 0.15};
  ProjectOptions o;
  o.captured_iops_cap = 2000;
  o.capture_at_cap = 1;
  const std::vector<Tier> tiers{fixed_tier("uncapped", 0.1, 0)};
  auto residual = project(p, tiers, o);
  p.commit_statements = 9000;  // the others ended without an explicit COMMIT
  p.commit_statement_s = 0.007 * 10000 / 9000;
  auto measured = project(p, tiers, o);
  REQUIRE(measured.capture_capped);
  REQUIRE(measured.group_commit);
  // The residual holds the commits' wait beyond the modelled cycle; with the
  // commits measured, "other" is what is left of the 1 ms outside them.
  CHECK(residual.other_s > 0.0012);
  CHECK(measured.other_s < 0.0005);
  CHECK(measured.other_s < residual.other_s - 0.001);
  CHECK(measured.tiers[0].tps > residual.tiers[0].tps);
  bool noted = false;
  for (const auto& n : measured.notes) noted |= n.find("'other' calibrated without the commits") != std::string::npos;
  CHECK(noted);
  // Not at its cap (or too few commits): the residual as before.
  o.capture_at_cap = 0;
  Profile no_commits = p;
  no_commits.commit_statements = 0;
  CHECK(project(p, tiers, o).other_s == Approx(project(no_commits, tiers, o).other_s));
}

TEST_CASE("project: a client count out of range is a SettingError naming the setting, not a flag", "[project]") {
  ProjectOptions o;
  o.clients_lo = 8;
  o.clients_hi = 4;
  try {
    project(base_profile(), {read_capped("x", 0.2, 0)}, o);
    FAIL("an empty range");
  } catch (const SettingError& e) {
    CHECK(e.setting() == "clients");
    CHECK(std::string(e.what()) == "range 8..4 is empty");
  }
  o.clients_lo = o.clients_hi = 200000;
  try {
    project(base_profile(), {read_capped("x", 0.2, 0)}, o);
    FAIL("too many clients");
  } catch (const SettingError& e) {
    CHECK(e.setting() == "clients");
    CHECK(std::string(e.what()) == "200000: at most 100000");
  }
  // Another memory, a curve, but no memory recorded at capture.
  Profile p = base_profile();
  p.mrc.source = "file_io";
  p.mrc.points = {{0, 1.0}, {2048 * kMiB, 0.0}};
  p.mrc.references = 10000 * 8;
  p.memory_bytes = 0;
  o.clients_lo = o.clients_hi = 0;
  o.memory_bytes = 2048 * kMiB;
  try {
    project(p, {read_capped("x", 0.2, 0)}, o);
    FAIL("no capture memory");
  } catch (const SettingError& e) {
    CHECK(e.setting() == "capture_memory");
    CHECK(std::string(e.what()).rfind("needed: ", 0) == 0);
    CHECK(std::string(e.what()).find("--") == std::string::npos);
  }
}
