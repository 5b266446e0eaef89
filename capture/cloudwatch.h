// A cloud provider's metrics of a managed database, as `aws cloudwatch
// get-metric-data` prints them (JSON), read into a trace of samples on the
// wall clock, so that `trace merge` can put them beside a capture of the
// same window.
//
// The file: {"MetricDataResults": [{"Id", "Label", "Timestamps": [ISO 8601
// times, newest first by default], "Values": [...], "StatusCode"}, ...],
// "Messages": [...]}. A series is known by its metric name, matched
// case-insensitively and ignoring '_', '-' and spaces, taken from the
// MetricStat of the query with its Id when the file has a
// "MetricDataQueries" array (the input of get-metric-data kept beside its
// output), else from its Label, else from its Id:
//
//   ReadIOPS        -> Sample "provider.read_iops"             (per second)
//   WriteIOPS       -> Sample "provider.write_iops"            (per second)
//   ReadLatency     -> Sample "provider.read_latency_s"        (seconds)
//   WriteLatency    -> Sample "provider.write_latency_s"       (seconds)
//   ReadThroughput  -> Sample "provider.read_bytes_per_s"
//   WriteThroughput -> Sample "provider.write_bytes_per_s"
//   DiskQueueDepth  -> Sample "provider.queue_depth"
//   CPUUtilization  -> Sample "provider.cpu_percent"           (0-100)
//   FreeableMemory  -> Sample "provider.freeable_memory_bytes"
//   any other       -> Sample "provider.cloudwatch.LABEL" (kept, not modelled)
//
// A Sample's ts is the start of its datapoint's period: its value is the
// metric over [ts, ts + period). Meta records: "provider" = "cloudwatch",
// "provider.period_s" (the smallest step between two datapoints of a
// series), "cpu.count" and "memory.bytes" when known (the instance's vCPUs
// and memory: given, or the file's top-level "vcpus" and "memory" keys,
// also inside a "Metadata" object).
//
// Gaps (a period without a datapoint), a series whose Timestamps and Values
// differ in length, a null value, a StatusCode other than "Complete" and
// unknown names are read as far as they go and noted. A file that is not
// such JSON throws InputError "FILE: where: what" (one line).
#pragma once

#include "trace/writer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tierlab::capture {

struct MetricSeries {
  std::string sample;  // the Sample name ("provider.read_iops", ...)
  std::string label;   // as the file names it
  bool known = false;  // one of the metrics above
  std::vector<std::pair<int64_t, double>> points;  // (wall-clock ns, value), oldest first
};

struct CloudWatchData {
  std::vector<MetricSeries> series;
  int vcpus = 0;            // 0: unknown
  double memory_bytes = 0;  // 0: unknown
  double period_s = 0;      // 0: no series has two datapoints
  std::vector<std::string> notes;  // what was read only in part, one line each
  int64_t first_ns = 0, last_ns = 0;  // wall-clock span of the datapoints
  size_t datapoints() const;
};

// Parses the JSON text of `name` (used in messages).
CloudWatchData parse_cloudwatch(std::string_view text, const std::string& name);

// An ISO 8601 time as CloudWatch prints it ("2026-12-03T12:05:00+00:00",
// "...Z", fractions of a second, no zone = UTC) as wall-clock ns since the
// epoch; false if it is not one.
bool parse_iso8601(std::string_view text, int64_t& ns);

// Writes the Meta and Sample records, in time order, on a clock whose 0 is
// the wall-clock time `origin_ns` (the writer's start_mono_ns 0 and
// realtime_offset_ns origin_ns). Returns the records written.
uint64_t write_cloudwatch(const CloudWatchData& d, trace::Writer& out, int64_t origin_ns);

}  // namespace tierlab::capture
