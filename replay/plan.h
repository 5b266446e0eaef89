// The loaded workload: flat, preallocated tables built once by load() and
// read-only while replaying. Every string is NUL-terminated and lives in the
// Plan's arena; every table refers to others by index, so nothing moves and
// the replay dispatch path only reads.
#pragma once

#include "replay/replay.h"

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::replay {

// One block allocator for all strings of a plan. Pointers stay valid for the
// life of the arena.
class Arena {
 public:
  // Strings are copied into blocks of `block` bytes; one longer than a
  // quarter of that gets a block of its own.
  explicit Arena(size_t block = size_t{1} << 20) : block_(block) {}
  // Copies `s` and a terminating NUL; returns the copy.
  const char* copy(std::string_view s);
  uint64_t bytes() const { return bytes_; }
  // Forgets every string (their pointers dangle), keeping the blocks of
  // the usual size for the next ones.
  void reset();

 private:
  size_t block_;
  std::vector<std::unique_ptr<char[]>> blocks_;  // of block_ bytes
  size_t in_use_ = 0;  // blocks_ holding strings; the last of them is being filled
  size_t used_ = 0;    // bytes used in blocks_[in_use_ - 1]
  std::vector<std::unique_ptr<char[]>> big_;     // a string each
  uint64_t bytes_ = 0;
};

// What the server said for one statement.
enum class Status : uint8_t {
  Ok = 0,       // CommandComplete
  Error = 1,    // ErrorResponse, sqlstate set
  Skipped = 2,  // not executed: an earlier error in the same Sync group
  Unknown = 3,  // the capture ended before the answer
};

struct Outcome {
  Status status = Status::Unknown;
  bool has_rows = false;
  char sqlstate[6] = {0, 0, 0, 0, 0, 0};
  uint64_t rows = 0;
};

// A statement: one captured Query or Execute.
struct Stmt {
  uint32_t fp = 0;           // index into Plan::fingerprints
  Outcome captured;
  Nanos captured_latency = -1;  // unit send -> its answer; -1 unknown
};

enum class OpKind : uint8_t {
  Prepare,         // Parse: PQsendPrepare(name, sql, types)
  Execute,         // Bind + Execute: PQsendQueryPrepared(name, params)
  DescribeStmt,    // Describe 'S': PQsendDescribePrepared
  DescribePortal,  // Describe 'P' not followed by Execute: PQsendDescribePortal
  Deallocate,      // Close 'S' of a named statement: DEALLOCATE "name"
                   // through libpq, Close on a connection driven directly
};

// One libpq call inside an extended-protocol unit.
struct Op {
  OpKind kind = OpKind::Prepare;
  int result_format = 0;
  int nparams = 0;
  const char* name = "";        // statement name ("" = unnamed)
  // Prepare: text; Deallocate: "DEALLOCATE ..."; Execute: the prepared
  // statement's text (nullptr: prepared before the capture).
  const char* sql = nullptr;
  uint32_t types = 0;           // Prepare: offset in Plan::types
  uint32_t params = 0;          // Execute: offset in Plan::param_*
  uint32_t stmt = UINT32_MAX;   // Execute: index in Plan::stmts
};

enum class UnitKind : uint8_t {
  Simple,    // one Query (may hold several SQL statements)
  Extended,  // ops up to and including a Sync, sent in pipeline mode
  Copy,      // a Query that starts COPY FROM STDIN, then its data
};

struct Unit {
  UnitKind kind = UnitKind::Simple;
  bool copy_fail = false;       // the client ended COPY with CopyFail
  char ready = 0;               // captured ReadyForQuery status; 0 unknown
  uint32_t session = 0;
  Nanos ts = 0;                 // captured send time (first message)
  Nanos ready_ts = 0;           // captured ReadyForQuery time; 0 unknown
  const char* sql = nullptr;    // Simple, Copy
  uint32_t first_op = 0, n_ops = 0;      // Extended: Plan::ops
  uint32_t first_stmt = 0, n_stmts = 0;  // Plan::stmts
  // Copy, or Extended with an Execute that started COPY FROM STDIN: the
  // captured data, in Plan::copy_chunks.
  uint32_t first_copy = 0, n_copy = 0;
  bool in_window = true;
  // The request as protocol messages, for connections the engine drives
  // itself: the Query (Simple, Copy), or the messages as the client sent
  // them up to their Sync (Extended; a Sync added where the capture has
  // none); the COPY data as CopyData messages and the CopyDone or CopyFail
  // (and, after an Execute, the Sync the server waits for then).
  const char* wire = nullptr;
  uint32_t wire_len = 0;
  uint32_t libpq_unsupported = 0;  // messages of it libpq cannot send
  uint32_t copy_wire_len = 0;
  const char* copy_wire = nullptr;
  // Commit order (replay --sync; see Plan::commits): the unit's place
  // among the commit points, or kNoCommit when it is none. What must have
  // completed in the replay before it is sent (only a transaction's first
  // unit, or an autocommit statement, waits; a unit inside a transaction
  // waits for nothing): with --sync commit, the first sync_need commit
  // points and the n_sync_deps listed from Plan::sync_deps[sync_dep] (the
  // earlier commits it could conflict with: replay/sync_plan.h); with
  // --sync all, the first sync_all (every commit point that completed at
  // capture before it was sent).
  uint32_t commit = UINT32_MAX;
  uint32_t sync_need = 0;
  uint32_t sync_dep = 0, n_sync_deps = 0;
  uint32_t sync_all = 0;
};

inline constexpr uint32_t kNoCommit = UINT32_MAX;

// What a COPY that the client ended with CopyFail at capture sends.
inline constexpr const char* kCopyFailMessage = "COPY failed by the client at capture";

struct CopyChunk {
  const char* data = nullptr;
  uint32_t len = 0;
};

struct Session {
  uint64_t id = 0;           // the trace's session id
  const char* user = "";
  const char* database = "";
  const char* application_name = "";
  Nanos begin = 0;           // captured start
  Nanos end = 0;             // captured end (SessionEnd, else last record)
  uint32_t first_unit = 0;   // into Plan::session_units
  uint32_t n_units = 0;
  uint64_t captured_transactions = 0;
  // Commit points (replay --sync all) that had completed at capture when
  // the session started: its connection opens once as many have completed
  // in the replay. (--sync commit: a connection waits for nothing; its
  // first unit waits for what it needs.)
  uint32_t sync_all = 0;
};

// The units and what they refer to by index (Unit::first_op, ...). A loaded
// Plan holds every unit of the trace in one; a streamed replay
// (replay/stream.cpp) holds a few units of one session at a time in each.
struct Tables {
  explicit Tables(size_t arena_block = size_t{1} << 20) : arena(arena_block) {}
  Arena arena;
  std::vector<Unit> units;
  std::vector<Op> ops;
  std::vector<Stmt> stmts;
  std::vector<CopyChunk> copy_chunks;
  std::vector<uint32_t> types;          // parameter type OIDs
  std::vector<const char*> param_values;
  std::vector<int> param_lengths;
  std::vector<int> param_formats;
  std::vector<uint32_t> sync_deps;      // commit points units wait for (Unit::sync_dep)
  // Empties every table, keeping the capacity (and the arena's first block).
  void clear();
};

// Some units of one session, in a streamed replay: those it sent from one
// idle point (every answer in) to the next, usually one. Pooled: cleared
// and refilled, so a replay in its steady state allocates none.
struct UnitBatch : Tables {
  static constexpr size_t kArenaBlock = 4096;
  UnitBatch() : Tables(kArenaBlock) {}
  uint32_t session = 0;          // its session's index in the Plan
  std::vector<uint32_t> order;   // the units replayed, in order (into units)
  uint32_t pos = 0;              // the next of them to send
  UnitBatch* next = nullptr;     // queue link
  // Streamed with commit order (PlanBuilder::Impl::StreamSync): what of its
  // units is still to be planned (a transaction's need, a commit's number),
  // and the link of its session's batches waiting for that.
  uint32_t unplanned = 0;
  UnitBatch* sync_next = nullptr;
};

namespace detail {
class KeyColumns;
}

// Loaded (load(), PlanBuilder): every table holds the whole trace, and
// session_units lists each session's units. Streamed (replay/stream.cpp):
// the tables are empty and Session::n_units counts what the stream will
// deliver; with commit order (stream(..., sync)) `commits`, Session::sync_all
// and the key columns are known, and the stream plans each unit's wait as
// it reads (Unit::commit, sync_need and sync_deps in the unit's batch).
struct Plan : Tables {
  bool streamed = false;
  std::vector<Session> sessions;
  std::vector<uint32_t> session_units;  // unit indices, grouped by session
  std::vector<std::string> fingerprints;  // normalised text by fp index
  std::unordered_map<uint64_t, uint32_t> fp_by_hash;  // streamed: hash_text(text) -> fp index
  Nanos t0 = 0;                         // schedule origin (capture clock)
  // Commit points, numbered 0..commits-1 in capture order (by their
  // ReadyForQuery time): a unit whose ReadyForQuery said idle ('I') and
  // that ends a transaction, or is an autocommit statement, in which a
  // statement changed state (changes_state). Only units replayed count.
  uint32_t commits = 0;
  // Streamed with commit order: the relations' key columns (pass 1's
  // count), for the stream's rule; or why the trace cannot be planned as
  // it is read ("" when it can: Workload::sync_unplanned).
  bool sync = false;
  std::shared_ptr<const detail::KeyColumns> key_columns;
  std::string sync_unplanned;
  Nanos sync_skew = 0;  // how far out of time order its records come (the stream waits that much longer)
  WorkloadSummary summary;
};

// Whether a statement that succeeded with CommandComplete `tag` (its
// words, without row counts: "INSERT", "CREATE TABLE", "SELECT") changed
// what other sessions see once it commits. `sql` is the statement's
// normalised text (normalize_sql), `copy_in` whether the client sent COPY
// data. Everything changes state but: SELECT that starts with "select",
// "values" or "table" and calls none of nextval, setval, pg_notify nor
// selects INTO a table; COPY TO (no data in, the text has " to "); SHOW,
// FETCH, MOVE, EXPLAIN, transaction control (BEGIN, START TRANSACTION,
// COMMIT, ROLLBACK, SAVEPOINT, RELEASE), SET, RESET, DISCARD, PREPARE,
// DEALLOCATE, DECLARE CURSOR, CLOSE CURSOR, LOCK TABLE; and an empty tag
// (a suspended portal, an empty query). A function with side effects
// called from a plain SELECT is not seen (what it changes is not waited
// for).
bool changes_state(std::string_view tag, std::string_view sql, bool copy_in);

// FNV-1a 64 of `s` (fingerprint() is hash_text(normalize_sql(sql))).
uint64_t hash_text(std::string_view s);

// Max speed keeps the captured concurrency: session i starts once as many
// sessions have ended as had ended, strictly before it began, in the
// capture. A session's end is taken as no earlier than its begin, so no
// session waits for itself or for one that began after it, and the first to
// begin never waits: the gates cannot hold every session back.
std::vector<uint64_t> max_speed_gates(const Plan& plan);

// Builds a plan from records in trace order. Exposed for tests that feed
// in-memory record sequences. `trace_start` is the trace header's clock
// origin (Header::start_mono_ns, what `tierlab trace dump` prints times
// from): the window's times are measured from it.
class PlanBuilder {
 public:
  explicit PlanBuilder(const Window& window = {}, Nanos trace_start = 0, const Shard& shard = {});
  ~PlanBuilder();
  void add(const trace::Record& r);
  std::shared_ptr<const Plan> finish();

 private:
  friend class UnitStream;
  friend std::shared_ptr<const Plan> plan_streamed(trace::Reader&, const Window&, const Shard&, bool);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A streamed replay reads the trace twice. Pass 1 (plan_streamed) keeps of
// each session only what the schedule and the report need (its span, how
// many units it replays, its transactions) and the fingerprints: a Plan
// with Plan::streamed and no unit, whose memory grows with the sessions
// and the distinct statements, not with the trace's length. Window and
// shard as load() applies them. With `sync` (commit order) it also counts
// the commit points, each session's start among them (Session::sync_all)
// and the key columns (Plan::key_columns), or says why the trace cannot be
// planned as it is read (Plan::sync_unplanned). Throws like trace::Reader.
std::shared_ptr<const Plan> plan_streamed(trace::Reader& reader, const Window& window, const Shard& shard,
                                          bool sync = false);

// Pass 2: the units of `sessions` (indices in `plan`, which plan_streamed
// made of the same trace, window and shard), read again from `reader` and
// made as load() makes them, one batch (UnitBatch) at a time: each session's
// in order, a session's next once the trace has its answers. A batch is
// the caller's until recycle(); batches are reused, so memory grows with
// the batches held at once, not with the trace. With the plan's commit
// order (Plan::sync) every session's units are made and planned (the
// commit points are numbered across all of them, as load() numbers them)
// and only those of `sessions` handed on; a batch goes on once its
// transactions' needs and its commits' numbers are known (a transaction's
// first batch waits for its end). Throws like trace::Reader, and
// RuntimeError when the trace holds a statement pass 1 did not see.
class UnitStream {
 public:
  UnitStream(std::unique_ptr<trace::Reader> reader, const Plan& plan, const Window& window, const Shard& shard,
             const std::vector<uint32_t>& sessions);
  ~UnitStream();
  UnitStream(const UnitStream&) = delete;
  UnitStream& operator=(const UnitStream&) = delete;
  // The next batch, nullptr at the trace's end. Its `order` may be empty
  // (units the window leaves out).
  UnitBatch* next();
  void recycle(UnitBatch* b);
  // Batches made so far: the most held at once.
  size_t batches() const;
  // With commit order: `f(ctx, session, commit)` for every commit point
  // numbered, as it is (the replay marks those of failed sessions done).
  void on_commit(void (*f)(void*, uint32_t session, uint32_t commit), void* ctx);
  // With commit order: earlier uses the stream's rule holds (for tests).
  size_t sync_held() const;

 private:
  std::unique_ptr<trace::Reader> reader_;
  PlanBuilder builder_;
  trace::Record rec_;
  bool ended_ = false;
};

}  // namespace tierlab::replay
