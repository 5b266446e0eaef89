// Workload profile: what one transaction of a captured workload asks of the
// machine, measured from a trace.
//
// From the session records: transaction templates (the fingerprinted
// statement sequence between two idle ReadyForQuery states), their counts,
// latency and concurrency; the clients' think time between a session's
// transactions. From periodic samples: CPU time of the server's process tree
// per transaction ("cpu.*_ns" counters) and PostgreSQL's own counters
// ("pg.*"). From block I/O: device reads and synchronous writes issued by the
// backend that ran a transaction (BlockIo.pid == SessionBegin.backend_pid,
// inside that transaction's time window), WAL flushes, writes of other
// processes (checkpointer, writeback) per second, and the device latency seen
// at capture. From file I/O (or block I/O when there is none): a miss-ratio
// curve of the page references below shared_buffers, so reads can be
// projected to another memory size.
#pragma once

#include "common/sql.h"
#include "trace/record.h"

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::trace {
class Reader;
}

namespace tierlab::models {

// Latency summary of a set of operations, seconds.
struct LatencySummary {
  uint64_t count = 0;
  double mean_s = 0;
  double p50_s = 0;
  double p99_s = 0;
};

struct TemplateStats {
  uint64_t id = 0;           // fingerprint hash
  std::string text;          // normalised statements joined by "; " (cut at 300 chars)
  int statements = 0;        // statements per transaction
  uint64_t count = 0;
  double share = 0;          // count / all transactions
  double mean_latency_s = 0;
  double concurrency = 0;    // mean transactions of this template in flight
  double reads_per_tx = 0;   // attributed device reads per transaction
  double writes_per_tx = 0;  // attributed device writes (WAL at commit) per transaction
};

// A miss-ratio curve over cache sizes in bytes (LRU over 8 KiB pages).
struct MissCurve {
  std::string source;           // "file_io", "block_io" or "" (none)
  double references = 0;        // page references it was built from
  double distinct_pages = 0;    // cold misses (footprint)
  bool sampled = false;         // SHARDS sampling was used
  double sample_rate = 1.0;
  std::vector<std::pair<double, double>> points;  // (cache bytes, miss ratio), ascending
  // Miss ratio at `cache_bytes` (linear between points; 1 below the first
  // point's size if it is not 0; the last value past the end).
  double at(double cache_bytes) const;
  bool empty() const { return points.empty(); }
};

struct Profile {
  std::string source;        // path of the trace
  double duration_s = 0;     // window from the first transaction start to the last end
  uint64_t sessions = 0;
  uint64_t transactions = 0;
  uint64_t statements = 0;
  uint64_t errors = 0;
  double tps = 0;
  int clients = 0;           // most sessions open at once that ran transactions
  double mean_clients = 0;   // mean sessions open over the window
  double concurrency = 0;    // mean transactions in flight (Little's law)
  LatencySummary latency;    // transaction latency (first message to idle ReadyForQuery)
  double think_time_s = 0;   // mean gap between a session's transactions
  // Mean time per transaction that the client held its turn inside it: from
  // each ReadyForQuery that left the transaction open (status 'T' or 'E')
  // to the session's next message (pgbench computing its next statement,
  // an application between a transaction's statements). It is part of the
  // transaction's latency, as think_time_s is not.
  double client_in_tx_s = 0;
  std::vector<TemplateStats> templates;  // by count, descending

  // CPU (from "cpu.*_ns" samples); has_cpu false when the trace has none.
  bool has_cpu = false;
  double cpu_s_per_tx = 0;
  double cpu_cores_busy = 0;  // mean cores the server kept busy
  // Mean cores tierlab's capture itself kept busy (sample "capture.cpu_ns"
  // of `capture run`); 0 when not recorded.
  double capture_cores_busy = 0;
  // The server's CPU split by regression over the capture's sample
  // intervals, cores = fixed + per_tx x tps: a part that does not follow
  // throughput (wake-ups, idle-state exits, the auxiliary processes) and
  // the part each transaction adds. Set (cpu_split) only where the
  // capture's throughput varied enough to tell them apart: 10 intervals or
  // more, the busiest at least 1.5x the quietest, the slope's standard error
  // within a tenth of it, both parts positive. Why: at a capped capture's
  // low utilisation the CPU per transaction is above what it is at full
  // speed (pgbench -S on 2 cores: 0.284 ms at 800 tps, 0.164 unthrottled).
  bool cpu_split = false;
  double cpu_fixed_cores = 0;
  double cpu_marginal_s_per_tx = 0;
  // CPU per transaction of the clients on the server's machine (sample
  // "clients.cpu_ns" of `capture run`: pgbench beside the server), which
  // compete with it for the same cores; -1 when none were seen.
  double client_cpu_s_per_tx = -1;

  // PostgreSQL counters (from "pg.*" samples), per transaction; -1 if absent.
  double pg_blks_read_per_tx = -1;
  double pg_blks_hit_per_tx = -1;
  double pg_wal_bytes_per_tx = -1;

  // Block I/O.
  bool has_block_io = false;
  std::string device;               // Meta "device" if recorded
  double reads_per_tx = 0;          // device reads by the transaction's backend
  double read_bytes_per_tx = 0;
  double sync_writes_per_tx = 0;    // device writes by the transaction's backend (WAL at commit)
  double write_bytes_per_tx = 0;
  double flushes_per_tx = 0;        // WAL flushes (Flush ops, fdatasync) per transaction
  double unattributed_backend_ios = 0;  // backend I/Os outside any transaction window
  double other_reads_per_s = 0;     // reads by processes that are not backends
  double background_writes_per_s = 0;  // writes by processes that are not backends
  double background_write_bytes_per_s = 0;
  // Of the background writes, those the server's own processes issued
  // (background writer, checkpointer, WAL writer: Meta "server.pid" of the
  // capture's process tree); the rest the kernel issued on its own
  // (writeback of buffered writes, the file system's journal). The server's
  // auxiliary processes run on their own clocks (bgwriter_delay, checkpoint
  // pacing), so this is a rate per second, not per transaction.
  bool knows_server_processes = false;
  double server_writes_per_s = 0;
  double server_write_bytes_per_s = 0;
  LatencySummary native_read;       // device latency at capture
  LatencySummary native_write;
  LatencySummary native_flush;
  double device_read_iops = 0;      // all device reads / duration
  double device_write_iops = 0;
  // Block-layer queueing: issue minus the queue time of the request's
  // earliest bio (BlockIo.queued_ns, trace format 1.2), for the requests
  // whose queue time the capture saw; has_queue_times false when none.
  // Time a request waits to be issued (an IOPS cap's throttling, the I/O
  // scheduler) is storage time.
  bool has_queue_times = false;
  LatencySummary queued_read;
  LatencySummary queued_write;
  // The queue time of the I/Os attributed to transactions (reads and the
  // backend's own writes), per transaction.
  double queued_s_per_tx = 0;
  // The transactions to which no device I/O was attributed (of backends
  // whose pid the trace knows): their count and mean latency. At an IOPS
  // cap their latency holds none of the cap's wait, so it measures the
  // time a transaction spends outside storage directly (see project's
  // calibration of "other").
  uint64_t quiet_transactions = 0;
  double quiet_latency_s = 0;
  // Transactions that end with an explicit COMMIT (or END) after other
  // statements: their count and the mean time of that last statement (its
  // query to the ReadyForQuery: the wait for the WAL flush and for the lock
  // behind other backends' flushes). At a write cap that wait is the cap's
  // (see project's calibration of "other").
  uint64_t commit_statements = 0;
  double commit_statement_s = 0;
  // Where a transaction's time went by what its backend waited on, from
  // the wait events `capture run` sampled in pg_stat_activity (samples
  // "pg.activity.*", capture/activity.h): each class's share of the sampled
  // backends in a transaction, times the mean latency, seconds per
  // transaction. io: reading or writing data files (at an IOPS cap, the
  // wait for it); commit: the WAL's writes and flushes and the WALWrite
  // lock behind them; lock: heavyweight locks and the other LWLocks; client:
  // idle in the transaction, for the client's next statement; cpu: running;
  // other: the rest (IPC, timeouts, extensions). `rounds` is 0 when the
  // trace has no such samples.
  struct WaitSplit {
    uint64_t rounds = 0;
    double backends = 0;  // backends in a transaction, summed over the rounds
    double io_s = 0, commit_s = 0, lock_s = 0, client_s = 0, cpu_s = 0, other_s = 0;
    std::string source;   // "pg_stat_activity, 300 rounds, 2,400 backends in a transaction"
  } waits;
  // The capture looks bound by an IOPS cap: the device's per-second count
  // of one op held steady (the middle 80% of the whole seconds within 10%
  // of their median) while that op's requests waited before their issue at
  // least as long as the device took to serve them and the transactions
  // waited at least a tenth of their latency so. `project` takes it as the
  // capture's tier unless given one.
  bool cap_bound = false;
  // From a host-less capture's counters (models/profile_counters.cpp): the
  // provider's ReadIOPS (or ReadIOPS + WriteIOPS, op "total"), else
  // pg_stat_io's or pg_stat_database's reads, steady over five periods or
  // more while the reads took at least a tenth of the transactions' time.
  std::string cap_op;               // "read", "write" or "total"
  double cap_iops = 0;              // the ceiling: the op's mean rate over the whole seconds

  // Host-less captures (no block I/O; models/profile_counters.cpp): the
  // device figures above come from counters: the provider's metrics
  // (samples "provider.*": ReadIOPS, ReadLatency, ... of CloudWatch), else
  // pg_stat_io, pg_stat_database and pg_stat_wal. Those count reads from
  // the OS, page-cache hits included.
  bool io_from_counters = false;
  // The device latencies are the volume's own as the provider measures it:
  // on a cloud volume the wait for its IOPS cap is inside them, so it is
  // storage time, which each tier's own replaces.
  bool latency_holds_cap_wait = false;
  // Where each figure came from, (figure, source), in the order `profile`
  // prints them: ("device reads per transaction", "provider ReadIOPS ...").
  std::vector<std::pair<std::string, std::string>> sources;

  // Memory at capture (Meta "memory.bytes" and "setting.shared_buffers");
  // 0 when unknown.
  double memory_bytes = 0;
  double shared_buffers_bytes = 0;
  int vcpus = 0;                    // Meta "cpu.count"; 0 when unknown
  // The server's settings at capture (Meta "setting.NAME": fsync,
  // synchronous_commit, wal_sync_method, ...), (NAME, value) by name.
  std::vector<std::pair<std::string, std::string>> settings;
  MissCurve mrc;

  std::vector<std::string> notes;   // what could not be measured, and why

  // The window the figures are from, on the trace's clock: the first
  // transaction's start and the last one's end.
  int64_t first_ns = 0;
  int64_t last_ns = 0;
};

struct ProfileOptions {
  // Exact stack distances up to this many distinct pages; SHARDS with this
  // many tracked pages (fixed size) beyond.
  size_t exact_pages = 1 << 20;
  uint32_t page_bytes = 8192;
  // A window of the trace, [from_ns, to_ns) on the trace's clock: only the
  // transactions that end in it, the I/O issued in it and the samples taken
  // in it count (sessions and prepared statements from before it are still
  // followed). The default is the whole trace.
  int64_t from_ns = std::numeric_limits<int64_t>::min();
  int64_t to_ns = std::numeric_limits<int64_t>::max();
};

// Builds a profile from records in trace order (roughly: sources may
// interleave slightly out of order, which the builder tolerates), in one
// pass: it holds state per session, template, backend pid and millisecond
// of the trace, never per transaction or I/O record (a backend's last 256
// transactions stay open to I/O recorded after they ended, and up to 64
// of its I/Os issued since the last one ended wait for the next to begin;
// I/O issued before the first transaction or after the latest end read
// waits until a transaction's span holds it). Transactions ending between
// two counter samples count to the millisecond.
class ProfileBuilder {
 public:
  explicit ProfileBuilder(ProfileOptions opts = {});
  ~ProfileBuilder();
  ProfileBuilder(const ProfileBuilder&) = delete;
  ProfileBuilder& operator=(const ProfileBuilder&) = delete;

  void add(const trace::Record& r);
  // Throws InputError if there is no completed transaction.
  Profile finish(const std::string& source);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads the whole trace. Throws InputError (no transactions, corrupt trace).
Profile profile_trace(trace::Reader& reader, const std::string& source, ProfileOptions opts = {});
Profile profile_file(const std::string& path, ProfileOptions opts = {});

// A statement's fingerprint: common/sql.h's normalize_sql, the one the
// replay's divergence report uses too.
inline std::string fingerprint_sql(std::string_view sql) { return normalize_sql(sql); }

// --- windows: how steady a capture is (models/windows.cpp) --------------------
//
// A capture is split into equal windows of time; each is profiled on its
// own, and the spread of the key inputs over them says how far a projection
// from the capture can be trusted.

// Each window needs this many transactions and seconds; by default a capture
// is split into kDefaultWindows when it is long enough for that (fewer when
// not, none below two).
inline constexpr uint64_t kMinWindowTransactions = 200;
inline constexpr double kMinWindowSeconds = 2.0;
inline constexpr int kDefaultWindows = 4;
// An input whose highest window value exceeds its lowest by more than this
// factor makes the capture unsteady.
inline constexpr double kUnsteadyFactor = 1.5;

// How many windows of at least kMinWindowTransactions and kMinWindowSeconds
// the capture holds (at most `want`); 0 when fewer than 2.
int windows_for(const Profile& whole, int want = kDefaultWindows);

// Profiles each of `n` equal windows of [whole.first_ns, whole.last_ns]
// (one pass over the trace). A window without a completed transaction is
// left out.
std::vector<Profile> profile_windows(const std::string& path, const Profile& whole, int n,
                                     ProfileOptions opts = {});

struct Spread {
  std::string input;  // "TPS", "WAL flush latency", "device reads per transaction"
  double lo = 0, hi = 0;
  std::string unit;   // "", " ms"
  bool unsteady = false;
};

struct Steadiness {
  int windows = 0;
  double window_s = 0;
  bool too_short = false;   // fewer than kDefaultWindows windows fit
  std::vector<Spread> spreads;
  bool unsteady() const;
  // One line per problem ("warning: ..."), empty when steady.
  std::vector<std::string> warnings(const Profile& whole) const;
};

Steadiness steadiness(const Profile& whole, const std::vector<Profile>& windows);

// The windows' spreads ("steadiness over 4 windows of 3.0 s: TPS 980.1–1012.3,
// ...") and a "warning: " line per problem.
void print_steadiness(std::ostream& out, const Profile& whole, const Steadiness& s);
// profile_json with a "steadiness" object: windows, window_s, too_short,
// unsteady, spreads, warnings.
std::string profile_json(const Profile& p, const Steadiness& s, int indent = 2);
// When the capture's commits did not wait for the device (setting fsync or
// synchronous_commit off), one line saying so and what it means for a
// projection: "fsync=off at capture: commits did not wait for the device,
// so commit latency on other tiers is not projected ..."; "" when they did
// or the trace does not record the settings.
std::string commit_durability_warning(const Profile& p);

void print_profile(std::ostream& out, const Profile& p);
std::string profile_json(const Profile& p, int indent = 2);

}  // namespace tierlab::models
