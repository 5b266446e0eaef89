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
// run many sessions on one event loop (common/loop.h: io_uring where the
// kernel has it, else epoll) — plaintext and TLS sessions driven directly (the plan's protocol
// messages out, the answers read as they come; TLS through libpq's own
// OpenSSL session), GSS-encrypted ones through non-blocking libpq.
//
// Errors on the target never stop a replay: they are counted by SQLSTATE and
// compared with the capture (divergence). Setup problems throw: InputError
// for unusable input (flags, user map, trace), RuntimeError for the target
// (first connection refused, file descriptor limit too low).
#pragma once

#include "common/histogram.h"
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
// InputError "PATH: why" if unreadable.
UserMap load_user_map(const std::string& path);

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

// Which part of the trace's sessions to replay: shard `index` of `count`
// (0-based, as Kubernetes' JOB_COMPLETION_INDEX and SLURM_PROCID count).
// A session belongs to shard shard_of(its trace session id, count): every
// record of a session goes to one shard, so each session replays whole and
// in its order, and the shards together are the whole trace. The choice is
// made per record as the trace is read (load()), from the id alone, so it
// needs no other shard's sessions and no second pass.
struct Shard {
  uint32_t index = 0;
  uint32_t count = 1;  // 1: every session
};

// The shard of `session_id` among `count` (count >= 1): the splitmix64
// finaliser of the id, modulo count. Stable across runs, hosts and tierlab
// versions (the formula is part of the trace's replay contract), and
// balanced for ids that are consecutive (the proxy's) or scattered
// (process ids, imported logs).
uint32_t shard_of(uint64_t session_id, uint32_t count);

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
  // Transactions and autocommit statements that changed state and ended
  // idle: what replay --sync commit orders the other sessions' work after.
  uint64_t commit_points = 0;
  Nanos duration_ns = 0;      // first session start to last session end
  // The trace's length: its last record of any kind, from the trace start
  // (as Window counts); 0 for a trace without records.
  Nanos trace_end_ns = 0;
  // Shard (see Shard): which one this workload is, and how many sessions
  // of the window all shards together replay (= sessions unsharded).
  Shard shard;
  uint64_t trace_sessions = 0;
};

class Workload {
 public:
  explicit Workload(std::shared_ptr<const Plan> plan);
  const WorkloadSummary& summary() const;
  const Plan& plan() const { return *plan_; }
  // Streamed (stream()): the trace run() reads again, as it was read.
  bool streamed() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  const Window& window() const { return window_; }
  const Shard& shard() const { return shard_; }
  // Streamed with commit order (stream(..., true)): why the trace cannot
  // be planned as it is read, "" when it can. A replay with commit order
  // of such a trace needs load().
  const std::string& sync_unplanned() const;

 private:
  friend Workload stream(const std::string&, const Window&, const Shard&, bool);
  std::shared_ptr<const Plan> plan_;
  std::string path_;
  Window window_;
  Shard shard_;
};

// Reads every record of `reader` (the Reader's strings are copied into one
// arena here, so the Workload outlives it). Throws like trace::Reader.
// With `shard`, only that shard's sessions are kept; the schedule's origin
// stays that of the whole trace (the earliest session of any shard), so
// that shards started at one time (Options::start_at) replay together on
// the captured schedule.
Workload load(trace::Reader& reader, const Window& window = {}, const Shard& shard = {});

// The trace at `path`, streamed: read once here for what the schedule and
// the report need (each session's span and counts, the fingerprints), and
// again by run(), each worker reading its sessions' units as it replays
// them and freeing each once answered. Memory grows with the sessions, the
// distinct statements and the units read ahead of the replay (at most
// detail::kQueueBatches batches a session, a batch at most 32 answered
// units and those in flight), not with the trace's length. The summary is
// load()'s. With `sync` the commit order (Options::sync) is planned as the
// trace is read, each worker planning every session's commits over a
// window of the trace (the transactions open at once, and the units not
// yet answered at capture) and handing on its own: the commit points,
// their numbering and every unit's wait are load()'s. That needs records
// in time order (a capture's, `trace merge`'s): otherwise sync_unplanned()
// says why, and run() refuses the workload with commit order. The trace
// must not change until run() returns. Throws like trace::Reader.
Workload stream(const std::string& path, const Window& window = {}, const Shard& shard = {}, bool sync = false);

// --- running it ------------------------------------------------------------------

struct Options {
  std::string conninfo;       // --db: libpq conninfo or URI of the target
  double speed = 1.0;         // schedule divisor; ignored with max_speed
  bool max_speed = false;     // no waits; per-session order and concurrency kept
  int threads = 0;            // worker threads; 0 = the CPUs it may use (affinity, cgroup quota)
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
  // Sessions on plaintext and TLS connections are driven directly once
  // libpq has connected them: the plan's protocol messages are written to
  // the socket (over TLS: encrypted with the session libpq negotiated) and
  // the answers read without libpq (no result objects, one read per
  // answer). false keeps every session on libpq, as GSS-encrypted sessions
  // always are.
  bool direct = true;
  // The workers' event loop: "io_uring" (directly driven sessions send and
  // receive through the ring, one io_uring_enter per round for all of them;
  // libpq's sockets are polls on the same ring), "epoll", or "auto":
  // io_uring where the kernel has what the loop needs and sessions are
  // driven directly (libpq makes its own system calls either way), else
  // epoll. `replay --io` (or TIERLAB_REPLAY_IO, which the app reads: tests
  // run on either loop).
  std::string io = "auto";
  // --sync commit (true): a transaction or an autocommit statement waits
  // until every commit point (Plan::commits) that completed at capture
  // before it was sent, and that could conflict with it (touched a
  // relation or row it touches: replay/sync_plan.h), has completed in the
  // replay, so work that followed another session's commit at capture
  // never overtakes it. With sync_all (--sync all) it, and a session's
  // start, wait for every such commit point, whatever it touched. false
  // (--sync none): sessions only keep their own order and the schedule.
  bool sync = true;
  bool sync_all = false;
  // A wait for commits longer than this goes on anyway (counted in
  // Report::sync_timeouts); 0: no limit. A commit whose session failed or
  // ended before it counts as done at once and is never waited for.
  Nanos sync_timeout_ns = 10'000'000'000;
  // --log: one line per round trip (unit) to this file, as pgbench -l
  // writes one per transaction; empty: none. See Report::log_*.
  std::string log_path;
  // Waits up to `timeout_ns` for a request to stop (a SIGINT, say); returns
  // its name, or nullptr when none came. While it is set, run() calls it
  // from its own thread while the workers run; on a stop every session ends
  // where it is and the report covers what ran (Report::stopped). Unset:
  // the replay runs to its end.
  std::function<const char*(long timeout_ns)> wait_stop;
  // --start-at: the schedule's epoch (the captured schedule's origin, and
  // with max_speed the first connections) is this CLOCK_REALTIME time, ns
  // since the Unix epoch, shared by the processes of a sharded replay
  // (replay/start_at.h); 0: 1 ms after the workers are set up. Loading the
  // trace and the first connection come before it.
  int64_t start_at_ns = 0;
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

// What the replay measured of one fingerprint: what FingerprintDelta is
// made from, kept whole so that reports merge.
struct FingerprintTotals {
  std::string sql;            // normalised text
  uint64_t count = 0;         // statements replayed
  uint64_t pairs = 0;         // of them compared (FingerprintDelta::count)
  double captured_ns = 0;     // sums over the pairs
  double replay_ns = 0;
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
  // Commit order (Options::sync): the commit points replayed in order,
  // the waits for other sessions' commits (units and session starts that
  // waited; their total, p99 and longest) and those that went on after
  // Options::sync_timeout_ns.
  bool sync = false;
  bool sync_all = false;  // --sync all
  double sync_timeout_s = 0;
  uint64_t commit_points = 0;
  uint64_t sync_waits = 0;
  double sync_wait_s = 0, sync_wait_p99_ms = 0, sync_wait_max_ms = 0;
  uint64_t sync_timeouts = 0;
  // Options::log_path: the lines written, and the first write error (the
  // replay went on without the log from there; "" when none).
  std::string log_path;
  uint64_t log_lines = 0;
  std::string log_error;
  std::string stopped;  // what stopped the replay early (Options::wait_stop); "" ran to its end
  // Options::start_at_ns (0: none), how far past it this process's epoch
  // came by its realtime clock (a merged report: the earliest and latest
  // shard's), and that clock's source and synchronisation.
  int64_t start_at_ns = 0;
  int64_t start_offset_ns = 0, start_offset_max_ns = 0;
  std::string clock;
  std::vector<FingerprintDelta> slowed;   // at most 10, most slowed first
  std::vector<FingerprintDelta> sped_up;  // at most 10, most sped up first
  // What the figures above come from, whole, so that the reports of the
  // shards of one replay merge without loss (merge_reports): the
  // histograms (ns) behind lat_*, lag_* and own_lag_*, and every
  // fingerprint replayed, in first-replayed order.
  Histogram lat_hist, lag_hist, own_lag_hist;
  Histogram sync_wait_hist;  // behind sync_waits, sync_wait_s, sync_wait_p99_ms, sync_wait_max_ms
  std::vector<FingerprintTotals> fingerprints;
  // Which shard of the trace ran (Shard); a merged report lists the shards
  // it holds in merged_shards (empty otherwise).
  Shard shard;
  std::vector<uint32_t> merged_shards;
};

// Recomputes what a report derives from the rest: tps, the divergence rate,
// the latency and lag figures from the histograms, and the slowed and sped
// up lists from the fingerprints.
void derive(Report& r);

// One report of the shards' reports of one replay (`names` name them in
// messages): counts, histograms, errors by SQLSTATE, divergence and
// fingerprints add up, and derive() computes the rest from the merged
// whole, so the percentiles are those of every statement of every shard
// (within the histograms' bucket width). Durations are the longest shard's
// (shards started together end with the last), CPU time and threads add
// up; the first error message of a SQLSTATE is the first report's that has
// one. InputError naming the two reports when they cannot be one replay:
// different speeds, different shard counts, the same shard twice.
Report merge_reports(const std::vector<Report>& reports, const std::vector<std::string>& names);

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
