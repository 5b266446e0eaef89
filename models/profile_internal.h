// The parts of a profile built from samples and page references, apart from
// the one pass over the trace (models/profile.cpp) that gathers them.
// Private to models/.
#pragma once

#include "models/mrc.h"
#include "models/profile.h"
#include "models/profile_counters.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tierlab::models {

// A sampled counter's first and last value in the window, and when.
struct SampleCounter {
  int64_t first_ts = 0, last_ts = 0;
  double first = 0, last = 0;
  bool seen = false;
};

// The server's CPU counters ("cpu.*_ns"), every sample: (time, value) by name.
using CpuSeries = std::map<std::string, std::vector<std::pair<int64_t, double>>>;

// The wait events of the backends in a transaction, as `capture run`
// samples them from pg_stat_activity (capture/activity.h): per sampling
// round, "pg.activity.backends" (client backends in a transaction) and
// "pg.activity.TYPE.EVENT" (how many of them were in that wait; TYPE "CPU"
// for those running). Summed over the rounds in the window.
struct ActivitySamples {
  std::map<std::string, double> by_event;  // "TYPE.EVENT" -> backends, summed
  double backends = 0;                     // backends in a transaction, summed
  uint64_t rounds = 0;
  // Takes a Sample; names other than pg.activity.* are ignored.
  void add(std::string_view name, double value);
};

// The class a wait event's time is put in (Profile::WaitSplit): "io",
// "commit", "lock", "client", "cpu" or "other".
std::string wait_class(std::string_view type, std::string_view event);

// CPU per transaction, its split by regression, the capture's and the
// clients' CPU, PostgreSQL's counters per transaction (Profile's fields
// from samples). `ends` counts the transactions' end times.
void profile_samples(Profile& p, const std::map<std::string, SampleCounter>& counters, const CpuSeries& cpu,
                     const MsCounts& ends);

// Profile::waits from the sampled wait events: each class's share of the
// backends' time in a transaction, times the mean transaction latency.
void profile_waits(Profile& p, const ActivitySamples& a);

// The settings, device, vCPUs and memory from the trace's Meta records, and
// the miss-ratio curve from the file references (else the block ones).
void profile_memory(Profile& p, const std::map<std::string, std::string>& meta, const StackDistances& file,
                    const StackDistances& block, uint32_t page_bytes);

}  // namespace tierlab::models
