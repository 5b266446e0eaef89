// Per-worker replay statistics, merged at the end of a run.
//
// A worker owns its Stats and never shares them while running; the few
// numbers the progress line needs are mirrored in Live (relaxed atomics,
// one writer). Nothing here allocates after construction except
// SqlstateCounts when more than kSlots distinct SQLSTATEs appear (never in
// practice: it then counts the rest under "other").
#pragma once

#include "common/histogram.h"
#include "replay/plan.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::replay {

class SqlstateCounts {
 public:
  static constexpr size_t kSlots = 256;
  void add(const char* sqlstate, uint64_t n = 1);
  void merge(const SqlstateCounts& o);
  uint64_t total() const { return total_; }
  uint64_t get(const char* sqlstate) const;
  // Sorted by SQLSTATE.
  std::vector<std::pair<std::string, uint64_t>> sorted() const;

 private:
  static uint64_t key(const char* s);
  std::array<uint64_t, kSlots> keys_{};
  std::array<uint64_t, kSlots> counts_{};
  uint64_t other_ = 0;
  uint64_t total_ = 0;
};

struct FpStat {
  uint64_t count = 0;        // statements replayed
  uint64_t pairs = 0;        // of them, with a known captured latency
  double replay_ns = 0;      // sum over pairs
  double captured_ns = 0;    // sum over pairs
};

// How a replayed statement compares with its capture.
struct Divergence {
  bool error_status = false;  // ok vs error, or different SQLSTATE
  bool row_count = false;     // both ok with a row count, counts differ
};
Divergence compare(const Outcome& captured, const Outcome& replayed);

struct Stats {
  explicit Stats(size_t fingerprints = 0) : fps(fingerprints) {}
  Histogram lat;   // statement latency, ns
  Histogram lag;   // schedule lag, ns
  Histogram own_lag;  // the part of each lag spent in tierlab, ns
  uint64_t statements = 0;
  uint64_t transactions = 0;         // ended without an error
  uint64_t failed_transactions = 0;  // ended after an error
  uint64_t div_error_status = 0;
  uint64_t div_row_count = 0;
  uint64_t sessions_failed = 0;
  uint64_t sessions_stopped = 0;  // connecting or connected when the replay stopped
  uint64_t sessions_direct = 0;
  uint64_t unsupported = 0;  // messages of units sent through libpq it could not send
  std::string first_session_error;
  SqlstateCounts errors;
  std::vector<FpStat> fps;

  // Records one replayed statement against its capture.
  void statement(const Stmt& st, const Outcome& replayed, Nanos latency) {
    ++statements;
    lat.record(latency);
    FpStat& f = fps[st.fp];
    ++f.count;
    if (st.captured_latency >= 0) {
      ++f.pairs;
      f.replay_ns += static_cast<double>(latency);
      f.captured_ns += static_cast<double>(st.captured_latency);
    }
    Divergence d = compare(st.captured, replayed);
    div_error_status += d.error_status;
    div_row_count += d.row_count;
  }

  void merge(const Stats& o);
};

// What the progress line reads while workers run: one writer per instance.
struct alignas(64) Live {
  std::atomic<uint64_t> statements{0};
  std::atomic<uint64_t> transactions{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<double> lat_sum_ns{0};
  std::atomic<double> lat_sumsq_ns{0};
  std::atomic<double> lag_sum_ns{0};
  std::atomic<uint64_t> lag_n{0};

  void add(std::atomic<uint64_t>& a, uint64_t v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  void add(std::atomic<double>& a, double v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
};

// Fills the report's totals, percentiles and fingerprint lists from merged
// stats. duration_ns is the replay's wall time.
void fill_report(Report& r, const Stats& s, const Plan& plan, Nanos duration_ns);

}  // namespace tierlab::replay
