// A capture taken on a capped tier: calibration keeps the wait for the cap
// out of "other", and projecting to the capture's own tier gives back the
// captured throughput, to an uncapped tier the demand-bound one.
#include "models/mva.h"
#include "models/profile.h"
#include "models/project.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>

using namespace tierlab;
using namespace tierlab::models;
using trace::Nanos;
using trace::Record;

namespace {

constexpr double kOther = 0.002;   // what the transactions spend beyond CPU and storage
constexpr double kCpu = 0.0002;    // CPU per transaction
constexpr double kRead = 0.0005;   // device read latency
constexpr int kClients = 8;

// 8 clients, no think time, 2 reads per transaction on a device with a
// 1,000 read IOPS cap: 500 tps at the cap, 16 ms per transaction, of which
// the reads' device time is 1 ms, the CPU about 0.2 ms, "other" 2 ms and
// the rest waiting for the cap (queued before issue).
Profile capped_profile(bool queue_times = true) {
  Profile p;
  p.source = "synthetic";
  p.transactions = 5000;
  p.duration_s = 10;
  p.tps = 500;
  p.clients = kClients;
  p.mean_clients = kClients;
  p.think_time_s = 0;
  p.has_cpu = true;
  p.cpu_s_per_tx = kCpu;
  p.vcpus = 2;
  p.has_block_io = true;
  p.reads_per_tx = 2;
  p.read_bytes_per_tx = 2 * 8192;
  p.device_read_iops = 1000;
  p.native_read = {10000, kRead, kRead, kRead};
  p.latency = {5000, kClients / 500.0, 0.015, 0.03};
  if (queue_times) {
    // The CPU's residence at 500 tps on 2 vCPUs, as the model has it.
    std::vector<Station> st{{"cpu", StationKind::Multi, kCpu, 2}, {"rest", StationKind::Delay, 0.016 - kCpu, 1}};
    double cpu_r = solve_mva(st, kClients).back().residence_s[0];
    p.has_queue_times = true;
    p.queued_s_per_tx = p.latency.mean_s - cpu_r - 2 * kRead - kOther;
    p.queued_read = {10000, p.queued_s_per_tx / 2, p.queued_s_per_tx / 2, p.queued_s_per_tx};
  }
  return p;
}

Tier tier(const std::string& name, double read_iops) {
  Tier t;
  t.name = name;
  t.read = {LatencyDist::Fixed, static_cast<Nanos>(kRead * 1e9), 0};
  t.write = t.read;
  t.flush = t.read;
  t.read_iops = read_iops;
  return t;
}

// Throughput of the network without any cap and without the wait for one.
double demand_bound_tps(double other_s) {
  std::vector<Station> st{{"think", StationKind::Delay, 0, 1},
                          {"cpu", StationKind::Multi, kCpu, 2},
                          {"storage", StationKind::Delay, 2 * kRead, 1},
                          {"other", StationKind::Delay, other_s, 1}};
  return solve_mva(st, kClients, 0).back().throughput;
}

}  // namespace

TEST_CASE("project: a capture on a known capped tier projects to itself and up without the cap",
          "[project][capped]") {
  Profile p = capped_profile();
  ProjectOptions o;
  o.captured_tier = tier("cap1000", 1000);
  auto pr = project(p, {tier("cap1000", 1000), tier("uncapped", 0), tier("cap4000", 4000)}, o);
  CHECK(pr.capture_tier_source == "known");
  CHECK(pr.capture_tier == "cap1000");
  CHECK(pr.other_s == Approx(kOther).epsilon(0.01));
  // Its own tier: the captured throughput, the wait for the cap in storage.
  CHECK(pr.tiers[0].tps == Approx(500).epsilon(0.01));
  CHECK(pr.tiers[0].split.other_s == Approx(kOther).epsilon(0.01));
  CHECK(pr.tiers[0].split.storage_s == Approx(0.016 - kOther - pr.tiers[0].split.cpu_s).epsilon(0.02));
  CHECK(pr.tiers[0].bottleneck == "read IOPS cap");
  // No cap: what the transactions ask of the CPU and the device.
  double free = demand_bound_tps(kOther);
  CHECK(free > 4 * 500);
  CHECK(pr.tiers[1].tps == Approx(free).epsilon(0.01));
  // Four times the cap: bound by it at 2,000 tps when demand allows more.
  CHECK(pr.tiers[2].tps == Approx(std::min(free, 2000.0)).epsilon(0.01));
  for (const auto& t : pr.tiers) CHECK(t.capture_tier_source == "known");

  std::ostringstream text;
  print_projection(text, pr);
  CHECK(text.str().find("capture's own tier: cap1000 (known") != std::string::npos);
  CHECK(projection_json(pr).find("\"capture_tier_source\": \"known\"") != std::string::npos);
  CHECK(projection_html(pr, p).find("<p>capture's own tier: cap1000 (known), at its cap") != std::string::npos);
}

TEST_CASE("project: --captured-iops-cap and a detected cap calibrate the same way", "[project][capped]") {
  Profile p = capped_profile();
  ProjectOptions o;
  o.captured_iops_cap = 1000;
  auto known = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  CHECK(known.capture_tier_source == "known");
  CHECK(known.capture_tier == "1000 IOPS");
  CHECK(known.tiers[0].tps == Approx(500).epsilon(0.01));
  CHECK(known.tiers[1].tps == Approx(demand_bound_tps(kOther)).epsilon(0.01));

  p.cap_bound = true;
  p.cap_op = "read";
  p.cap_iops = 1000;
  auto detected = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, ProjectOptions{});
  CHECK(detected.capture_tier_source == "detected");
  CHECK(detected.capture_tier == "read IOPS cap ~1000");
  CHECK(detected.tiers[0].tps == Approx(500).epsilon(0.01));
  CHECK(detected.tiers[1].tps == Approx(demand_bound_tps(kOther)).epsilon(0.01));
}

TEST_CASE("project: a capture assumed uncapped keeps its queueing as storage time on every tier",
          "[project][capped]") {
  Profile p = capped_profile();
  auto pr = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, ProjectOptions{});
  CHECK(pr.capture_tier_source == "assumed uncapped");
  CHECK(pr.other_s == Approx(kOther).epsilon(0.01));
  CHECK(pr.tiers[1].split.other_s == Approx(kOther).epsilon(0.01));
  CHECK(pr.tiers[1].split.storage_s > 0.01);  // the queueing, kept
  CHECK(pr.tiers[1].tps == Approx(500).epsilon(0.02));
  std::ostringstream text;
  print_projection(text, pr);
  CHECK(text.str().find("capture's own tier: assumed uncapped") != std::string::npos);
}

TEST_CASE("project: a capped capture without queue times says the cap's wait is in other",
          "[project][capped]") {
  Profile p = capped_profile(false);
  ProjectOptions o;
  o.captured_iops_cap = 1000;
  auto pr = project(p, {tier("uncapped", 0)}, o);
  CHECK(pr.capture_tier_source == "known");
  bool said = false;
  for (const auto& n : pr.notes) said = said || n.find("no queue times") != std::string::npos;
  CHECK(said);
}

TEST_CASE("project: a capped capture whose queue times missed the cap's wait says so", "[project][capped]") {
  Profile p = capped_profile(false);
  p.has_queue_times = true;  // the block layer's queueing only: 5 us a read
  p.queued_read = {10000, 5e-6, 5e-6, 1e-5};
  p.queued_s_per_tx = 1e-5;
  ProjectOptions o;
  o.captured_iops_cap = 1000;
  auto pr = project(p, {tier("uncapped", 0)}, o);
  bool said = false;
  for (const auto& n : pr.notes) said = said || n.find("did not see the wait for the cap") != std::string::npos;
  CHECK(said);
  // With the wait seen, no such note.
  auto seen = project(capped_profile(), {tier("uncapped", 0)}, o);
  for (const auto& n : seen.notes) CHECK(n.find("did not see the wait") == std::string::npos);
}

TEST_CASE("project: a captured tier whose cap the capture did not reach keeps its queueing",
          "[project][capped]") {
  Profile p = capped_profile();
  ProjectOptions o;
  o.captured_iops_cap = 4000;  // the capture ran at 1,000
  auto pr = project(p, {tier("uncapped", 0)}, o);
  CHECK(pr.tiers[0].tps == Approx(500).epsilon(0.02));
  bool said = false;
  for (const auto& n : pr.notes) said = said || n.find("below its tier's cap") != std::string::npos;
  CHECK(said);
}

namespace {

// One backend running back-to-back transactions of one read each, `rate`
// reads per second for `seconds`; each read queued `queued` before its
// issue and served in 0.5 ms.
std::vector<Record> steady_reads(int rate, int seconds, Nanos queued) {
  constexpr Nanos kS = 1'000'000'000;
  std::vector<Record> out;
  out.push_back({0, 1, trace::SessionBegin{"u", "db", "app", "", 100, 0}});
  Nanos gap = kS / rate;
  for (Nanos t = 0; t + gap <= seconds * kS; t += gap) {
    out.push_back({t, 1, trace::Query{"SELECT 1"}});
    Nanos issue = t + queued;
    out.push_back({issue, 0, trace::BlockIo{issue + 500'000, 0x00fe00000, uint64_t(t / gap) * 8192, 8192,
                                            trace::IoOp::Read, 0, 100, t + 1}});
    out.push_back({t + gap - 1, 1, trace::Ready{'I'}});
  }
  return out;
}

Profile profile_of(const std::vector<Record>& recs) {
  ProfileBuilder b;
  for (const auto& r : recs) b.add(r);
  return b.finish("synthetic");
}

}  // namespace

TEST_CASE("profile: queued before issue, and a cap-bound capture detected", "[profile][capped]") {
  // 1,000 reads/s, each waiting 0.6 ms before its issue: steady, and the
  // transactions wait before issue longer than the device serves them.
  Profile p = profile_of(steady_reads(1000, 8, 600'000));
  CHECK(p.has_queue_times);
  CHECK(p.queued_read.count == 8000);
  CHECK(p.queued_read.mean_s == Approx(0.0006).epsilon(0.01));
  CHECK(p.queued_s_per_tx == Approx(0.0006).epsilon(0.01));
  CHECK(p.cap_bound);
  CHECK(p.cap_op == "read");
  CHECK(p.cap_iops == Approx(1000).epsilon(0.01));
  std::ostringstream text;
  print_profile(text, p);
  CHECK(text.str().find("queued before issue: read mean 0.600 ms") != std::string::npos);
  CHECK(text.str().find("this capture looks cap-bound at ~1000 read IOPS") != std::string::npos);
  CHECK(profile_json(p).find("\"cap_bound\": true") != std::string::npos);

  // The same rate with no wait before issue: a steady workload, not a cap.
  Profile free = profile_of(steady_reads(1000, 8, 1'000));
  CHECK_FALSE(free.cap_bound);
  // Queue times without the trace's format 1.2 field (0): unknown.
  auto recs = steady_reads(1000, 8, 600'000);
  for (auto& r : recs)
    if (auto* b = std::get_if<trace::BlockIo>(&r.body)) b->queued_ns = 0;
  Profile old = profile_of(recs);
  CHECK_FALSE(old.has_queue_times);
  CHECK(old.queued_s_per_tx == 0);
  CHECK_FALSE(old.cap_bound);
}

TEST_CASE("profile: transactions without device I/O counted with their latency", "[profile][capped]") {
  // Every other transaction reads: 1 ms each with the read, 0.2 ms without.
  constexpr Nanos kMs = 1'000'000;
  std::vector<Record> recs;
  recs.push_back({0, 1, trace::SessionBegin{"u", "db", "app", "", 100, 0}});
  Nanos t = 0;
  for (int i = 0; i < 1000; ++i, t += 2 * kMs) {
    const bool reads = i % 2 == 0;
    recs.push_back({t, 1, trace::Query{"SELECT 1"}});
    if (reads)
      recs.push_back({t + kMs / 2, 0, trace::BlockIo{t + kMs / 2 + 100'000, 0x00fe00000, uint64_t(i) * 8192, 8192,
                                                     trace::IoOp::Read, 0, 100, t + 1}});
    recs.push_back({t + (reads ? kMs : kMs / 5), 1, trace::Ready{'I'}});
  }
  Profile p = profile_of(recs);
  CHECK(p.transactions == 1000);
  CHECK(p.quiet_transactions == 500);
  CHECK(p.quiet_latency_s == Approx(0.0002).epsilon(0.01));
  // Through the profile's JSON and back.
  CHECK(profile_json(p).find("\"quiet_transactions\"") != std::string::npos);
}

TEST_CASE("project: at its cap, other comes from the transactions that did no device I/O", "[project][capped]") {
  // The capture's residual holds 1 ms per transaction more than the time
  // outside storage (the cap's wait that the queue times missed); its
  // transactions without I/O took the CPU's residence plus kOther.
  Profile p = capped_profile();
  p.queued_s_per_tx -= 0.001;
  p.queued_read.mean_s = p.queued_s_per_tx / 2;
  std::vector<Station> st{{"cpu", StationKind::Multi, kCpu, 2}, {"rest", StationKind::Delay, 0.016 - kCpu, 1}};
  const double cpu_r = solve_mva(st, kClients).back().residence_s[0];
  p.quiet_transactions = 1000;
  p.quiet_latency_s = cpu_r + kOther;
  ProjectOptions o;
  o.captured_iops_cap = 1000;
  auto pr = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  CHECK(pr.other_source == "quiet transactions");
  CHECK(pr.other_s == Approx(kOther).epsilon(0.02));
  CHECK(pr.other_residual_s == Approx(kOther + 0.001).epsilon(0.02));
  CHECK(pr.tiers[0].tps == Approx(500).epsilon(0.01));  // its own tier: still the cap's
  CHECK(pr.tiers[1].tps == Approx(demand_bound_tps(kOther)).epsilon(0.02));
  bool said = false;
  for (const auto& n : pr.notes) said = said || n.find("transactions that did no device I/O") != std::string::npos;
  CHECK(said);
  CHECK(projection_json(pr).find("\"other_source\": \"quiet transactions\"") != std::string::npos);

  // Too few of them, or a capture not at its cap: the residual, as before.
  p.quiet_transactions = 100;
  auto few = project(p, {tier("uncapped", 0)}, o);
  CHECK(few.other_source == "residual");
  CHECK(few.other_s == Approx(kOther + 0.001).epsilon(0.02));
  p.quiet_transactions = 1000;
  auto uncapped = project(p, {tier("uncapped", 0)}, ProjectOptions{});
  CHECK(uncapped.other_source == "residual");
}

TEST_CASE("project: a window takes the whole capture's verdict on its cap", "[project][capped][windows]") {
  // A window whose rate dipped to 800 of the 1,000 IOPS cap: on its own
  // it would be taken as below the cap; as a window of a capped capture it
  // is at it, so its interval is not the queueing kept on every tier.
  Profile p = capped_profile();
  p.device_read_iops = 800;
  ProjectOptions o;
  o.captured_iops_cap = 1000;
  CHECK_FALSE(project(p, {tier("uncapped", 0)}, o).capture_capped);
  o.capture_at_cap = 1;
  auto w = project(p, {tier("uncapped", 0)}, o);
  CHECK(w.capture_capped);
  CHECK(w.tiers[0].tps > 2 * 500);
  for (const auto& n : w.notes) CHECK(n.find("below its tier's cap") == std::string::npos);
}

TEST_CASE("project: the CPU of clients on the server's machine is demand on its cores, out of the think time",
          "[project][capped]") {
  constexpr double kThink = 0.0003, kClientCpu = 0.00025;
  Profile p = capped_profile();
  p.think_time_s = kThink;
  ProjectOptions o;
  o.captured_tier = tier("cap1000", 1000);
  auto without = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  p.client_cpu_s_per_tx = kClientCpu;
  auto with = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  CHECK(with.client_cpu_s_per_tx == Approx(kClientCpu));
  CHECK(with.cpu_s_per_tx == Approx(kCpu + kClientCpu));
  CHECK(with.think_time_s == Approx(kThink - kClientCpu));
  // Its own tier still gives back the captured throughput.
  CHECK(with.tiers[0].tps == Approx(500).epsilon(0.01));
  // Without the cap: the network with the clients' CPU at the CPU station.
  std::vector<Station> st{{"think", StationKind::Delay, kThink - kClientCpu, 1},
                          {"cpu", StationKind::Multi, kCpu + kClientCpu, 2},
                          {"storage", StationKind::Delay, 2 * kRead, 1},
                          {"other", StationKind::Delay, with.other_s, 1}};
  auto pt = solve_mva(st, kClients, 0).back();
  CHECK(with.tiers[1].tps == Approx(pt.throughput).epsilon(0.01));
  CHECK(with.tiers[1].tps < without.tiers[1].tps);
  // Calibrated on the transactions' latency, which the clients' CPU is not
  // in: "other" as without them.
  CHECK(with.other_s == Approx(without.other_s).epsilon(0.02));
  // The latency is the transaction's: the clients' part of the CPU's
  // residence is not in it.
  const double client_res = pt.residence_s[1] * kClientCpu / (kCpu + kClientCpu);
  CHECK(with.tiers[1].latency_s == Approx(pt.response_s - client_res).epsilon(0.01));
  CHECK(with.tiers[1].split.cpu_s == Approx(pt.residence_s[1] - client_res).epsilon(0.01));
  std::ostringstream text;
  print_projection(text, with);
  CHECK(text.str().find("(0.250 ms of it the clients on the server's machine, 0.000 ms of that inside transactions)") != std::string::npos);
}

TEST_CASE("project: the clients' CPU inside transactions is counted once, out of other", "[project][clients]") {
  // 8 clients beside the server on 2 cores: the server 0.2 ms of CPU a
  // transaction, the clients 0.4 ms. They spent 0.2 ms between transactions
  // (think time) and 0.6 ms in their turns inside each (between its
  // statements): 0.1 ms of their CPU is think time, 0.3 ms is in the
  // transaction's latency. The capture is this network: think 0.1 ms, the
  // CPU 0.6 ms on 2 servers, "other" 1 ms; its transactions' latency is
  // the response less the CPU residence of the clients' 0.1 ms between.
  constexpr double kServer = 0.0002, kClients = 0.0004, kZ = 0.0002, kTurns = 0.0006, kOtherHere = 0.001;
  std::vector<Station> st{{"think", StationKind::Delay, 0.0001, 1},
                          {"cpu", StationKind::Multi, kServer + kClients, 2},
                          {"other", StationKind::Delay, kOtherHere, 1}};
  const auto pt = solve_mva(st, 8, 0).back();
  const double between_res = pt.residence_s[1] * 0.0001 / (kServer + kClients);
  Profile p;
  p.source = "synthetic";
  p.transactions = 20000;
  p.duration_s = 10;
  p.tps = pt.throughput;
  p.clients = 8;
  p.mean_clients = 8;
  p.think_time_s = kZ;
  p.client_in_tx_s = kTurns;
  p.has_cpu = true;
  p.cpu_s_per_tx = kServer;
  p.client_cpu_s_per_tx = kClients;
  p.vcpus = 2;
  p.latency = {20000, pt.response_s - between_res, 0, 0};
  Tier same;
  same.name = "same";
  auto pr = project(p, {same}, ProjectOptions{});
  CHECK(pr.client_cpu_s_per_tx == Approx(0.0004).epsilon(1e-12));
  CHECK(pr.client_cpu_in_tx_s_per_tx == Approx(0.0003).epsilon(1e-12));
  CHECK(pr.think_time_s == Approx(0.0001).epsilon(1e-12));
  // "Other" is the 1 ms outside the CPU: the clients' 0.3 ms inside the
  // transaction is at the CPU station, not in "other" as well.
  CHECK(pr.other_s == Approx(kOtherHere).epsilon(1e-6));
  // The capture's own network, projected: its throughput and latency.
  CHECK(pt.throughput == Approx(3220.87).epsilon(1e-5));
  CHECK(pr.tiers[0].tps == Approx(pt.throughput).epsilon(1e-6));
  CHECK(pr.tiers[0].latency_s == Approx(pt.response_s - between_res).epsilon(1e-6));
  CHECK(pr.tiers[0].split.cpu_s == Approx(pt.residence_s[1] - between_res).epsilon(1e-6));
  std::ostringstream text;
  print_projection(text, pr);
  CHECK(text.str().find("(0.400 ms of it the clients on the server's machine, 0.300 ms of that inside "
                        "transactions)") != std::string::npos);
  CHECK(projection_json(pr).find("\"client_cpu_in_tx_ms\"") != std::string::npos);
}

namespace {

// A tpcb-like capture at a 1,000 write IOPS cap that counts flushes: 8
// clients, no think time, 500 tps. Every transaction writes the WAL at its
// COMMIT; the background writer writes 0.8 buffers a transaction (400/s).
// The cap leaves the flush cycles (a WAL write and a flush each) 600 I/Os a
// second: 300 cycles, 1.667 commits each. A COMMIT statement takes 8 ms
// (2.4 cycle intervals: its own, the one in progress and the cap's tail),
// the rest of the transaction 8 ms. The captured flush latency, 3 ms, holds
// the cap's hold on the flush; the device itself flushes in 0.2 ms.
Profile capped_commits_profile() {
  Profile p;
  p.source = "synthetic";
  p.transactions = 5000;
  p.duration_s = 10;
  p.tps = 500;
  p.clients = kClients;
  p.mean_clients = kClients;
  p.has_cpu = true;
  p.cpu_s_per_tx = kCpu;
  p.vcpus = 2;
  p.has_block_io = true;
  p.sync_writes_per_tx = 0.6;
  p.write_bytes_per_tx = 0.6 * 8192;
  p.flushes_per_tx = 0.6;
  p.background_writes_per_s = 400;
  p.background_write_bytes_per_s = 400 * 8192;
  p.device_write_iops = 0.6 * 500 + 400;
  p.native_write = {3000, 0.0002, 0.0002, 0.0002};
  p.native_flush = {3000, 0.003, 0.003, 0.003};
  p.latency = {5000, 0.016, 0.016, 0.03};
  p.commit_statements = 5000;
  p.commit_statement_s = 0.008;
  TemplateStats t;
  t.count = 5000;
  t.share = 1;
  t.writes_per_tx = 0.6;
  p.templates = {t};
  return p;
}

Tier write_cap(const std::string& name, double iops) {
  Tier t = tier(name, 0);
  t.write_iops = iops;
  t.count_flushes = true;
  return t;
}

}  // namespace

TEST_CASE("project: at a binding write cap, throughput and the flush rate are solved together",
          "[project][capped][commit]") {
  Profile p = capped_commits_profile();
  ProjectOptions o;
  o.captured_tier = write_cap("wcap1000", 1000);
  auto pr = project(p, {write_cap("wcap1000", 1000), write_cap("wcap4000", 4000), tier("uncapped", 0)}, o);
  CHECK(pr.capture_capped);
  CHECK(pr.commit_wait_cycles == Approx(2.4).epsilon(1e-9));
  // Its own tier: the captured 500 tps, the cap's pace giving the captured
  // 1.667 commits a flush (0.6 flushes a transaction). Counting the flush
  // cycle its device gives at the captured rate (about one a commit with a
  // 0.2 ms flush) projected about 370.
  CHECK(pr.tiers[0].tps == Approx(500).epsilon(0.03));
  CHECK(pr.tiers[0].flushes_per_tx == Approx(0.6).epsilon(0.03));
  CHECK(pr.tiers[0].write_iops == Approx(1000).epsilon(1e-6));
  CHECK(pr.tiers[0].bottleneck == "write IOPS cap");
  // Four times the cap and no cap: more, and never less without the cap.
  CHECK(pr.tiers[1].tps > 1.5 * 500);
  CHECK(pr.tiers[2].tps >= pr.tiers[1].tps * (1 - 1e-9));
}

TEST_CASE("project: the server's CPU split by the capture's samples: the fixed part taken from the vCPUs",
          "[project][capped][cpu]") {
  // The capped capture at 500 tps measured 0.2 ms a transaction: 0.1 ms a
  // transaction plus 0.05 cores.
  Profile p = capped_profile();
  ProjectOptions o;
  o.captured_tier = tier("cap1000", 1000);
  auto as_captured = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  bool said = false;
  for (const auto& n : as_captured.notes) said = said || n.find("cpu per transaction taken as captured") != std::string::npos;
  CHECK(said);
  CHECK(as_captured.cpu_s_per_tx == Approx(kCpu));
  p.cpu_split = true;
  p.cpu_fixed_cores = 0.05;
  p.cpu_marginal_s_per_tx = 0.0001;
  auto split = project(p, {tier("cap1000", 1000), tier("uncapped", 0)}, o);
  // On the tiers: 0.1 ms on 2 - 0.05 of the 2 vCPUs.
  CHECK(split.cpu_s_per_tx == Approx(0.0001 * 2 / 1.95).epsilon(1e-12));
  CHECK(split.cpu_fixed_cores == Approx(0.05));
  // "Other" calibrated on the CPU as captured: the same.
  CHECK(split.other_s == Approx(as_captured.other_s).epsilon(1e-9));
  CHECK(split.tiers[0].tps == Approx(500).epsilon(0.01));
  std::vector<Station> st{{"think", StationKind::Delay, 0, 1},
                          {"cpu", StationKind::Multi, 0.0001 * 2 / 1.95, 2},
                          {"storage", StationKind::Delay, 2 * kRead, 1},
                          {"other", StationKind::Delay, split.other_s, 1}};
  CHECK(split.tiers[1].tps == Approx(solve_mva(st, kClients, 0).back().throughput).epsilon(1e-6));
  CHECK(split.tiers[1].tps > as_captured.tiers[1].tps);
  said = false;
  for (const auto& n : split.notes)
    said = said || n.find("cpu on the tiers: 0.100 ms a transaction plus 0.050 cores whatever the throughput") !=
                       std::string::npos;
  CHECK(said);
}
