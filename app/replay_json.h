// A replay's report as JSON (tierlab replay --json), and back: the shards'
// reports of one replay are read again by tierlab report merge.
#pragma once

#include "replay/replay.h"

#include <nlohmann/json.hpp>

#include <string>

namespace tierlab::app {

// The report as `replay --json` writes it. `max_rate` is --max-divergence.
// Besides the figures it holds what they come from, so that reports merge
// without loss: "histograms" (latency, lag, tierlab's lag, each its
// non-empty buckets in the fixed layout of common/histogram.h with its
// exact count, sum, sum of squares, min and max) and "fingerprints" (every
// fingerprint replayed: count, pairs compared, sums of the captured and
// replay latencies).
nlohmann::json report_json(const replay::Report& r, double max_rate);

// A report read back from report_json()'s output; `name` (the file) is in
// every message. InputError naming the file and the field when something
// is missing or of the wrong kind, or when the histograms are of another
// layout (another version of tierlab). *max_rate gets --max-divergence.
replay::Report report_from_json(const nlohmann::json& j, const std::string& name, double* max_rate = nullptr);

// A histogram as report_json() writes one, and back (nullopt: not one).
nlohmann::json histogram_json(const Histogram& h);
std::optional<Histogram> histogram_from_json(const nlohmann::json& j);

}  // namespace tierlab::app
