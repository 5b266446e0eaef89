// Projection: what a profiled workload would do on other storage tiers.
//
// The workload is a closed queueing network solved by exact mean value
// analysis (models/mva.h): N clients cycle through
//
//   think   — delay station, the captured think time between transactions
//   cpu     — `vcpus` servers (exact load-dependent MVA), the server's CPU
//             time per transaction from the capture's samples
//   storage — the tier's per-I/O service time (mean of its latency
//             distribution, the same definitions iosim's shaper draws from)
//             times the transaction's synchronous I/Os: device reads by its
//             backend (and its commit writes and WAL flushes when the
//             capture has no flushes to build the commit station from). A
//             tier with `parallelism` P serves P I/Os at once (P servers),
//             0 = a pure delay.
//   commit  — the WAL flush cycle that commits share (group commit,
//             models/group_commit.h): a delay that grows with throughput,
//             since the faster commits arrive the more of them wait for the
//             cycle in progress and share the next flush. Flushes and commit
//             writes per transaction follow the cycle (one per commit at low
//             load, towards 1/N when the cycle is long), calibrated to give
//             the captured flushes per transaction at the captured
//             throughput on the captured device. A cap that counts the
//             cycle's writes and flushes paces back-to-back cycles (tokens
//             per cycle / the rate the rest of the workload leaves), which
//             lengthens the cycle instead of bounding throughput.
//   caps    — the tier's rate caps (read IOPS, write IOPS, total IOPS,
//             bytes/s) bound throughput at (cap - background rate) /
//             (counted I/Os or bytes per transaction). A transaction counts
//             its own I/Os (its commit writes and WAL flushes through the
//             commit station's pacing, flushes only on a tier that counts
//             them) plus its share of the background writes of what the
//             backends dirtied (the captured rate per transaction): the
//             server's auxiliary processes (background writer,
//             checkpointer) write them up to their captured rate per
//             second, the kernel the rest; with the kernel's writeback
//             uncapped only the server's share counts. A token bucket delays nothing until its rate
//             is exceeded, so a cap is not a queue: below the bound the
//             network runs as if uncapped; where the uncapped network would
//             exceed it, throughput is the bound and the clients beyond wait
//             for tokens (response time N/X - Z). A burst bucket is
//             projected twice: at its burst rate while credits last (the
//             tier's headline figures), then at its refill rate (baseline).
//   queued  — delay station: the time the transaction's I/Os waited before
//             their issue at capture (block-layer queueing), kept on every
//             tier unless the capture ran at its own tier's cap: that wait
//             was the cap's, and each tier's caps give their own instead.
//             Calibration always has it, so it never lands in "other".
//   other   — delay station: what the capture's mean transaction latency
//             holds beyond the model at the captured client count, on the
//             captured device with the captured vCPUs (network round trips,
//             locks, client time). It is the same on every tier and for
//             every --vcpus, so more vCPUs only shorten the CPU's queue.
//
// Reads per transaction follow the miss-ratio curve when `memory_bytes`
// differs from the capture's memory (models/project_memory.h): with
// a file-level curve (the server's file reads, `capture run` as root), less
// memory adds the page references the smaller OS cache misses and the
// capture's did not; more memory, or a block-level curve, scales the reads
// measured.
//
// p99 estimate: the transaction's response time is taken as a sum of
// independent parts — queueing stations exponential (variance R_k^2), the
// storage time a compound Poisson sum of I/Os with the tier's latency
// distribution (variance r E[L^2]), the commit one cycle's device time plus
// an exponential wait beyond it, "other" fixed — and a gamma distribution
// with that mean and variance is fitted; its 99th percentile is reported.
// It is a model estimate, not a measurement.
#pragma once

#include "models/profile.h"
#include "tiers/tiers.h"

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace tierlab::models {

// The tier model the projection takes (tiers/tiers.h).
using tiers::Catalog;
using tiers::Latency;
using tiers::LatencyDist;
using tiers::Tier;

struct ProjectOptions {
  int clients_lo = 0;  // 0: the capture's client count
  int clients_hi = 0;
  int vcpus = 0;       // the target's; 0: as captured
  double memory_bytes = 0;          // 0: the capture's
  double capture_memory_bytes = 0;  // overrides the trace's Meta "memory.bytes"
  // Leave the writes the kernel issues on its own (writeback of buffered
  // writes, the file system's journal) out of the IOPS caps, and count only
  // what the server's processes submit: backends' reads, WAL writes and
  // flushes, the background writer's and checkpointer's writes. That is
  // what cgroup v1 blkio throttling of the server's cgroup sees. Without
  // the server's pids in the trace, every non-backend write is left out.
  bool kernel_writes_uncapped = false;
  // The tier the capture ran on (--captured-on): only its rate caps are
  // used (the device's latencies are the capture's own). Or a total IOPS
  // cap of the capture's device (--captured-iops-cap). Without either, the
  // profile's detection (Profile::cap_bound), else the capture is assumed
  // uncapped. A capture that ran at such a cap waited for it: that wait
  // (its queue time before issue) is kept out of "other", and each tier's
  // own caps give its waiting instead.
  std::optional<Tier> captured_tier;
  double captured_iops_cap = 0;
  // Whether the capture ran at its tier's cap, decided by the caller: -1
  // decides from the profile's rates; a window of a capture takes the
  // whole capture's verdict (a window whose rate dipped is still capped).
  int capture_at_cap = -1;
  // The data grows this many times with the same access pattern (each
  // page's share of the references spread over that many more pages): a
  // cache of M then holds what M / growth holds today, so the miss-ratio
  // curve is read at memory / growth (models/project_memory.h).
  double data_growth = 1;
  // The clients' think time on every tier, seconds; < 0: as captured. The
  // calibration of "other" always uses the captured one (models/capacity.h
  // sets it for a load multiple).
  double think_s = -1;
};

// Time of one transaction, by where it goes, seconds.
struct TimeSplit {
  double cpu_s = 0;      // CPU service and queueing
  double storage_s = 0;  // device service, device queueing and cap waits
  double other_s = 0;    // calibrated residual
  double think_s = 0;
};

struct CurvePoint {
  int clients = 0;
  double tps = 0;
  double latency_s = 0;
};

// Lowest and highest over a capture's windows.
struct Range {
  double lo = 0, hi = 0;
};

struct TierProjection {
  std::string tier;
  std::string description;
  // How the capture's own tier was taken (Projection::capture_tier_source).
  std::string capture_tier_source;
  int clients = 0;           // population of the headline figures (clients_hi)
  double tps = 0;
  double latency_s = 0;      // mean response time (excludes think time)
  double p99_s = 0;          // estimate, see the file comment
  double read_iops = 0;      // device I/Os the tier serves (counted units)
  double write_iops = 0;
  double bytes_per_s = 0;
  double flushes_per_tx = 0; // WAL flushes per transaction at this throughput
  // The busiest resource: "cpu", "storage", "IOPS cap", ...; "" when the
  // network has none with any demand (no CPU samples, no device I/O).
  std::string busiest;
  double busiest_utilisation = 0;
  bool busiest_is_cap = false;  // a rate cap, not a station
  // The busiest resource when it is near saturation (utilisation at least
  // kSaturated, or a cap's bound reached), else "": nothing then limits
  // throughput but the clients' own cycle, and the time split says where a
  // transaction's time goes.
  std::string bottleneck;
  double bottleneck_utilisation = 0;
  double ratio = 1;          // tps / the first tier's tps
  TimeSplit split;
  std::vector<CurvePoint> curve;  // 1..clients_hi (index = clients - 1)
  // A tier with a burst bucket (gp2): the figures above are the burst's,
  // while credits last (the tier starts with them all); `after_burst` holds
  // the figures at the baseline once they are gone, when they run out at
  // the projected rate (empty when they never do).
  double burst_iops = 0;      // 0: no burst bucket
  double baseline_iops = 0;
  double burst_credits = 0;
  double burst_lasts_s = 0;   // at the projected rate; infinity: never run out
  std::vector<TierProjection> after_burst;
  // Over the capture's windows (add_windows): each window projected alone.
  Range tps_range, ratio_range, latency_range;
  // Headroom (models/capacity.h): the lowest load multiple at which the
  // tier saturates (a bottleneck, kSaturated busy or a cap's bound reached)
  // or its p99 crosses the SLO; 0 when not computed, infinity when it does
  // not within kMaxLoad. `headroom_by` names what saturates; the figures
  // are the tier's at that load (sustained: a burst tier's baseline once its
  // credits run out).
  double headroom = 0;
  std::string headroom_by;
  double headroom_tps = 0;
  double headroom_iops = 0;  // read + write, counted units
  double headroom_p99_s = 0;
};

// One tier at one load multiple (models/capacity.h).
struct LoadTier {
  double tps = 0;
  double latency_s = 0;
  double p99_s = 0;
  double read_iops = 0, write_iops = 0;
  std::string bottleneck;  // "" below saturation
  double bottleneck_utilisation = 0;
};

struct LoadPoint {
  double load = 1;     // multiple of today's arrival rate
  int clients = 0;     // the population projected
  double think_s = 0;  // and its think time
  std::vector<LoadTier> tiers;  // as Projection::tiers
};

struct Projection {
  std::string source;
  int clients_lo = 0, clients_hi = 0;
  int vcpus = 0;          // the target's, every tier is projected with
  // The server's at capture (Meta "cpu.count", else this machine's): "other"
  // is calibrated with these, so the target's count changes only the CPU's
  // queueing.
  int capture_vcpus = 0;
  // Cores the capture itself kept busy on the server's machine (profile's
  // capture_cores_busy): taken from the server at capture, given back on
  // every tier.
  double capture_cores = 0;
  double memory_bytes = 0;
  double capture_memory_bytes = 0;
  double read_factor = 1;     // reads per transaction relative to the capture
  // False when the trace has no CPU samples: the CPU is then no resource of
  // the network, its time is in "other" (calibrated on the capture), and
  // cpu_s_per_tx and every tier's split.cpu_s are 0.
  bool cpu_modelled = true;
  double cpu_s_per_tx = 0;         // the server's and, of it, its machine's clients':
  double client_cpu_s_per_tx = 0;  // the part between transactions taken out of the think time,
  double client_cpu_in_tx_s_per_tx = 0;  // the part inside them out of the latency ("other")
  // The server's CPU that does not follow throughput (Profile::cpu_split),
  // cores taken from the vCPUs on every tier; 0 when not split.
  double cpu_fixed_cores = 0;
  double reads_per_tx = 0;
  double sync_writes_per_tx = 0;
  double flushes_per_tx = 0;
  double think_time_s = 0;
  double other_s = 0;
  // Where "other" came from: "residual" (the captured latency less the
  // model's residence times) or "quiet transactions" (a capture at its cap:
  // the latency of the transactions that did no device I/O, less their CPU
  // residence).
  std::string other_source = "residual";
  double other_residual_s = 0;  // the residual, when other_source says otherwise
  // Cycle intervals a commit waits where a cap binds the flush cycle (1.5,
  // or measured by the COMMIT statements of a capture at its cap): sets the
  // batch the cap's pace gives (see project()).
  double commit_wait_cycles = 1.5;
  // Group commit (models/group_commit.h), when the capture has WAL flushes:
  // the flush cycle calibrated on the capture, the captured device's time
  // for one cycle's writes and flush (a tier's cycle is scaled by its own),
  // and flushes per cycle.
  bool group_commit = false;
  double committing_share = 0;  // transactions that commit through the cycle
  double cycle_s = 0;
  double cycle_device_s = 0;
  double flushes_per_cycle = 0;
  // The capture's own tier: "known" (--captured-on, --captured-iops-cap),
  // "detected" (the profile's cap detection) or "assumed uncapped"; its
  // name ("cap1000", "1000 IOPS", "read IOPS cap ~1000"); whether the
  // capture ran at its cap. The queue time before issue per transaction
  // is storage time: where the capture ran at its tier's cap it is the
  // wait for that cap, calibrated apart from "other" and replaced on each
  // tier by that tier's caps; otherwise it is kept on every tier.
  std::string capture_tier_source = "assumed uncapped";
  std::string capture_tier;
  bool capture_capped = false;
  double queued_s_per_tx = 0;
  // The model at the capture's own conditions, against what was measured.
  double captured_tps = 0;
  double modelled_capture_tps = 0;
  std::vector<TierProjection> tiers;
  // Set when the workload asks nothing of the storage (a trace without
  // device I/O): every tier then projects the same by construction, and
  // this says why.
  std::string same_on_every_tier;
  // Windows the capture was split into for the ranges (0: none), and their
  // mean length.
  int windows = 0;
  double window_s = 0;
  std::vector<std::string> notes;
  // commit_durability_warning() of the profile: "" when commits waited.
  std::string durability_warning;
  // Capacity (models/capacity.h): the data growth every figure is projected
  // with, how load multiples were made ("think" or "clients"), the p99
  // target of the headroom (0: none) and the figures at each load.
  double data_growth = 1;
  std::string load_by;
  double slo_p99_s = 0;
  std::vector<LoadPoint> loads;
};

// Throws InputError for unusable input (no tiers, bad client range, a
// memory size the curve cannot answer for, ...).
Projection project(const Profile& profile, const std::vector<Tier>& tiers,
                   const ProjectOptions& opts);

// Projects each window of the capture (profile_windows) with `p`'s client
// range and vCPUs, and sets every tier's ranges: the spread a projection
// from a part of the capture has. Fewer than 2 windows: nothing.
void add_windows(Projection& p, const std::vector<Profile>& windows, const std::vector<Tier>& tiers,
                 const ProjectOptions& opts);

// Mean of a latency distribution as the shaper draws it, seconds.
double mean_latency_s(const Latency& l);

// "capture's own tier: cap1000 (known), at its cap: ...": how the capture's
// tier was taken and what became of its queue time before issue.
std::string capture_tier_line(const Projection& p);

// A tier's bottleneck as the reports print it: "storage 83%", or "clients".
// Utilisation from which the busiest resource is named the bottleneck.
inline constexpr double kSaturated = 0.9;

// As the reports print them: the busiest resource "cpu 36%" ("-" for none),
// the bottleneck "IOPS cap 100%" ("none" below kSaturated), and where a
// transaction's time goes, "storage wait 40%, cpu 25%, other 35%" (shares of the
// mean response time, largest first).
std::string busiest_text(const TierProjection& t);
std::string bottleneck_text(const TierProjection& t);
std::string time_split_text(const TierProjection& t, bool cpu_modelled);

void print_projection(std::ostream& out, const Projection& p);
std::string projection_json(const Projection& p, int indent = 2);
// One self-contained HTML page: inline CSS and SVG, no scripts, no fonts.
std::string projection_html(const Projection& p, const Profile& profile);

}  // namespace tierlab::models
