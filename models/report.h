// One report of a workload, as one self-contained HTML page (inline CSS and
// SVG, no scripts, nothing fetched): the capture over time, its replays
// against it, its projection onto storage tiers and its miss-ratio curve.
// `tierlab report` shows every section it has input for; `project --html`
// and `profile --html` are views of the same page with some sections only.
#pragma once

#include "models/profile.h"
#include "models/project.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::trace {
class Reader;
}

namespace tierlab::models {

// A capture over time: what happened in each bucket of its span, and its
// statements by template.
struct CaptureTimeline {
  std::string source;
  double bucket_s = 0.1;  // width of each bucket
  struct Bucket {
    double transactions = 0;  // idle ReadyForQuery after a statement
    double statements = 0;    // Query and Execute messages
    double errors = 0;
    double reads = 0, writes = 0;  // block I/O requests issued
    double read_bytes = 0, write_bytes = 0;
    double read_latency_s = 0, write_latency_s = 0;  // sums (issue to completion)
    // Adds o's counts and sums: two neighbouring buckets merged into one.
    Bucket& operator+=(const Bucket& o) {
      transactions += o.transactions;
      statements += o.statements;
      errors += o.errors;
      reads += o.reads;
      writes += o.writes;
      read_bytes += o.read_bytes;
      write_bytes += o.write_bytes;
      read_latency_s += o.read_latency_s;
      write_latency_s += o.write_latency_s;
      return *this;
    }
  };
  // Bucket i spans [i, i + 1) * bucket_s from the first statement, error,
  // transaction end or block I/O of the trace.
  std::vector<Bucket> buckets;
  bool has_block_io = false;
  struct Statement {
    std::string sql;  // fingerprint (normalize_sql)
    uint64_t count = 0;
    uint64_t errors = 0;
    double total_s = 0;  // sum of each statement's time: its message to its answer
  };
  std::vector<Statement> statements;  // by total time, descending
  uint64_t statement_count = 0;
  double statement_time_s = 0;
};

// Buckets start at 0.1 s; when a capture needs more than kMaxBuckets of
// them, neighbours are merged and the width doubles (so an hour-long capture
// keeps seconds and a day's keeps less than a minute per bucket, in bounded
// memory).
inline constexpr size_t kMaxTimelineBuckets = 4096;

// One pass over the trace. A Query's time runs from the Query to its
// ReadyForQuery, an Execute's to its CommandComplete, ErrorResponse,
// EmptyQueryResponse or PortalSuspended. Throws InputError (corrupt trace).
CaptureTimeline capture_timeline(trace::Reader& reader, const std::string& source);
CaptureTimeline capture_timeline(const std::string& path);

// A replay as its `replay --json` report says it (the app reads the JSON).
struct ReplayView {
  std::string source;  // the report's path
  std::string speed;   // "max", "1", "2"
  uint64_t sessions = 0, sessions_failed = 0;
  uint64_t transactions = 0, statements = 0, errors = 0;
  double tps = 0, duration_s = 0, captured_duration_s = 0;
  double lat_avg_ms = 0, lat_p50_ms = 0, lat_p99_ms = 0;
  // Divergence: statements whose outcome differs from the capture's.
  uint64_t divergence_error_status = 0, divergence_row_count = 0, divergence_new_errors = 0;
  double divergence_rate = 0;
  std::vector<std::pair<std::string, uint64_t>> errors_by_sqlstate;
  std::vector<std::pair<std::string, std::string>> first_errors;  // (SQLSTATE, message)
  struct Statement {
    std::string sql;
    uint64_t count = 0;  // replayed
    uint64_t pairs = 0;  // of them compared with the capture
    double captured_ms = 0, replay_ms = 0;  // means over the pairs
  };
  std::vector<Statement> templates;  // by captured time (count x mean), descending
};

struct ReportInput {
  const Profile* profile = nullptr;          // header and miss-ratio curve
  const CaptureTimeline* capture = nullptr;  // the capture section
  std::vector<ReplayView> replays;           // one section each
  const Projection* projection = nullptr;    // the projection section
  bool profile_section = false;              // transaction templates and per-transaction figures
  bool mrc = true;                           // the miss-ratio curve
};

// The page, with the sections the input holds, in the order capture,
// replay, projection, miss-ratio curve. Needs `profile`.
std::string report_html(const ReportInput& in);

}  // namespace tierlab::models
