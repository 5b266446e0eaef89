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

// Fills the device figures (reads, writes, flushes and background writes
// per transaction, read and write IOPS, latencies), the CPU (provider
// CPUUtilization x vCPUs) when the profile has none, cap detection, and
// p.sources. `ends` holds the transactions' end times, sorted. Does nothing
// to figures the block I/O and process CPU already gave.
void profile_from_counters(Profile& p, const CounterSeries& c, const std::map<std::string, std::string>& meta,
                           const std::vector<int64_t>& ends);

}  // namespace tierlab::models
