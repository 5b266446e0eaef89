// Per-worker replay statistics, merged at the end of a run.
//
// A worker owns its Stats and never shares them while running; the few
// numbers the progress line needs are mirrored in Live (relaxed atomics,
// one writer). Nothing here allocates after construction except
// SqlstateCounts, once per distinct SQLSTATE, to keep the first message of
// each (beyond kSlots distinct SQLSTATEs, never seen in practice, the rest
// are counted under "other" with no message).
#pragma once

#include "common/histogram.h"
#include "replay/plan.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tierlab::replay {

// Errors counted by SQLSTATE, each with the first message the target gave
// for it and the statement it came from.
class SqlstateCounts {
 public:
  static constexpr size_t kSlots = 256;
  static constexpr uint32_t kNoStatement = UINT32_MAX;
  // Counts `n` errors of `sqlstate` (five characters; a NUL ends it early).
  // The first of a SQLSTATE keeps `message` and when it came: the only
  // allocation, once per SQLSTATE.
  void add(const char* sqlstate, uint64_t n = 1, std::string_view message = {});
  // A statement (fingerprint `fp`) was answered with `sqlstate`: it becomes
  // the statement of that SQLSTATE's first message if it has none yet.
  // Errors come before the statement they answer is recorded, so this is
  // the first message's statement, or (for an error no statement answers,
  // a Parse's say) the next statement that failed the same way.
  void attach(const char* sqlstate, uint32_t fp);
  // Adds o's counts; the first message of each SQLSTATE is the earlier of
  // the two.
  void merge(const SqlstateCounts& o);
  uint64_t total() const { return total_; }
  uint64_t get(const char* sqlstate) const;
  // Sorted by SQLSTATE.
  std::vector<std::pair<std::string, uint64_t>> sorted() const;

  struct First {
    std::string sqlstate;
    uint64_t count = 0;
    std::string message;                 // "" when the target gave none
    uint32_t statement = kNoStatement;   // fingerprint index
  };
  // Every SQLSTATE with its first message, sorted by SQLSTATE ("other"
  // last, with no message).
  std::vector<First> firsts() const;

 private:
  static uint64_t key(const char* s);
  static std::string name(uint64_t key);
  // The slot of `k`, taken if new (*added set); kSlots when the table is full.
  size_t slot(uint64_t k, bool* added);
  size_t find(uint64_t k) const;
  std::array<uint64_t, kSlots> keys_{};
  std::array<uint64_t, kSlots> counts_{};
  // Per slot: the first message, its time (steady clock, for merge) and
  // its statement. std::string is empty until a SQLSTATE is first seen.
  std::array<std::string, kSlots> message_{};
  std::array<int64_t, kSlots> first_at_{};
  std::array<uint32_t, kSlots> statement_{};
  uint64_t other_ = 0;
  uint64_t total_ = 0;
};

struct FpStat {
  uint64_t count = 0;        // statements replayed
  uint64_t pairs = 0;        // of them compared: ok at capture and now, captured latency known
  double replay_ns = 0;      // sum over pairs
  double captured_ns = 0;    // sum over pairs
};

// How a replayed statement compares with its capture.
struct Divergence {
  bool error_status = false;  // ok vs error, or different SQLSTATE
  bool row_count = false;     // both ok with a row count, counts differ
  bool new_error = false;     // ok at capture, an error now
};
Divergence compare(const Outcome& captured, const Outcome& replayed);

struct Stats {
  explicit Stats(size_t fingerprints = 0) : fps(fingerprints) {}
  Histogram lat;   // statement latency, ns
  Histogram lag;   // schedule lag, ns
  Histogram own_lag;  // the part of each lag spent in tierlab, ns
  Histogram sync_wait;  // --sync commit: each wait for other sessions' commits, ns
  uint64_t sync_timeouts = 0;  // of them, those that gave up (--sync-timeout)
  uint64_t statements = 0;
  uint64_t transactions = 0;         // ended without an error
  uint64_t failed_transactions = 0;  // ended after an error
  uint64_t div_error_status = 0;
  uint64_t div_row_count = 0;
  uint64_t div_new_errors = 0;  // statements that succeeded at capture and failed
  uint64_t sessions_failed = 0;
  uint64_t sessions_stopped = 0;  // connecting or connected when the replay stopped
  uint64_t sessions_direct = 0;
  uint64_t unsupported = 0;  // messages of units sent through libpq it could not send
  std::string first_session_error;
  SqlstateCounts errors;
  std::vector<FpStat> fps;

  // One error the target answered (of any message of a unit: a Parse's
  // too), with its primary message.
  void error(const char* sqlstate, std::string_view message) { errors.add(sqlstate, 1, message); }

  // Records one replayed statement against its capture. Latencies compare
  // only statements that succeeded both times: an error's answer is quick
  // and says nothing of the statement's speed.
  void statement(const Stmt& st, const Outcome& replayed, Nanos latency) {
    ++statements;
    lat.record(latency);
    FpStat& f = fps[st.fp];
    ++f.count;
    if (st.captured_latency >= 0 && replayed.status == Status::Ok && st.captured.status == Status::Ok) {
      ++f.pairs;
      f.replay_ns += static_cast<double>(latency);
      f.captured_ns += static_cast<double>(st.captured_latency);
    }
    if (replayed.status == Status::Error) errors.attach(replayed.sqlstate, st.fp);
    Divergence d = compare(st.captured, replayed);
    div_error_status += d.error_status;
    div_row_count += d.row_count;
    div_new_errors += d.new_error;
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
