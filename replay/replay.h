// Replaying a captured transaction stream against a real PostgreSQL.
//
// load() reads a trace once and turns its session records into a compact,
// preallocated Workload: per session, the units the client sent (a simple
// Query, an extended-protocol group ending in Sync, or a COPY with its data),
// each with its captured send time, captured outcome (result tag and rows, or
// SQLSTATE) and captured latency. run() re-drives that workload: one
// connection per captured session, opened by libpq at the session's captured
// start and closed at its end, on one absolute schedule
// (replay epoch + (t_capture - t0) / speed), over worker threads that each
// run many sessions on one wait (io_uring where the kernel has it, else
// epoll) — plaintext sessions driven directly (the plan's protocol messages
// out, the answers read as they come), TLS and GSS ones through
// non-blocking libpq.
//
// Errors on the target never stop a replay: they are counted by SQLSTATE and
// compared with the capture (divergence). Setup problems throw: InputError
// for unusable input (flags, user map, trace), RuntimeError for the target
// (first connection refused, file descriptor limit too low).
#pragma once

#include "common/sql.h"
#include "trace/reader.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tierlab::replay {

using trace::Nanos;

// --- small pure helpers (tested on their own) --------------------------------

// A user map file: one "captured=target" per line; blank lines and lines
// starting with '#' are ignored, spaces around names are trimmed.
struct UserMap {
  std::vector<std::pair<std::string, std::string>> entries;
  // The target user for `captured`, or nullptr when it is not mapped.
  const std::string* find(std::string_view captured) const;
};
// `name` is used in messages ("users.map:3: expected captured=target").
UserMap parse_user_map(std::string_view text, const std::string& name);
UserMap load_user_map(const std::string& path);  // InputError if unreadable

// Statement fingerprint: common/sql.h's normalize_sql, the profile's too.
using tierlab::normalize_sql;
uint64_t fingerprint(std::string_view sql);  // 64-bit hash of normalize_sql

// --- the workload --------------------------------------------------------------

// Which part of the trace to replay, in nanoseconds from the trace start:
// the clock origin in the trace header, from which `tierlab trace dump`
// prints its times (records stamped before it count as at 0). Units sent
// outside [begin, end) are not replayed. A session the capture had inside a
// transaction at `begin` joins at its next idle point (ReadyForQuery 'I'):
// the rest of that transaction is neither replayed nor counted. A
// transaction still open at `end` is left unfinished: its session closes,
// and the target rolls it back. Statements a session prepared before its
// first replayed unit are prepared again (not counted) so that later
// Executes still find them. A session the capture joined mid-stream inside
// a transaction (its first statement ends inside one it did not open)
// joins at its next idle point the same way, whatever the window.
struct Window {
  Nanos begin = 0;
  Nanos end = std::numeric_limits<Nanos>::max();
};

struct Plan;  // private to replay/

struct WorkloadSummary {
  uint64_t sessions = 0;
  uint64_t units = 0;         // client round trips (Query, Sync group, COPY)
  uint64_t statements = 0;    // Query + Execute
  // ReadyForQuery 'I' after replayed statements, counted per session as
  // the replay counts them.
  uint64_t transactions = 0;
  uint64_t captured_errors = 0;
  uint64_t copy_bytes = 0;
  uint64_t max_concurrency = 0;  // most sessions open at once in the capture
  uint64_t fingerprints = 0;
  uint64_t unsupported = 0;   // messages that cannot be re-sent (see notes)
  // Messages only a directly driven session re-sends: Executes that resume
  // a portal (row limits), Binds never executed. libpq has no call for them.
  uint64_t libpq_unsupported = 0;
  // Sessions the capture joined mid-stream inside a transaction opened
  // before it: each replays from its next idle point (see Window).
  uint64_t joined_in_transaction = 0;
  Nanos duration_ns = 0;      // first session start to last session end
  // The trace's length: its last record of any kind, from the trace start
  // (as Window counts); 0 for a trace without records.
  Nanos trace_end_ns = 0;
};

class Workload {
 public:
  explicit Workload(std::shared_ptr<const Plan> plan);
  const WorkloadSummary& summary() const;
  const Plan& plan() const { return *plan_; }

 private:
  std::shared_ptr<const Plan> plan_;
};

// Reads every record of `reader` (the Reader's strings are copied into one
// arena here, so the Workload outlives it). Throws like trace::Reader.
Workload load(trace::Reader& reader, const Window& window = {});

// --- running it ------------------------------------------------------------------

struct Options {
  std::string conninfo;       // --db: libpq conninfo or URI of the target
  double speed = 1.0;         // schedule divisor; ignored with max_speed
  bool max_speed = false;     // no waits; per-session order and concurrency kept
  int threads = 0;            // worker threads; 0 = number of cores
  double progress_s = 0;      // -P: progress line period; 0 = none
  std::string database;       // force this database for every session
  std::string user;           // force this user for every session
  UserMap user_map;           // captured user -> target user
  // Timed replays (not max_speed) hold the CPU wake-up latency limit
  // (/dev/cpu_dma_latency) at 0 us while they run, as cyclictest does, so
  // that idle CPUs wake on time for each scheduled send. Needs root;
  // skipped without it (Report::cpu_latency_held says which).
  bool hold_cpu_latency = true;
  // Run the worker threads at real-time priority (SCHED_FIFO 1), so that
  // backends of a target on the same machine do not delay scheduled sends.
  // Needs root or CAP_SYS_NICE; RuntimeError otherwise.
  bool realtime = false;
  // Sessions on plaintext connections are driven directly once libpq has
  // connected them: the plan's protocol messages are written to the socket
  // and the answers read without libpq (no result objects, one read per
  // answer). false keeps every session on libpq, as TLS and GSS-encrypted
  // sessions always are.
  bool direct = true;
  // The workers' event loop: "io_uring" (directly driven sessions send and
  // receive through a ring, one io_uring_enter per round for all of them;
  // libpq sessions stay on epoll, polled through the ring),
  // "epoll", or "auto": io_uring where the kernel has what the loop needs,
  // else epoll. The environment variable TIERLAB_REPLAY_IO, when set,
  // overrides it (tests run on either loop).
  std::string io = "auto";
  // --log: one line per round trip (unit) to this file, as pgbench -l
  // writes one per transaction; empty: none. See Report::log_*.
  std::string log_path;
  // Waits up to `timeout_ns` for a request to stop (a SIGINT, say); returns
  // its name, or nullptr when none came. While it is set, run() calls it
  // from its own thread while the workers run; on a stop every session ends
  // where it is and the report covers what ran (Report::stopped). Unset:
  // the replay runs to its end.
  std::function<const char*(long timeout_ns)> wait_stop;
};

// Latency of one fingerprint, over the statements that succeeded both at
// capture and in the replay (a failed statement answers quickly, which says
// nothing of its speed).
struct FingerprintDelta {
  std::string sql;            // normalised text
  uint64_t count = 0;         // statements compared
  double captured_ms = 0;     // mean captured latency
  double replay_ms = 0;       // mean replay latency
};

// The first error the target answered with one SQLSTATE.
struct FirstError {
  std::string sqlstate;       // "other": beyond the SQLSTATEs the replay tells apart
  uint64_t count = 0;         // errors with this SQLSTATE
  std::string message;        // the target's primary message of the first
  // Normalised text (as FingerprintDelta::sql) of the statement it answered;
  // "" when no statement did (a Parse nothing executed).
  std::string statement;
};

struct Report {
  uint64_t sessions = 0;
  uint64_t sessions_failed = 0;     // could not connect or lost the connection
  uint64_t sessions_stopped = 0;    // cut short by a stop (Options::wait_stop)
  uint64_t sessions_direct = 0;     // driven directly (Options::direct), not by libpq
  std::string first_session_error;  // libpq's message for the first of those
  // Transactions that ended without an error (pgbench's "actually
  // processed", which tps counts), and those that met one.
  uint64_t transactions = 0;
  uint64_t failed_transactions = 0;
  uint64_t statements = 0;
  uint64_t errors = 0;
  std::vector<std::pair<std::string, uint64_t>> errors_by_sqlstate;  // sorted
  std::vector<FirstError> first_errors;  // one per SQLSTATE, sorted as errors_by_sqlstate
  uint64_t divergence_error_status = 0;  // ok vs error, or another SQLSTATE, either way
  uint64_t divergence_row_count = 0;
  // Statements that succeeded at capture and failed in the replay, and
  // their share of the statements replayed (0 when none ran): what
  // `tierlab replay --max-divergence` limits.
  uint64_t divergence_new_errors = 0;
  double divergence_rate = 0;
  uint64_t unsupported = 0;         // captured messages not re-sent (see WorkloadSummary)
  // Max speed: from the start (every session that starts at once connected)
  // to the last session's end, so tps is "without initial connection time"
  // as pgbench's; timed: from the schedule's epoch.
  double duration_s = 0;
  double tps = 0;
  double connect_s = 0;             // max speed: initial connections, not in duration_s
  double captured_duration_s = 0;
  double speed = 1.0;
  bool max_speed = false;
  int threads = 0;
  bool cpu_latency_held = false;    // see Options::hold_cpu_latency
  // CPU time (user + system) of the worker threads and the connection
  // thread over the whole replay: the replayer's own cost, which on a target on the
  // same machine is taken from the server (reading the trace and building
  // the plan come before and are not in it).
  double cpu_s = 0;
  // cpu_s per transaction ended (processed or failed), microseconds; < 0
  // when none ended.
  double cpu_us_per_transaction() const {
    const uint64_t ended = transactions + failed_transactions;
    return ended ? cpu_s * 1e6 / static_cast<double>(ended) : -1;
  }
  bool realtime = false;            // workers ran at SCHED_FIFO
  double slice_ms = 0;              // workers' scheduler slice (timed replays: 0.1 ms); 0: the kernel's default
  std::string io;                   // the workers' event loop: io_uring or epoll
  // Statement latency (send of its unit to its result), milliseconds.
  double lat_avg_ms = 0, lat_stddev_ms = 0, lat_p50_ms = 0, lat_p90_ms = 0,
         lat_p99_ms = 0, lat_p999_ms = 0, lat_max_ms = 0;
  // Schedule lag (actual send - scheduled send), milliseconds; 0 with max_speed.
  double lag_avg_ms = 0, lag_p99_ms = 0, lag_max_ms = 0;
  // The part of each lag spent in tierlab: actual send - the later of the
  // scheduled send and the session's previous answer (a session still
  // waiting for the target at its due time is the target's lag).
  double own_lag_p99_ms = 0, own_lag_max_ms = 0;
  // Options::log_path: the lines written, and the first write error (the
  // replay went on without the log from there; "" when none).
  std::string log_path;
  uint64_t log_lines = 0;
  std::string log_error;
  std::string stopped;  // what stopped the replay early (Options::wait_stop); "" ran to its end
  std::vector<FingerprintDelta> slowed;   // at most 10, most slowed first
  std::vector<FingerprintDelta> sped_up;  // at most 10, most sped up first
};

// Replays `w` against opts.conninfo. Progress lines go to `progress` every
// opts.progress_s seconds (from the calling thread, which owns the output).
// Throws RuntimeError when the first connection fails (libpq's message) or
// the descriptor limit cannot be raised to what the workload needs.
Report run(const Workload& w, const Options& opts, std::ostream* progress = nullptr);

// InputError unless `speed` is above 0 and the workload's schedule at that
// speed fits the clock; the message starts with the speed ("1e-12: the
// captured 2.000 s would take more than 146 years"). run() checks it too.
void check_speed(const Workload& w, double speed);

// Why the workers' io_uring loop (Options::io) cannot run on this kernel:
// "" when it can.
std::string uring_unsupported();

// pgbench-like text report. Messages and statements of first_errors are
// shown on one line each, cut to 100 and 80 characters.
void print_report(std::ostream& out, const Report& r);
// A fraction as a percentage: "99.98%", "0.0012%", "0%".
std::string percent(double fraction);
void print_dry_run(std::ostream& out, const WorkloadSummary& s);

}  // namespace tierlab::replay
