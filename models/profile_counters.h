// The device and CPU figures of a profile from counters, for a capture that
// has no block I/O and no CPU of the server's processes (a host-less
// capture in front of a managed server). Private to models/.
#pragma once

#include "models/profile.h"

#include <map>
#include <string>
#include <vector>

namespace tierlab::models {

// Every sample of the counters the figures come from, by name, in time
// order: "provider.*" (gauges: a value per period), "pg.blks_read",
// "pg.wal.*", "pg.bgwriter.*", "pg.checkpointer.*", "pg.buffers_*", and the
// sums of pg_stat_io over backend types and contexts as "pg.io:OBJECT.COLUMN"
// (all backends) and "pg.io:bg.OBJECT.COLUMN" (checkpointer and background
// writer). Cumulative counters but for "provider.*".
struct CounterSeries {
  std::map<std::string, std::vector<std::pair<int64_t, double>>> series;
  // Adds one Sample (those of other names are ignored).
  void add(std::string_view name, int64_t ts, double value);
};

// Counts of events by millisecond of the trace clock, for figures over a
// span known only once the trace is read (the transactions' first start
// to last end): memory grows with the capture's duration (4 bytes a
// millisecond from the first event counted to the last), not with its
// records. Events may arrive in any order.
class MsCounts {
 public:
  void add(int64_t ts_ns, uint32_t n = 1);
  // Events in the milliseconds after a's and up to b's: those in (a, b]
  // to the millisecond (an event in a's millisecond counts as at a).
  double between(int64_t a_ns, int64_t b_ns) const;
  // Events in the milliseconds from a's up to, not including, b's.
  double in(int64_t from_ns, int64_t to_ns) const;
  uint64_t total() const { return total_; }

 private:
  static int64_t ms(int64_t ns) { return ns >= 0 ? ns / 1'000'000 : -((-ns + 999'999) / 1'000'000); }
  // Events in milliseconds [from, to).
  uint64_t sum(int64_t from, int64_t to) const;
  int64_t base_ = 0;  // the millisecond of bins_[0]
  std::vector<uint32_t> bins_;
  uint64_t total_ = 0;
};

// Fills the device figures (reads, writes, flushes and background writes
// per transaction, read and write IOPS, latencies), the CPU (provider
// CPUUtilization x vCPUs) when the profile has none, cap detection, and
// p.sources. `ends` counts the transactions' end times. Does nothing to
// figures the block I/O and process CPU already gave.
void profile_from_counters(Profile& p, const CounterSeries& c, const std::map<std::string, std::string>& meta,
                           const MsCounts& ends);

}  // namespace tierlab::models
