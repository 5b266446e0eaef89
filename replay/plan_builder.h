// Private to replay/: the plan builder's state (PlanBuilder::Impl), shared by
// replay/plan.cpp (records into units), replay/plan_finish.cpp (a loaded
// plan's window, sessions and commit order) and replay/stream.cpp (a
// streamed plan: pooled batches, the window's rule one unit at a time).
#pragma once

#include "common/error.h"
#include "replay/plan.h"
#include "replay/sync_plan.h"
#include "replay/sync_sql.h"
#include "replay/wire.h"

#include <boost/container/flat_map.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::replay {
namespace build_detail {

constexpr uint32_t kNone = UINT32_MAX;

// Hashes a name table's std::string keys and the string_view a record
// carries alike, so that a lookup makes no std::string.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
};

// A statement, normalised (normalize_sql: lower case, no comments, no
// leading space), that opens a transaction block.
inline bool opens_transaction(std::string_view norm) {
  auto keyword = [&](std::string_view k) {
    if (norm.substr(0, k.size()) != k) return false;
    if (norm.size() == k.size()) return true;
    const unsigned char next = static_cast<unsigned char>(norm[k.size()]);
    return !(std::isalnum(next) || next == '_' || next == '$');
  };
  return keyword("begin") || keyword("start transaction");
}

struct Prepared {
  const char* sql = nullptr;
  uint32_t fp = 0;
  uint32_t types = 0;
  int ntypes = 0;
};

// Per-unit bookkeeping while its answers arrive.
struct UnitTmp {
  uint32_t cursor = 0;     // next statement of the unit to get an answer
  uint32_t errors = 0;     // ErrorResponses answering it
  bool error_seen = false;
  // Simple / Copy: answers folded into one outcome.
  Outcome agg;
  bool any_result = false;
  bool changed = false;    // a statement of it changed state (changes_state)
  uint64_t seq = 0;        // creation order among every session's units (a loaded unit's index)
};

struct SessionBuild {
  uint32_t index = 0;
  bool has_begin = false;
  bool unknown_startup = false;  // joined mid-stream (kSessionUnknownStartup)
  Nanos last_ts = 0;
  // extended unit under construction
  bool ext_open = false;
  Nanos ext_ts = 0;
  std::vector<Op> ops;
  // Every Execute in order: its fingerprint and its op in `ops`, or kNone
  // for one that resumes a portal (no op: libpq cannot send it).
  std::vector<std::pair<uint32_t, uint32_t>> execs;
  std::string wire;                 // the messages as sent (Unit::wire)
  bool wire_synced = false;         // `wire` ends with a Sync
  uint32_t libpq_unsupported = 0;   // of them, what libpq cannot send
  // Bound portal -> fp. Sessions bind one or two portals (mostly the
  // unnamed one), where a sorted vector looked up by the record's
  // string_view is the quickest (bench/small_tables.cpp).
  boost::container::flat_map<std::string, uint32_t, std::less<>> portal_fp;
  bool bind_pending = false;
  Op bind;                          // Execute op prepared by the last Bind
  uint32_t bind_fp = 0;
  // units sent, waiting for ReadyForQuery
  // A FIFO that reuses its storage once emptied (no allocation per unit).
  struct Awaiting {
    std::vector<uint32_t> v;
    size_t head = 0;
    bool empty() const { return head == v.size(); }
    uint32_t front() const { return v[head]; }
    void push_back(uint32_t u) { v.push_back(u); }
    void pop_front() {
      if (++head == v.size()) clear();
    }
    void clear() {
      v.clear();
      head = 0;
    }
  } awaiting;
  uint32_t last_unit = kNone;
  std::vector<CopyChunk> copy_tmp;
  // Statement name -> what Parse prepared; up to tens of statements, where
  // a hash looked up by the record's string_view is the quickest
  // (bench/small_tables.cpp).
  std::unordered_map<std::string, Prepared, NameHash, std::equal_to<>> prepared;
  // Streamed (replay/stream.cpp): the units made since the session was last
  // idle and their bookkeeping, handed on (emit) once their answers are in;
  // the session's index in the loaded plan being streamed (pass 2); and the
  // window's rule, applied one unit at a time (start_sessions_idle).
  UnitBatch* batch = nullptr;
  std::vector<UnitTmp> tmp;
  uint32_t plan_index = 0;
  bool lead_known = false;   // lead_status set from the session's start
  bool started = false;      // its first replayed unit was seen
  bool passed = false;       // units before it
  bool changed = false;      // a replayed unit changed state since the last idle one
  char lead_status = 0;
  struct OpenStmt {
    std::string name;
    const char* sql = nullptr;
    std::vector<uint32_t> types;
    uint64_t seq = 0;        // parse order
  };
  std::vector<OpenStmt> open;  // prepared and not closed before its first replayed unit
  // Streamed with commit order (PlanBuilder::Impl::StreamSync): whether its
  // next replayed unit starts a transaction, whether one of its units
  // changed state since it was last idle, its open transaction; its
  // batches handed on but not yet planned (in order); and since when it
  // holds units not handed on (pending, pend_since; pend_stamp tells the
  // current entry in StreamSync::pend).
  bool sync_idle = true;
  bool sync_changed = false;
  uint32_t txn = UINT32_MAX;
  UnitBatch* plan_head = nullptr;
  UnitBatch* plan_tail = nullptr;
  bool pending = false;
  Nanos pend_since = 0;
  uint32_t pend_stamp = 0;
};

}  // namespace build_detail

using build_detail::kNone;
using build_detail::opens_transaction;
using build_detail::Prepared;
using build_detail::SessionBuild;
using build_detail::UnitTmp;

struct PlanBuilder::Impl {
  Window window;
  Shard shard;
  // Sessions of other shards: only their span (first record, end), for the
  // schedule's origin and the count of the window's sessions.
  std::unordered_map<uint64_t, std::pair<Nanos, Nanos>> others;
  std::shared_ptr<Plan> plan = std::make_shared<Plan>();
  std::unordered_map<uint64_t, SessionBuild> sessions;
  std::vector<UnitTmp> unit_tmp;
  std::string scratch;  // a unit's messages while they are encoded
  std::unordered_map<std::string_view, uint32_t> sql_fp;    // interned SQL -> fp
  std::unordered_map<std::string_view, const char*> sql_intern;
  std::unordered_map<uint64_t, uint32_t> hash_fp;
  Nanos origin = 0;  // the trace start: Window times are from here
  Nanos last_ts = 0;       // the latest record of any kind
  bool any_record = false;

  // Streamed (replay/stream.cpp): units are made per session into pooled
  // batches and handed on (ready_*) instead of into the plan's tables.
  bool stream = false;
  // Pass 2: only these sessions (trace id -> index in the streamed plan),
  // with the plan's fingerprint numbering (fixed_fps).
  bool filtered = false;
  std::unordered_map<uint64_t, uint32_t> keep;
  bool fixed_fps = false;
  // The fingerprints' texts: the plan's, or in pass 2 the streamed plan's.
  const std::vector<std::string>* fps = &plan->fingerprints;
  std::vector<std::unique_ptr<UnitBatch>> batches;  // every batch made
  std::vector<UnitBatch*> free_batches;
  UnitBatch* ready_head = nullptr;
  UnitBatch* ready_tail = nullptr;
  // A simple query's text -> its fingerprint, by the text's hash; emptied
  // when it grows past kQueryCache (texts with literals are many).
  std::unordered_map<uint64_t, uint32_t> query_fp;
  static constexpr size_t kQueryCache = 4096;
  uint64_t open_seq = 0;
  uint64_t unit_seq = 0;  // UnitTmp::seq of the next unit

  // Streamed with commit order (replay/stream.cpp): plans the commit order
  // over a window of the trace as it is read, as order_commits does over a
  // loaded plan. A replayed unit that starts a transaction opens one; its
  // accesses go to the rule (SyncPlanner); a unit that ends idle having
  // changed state is a commit point. Events (a transaction's open at its
  // begin, a commit at its end, a session's start in pass 1) wait in a
  // heap until the trace has been read past their time (floor(): no unit
  // still to be handed on, nor a record still to be read, is older), then
  // go in time order, ties by kind and then by the units' creation order
  // (load()'s numbering): so commit points are numbered, and every need
  // taken, as load() numbers and takes them. A batch goes on once its
  // transactions' needs and its commits' numbers are set; a session's
  // batches in order.
  struct StreamTxn {
    Nanos begin = 0;
    SessionBuild* sb = nullptr;
    UnitBatch* first_b = nullptr;  // its first unit (the need goes there)
    uint32_t first_i = 0;
    UnitBatch* commit_b = nullptr; // its commit point's unit, or nullptr
    uint32_t commit_i = 0;
    uint32_t handle = UINT32_MAX;  // the planner's, once opened
    bool ended = false;
    std::vector<detail::SqlAccess> early;  // accesses before it opened
  };
  struct SyncEvent {
    enum Kind : uint8_t { Start = 0, Open = 1, Commit = 2 };
    Nanos t = 0;
    Kind kind = Start;
    uint64_t seq = 0;
    uint32_t ref = 0;  // Start: builder session index; Open, Commit: transaction
    // std::push_heap keeps the greatest on top: the earliest is greatest.
    bool operator<(const SyncEvent& o) const {
      if (t != o.t) return t > o.t;
      if (kind != o.kind) return kind > o.kind;
      return seq > o.seq;
    }
  };
  struct PendEntry {
    Nanos since = 0;
    uint32_t stamp = 0;
    SessionBuild* sb = nullptr;
    bool operator<(const PendEntry& o) const { return since > o.since; }
  };
  bool sync = false;       // plan the commit order
  bool sync_rule = false;  // pass 2: take the needs (pass 1 numbers only)
  std::vector<bool> mine;  // pass 2: plan sessions handed on (the others are planned, then recycled)
  std::unique_ptr<detail::SyncPlanner> planner;
  std::vector<StreamTxn> txns;
  std::vector<uint32_t> free_txns;
  std::vector<SyncEvent> events;  // a heap
  std::vector<PendEntry> pend;    // a heap of the sessions holding units not handed on
  Nanos sync_now = std::numeric_limits<Nanos>::min();  // latest session record read
  // How much earlier than one read before it a record comes (pass 1
  // measures it, pass 2 holds events that much longer); above kMaxSkew the
  // trace is not planned as it is read.
  Nanos sync_skew = 0;
  static constexpr Nanos kMaxSkew = 1'000'000'000;
  uint32_t next_commit = 0;
  std::string unplanned;  // pass 1: why the trace cannot be planned as it is read
  std::unique_ptr<detail::KeyColumns> keys;  // pass 1: counted
  std::vector<uint32_t> start_commits;       // pass 1: by builder session, Session::sync_all
  void (*commit_hook)(void*, uint32_t, uint32_t) = nullptr;
  void* commit_ctx = nullptr;

  void sync_take(SessionBuild& sb, UnitBatch& b);
  void sync_pending(SessionBuild& sb);  // after a record of the session
  Nanos sync_floor();
  void sync_release(Nanos floor);
  void sync_end_txn(SessionBuild& sb);
  void sync_need(StreamTxn& t);
  void sync_resolve(UnitBatch* b, SessionBuild& sb);
  void sync_deliver(UnitBatch* b);
  void ready_push(UnitBatch* b);
  // What unit i of `t` touches (unit_access).
  detail::SqlAccess access_of(const Tables& t, uint32_t i, bool failed) const;

  Tables& T(SessionBuild& sb);
  // Streamed: a batch from the pool (or a new one), empty.
  UnitBatch* take_batch();
  std::vector<UnitTmp>& TMP(SessionBuild& sb) { return stream ? sb.tmp : unit_tmp; }

  void recycle(UnitBatch* b);
  UnitBatch* take_ready();

  // The fingerprint of normalised text `norm`: a new number in a loaded or
  // first pass, the first pass's number in the second.
  uint32_t fp_of_norm(std::string&& norm);

  // A simple query's fingerprint, streamed: its text is not kept.
  uint32_t query_fingerprint(std::string_view sql);

  const char* intern_sql(std::string_view sql, uint32_t* fp_out);

  uint32_t fp_for_text(const std::string& text);

  // Time from the trace start; a record stamped before it (a clock the
  // capture did not share exactly) counts as at the start.
  Nanos rel(Nanos ts) const { return std::max<Nanos>(ts - origin, 0); }
  bool in_window(Nanos ts) const;

  SessionBuild& session(uint64_t id, Nanos ts);

  uint32_t new_unit(SessionBuild& sb, UnitKind kind, Nanos ts);

  // The unit that re-prepares statements (made here, not captured) as
  // protocol messages: its Parses and a Sync.
  void encode_restore(uint32_t ui);

  // The unit that re-prepares, before `first` (a session's first replayed
  // unit), the statements its session left prepared by the units it sent
  // before (`open`: their Parse ops by name), but for those `first` parses
  // itself. kNone when there are none.
  uint32_t restore_prepared(uint32_t first,
                            const std::unordered_map<std::string_view, uint32_t>& open);

  // Which units of each session replay: those sent in the window, less the
  // leading ones the capture ran inside a transaction opened before the
  // window (the session's previous ReadyForQuery said 'T' or 'E'): a
  // session joins at its first idle point in the window, so that no
  // transaction's tail runs on its own, in autocommit. Clears in_window of
  // the units passed over, and returns, per session (by index), the unit
  // that re-prepares its statements ahead of its first replayed unit, or
  // kNone.
  //
  // A session the capture joined mid-stream (or whose start it lacks) has
  // no status before its first unit. Its first unit tells: one that ends
  // inside a transaction ('T', 'E') without opening it (BEGIN, START
  // TRANSACTION) ran in a transaction opened before the capture, and the
  // session joins at its next idle point too (counted in
  // summary.joined_in_transaction).
  std::vector<uint32_t> start_sessions_idle();

  void finish_ext(SessionBuild& sb);

  void open_ext(SessionBuild& sb, Nanos ts);

  void on_answer(SessionBuild& sb, Nanos ts, bool is_error, std::string_view sqlstate,
                 bool has_rows, uint64_t rows, std::string_view tag = {});

  void on_ready(SessionBuild& sb, Nanos ts, char status);

  void add(const trace::Record& r);

  // Streamed: hands on the session's batch (ready_*), its units to replay
  // in `order`, by the window's rule as start_sessions_idle applies it.
  void emit(SessionBuild& sb);

  // Streamed: a session that pipelines (sends its next unit before the
  // last one's answer) may never be idle. Once kSplitUnits units at the
  // front of its batch are answered, they go on (emit), and the units
  // still waiting move to a new batch: a batch holds at most kSplitUnits
  // units and what the session has in flight, however long it pipelines.
  static constexpr uint32_t kSplitUnits = 32;
  void split(SessionBuild& sb);
  // Copies unit i of `from`, with what it refers to, to the end of `to`.
  static void move_unit(const Tables& from, uint32_t i, Tables& to);
  std::vector<UnitTmp> split_tmp;     // split's scratch, kept
  std::vector<uint32_t> split_await;

  // Unit i of the batch replays: counted as finish() and order_commits
  // count what the replay sends (captured errors, commit points).
  void placed(SessionBuild& sb, UnitBatch& b, uint32_t i);

  // restore_prepared, streamed: the unit (appended to `b`) that re-prepares
  // what the session's units before its first replayed one (`first`) left
  // prepared, but for what `first` parses itself; kNone when nothing.
  uint32_t restore_streamed(SessionBuild& sb, UnitBatch& b, uint32_t first);

  void on(SessionBuild& sb, Nanos ts, const trace::SessionBegin& b);
  void on(SessionBuild& sb, Nanos ts, const trace::SessionEnd&);
  void on(SessionBuild& sb, Nanos ts, const trace::Query& q);
  void on(SessionBuild& sb, Nanos ts, const trace::Parse& p);
  void on(SessionBuild& sb, Nanos ts, const trace::Bind& b);
  void on(SessionBuild& sb, Nanos ts, const trace::Execute& e);
  void on(SessionBuild& sb, Nanos ts, const trace::Describe& d);
  void on(SessionBuild& sb, Nanos ts, const trace::Close& c);
  void on(SessionBuild& sb, Nanos, const trace::Sync&);
  void on(SessionBuild& sb, Nanos, const trace::Flush&) {
    if (sb.ext_open) wire::flush(sb.wire);
  }
  // COPY FROM STDIN data belongs to the unit that started the COPY: a Query
  // (the unit becomes a Copy unit) or an Execute. A client that sent the
  // Execute with Flush instead of Sync sends its data before any Sync: the
  // extended unit ends there (its replay gets a Sync, which the server
  // ignores in copy mode, as it ignores libpq's own one there).
  Unit* copy_unit(SessionBuild& sb);
  void on(SessionBuild& sb, Nanos, const trace::CopyData& d);
  void end_copy(SessionBuild& sb, bool fail);
  void on(SessionBuild& sb, Nanos, const trace::CopyDone& d) {
    if (d.dir == trace::CopyDir::In) end_copy(sb, false);
  }
  void on(SessionBuild& sb, Nanos, const trace::CopyFail&) { end_copy(sb, true); }
  void on(SessionBuild& sb, Nanos ts, const trace::Result& r) {
    on_answer(sb, ts, false, {}, r.has_rows, r.rows, r.tag);
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Error& e) {
    on_answer(sb, ts, true, e.sqlstate, false, 0);
  }
  // Answers without a tag (trace format 1.1; older traces lack them, and a
  // Sync group's later answers then pair with its earlier Executes).
  void on(SessionBuild& sb, Nanos ts, const trace::Suspended&) { on_answer(sb, ts, false, {}, false, 0); }
  void on(SessionBuild& sb, Nanos ts, const trace::EmptyQuery&) { on_answer(sb, ts, false, {}, false, 0); }
  void on(SessionBuild& sb, Nanos ts, const trace::Ready& r) { on_ready(sb, ts, r.status); }
  template <typename T>
  void on(SessionBuild&, Nanos, const T&) {}  // storage records, meta, loss

  // What unit `ui` touches (replay/sync_sql.h): its SQL, with the
  // parameters an Execute binds; a Parse only names relations (Schema). A
  // unit with an error at capture counts as unknown: the error may come of
  // another session's work (a duplicate key, a missing row), whatever the
  // text says.
  detail::SqlAccess unit_access(uint32_t ui, uint32_t captured) const {
    return access_of(*plan, ui, ui < captured && unit_tmp[ui].errors > 0);
  }

  // Numbers the commit points of the units replayed in capture order (by
  // ReadyForQuery time), and gives each unit that starts a transaction (the
  // session's first, or one after a ReadyForQuery that said idle) what it
  // waits for: under --sync all the count of commit points whose
  // ReadyForQuery came before it was sent (and each session's start the
  // count before it started); under --sync commit those of them it could
  // conflict with (replay/sync_plan.h). `start`: the sessions' ranges in
  // Plan::session_units; units below `captured` were captured (the others
  // re-prepare, and change nothing).
  void order_commits(const std::vector<uint32_t>& start, uint32_t captured);

  std::shared_ptr<const Plan> finish();

  // The schedule's origin, the capture's concurrency and the summary, from
  // the sessions kept (Plan::sessions) and the counts of what they replay.
  void finish_sessions(uint64_t units, uint64_t stmts, uint64_t txns);

  // Streamed, pass 1: what one session replays, counted as its batches go by.
  struct Replayed {
    uint32_t units = 0;
    uint64_t stmts = 0, transactions = 0, since_idle = 0;
    Nanos first_ts = 0, last_ts = 0, last_ready = 0;
  };
  std::vector<Replayed> replayed;  // by builder session index

  void count(const UnitBatch& b);

  // Streamed, pass 1, after the last record: the sessions kept and the
  // summary, as finish() has them, without a unit.
  std::shared_ptr<const Plan> finish_streamed();

  // Streamed, at the end of the records: every session's last units go on.
  void flush_all();
};

}  // namespace tierlab::replay
