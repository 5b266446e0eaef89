// Discrete-event simulation of a stream of I/Os on a storage tier.
//
// No I/O is done: each I/O goes through the tier's Shaper (iosim/shaper.h),
// which says when the tier starts and completes it, and the simulator keeps
// the clock, the queue depth and the statistics.
//
//   Closed loop (fio-like): `iodepth` I/O streams; each issues its next I/O
//   when the previous one completes (plus an optional think time), until
//   `runtime_ns` of simulated time or `ios` I/Os.
//   Open loop: I/Os arrive at fixed times from an ArrivalSource (a trace's
//   block or file I/O records, or a Poisson/fixed-rate pattern) whatever the
//   tier does; if the tier is slower, completions fall behind. As in
//   `iosim run`, at most `open_iodepth` I/Os are outstanding: an arrival that
//   finds them all in flight waits for the next completion and is issued
//   then, late (counted in slot_waits, issue_lag, late_issues). So an offered
//   rate above the tier's capacity runs in memory bounded by the depth, and
//   with open_runtime_ns in time bounded by what the tier completes.
//
// A run is deterministic for (tier, seed, input). The event queue is a binary
// heap over an array of iodepth (closed) or open_iodepth (open) entries
// allocated before the loop; the loop itself does not allocate.
#pragma once

#include "common/histogram.h"
#include "iosim/pattern.h"
#include "iosim/shaper.h"
#include "tiers/tiers.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::trace {
class Reader;
}

namespace tierlab::iosim {

// One I/O of an open loop: when it arrives and, when the input recorded it,
// when it completed originally (0 = unknown).
struct Arrival {
  Nanos at = 0;
  IoRequest req;
  Nanos recorded_complete = 0;
};

class ArrivalSource {
 public:
  virtual ~ArrivalSource() = default;
  // The next arrival, in non-decreasing `at` order; false at the end.
  virtual bool next(Arrival& out) = 0;
};

// Arrivals from a pattern at `rate_iops`, Poisson (exponential gaps) or
// evenly spaced, starting at time 0, until `count` I/Os or `runtime_ns`
// (whichever is set and comes first; at least one must be set).
class PatternArrivals : public ArrivalSource {
 public:
  PatternArrivals(const PatternSpec& pattern, double rate_iops, bool poisson, uint64_t count,
                  Nanos runtime_ns);
  bool next(Arrival& out) override;

 private:
  Pattern pattern_;
  Rng rng_;
  double mean_gap_ns_;
  bool poisson_;
  uint64_t count_, issued_ = 0;
  Nanos runtime_ns_;
  double t_ = 0;
};

// Which trace records become I/Os.
enum class TraceRecords : uint8_t { Block, File, All };

// Arrivals from a trace: BlockIo records (issue time, recorded completion)
// and/or FileIo records (entry time, entry + latency). Records a little out
// of issue order (block records are written at completion) are put back in
// order through a window of `reorder_window` records; an arrival that is
// older than one already delivered is delivered at that later time and
// counted in late().
class TraceArrivals : public ArrivalSource {
 public:
  TraceArrivals(trace::Reader& reader, TraceRecords which, size_t reorder_window = 65536);
  bool next(Arrival& out) override;

  uint64_t late() const { return late_; }
  uint64_t block_records() const { return block_; }
  uint64_t file_records() const { return file_; }

 private:
  bool fill_one();
  trace::Reader& reader_;
  TraceRecords which_;
  std::vector<Arrival> heap_;  // min-heap on `at`, capacity reorder_window
  size_t window_;
  bool eof_ = false;
  Nanos last_at_ = INT64_MIN;
  uint64_t late_ = 0, block_ = 0, file_ = 0;
};

struct ClosedLoop {
  PatternSpec pattern;
  uint32_t iodepth = 1;
  Nanos think_ns = 0;    // between a completion and the stream's next issue
  Nanos runtime_ns = 0;  // no new I/O is issued at or after this time; 0 = no limit
  uint64_t ios = 0;      // issue at most this many I/Os; 0 = no limit
};

// What the simulator reports per I/O, for tests and per-I/O logs.
struct IoEvent {
  IoRequest req;
  Nanos issue = 0;     // submitted (arrival)
  Nanos start = 0;     // the tier started serving it
  Nanos complete = 0;
  uint32_t counted = 0;
};
using IoObserver = void (*)(void* ctx, const IoEvent& ev);

struct SimOptions {
  uint64_t seed = 1;
  IoObserver observer = nullptr;  // called once per completed I/O, in completion order
  void* observer_ctx = nullptr;
  // Open loop: most I/Os outstanding at once (iosim run's --iodepth, same
  // default); later arrivals wait for a completion.
  uint32_t open_iodepth = 32;
  // Open loop: no I/O is issued at or after this long after the first
  // arrival (0 = no limit), as --runtime ends an `iosim run`: arrivals still
  // waiting for a slot then are not issued.
  Nanos open_runtime_ns = 0;
};

// Latency and volume of one op kind.
struct OpResult {
  uint64_t ios = 0;
  uint64_t bytes = 0;
  Histogram lat;  // completion - issue, ns
};

struct QdPoint {
  Nanos t = 0;          // start of the interval, from the start of the run
  Nanos width = 0;
  double mean_qd = 0;   // time-weighted mean of I/Os outstanding in it
  uint64_t completed = 0;  // I/Os completed in it
};

struct SimResult {
  std::string tier;
  bool open_loop = false;
  uint64_t ios = 0;
  uint64_t bytes = 0;
  Nanos first_issue = 0;     // absolute, as the input gave it
  Nanos last_complete = 0;
  Nanos elapsed_ns = 0;      // last_complete - first_issue
  double iops = 0;           // ios / elapsed
  double bw_bytes = 0;       // bytes / elapsed, per second
  Histogram lat;             // every op
  OpResult read, write, other;  // other: flush and discard
  ShaperStats shaper;
  double mean_queue_depth = 0;  // time-weighted, over elapsed
  uint64_t max_queue_depth = 0;
  std::vector<QdPoint> qd_series;  // at most 64 intervals covering the run, in order
  // Open loop with recorded completions: simulated minus recorded completion.
  uint64_t recorded_ios = 0;   // I/Os whose input recorded a completion
  uint64_t behind_ios = 0;     // I/Os that completed later than recorded
  Histogram behind;            // positive part, ns
  double mean_behind_ns = 0;   // signed mean over I/Os with a recorded completion
  Nanos end_behind_ns = 0;     // last simulated completion - last recorded one
  uint64_t late_arrivals = 0;  // trace records out of order beyond the window
  // Open loop, counted as `iosim run` counts them (EngineResult): arrivals
  // that found open_iodepth I/Os outstanding and waited for a completion;
  // issue - arrival of every I/O; issues later than kLateIssueNs and the
  // stalls (runs of consecutive late issues) they came in.
  static constexpr Nanos kLateIssueNs = 100'000;
  uint64_t slot_waits = 0;
  Histogram issue_lag;
  uint64_t late_issues = 0;
  uint64_t issue_stalls = 0;
};

SimResult simulate_closed(const tiers::Tier& tier, const ClosedLoop& loop, const SimOptions& opt);
SimResult simulate_open(const tiers::Tier& tier, ArrivalSource& arrivals, const SimOptions& opt);

}  // namespace tierlab::iosim
