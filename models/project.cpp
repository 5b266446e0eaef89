#include "models/project.h"
#include "models/fmt.h"

#include "common/error.h"
#include "common/units.h"
#include "models/group_commit.h"
#include "models/mva.h"
#include "models/project_internal.h"
#include "models/project_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <thread>

namespace tierlab::models {

namespace {

// A capped capture's "other" is taken from its transactions without device
// I/O when at least this many, and this share of all, did none.
constexpr uint64_t kMinQuietTransactions = 200;
constexpr double kMinQuietShare = 0.1;

// Counted I/Os for an I/O of `bytes` on a tier counting in `unit` bytes.
double counted(double bytes, uint64_t unit) {
  if (unit == 0 || bytes <= 0) return 1;
  return std::max(1.0, std::ceil(bytes / static_cast<double>(unit)));
}

// What one transaction asks of the storage, per transaction.
struct Demands {
  double cpu_s = 0;
  double reads = 0, read_bytes = 0;
  double writes = 0, write_bytes = 0;
  double flushes = 0;
  double bg_reads = 0;
  // Writes besides the transactions' own, per transaction: the dirtied
  // buffers written back, by the server's auxiliary processes (background
  // writer, checkpointer) or by the kernel (writeback, journal).
  double bg_writes = 0, bg_write_bytes = 0;
  // Of those, the server's processes write at most their captured rate
  // (server_writes_at, models/group_commit.h): a tier whose caps leave the
  // kernel's writeback out (--kernel-writes-uncapped) counts only these.
  double srv_writes_per_s = 0, srv_write_bytes_per_s = 0;
  // With WAL flushes in the capture, the commit writes and flushes go
  // through the flush cycle (models/group_commit.h), calibrated on the
  // capture; `writes` and `flushes` above are then the captured figures
  // and no longer a fixed demand per transaction.
  bool group_commit = false;
  FlushCycle cycle;
  // Time queued before issue per transaction, a delay of its own (storage
  // time): the measured one where it is kept (see project()), else 0.
  double queued_s = 0;
};

// A rate cap: the tier admits `limit` units per second; a transaction takes
// `per_tx` of them and the server's own background I/O
// server_writes_at(fixed_per_s, fixed_per_tx, x).
struct Cap {
  std::string name;
  double per_tx = 0;         // besides the flush cycle's I/O
  double fixed_per_s = 0;
  double limit = 0;
  // With the flush cycle modelled: its I/Os per cycle (the bound is given
  // the cycles per transaction, see binding_cap in project()).
  double commit_tokens = 0;
  double fixed_per_tx = 0;
  // Highest throughput the cap admits. The background I/O keeps its rate
  // while it fits under the cap (its requests wait in line, but they keep
  // coming at that rate) and the transactions get what is left. When it
  // alone would take all of the cap, the background processes are
  // throttled too and the cap is shared in proportion to demand at
  // `x_free`, the uncapped throughput.
  // Where the server's processes still keep up with what the transactions
  // dirty (below max rate), their writes are per transaction too.
  double bound(double x_free, double cycles_per_tx) const {
    double per = per_tx + commit_tokens * cycles_per_tx;
    if (fixed_per_tx > 0 && per + fixed_per_tx > 0) {
      double x = limit / (per + fixed_per_tx);
      if (x * fixed_per_tx <= fixed_per_s) return x;
    }
    if (per <= 0) return std::numeric_limits<double>::infinity();
    double left = limit - fixed_per_s;
    if (left > 0) return left / per;
    return x_free > 0 ? limit * x_free / (x_free * per + fixed_per_s) : 0;
  }
  // With `cycles_per_tx` flush cycles per transaction at throughput x.
  double utilisation(double x, double cycles_per_tx) const {
    return (x * (per_tx + cycles_per_tx * commit_tokens) + server_writes_at(fixed_per_s, fixed_per_tx, x)) /
           limit;
  }
};

struct Network {
  std::vector<Station> stations;
  int think = 0, cpu = 1, storage = 2, other = 3, commit = -1, queued = -1;
  double io_var = 0;  // compound-Poisson variance of the device service time
  double read_ios = 0, write_ios = 0, bytes = 0;  // counted per transaction
  // The server's own writes: at most these per second, these per transaction
  // below that (server_writes_at).
  double fixed_write_ios = 0, fixed_bytes = 0;
  double fixed_write_ios_per_tx = 0, fixed_bytes_per_tx = 0;
  std::vector<Cap> caps;
  // The flush cycle on this tier (group commit); when set, write_ios holds
  // no commit I/O, which counts per cycle: cycle_write_ios of the writes
  // cap and the total cap.
  bool group_commit = false;
  std::shared_ptr<FlushCycle> cycle;
  double cycle_write_ios = 0;
  double cycle_var = 0;  // device variance of one cycle
};

Network build(const Demands& d, const Tier& t, int vcpus, double think_s, double other_s,
              bool kernel_uncapped) {
  Network n;
  n.stations.push_back({"think", StationKind::Delay, think_s, 1});
  n.stations.push_back({"cpu", StationKind::Multi, d.cpu_s, std::max(1, vcpus)});
  double lr = mean_latency_s(t.read), lw = mean_latency_s(t.write), lf = mean_latency_s(t.flush);
  // Commit writes and flushes: a fixed demand per transaction, or the flush
  // cycle (a station of its own, below).
  const double cw = d.group_commit ? 0 : d.writes, cf = d.group_commit ? 0 : d.flushes;
  double service = d.reads * lr + cw * lw + cf * lf;
  if (t.parallelism > 0)
    n.stations.push_back({"storage", StationKind::Multi, service, static_cast<int>(t.parallelism)});
  else
    n.stations.push_back({"storage", StationKind::Delay, service, 1});
  n.stations.push_back({"other", StationKind::Delay, other_s, 1});
  n.io_var = d.reads * second_moment(t.read) + cw * second_moment(t.write) +
             cf * second_moment(t.flush);

  double read_size = d.reads > 0 ? d.read_bytes / d.reads : 8192;
  double write_size = d.writes > 0 ? d.write_bytes / d.writes : 8192;
  double bg_size = d.bg_writes > 0 ? d.bg_write_bytes / d.bg_writes : 8192;
  double srv_size = d.srv_writes_per_s > 0 ? d.srv_write_bytes_per_s / d.srv_writes_per_s : 8192;
  // Every background write is counted (per transaction), or, with the
  // kernel's left out, the server's processes' share of them.
  double bgw = kernel_uncapped ? 0 : d.bg_writes;
  n.read_ios = (d.reads + d.bg_reads) * counted(read_size, t.io_unit_bytes);
  n.write_ios = cw * counted(write_size, t.io_unit_bytes) + bgw * counted(bg_size, t.io_unit_bytes) +
                (t.count_flushes ? cf : 0);
  n.bytes = d.read_bytes + d.bg_reads * read_size + d.write_bytes + (kernel_uncapped ? 0 : d.bg_write_bytes);
  if (kernel_uncapped) {
    n.fixed_write_ios = d.srv_writes_per_s * counted(srv_size, t.io_unit_bytes);
    n.fixed_bytes = d.srv_write_bytes_per_s;
    n.fixed_write_ios_per_tx = d.bg_writes * counted(srv_size, t.io_unit_bytes);
    n.fixed_bytes_per_tx = d.bg_write_bytes;
  }
  double read_cap = t.read_iops, write_cap = t.write_iops, total_cap = t.total_iops;
  if (t.burst.enabled()) {
    // Sustained rate: the baseline the bucket refills at.
    total_cap = total_cap > 0 ? std::min(total_cap, t.burst.refill_iops) : t.burst.refill_iops;
  }
  if (d.group_commit) {
    // One cycle: its WAL writes (each of the captured mean size) and, on a
    // tier that counts them, its flushes.
    n.group_commit = true;
    n.cycle = std::make_shared<FlushCycle>(d.cycle);
    set_device(*n.cycle, lw, lf);
    n.cycle_write_ios = n.cycle->writes * counted(write_size, t.io_unit_bytes) +
                        (t.count_flushes ? n.cycle->flushes : 0);
    n.cycle_var = n.cycle->writes * second_moment(t.write) + n.cycle->flushes * second_moment(t.flush);
    if (n.cycle_write_ios > 0) {
      if (write_cap > 0)
        n.cycle->paces.push_back(
            {n.cycle_write_ios, write_cap, n.fixed_write_ios, n.write_ios, n.fixed_write_ios_per_tx});
      if (total_cap > 0)
        n.cycle->paces.push_back({n.cycle_write_ios, total_cap, n.fixed_write_ios, n.read_ios + n.write_ios,
                                  n.fixed_write_ios_per_tx});
    }
    n.commit = static_cast<int>(n.stations.size());
    std::shared_ptr<const FlushCycle> c = n.cycle;
    n.stations.emplace_back("commit", StationKind::Cycle, 0, 1,
                            [c](double x, int clients) { return c->residence_s(x, clients); });
  }
  if (d.queued_s > 0) {
    n.queued = static_cast<int>(n.stations.size());
    n.stations.push_back({"queued", StationKind::Delay, d.queued_s, 1});
  }
  // Caps that the flush cycle's I/O draws on take it per cycle (it paces the
  // cycle, see models/group_commit.h), not as a bound per transaction.
  auto cap = [&](const char* name, double per_tx, double fixed, double fixed_per_tx, double rate,
                 double per_cycle) {
    if (rate > 0 && (per_tx > 0 || fixed > 0 || per_cycle > 0))
      n.caps.push_back({name, per_tx, fixed, rate, per_cycle, fixed_per_tx});
  };
  double cyc = n.group_commit ? n.cycle_write_ios : 0;
  cap("read IOPS cap", n.read_ios, 0, 0, read_cap, 0);
  cap("write IOPS cap", n.write_ios, n.fixed_write_ios, n.fixed_write_ios_per_tx, write_cap, cyc);
  cap("IOPS cap", n.read_ios + n.write_ios, n.fixed_write_ios, n.fixed_write_ios_per_tx, total_cap, cyc);
  cap("throughput cap", n.bytes, n.fixed_bytes, n.fixed_bytes_per_tx, t.bytes_per_sec, 0);
  return n;
}

struct Solved {
  std::vector<MvaPoint> pts;
  Network net;
};

Solved solve(const Demands& d, const Tier& t, int vcpus, double think_s, double other_s,
             bool kernel_uncapped, int max_n) {
  Solved s;
  s.net = build(d, t, vcpus, think_s, other_s, kernel_uncapped);
  s.pts = solve_mva(s.net.stations, max_n, s.net.think);
  return s;
}

constexpr double kPageBytes = 8192;  // the miss-ratio curve's page (PostgreSQL's block)

// `projected` has a burst tier's burst phase before its baseline (see
// project()): folds the two into one, the burst's figures with the
// baseline's after them, and how long the credits last at the burst's rate.
void fold_bursts(std::vector<TierProjection>& projected, const std::vector<Tier>& tiers) {
  std::vector<TierProjection> out;
  size_t i = 0;
  for (const auto& t : tiers) {
    if (!t.burst.enabled()) {
      out.push_back(std::move(projected[i++]));
      continue;
    }
    TierProjection burst = std::move(projected[i++]);
    TierProjection baseline = std::move(projected[i++]);
    burst.burst_iops = t.total_iops > 0 ? std::min(t.total_iops, t.burst.burst_iops) : t.burst.burst_iops;
    burst.baseline_iops = t.burst.refill_iops;
    burst.burst_credits = t.burst.credits;
    // Every counted I/O takes a credit and credits come back at the
    // baseline rate: the bucket drains at the difference.
    const double drain = burst.read_iops + burst.write_iops - t.burst.refill_iops;
    burst.burst_lasts_s = drain > 0 ? t.burst.credits / drain : std::numeric_limits<double>::infinity();
    if (drain > 0) burst.after_burst.push_back(std::move(baseline));
    out.push_back(std::move(burst));
  }
  projected = std::move(out);
}

}  // namespace

Projection project(const Profile& p, const std::vector<Tier>& tiers, const ProjectOptions& o) {
  if (tiers.empty()) throw SettingError("tiers", "none given: a projection needs at least one tier");
  if (p.transactions == 0) throw InputError(p.source + ": no completed transaction");
  Projection out;
  out.source = p.source;
  out.notes = p.notes;
  out.durability_warning = commit_durability_warning(p);
  int cap_clients = std::max(1, p.clients);
  out.clients_hi = o.clients_hi > 0 ? o.clients_hi : cap_clients;
  out.clients_lo = o.clients_lo > 0 ? o.clients_lo : out.clients_hi;
  if (out.clients_lo > out.clients_hi)
    throw SettingError("clients", "range " + std::to_string(out.clients_lo) + ".." +
                                      std::to_string(out.clients_hi) + " is empty");
  if (out.clients_hi > 100000) throw SettingError("clients", std::to_string(out.clients_hi) + ": at most 100000");
  // The server's CPUs at capture (Meta "cpu.count", else this machine's,
  // where the capture is taken to have run) and on the target (--vcpus,
  // else as captured). "Other" is calibrated on the former: it is what the
  // capture measured, whatever the target.
  const int here = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  out.capture_vcpus = p.vcpus > 0 ? p.vcpus : here;
  out.vcpus = o.vcpus > 0 ? o.vcpus : out.capture_vcpus;
  if (p.vcpus <= 0 && p.has_cpu)
    out.notes.push_back("the trace does not record the server's CPUs (meta cpu.count): taken as this "
                        "machine's " + std::to_string(here) + " at capture");
  out.capture_memory_bytes = o.capture_memory_bytes > 0 ? o.capture_memory_bytes : p.memory_bytes;
  out.memory_bytes = o.memory_bytes > 0 ? o.memory_bytes : out.capture_memory_bytes;
  double extra_reads = 0;
  if (!(o.data_growth > 0) || !std::isfinite(o.data_growth))
    throw SettingError("data_growth", fmt("%g", o.data_growth) + ": expected a factor more than 0");
  out.data_growth = o.data_growth;
  out.read_factor =
      memory_factor(p, o.memory_bytes, out.capture_memory_bytes, o.data_growth, out.notes, extra_reads);

  Demands d;
  // Clients on the server's machine (pgbench beside it) use its cores: their
  // CPU is demand at the CPU station. A client computes in its turns: between
  // a result and its next request, which is think time between transactions
  // and the client's turns inside one (pgbench between a transaction's
  // statements), which the transaction's latency holds. The clients' CPU is
  // split between the two in proportion to the time the clients spent in
  // each, and each part comes out of where it was measured: the first out of
  // the think time, the second out of the latency "other" is calibrated on.
  const double client_cpu = p.has_cpu && p.client_cpu_s_per_tx > 0 ? p.client_cpu_s_per_tx : 0.0;
  const double turns = p.think_time_s + p.client_in_tx_s;
  const double client_in_tx = turns > 0 ? client_cpu * p.client_in_tx_s / turns : 0.0;
  const double client_between = client_cpu - client_in_tx;
  out.client_cpu_s_per_tx = client_cpu;
  out.client_cpu_in_tx_s_per_tx = client_in_tx;
  // The CPU per transaction as captured calibrates "other". On the tiers,
  // where the capture's own samples split the server's CPU into a part per
  // transaction and a part that does not follow throughput (Profile::
  // cpu_split), the latter is taken as cores the server keeps busy whatever
  // the throughput, as the capture's own are: the transactions get the
  // rest of the vCPUs. Otherwise the CPU per transaction is taken as
  // captured on every tier, which a capture at low utilisation overstates.
  const double captured_cpu = p.has_cpu ? p.cpu_s_per_tx + client_cpu : 0.0;
  d.cpu_s = captured_cpu;
  if (p.has_cpu && p.cpu_split) {
    const double v = out.vcpus, fixed = std::min(p.cpu_fixed_cores, 0.5 * v);
    out.cpu_fixed_cores = fixed;
    d.cpu_s = p.cpu_marginal_s_per_tx * v / (v - fixed) + client_cpu;
    out.notes.push_back("cpu on the tiers: " + fmt("%.3f ms", p.cpu_marginal_s_per_tx * 1e3) +
                        " a transaction plus " + fmt("%.3f", p.cpu_fixed_cores) +
                        " cores whatever the throughput (regressed on the capture's sample intervals), not the " +
                        fmt("%.3f ms", p.cpu_s_per_tx * 1e3) + " a transaction measured at " +
                        fmt("%.0f", p.tps) + " tps: the fixed part taken from the vCPUs");
  }
  d.reads = p.reads_per_tx * out.read_factor + extra_reads;
  d.read_bytes = p.read_bytes_per_tx * out.read_factor + extra_reads * kPageBytes;
  d.writes = p.sync_writes_per_tx;
  d.write_bytes = p.write_bytes_per_tx;
  d.flushes = p.flushes_per_tx;
  d.bg_reads = p.tps > 0 ? p.other_reads_per_s / p.tps * out.read_factor : 0;
  // Background writes: per transaction (they write back what the backends
  // dirtied), the server's auxiliary processes' share up to their captured
  // rate. A trace without the server's pids has only the total.
  if (p.knows_server_processes) {
    d.srv_writes_per_s = p.server_writes_per_s;
    d.srv_write_bytes_per_s = p.server_write_bytes_per_s;
  } else if (o.kernel_writes_uncapped && p.background_writes_per_s > 0) {
    out.notes.push_back("the trace does not say which processes are the server's: all background writes "
                        "are taken as the kernel's and left out of the IOPS caps");
  }
  d.bg_writes = p.tps > 0 ? p.background_writes_per_s / p.tps : 0;
  d.bg_write_bytes = p.tps > 0 ? p.background_write_bytes_per_s / p.tps : 0;
  out.cpu_s_per_tx = d.cpu_s;
  out.reads_per_tx = d.reads;
  out.sync_writes_per_tx = d.writes;
  out.flushes_per_tx = d.flushes;
  // The think time of the tiers' clients (a load multiple shortens it);
  // "other" is calibrated with the captured one.
  const double think = std::max(0.0, (o.think_s >= 0 ? o.think_s : p.think_time_s) - client_between);
  const double think_captured = std::max(0.0, p.think_time_s - client_between);
  // The clients' CPU between transactions takes its part of the CPU
  // station's residence out of the transaction: a transaction's latency
  // (first message to its end) leaves it out, at capture and on every tier.
  // Their CPU inside transactions stays in it.
  // At the calibration, of the captured CPU; on the tiers (set before
  // them), of theirs.
  double client_share = captured_cpu > 0 ? client_between / captured_cpu : 0.0;
  auto server_response = [&client_share](const MvaPoint& pt, const Network& net) {
    return pt.response_s - (net.cpu >= 0 ? client_share * pt.residence_s[static_cast<size_t>(net.cpu)] : 0.0);
  };
  out.think_time_s = think;
  int n_cap = std::max(1, static_cast<int>(std::lround(p.mean_clients > 0 ? p.mean_clients : p.clients)));
  // Transactions that commit through the flush cycle: those of templates
  // whose backends wrote (the WAL, at commit) at least half as often as one
  // write per `clients` commits would show.
  double writing = 0;
  for (const auto& t : p.templates)
    if (t.writes_per_tx >= 0.5 / std::max(1, p.clients)) writing += t.share;
  if (d.flushes > 0 && p.tps > 0 && writing > 0) {
    // Group commit: the flush cycle, calibrated so that at the captured
    // throughput and client count on the captured device it gives the
    // captured flushes per transaction.
    d.group_commit = true;
    d.cycle = calibrate_flush_cycle(d.flushes, d.writes, p.tps, n_cap, p.native_write.mean_s,
                                    p.native_flush.mean_s, writing);
    out.committing_share = d.cycle.share;
    out.group_commit = true;
    out.cycle_s = d.cycle.captured_s;
    out.cycle_device_s = d.cycle.captured_device_s;
    out.flushes_per_cycle = d.cycle.flushes;
  }

  // The capture's own tier, and whether the capture ran at its cap: then
  // the queue time before issue was the wait for that cap, which the
  // calibration below keeps apart from "other" and each tier's own caps
  // replace. Otherwise it is kept, as measured, on every tier.
  capture_tier(p, o, out);
  d.queued_s = out.capture_capped ? 0.0 : out.queued_s_per_tx;

  // Calibrate "other" on the captured device at the captured client count,
  // with the captured memory (factor 1).
  Tier native;
  native.name = "captured device";
  native.read = {LatencyDist::Fixed, static_cast<Nanos>(p.native_read.mean_s * 1e9), 0};
  native.write = {LatencyDist::Fixed, static_cast<Nanos>(p.native_write.mean_s * 1e9), 0};
  native.flush = {LatencyDist::Fixed, static_cast<Nanos>(p.native_flush.mean_s * 1e9), 0};
  Demands dc = d;
  dc.cpu_s = captured_cpu;
  dc.reads = p.reads_per_tx;
  dc.read_bytes = p.read_bytes_per_tx;
  dc.bg_reads = p.tps > 0 ? p.other_reads_per_s / p.tps : 0;
  dc.queued_s = out.queued_s_per_tx;
  // The capture's own CPU (capture run on the server's machine) took cores
  // the server would otherwise have had: at capture the server had
  // vcpus - c of them, as if each transaction's CPU time were vcpus /
  // (vcpus - c) longer. "Other" is calibrated on that; the tiers are
  // projected without the capture.
  if (const int cv = out.capture_vcpus; p.capture_cores_busy > 0) {
    out.capture_cores = p.capture_cores_busy;
    dc.cpu_s = captured_cpu * cv / std::max(cv - p.capture_cores_busy, 0.5 * cv);
  }
  // At its cap, a capture's commits wait for the cap as well: a flush the
  // cap holds keeps the lock every other committing backend waits for, so
  // the commit waits hold the cap's long tail, which the flush cycle's mean
  // does not. When the transactions end with an explicit COMMIT, the time of
  // those statements measures the commit station at capture, and "other" is
  // calibrated on the rest of the transaction.
  const double tx_n = static_cast<double>(std::max<uint64_t>(1, p.transactions));
  const bool commit_measured = out.capture_capped && d.group_commit &&
                               p.commit_statements >= kMinQuietTransactions &&
                               static_cast<double>(p.commit_statements) >= 0.5 * tx_n;
  const double commit_per_tx = commit_measured ? p.commit_statement_s * static_cast<double>(p.commit_statements) / tx_n : 0.0;
  auto calibration_gap = [&](const Solved& s) {
    double model = server_response(s.pts.back(), s.net);
    if (commit_measured && s.net.commit >= 0)
      model -= s.pts.back().residence_s[static_cast<size_t>(s.net.commit)];
    return p.latency.mean_s - commit_per_tx - model;
  };
  if (commit_measured)
    out.notes.push_back("'other' calibrated without the commits: at its cap the capture's COMMIT statements took " +
                        fmt("%.3f ms", p.commit_statement_s * 1e3) + " (" + std::to_string(p.commit_statements) +
                        " transactions), the wait for flushes the cap held, which each tier replaces with its own "
                        "flush cycle");
  {
    // Fixed point: a larger "other" lowers throughput and so the queueing
    // elsewhere; the response time grows by at most the added delay, so
    // the iteration converges from below. The CPU is the captured server's.
    out.other_s = 0;
    for (int i = 0; i < 50; ++i) {
      auto s = solve(dc, native, out.capture_vcpus, think_captured, out.other_s, o.kernel_writes_uncapped, n_cap);
      double gap = calibration_gap(s);
      if (gap <= 0 && out.other_s == 0) break;
      out.other_s = std::max(0.0, out.other_s + gap);
      if (std::abs(gap) < 1e-9) break;
    }
    auto c = solve(dc, native, out.capture_vcpus, think_captured, out.other_s, o.kernel_writes_uncapped, n_cap);
    // At its cap, the residual holds more than the time outside storage:
    // what the cap's wait cost beyond the queue times the recorder saw
    // (before a bio reaches the block layer, the backend's wake-up after a
    // held request completes). Transactions that did no device I/O waited
    // for none of it, so their latency less their CPU residence measures
    // "other" directly; it is taken when they are enough of the capture.
    const double quiet = static_cast<double>(p.quiet_transactions);
    if (out.capture_capped && p.quiet_transactions >= kMinQuietTransactions &&
        quiet >= kMinQuietShare * static_cast<double>(p.transactions) && c.net.cpu >= 0) {
      const double cpu_res = (1 - client_share) * c.pts.back().residence_s[static_cast<size_t>(c.net.cpu)];
      const double other_quiet = std::max(0.0, p.quiet_latency_s - cpu_res);
      if (other_quiet < out.other_s) {
        out.other_residual_s = out.other_s;
        out.other_s = other_quiet;
        out.other_source = "quiet transactions";
        out.notes.push_back("'other' " + fmt("%.3f ms", other_quiet * 1e3) + " from the " +
                            std::to_string(p.quiet_transactions) +
                            " transactions that did no device I/O (their mean latency " +
                            fmt("%.3f ms", p.quiet_latency_s * 1e3) + " less " + fmt("%.3f ms", cpu_res * 1e3) +
                            " of CPU), not the residual " + fmt("%.3f ms", out.other_residual_s * 1e3) +
                            ": at its cap the residual also holds the cap's wait the queue times missed");
        c = solve(dc, native, out.capture_vcpus, think_captured, out.other_s, o.kernel_writes_uncapped, n_cap);
      }
    }
    out.modelled_capture_tps = c.pts.back().throughput;
    out.captured_tps = p.tps;
  }
  out.cpu_modelled = p.has_cpu;
  if (!p.has_cpu)
    out.notes.push_back("no CPU samples: the CPU is not modelled as a resource; its time is in 'other'");

  if (d.reads == 0 && d.writes == 0 && d.flushes == 0 && d.bg_reads == 0 && d.bg_writes == 0)
    out.same_on_every_tier =
        std::string("every tier is the same by construction: ") +
        (p.has_block_io ? "the trace's transactions did no device I/O"
                        : "the trace has no device I/O (capture with block I/O, e.g. `capture run`, to tell tiers apart)") +
        ", so nothing the model computes depends on the tier";
  // A tier with a burst bucket is projected twice: at its burst rate (the
  // bucket starts full) and, after it, at its baseline (build() takes a
  // bucket's refill rate as the sustained cap).
  std::vector<Tier> phases;
  for (const auto& t : tiers) {
    if (t.burst.enabled()) {
      Tier b = t;
      b.burst = {};
      b.total_iops = t.total_iops > 0 ? std::min(t.total_iops, t.burst.burst_iops) : t.burst.burst_iops;
      phases.push_back(std::move(b));
    }
    phases.push_back(t);
  }
  // Cycle intervals a commit waits where a cap binds and the flush cycles
  // run back to back at its pace: the rest of the cycle in progress and its
  // own, 1.5; where the capture, at its cap, measured its COMMIT statements,
  // their time over the captured interval between cycles (the cap's long
  // tail holds the WAL lock every committer queues for).
  double commit_wait_cycles = 1.5;
  if (commit_measured && d.flushes > 0 && d.cycle.flushes > 0) {
    const double cycles_per_s = p.tps * d.flushes / d.cycle.flushes;
    commit_wait_cycles = std::max(1.0, p.commit_statement_s * cycles_per_s);
  }
  out.commit_wait_cycles = commit_wait_cycles;
  if (p.has_cpu && !p.cpu_split && out.capture_capped)
    out.notes.push_back("cpu per transaction taken as captured on every tier (" +
                        fmt("%.3f ms", captured_cpu * 1e3) + " at " + fmt("%.0f", p.tps) +
                        " tps): the CPU per transaction grows at low utilisation (pgbench -S on 2 cores: 0.284 ms "
                        "at 800 tps, 0.164 ms unthrottled) and the capture's throughput varied too little to tell "
                        "its fixed part from the part per transaction, so tiers that lift the cap may be projected "
                        "low where the CPU binds");
  client_share = d.cpu_s > 0 ? client_between / d.cpu_s : 0.0;
  for (const auto& t : phases) {
    auto s = solve(d, t, out.vcpus, think, out.other_s, o.kernel_writes_uncapped, out.clients_hi);
    const auto& net = s.net;
    const double x_free = s.pts.back().throughput;
    // The largest population up to n whose uncapped throughput is at most
    // x (the first when none): what the stations without caps see while a
    // cap holds throughput at x. Throughput grows with the population.
    auto under = [&](double x, int n) -> const MvaPoint& {
      int lo = 1, hi = n;  // Invariant: the answer is in [lo, hi].
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s.pts[static_cast<size_t>(mid - 1)].throughput <= x) lo = mid;
        else hi = mid - 1;
      }
      return s.pts[static_cast<size_t>(lo - 1)];
    };
    // The tightest rate cap's bound with n clients, and the flush cycles
    // per transaction there. Where a cap the flush cycle draws on binds,
    // cycles run back to back at its pace: the cap fixes the flush rate f,
    // not the batch, which follows from where the clients spend the rest of
    // their time. Throughput x and f solve together
    //   tokens:  x per_tx + f tokens per cycle + background(x) = limit
    //   clients: n = x (Z + R0(x)) + k share x / f
    // (R0: the response without the commit at the largest population under
    // x; k: commit_wait_cycles), that is the batch b = share x / f =
    // (n - x (Z + R0)) / k, within [1, n].
    struct Bound {
      double x = std::numeric_limits<double>::infinity();
      std::string name;
      double cycles_per_tx = -1;  // -1: the flush cycle's own at x
    };
    // A cap that the throughput `free_x` of the network without caps stays
    // under at a batch of one (its lowest bound) does not bind: its bound is
    // then taken at that batch, without solving.
    auto bound_at = [&](int n, double free_x) {
      Bound best;
      for (const auto& c : net.caps) {
        double xb = 0, cyc = -1;
        if (c.commit_tokens > 0 && net.group_commit) {
          const double share = net.cycle->share, most = std::max(1, n);
          auto batch = [&](double x) {
            const MvaPoint& pt = under(x, n);
            const double rest =
                think + pt.response_s - (net.commit >= 0 ? pt.residence_s[static_cast<size_t>(net.commit)] : 0.0);
            return std::clamp((n - x * rest) / commit_wait_cycles, 1.0, most);
          };
          // h(x) = bound at batch(x) - x falls as x grows (the batch does).
          // Invariant: h(lo) > 0 >= h(hi).
          double lo = 0, hi = c.bound(x_free, share / most);
          if (const double lowest = c.bound(x_free, share); free_x <= lowest) lo = hi = lowest;
          for (int i = 0; i < 100 && hi - lo > hi * 1e-10; ++i) {
            const double mid = (lo + hi) / 2;
            (c.bound(x_free, share / batch(mid)) > mid ? lo : hi) = mid;
          }
          xb = hi;
          cyc = share / batch(hi);
        } else {
          xb = c.bound(x_free, 0);
        }
        if (xb < best.x) best = {xb, c.name, cyc};
      }
      return best;
    };
    // Client count n under a cap: where the uncapped network would exceed
    // it, throughput is the cap's and the clients beyond wait for tokens.
    // The uncapped stations then see the load of the largest population
    // that stays under the cap (`below`).
    auto capped = [&](int n, double* x, double* r, const MvaPoint** below) {
      const MvaPoint& free = s.pts[static_cast<size_t>(n - 1)];
      *below = &free;
      const double x_cap = bound_at(n, free.throughput).x;
      if (free.throughput <= x_cap) {
        *x = free.throughput;
        *r = server_response(free, net);
        return false;
      }
      *below = &under(x_cap, n);
      *x = x_cap;
      *r = std::max((*below)->response_s, n / x_cap - think) - ((*below)->response_s - server_response(**below, net));
      return true;
    };
    double x = 0, r = 0;
    const MvaPoint* pt_ptr = nullptr;
    bool at_cap = capped(out.clients_hi, &x, &r, &pt_ptr);
    const Bound binding = bound_at(out.clients_hi, s.pts.back().throughput);
    const std::string& cap_name = binding.name;
    const MvaPoint& pt = *pt_ptr;
    TierProjection tp;
    tp.tier = t.name;
    tp.description = t.description;
    tp.capture_tier_source = out.capture_tier_source;
    tp.clients = out.clients_hi;
    tp.tps = x;
    tp.latency_s = r;
    // Flush cycles per transaction at this throughput (group commit), or the
    // captured flushes as a fixed demand.
    double cycles = !net.group_commit                   ? 0.0
                    : at_cap && binding.cycles_per_tx >= 0 ? binding.cycles_per_tx
                                                           : net.cycle->share / net.cycle->batch(x, out.clients_hi);
    tp.flushes_per_tx = net.group_commit ? cycles * net.cycle->flushes : d.flushes;
    tp.read_iops = x * net.read_ios;
    tp.write_iops = x * (net.write_ios + cycles * net.cycle_write_ios) +
                    server_writes_at(net.fixed_write_ios, net.fixed_write_ios_per_tx, x);
    tp.bytes_per_s = x * net.bytes + server_writes_at(net.fixed_bytes, net.fixed_bytes_per_tx, x);
    double cap_wait = std::max(0.0, r - server_response(pt, net));
    double commit_s = net.commit >= 0 ? pt.residence_s[static_cast<size_t>(net.commit)] : 0.0;
    tp.split.cpu_s = (1 - client_share) * pt.residence_s[static_cast<size_t>(net.cpu)];
    tp.split.storage_s = pt.residence_s[static_cast<size_t>(net.storage)] + commit_s + cap_wait;
    if (net.queued >= 0) tp.split.storage_s += pt.residence_s[static_cast<size_t>(net.queued)];
    tp.split.other_s = pt.residence_s[static_cast<size_t>(net.other)];
    tp.split.think_s = pt.residence_s[static_cast<size_t>(net.think)] +
                       client_share * pt.residence_s[static_cast<size_t>(net.cpu)];
    // Variance: exponential queueing stations (and cap wait), compound-
    // Poisson device time.
    double var = cap_wait * cap_wait;
    for (size_t i = 0; i < net.stations.size(); ++i) {
      const auto& st = net.stations[i];
      double ri = pt.residence_s[i];
      if (static_cast<int>(i) == net.think || static_cast<int>(i) == net.other) continue;
      if (static_cast<int>(i) == net.commit) {
        // A committing transaction's own cycle, and the queue before it.
        double own = net.cycle->share * net.cycle->device_s;
        double wait = std::max(0.0, ri - own);
        var += net.cycle->share * net.cycle_var + wait * wait;
      } else if (static_cast<int>(i) == net.storage) {
        double wait = std::max(0.0, ri - st.demand_s);
        var += net.io_var + wait * wait;
      } else {
        var += ri * ri;
      }
    }
    tp.p99_s = gamma_p99(tp.latency_s, var);
    if (at_cap) {
      tp.busiest = cap_name;
      tp.busiest_utilisation = 1.0;
      tp.busiest_is_cap = true;
    } else {
      // The busiest station that serves anything (the CPU without samples,
      // or the storage without device I/O, has no demand: it is no
      // resource), or the busiest cap.
      double best = -1;
      for (size_t i = 0; i < net.stations.size(); ++i) {
        const auto& st = net.stations[i];
        if (st.demand_s <= 0 || (st.kind != StationKind::Queue && st.kind != StationKind::Multi)) continue;
        if (pt.utilisation[i] > best) {
          best = tp.busiest_utilisation = pt.utilisation[i];
          tp.busiest = st.name;
          tp.busiest_is_cap = false;
        }
      }
      for (const auto& c : net.caps)
        if (c.utilisation(x, cycles) > std::max(best, 0.0)) {
          best = c.utilisation(x, cycles);
          tp.busiest = c.name;
          tp.busiest_utilisation = best;
          tp.busiest_is_cap = true;
        }
    }
    if (at_cap || tp.busiest_utilisation >= kSaturated) {
      tp.bottleneck = tp.busiest;
      tp.bottleneck_utilisation = tp.busiest_utilisation;
    }
    for (int n = 1; n <= out.clients_hi; ++n) {
      double xn = 0, rn = 0;
      const MvaPoint* b = nullptr;
      capped(n, &xn, &rn, &b);
      tp.curve.push_back({n, xn, rn});
    }
    out.tiers.push_back(std::move(tp));
  }
  fold_bursts(out.tiers, tiers);
  double base = out.tiers.front().tps;
  for (auto& t : out.tiers) {
    t.ratio = base > 0 ? t.tps / base : 0;
    for (auto& a : t.after_burst) a.ratio = base > 0 ? a.tps / base : 0;
  }
  return out;
}

}  // namespace tierlab::models
