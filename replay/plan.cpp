// Turning trace records into a Plan.
//
// Records arrive in trace order: per session, client messages in the order
// the client sent them and server messages in the order the server sent
// them, interleaved as the capture saw them. A unit is what the client sent
// before waiting: one Query or the extended-protocol messages up to Sync,
// with the COPY data that follows when it starts a COPY FROM STDIN. Server
// answers (Result, Error, Suspended, EmptyQuery) belong to the oldest unit
// of the session still waiting for its ReadyForQuery.
//
// The window (Window) is applied in two steps: each unit is marked by its
// send time as it is made, and finish() then passes over a session's
// leading units in the window that ran inside a transaction begun before
// it (known only once every ReadyForQuery is in), re-prepares what the
// session's earlier units left prepared, and counts transactions over the
// units kept, as the replay will.
#include "replay/plan.h"

#include "common/error.h"
#include "replay/sync_plan.h"
#include "replay/sync_sql.h"
#include "replay/wire.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>

namespace tierlab::replay {

const char* Arena::copy(std::string_view s) {
  size_t need = s.size() + 1;
  char* p;
  if (need > block_ / 4) {
    big_.push_back(std::make_unique<char[]>(need));
    p = big_.back().get();
  } else {
    if (in_use_ == 0 || used_ + need > block_) {
      if (in_use_ == blocks_.size()) blocks_.push_back(std::make_unique<char[]>(block_));
      ++in_use_;
      used_ = 0;
    }
    p = blocks_[in_use_ - 1].get() + used_;
    used_ += need;
  }
  if (!s.empty()) std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  bytes_ += need;
  return p;
}

void Arena::reset() {
  big_.clear();
  in_use_ = 0;
  used_ = 0;
  bytes_ = 0;
}

void Tables::clear() {
  arena.reset();
  units.clear();
  ops.clear();
  stmts.clear();
  copy_chunks.clear();
  types.clear();
  param_values.clear();
  param_lengths.clear();
  param_formats.clear();
}

bool changes_state(std::string_view tag, std::string_view sql, bool copy_in) {
  tag = trace::split_command_tag(tag).tag;  // "INSERT 0 1" reads as "INSERT"
  if (tag.empty()) return false;
  auto starts = [&](std::string_view text, std::string_view k) {
    if (text.substr(0, k.size()) != k) return false;
    if (text.size() == k.size()) return true;
    const unsigned char next = static_cast<unsigned char>(text[k.size()]);
    return !(std::isalnum(next) || next == '_');
  };
  auto has = [&](std::string_view k) { return sql.find(k) != std::string_view::npos; };
  if (tag == "SELECT") {
    const bool plain = starts(sql, "select") || starts(sql, "values") || starts(sql, "table");
    return !plain || has("nextval(") || has("setval(") || has("pg_notify(") || has(" into ");
  }
  if (tag == "COPY") return copy_in || !has(" to ");
  static constexpr std::string_view kReads[] = {
      "SHOW", "FETCH", "MOVE", "EXPLAIN", "BEGIN", "START TRANSACTION", "COMMIT", "ROLLBACK",
      "SAVEPOINT", "RELEASE", "SET", "RESET", "DISCARD", "DISCARD ALL", "DISCARD PLANS",
      "DISCARD SEQUENCES", "DISCARD TEMP", "PREPARE", "DEALLOCATE", "DEALLOCATE ALL",
      "DECLARE CURSOR", "CLOSE CURSOR", "CLOSE CURSOR ALL", "LOCK TABLE", "SET CONSTRAINTS"};
  for (std::string_view r : kReads)
    if (tag == r) return false;
  return true;
}

namespace {

constexpr uint32_t kNone = UINT32_MAX;

// A statement, normalised (normalize_sql: lower case, no comments, no
// leading space), that opens a transaction block.
bool opens_transaction(std::string_view norm) {
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
  std::unordered_map<std::string, uint32_t> portal_fp;  // bound portal -> fp
  bool bind_pending = false;
  Op bind;                          // Execute op prepared by the last Bind
  uint32_t bind_fp = 0;
  // units sent, waiting for ReadyForQuery
  std::deque<uint32_t> awaiting;
  uint32_t last_unit = kNone;
  std::vector<CopyChunk> copy_tmp;
  std::unordered_map<std::string, Prepared> prepared;
  // Streamed (replay/stream.h): the units made since the session was last
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
};

}  // namespace

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

  // Streamed (replay/stream.h): units are made per session into pooled
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

  Tables& T(SessionBuild& sb) {
    if (!stream) return *plan;
    if (!sb.batch) {
      if (free_batches.empty()) {
        batches.push_back(std::make_unique<UnitBatch>());
        free_batches.push_back(batches.back().get());
      }
      sb.batch = free_batches.back();
      free_batches.pop_back();
      sb.batch->session = sb.plan_index;
      sb.tmp.clear();
    }
    return *sb.batch;
  }
  std::vector<UnitTmp>& TMP(SessionBuild& sb) { return stream ? sb.tmp : unit_tmp; }

  void recycle(UnitBatch* b) {
    b->clear();
    b->order.clear();
    b->pos = 0;
    b->next = nullptr;
    free_batches.push_back(b);
  }
  UnitBatch* take_ready() {
    UnitBatch* b = ready_head;
    if (b) {
      ready_head = b->next;
      if (!ready_head) ready_tail = nullptr;
      b->next = nullptr;
    }
    return b;
  }

  // The fingerprint of normalised text `norm`: a new number in a loaded or
  // first pass, the first pass's number in the second.
  uint32_t fp_of_norm(std::string&& norm) {
    uint64_t h = hash_text(norm);
    if (fixed_fps) {
      auto it = hash_fp.find(h);
      if (it == hash_fp.end())
        throw RuntimeError("replay: the trace changed while it was replayed (a statement not read before: " +
                           norm.substr(0, 80) + ")");
      return it->second;
    }
    auto [hit, fresh] = hash_fp.emplace(h, static_cast<uint32_t>(plan->fingerprints.size()));
    if (fresh) plan->fingerprints.push_back(std::move(norm));
    return hit->second;
  }

  // A simple query's fingerprint, streamed: its text is not kept.
  uint32_t query_fingerprint(std::string_view sql) {
    const uint64_t h = hash_text(sql);
    auto it = query_fp.find(h);
    if (it != query_fp.end()) return it->second;
    if (query_fp.size() >= kQueryCache) query_fp.clear();
    const uint32_t fp = fp_of_norm(normalize_sql(sql));
    query_fp.emplace(h, fp);
    return fp;
  }

  const char* intern_sql(std::string_view sql, uint32_t* fp_out) {
    auto it = sql_intern.find(sql);
    if (it == sql_intern.end()) {
      const char* copy = plan->arena.copy(sql);
      std::string_view key(copy, sql.size());
      it = sql_intern.emplace(key, copy).first;
      sql_fp.emplace(key, fp_of_norm(normalize_sql(sql)));
    }
    if (fp_out) *fp_out = sql_fp.at(std::string_view(it->second, sql.size()));
    return it->second;
  }

  uint32_t fp_for_text(const std::string& text) {
    uint32_t fp;
    intern_sql(text, &fp);
    return fp;
  }

  // Time from the trace start; a record stamped before it (a clock the
  // capture did not share exactly) counts as at the start.
  Nanos rel(Nanos ts) const { return std::max<Nanos>(ts - origin, 0); }
  bool in_window(Nanos ts) const {
    Nanos r = rel(ts);
    return r >= window.begin && r < window.end;
  }

  SessionBuild& session(uint64_t id, Nanos ts) {
    auto [it, fresh] = sessions.try_emplace(id);
    if (fresh) {
      it->second.index = static_cast<uint32_t>(plan->sessions.size());
      Session s;
      s.id = id;
      s.begin = ts;
      s.end = ts;
      plan->sessions.push_back(s);
    }
    it->second.last_ts = ts;
    return it->second;
  }

  uint32_t new_unit(SessionBuild& sb, UnitKind kind, Nanos ts) {
    Unit u;
    u.kind = kind;
    u.session = sb.index;
    u.ts = ts;
    u.in_window = in_window(ts);
    Tables& t = T(sb);
    t.units.push_back(u);
    TMP(sb).emplace_back();
    return static_cast<uint32_t>(t.units.size() - 1);
  }

  // The unit that re-prepares statements (made here, not captured) as
  // protocol messages: its Parses and a Sync.
  void encode_restore(uint32_t ui) {
    Unit& u = plan->units[ui];
    scratch.clear();
    for (uint32_t i = 0; i < u.n_ops; ++i) {
      const Op& op = plan->ops[u.first_op + i];
      wire::parse(scratch, op.name, op.sql, plan->types.data() + op.types, op.nparams);
    }
    wire::sync(scratch);
    u.wire = plan->arena.copy(scratch);
    u.wire_len = static_cast<uint32_t>(scratch.size());
  }

  // The unit that re-prepares, before `first` (a session's first replayed
  // unit), the statements its session left prepared by the units it sent
  // before (`open`: their Parse ops by name), but for those `first` parses
  // itself. kNone when there are none.
  uint32_t restore_prepared(uint32_t first,
                            const std::unordered_map<std::string_view, uint32_t>& open) {
    const Unit& f = plan->units[first];
    std::vector<uint32_t> ops;
    for (const auto& [name, op] : open) {
      bool reparsed = false;
      for (uint32_t i = 0; i < f.n_ops; ++i) {
        const Op& o = plan->ops[f.first_op + i];
        if (o.kind == OpKind::Prepare && name == o.name) reparsed = true;
      }
      if (!reparsed) ops.push_back(op);
    }
    if (ops.empty()) return kNone;
    std::sort(ops.begin(), ops.end());  // in the order the client parsed them
    Unit u;
    u.kind = UnitKind::Extended;
    u.session = f.session;
    u.ts = f.ts;
    u.first_op = static_cast<uint32_t>(plan->ops.size());
    u.n_ops = static_cast<uint32_t>(ops.size());
    u.first_stmt = static_cast<uint32_t>(plan->stmts.size());
    for (uint32_t op : ops) {
      Op o;
      o.kind = OpKind::Prepare;
      o.name = plan->ops[op].name;
      o.sql = plan->ops[op].sql;
      o.types = plan->ops[op].types;
      o.nparams = plan->ops[op].nparams;
      plan->ops.push_back(o);
    }
    plan->units.push_back(u);
    uint32_t ui = static_cast<uint32_t>(plan->units.size() - 1);
    encode_restore(ui);
    return ui;
  }

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
  std::vector<uint32_t> start_sessions_idle() {
    Plan& p = *plan;
    const size_t n = p.sessions.size();
    enum class Lead : uint8_t { Before, Started };
    std::vector<Lead> lead(n, Lead::Before);
    constexpr char kUnknown = '?';
    std::vector<char> status(n, 0);      // after the session's last unit; 0 idle or unknown
    for (const auto& [id, sb] : sessions)
      if (!sb.has_begin || sb.unknown_startup) status[sb.index] = kUnknown;
    std::vector<bool> passed(n, false);  // units before its first replayed one
    std::vector<uint32_t> first(n, kNone);
    // Per session: the statements prepared (Parse) and not closed before its
    // first replayed unit, by name.
    std::vector<std::unordered_map<std::string_view, uint32_t>> open(n);
    const uint32_t captured = static_cast<uint32_t>(p.units.size());
    for (uint32_t i = 0; i < captured; ++i) {
      Unit& u = p.units[i];
      const uint32_t s = u.session;
      if (lead[s] == Lead::Started) continue;
      if (status[s] == kUnknown) {
        const bool inside = (u.ready == 'T' || u.ready == 'E') &&
                            !(u.n_stmts && opens_transaction(p.fingerprints[p.stmts[u.first_stmt].fp]));
        status[s] = inside ? u.ready : 0;
        if (inside && u.in_window) ++p.summary.joined_in_transaction;
      }
      if (u.in_window && status[s] != 'T' && status[s] != 'E') {
        lead[s] = Lead::Started;
        first[s] = i;
        continue;
      }
      u.in_window = false;
      passed[s] = true;
      status[s] = u.ready;
      for (uint32_t k = 0; k < u.n_ops; ++k) {
        const Op& o = p.ops[u.first_op + k];
        if (o.kind == OpKind::Prepare) open[s][o.name] = u.first_op + k;
        if (o.kind == OpKind::Deallocate) open[s].erase(o.name);
      }
    }
    std::vector<uint32_t> restore(n, kNone);
    for (size_t s = 0; s < n; ++s)
      if (first[s] != kNone && passed[s]) restore[s] = restore_prepared(first[s], open[s]);
    return restore;
  }

  void finish_ext(SessionBuild& sb) {
    if (!sb.ext_open) return;
    if (sb.bind_pending) {
      ++sb.libpq_unsupported;  // a Bind never executed
      sb.bind_pending = false;
    }
    uint32_t u = new_unit(sb, UnitKind::Extended, sb.ext_ts);
    Unit& unit = T(sb).units[u];
    unit.first_op = static_cast<uint32_t>(T(sb).ops.size());
    unit.n_ops = static_cast<uint32_t>(sb.ops.size());
    unit.first_stmt = static_cast<uint32_t>(T(sb).stmts.size());
    for (const auto& [fp, op] : sb.execs) {
      if (op != kNone) sb.ops[op].stmt = static_cast<uint32_t>(T(sb).stmts.size());
      Stmt st;
      st.fp = fp;
      T(sb).stmts.push_back(st);
    }
    T(sb).ops.insert(T(sb).ops.end(), sb.ops.begin(), sb.ops.end());
    unit.n_stmts = static_cast<uint32_t>(T(sb).stmts.size()) - unit.first_stmt;
    unit.libpq_unsupported = sb.libpq_unsupported;
    plan->summary.libpq_unsupported += sb.libpq_unsupported;
    if (unit.in_window) {
      if (!sb.wire_synced) wire::sync(sb.wire);
      unit.wire = T(sb).arena.copy(sb.wire);
      unit.wire_len = static_cast<uint32_t>(sb.wire.size());
    }
    sb.wire.clear();
    sb.wire_synced = false;
    sb.libpq_unsupported = 0;
    sb.ops.clear();
    sb.execs.clear();
    sb.ext_open = false;
    sb.awaiting.push_back(u);
    sb.last_unit = u;
  }

  void open_ext(SessionBuild& sb, Nanos ts) {
    if (sb.ext_open) return;
    sb.ext_open = true;
    sb.ext_ts = ts;
  }

  void on_answer(SessionBuild& sb, Nanos ts, bool is_error, std::string_view sqlstate,
                 bool has_rows, uint64_t rows, std::string_view tag = {}) {
    if (sb.awaiting.empty()) return;  // answer to something not recorded
    uint32_t ui = sb.awaiting.front();
    Unit& u = T(sb).units[ui];
    UnitTmp& t = TMP(sb)[ui];
    if (is_error) ++t.errors;
    if (!is_error && !tag.empty() && !t.changed && u.n_stmts) {
      const uint32_t k = u.kind == UnitKind::Extended ? std::min(t.cursor, u.n_stmts - 1) : 0;
      const bool copy_in = u.kind == UnitKind::Copy || u.n_copy > 0 || u.copy_fail;
      t.changed = changes_state(tag, (*fps)[T(sb).stmts[u.first_stmt + k].fp], copy_in);
    }
    if (u.kind == UnitKind::Extended) {
      if (t.cursor >= u.n_stmts) {
        if (is_error) t.error_seen = true;
        return;
      }
      Stmt& st = T(sb).stmts[u.first_stmt + t.cursor++];
      st.captured_latency = ts - u.ts;
      if (is_error) {
        st.captured.status = Status::Error;
        if (!sqlstate.empty())  // data() may be null when empty
          std::memcpy(st.captured.sqlstate, sqlstate.data(), std::min<size_t>(5, sqlstate.size()));
        t.error_seen = true;
      } else {
        st.captured.status = Status::Ok;
        st.captured.has_rows = has_rows;
        st.captured.rows = rows;
      }
      return;
    }
    // Simple or Copy: fold.
    if (is_error) {
      if (t.agg.status != Status::Error) {
        t.agg.status = Status::Error;
        if (!sqlstate.empty())  // data() may be null when empty
          std::memcpy(t.agg.sqlstate, sqlstate.data(), std::min<size_t>(5, sqlstate.size()));
      }
    } else {
      t.any_result = true;
      if (has_rows) {
        t.agg.has_rows = true;
        t.agg.rows += rows;
      }
    }
  }

  void on_ready(SessionBuild& sb, Nanos ts, char status) {
    if (sb.awaiting.empty()) return;
    uint32_t ui = sb.awaiting.front();
    sb.awaiting.pop_front();
    Unit& u = T(sb).units[ui];
    UnitTmp& t = TMP(sb)[ui];
    u.ready = status;
    u.ready_ts = ts;
    if (u.kind == UnitKind::Extended) {
      for (uint32_t i = t.cursor; i < u.n_stmts; ++i) {
        Stmt& st = T(sb).stmts[u.first_stmt + i];
        st.captured.status = t.error_seen ? Status::Skipped : Status::Unknown;
      }
      return;
    }
    if (u.n_stmts == 0) return;
    Stmt& st = T(sb).stmts[u.first_stmt];
    st.captured_latency = ts - u.ts;
    if (t.agg.status == Status::Error) {
      st.captured = t.agg;
    } else {
      st.captured = t.agg;
      st.captured.status = Status::Ok;
    }
  }

  void add(const trace::Record& r) {
    last_ts = std::max(last_ts, r.ts);
    any_record = true;
    if (r.session == 0) return;
    if (shard.count > 1 && shard_of(r.session, shard.count) != shard.index) {
      auto [it, fresh] = others.try_emplace(r.session, r.ts, r.ts);
      if (!fresh) it->second.second = std::max(it->second.second, r.ts);
      if (std::holds_alternative<trace::SessionBegin>(r.body)) it->second.first = r.ts;
      if (std::holds_alternative<trace::SessionEnd>(r.body)) it->second.second = r.ts;
      return;
    }
    uint32_t plan_index = 0;
    if (filtered) {
      auto it = keep.find(r.session);
      if (it == keep.end()) return;  // a session the streamed plan does not replay
      plan_index = it->second;
    }
    SessionBuild& sb = session(r.session, r.ts);
    sb.plan_index = filtered ? plan_index : sb.index;
    Session& s = plan->sessions[sb.index];
    s.end = std::max(s.end, r.ts);
    std::visit([&](const auto& b) { on(sb, r.ts, b); }, r.body);
    if (!stream || !sb.batch) return;
    // Streamed: the session's units go on once every answer is in (at its
    // end, whatever it has).
    const bool end = std::holds_alternative<trace::SessionEnd>(r.body);
    if (end || (sb.awaiting.empty() && !sb.ext_open && sb.copy_tmp.empty())) emit(sb);
  }

  // Streamed: hands on the session's batch (ready_*), its units to replay
  // in `order`, by the window's rule as start_sessions_idle applies it.
  void emit(SessionBuild& sb) {
    UnitBatch& b = *sb.batch;
    sb.batch = nullptr;
    sb.awaiting.clear();
    sb.last_unit = kNone;
    if (!sb.lead_known) {
      sb.lead_known = true;
      sb.lead_status = !sb.has_begin || sb.unknown_startup ? '?' : 0;
    }
    const uint32_t n = static_cast<uint32_t>(b.units.size());
    for (uint32_t i = 0; i < n; ++i) {
      Unit& u = b.units[i];
      u.session = sb.plan_index;
      if (sb.started) {
        if (u.in_window) placed(sb, b, i);
        continue;
      }
      if (sb.lead_status == '?') {
        const bool inside = (u.ready == 'T' || u.ready == 'E') &&
                            !(u.n_stmts && opens_transaction((*fps)[b.stmts[u.first_stmt].fp]));
        sb.lead_status = inside ? u.ready : 0;
        if (inside && u.in_window) ++plan->summary.joined_in_transaction;
      }
      if (u.in_window && sb.lead_status != 'T' && sb.lead_status != 'E') {
        sb.started = true;
        if (sb.passed) {
          const uint32_t r = restore_streamed(sb, b, i);
          if (r != kNone) b.order.push_back(r);
        }
        placed(sb, b, i);
        continue;
      }
      u.in_window = false;
      sb.passed = true;
      sb.lead_status = u.ready;
      for (uint32_t k = 0; k < u.n_ops; ++k) {
        const Op& o = b.ops[u.first_op + k];
        auto it = std::find_if(sb.open.begin(), sb.open.end(),
                               [&](const SessionBuild::OpenStmt& e) { return e.name == o.name; });
        if (o.kind == OpKind::Deallocate && it != sb.open.end()) sb.open.erase(it);
        if (o.kind != OpKind::Prepare) continue;
        if (it == sb.open.end()) it = sb.open.insert(sb.open.end(), SessionBuild::OpenStmt{o.name, nullptr, {}, 0});
        it->sql = o.sql;
        it->types.assign(b.types.begin() + o.types, b.types.begin() + o.types + o.nparams);
        it->seq = open_seq++;
      }
    }
    if (ready_tail) ready_tail->next = &b;
    else ready_head = &b;
    ready_tail = &b;
  }

  // Unit i of the batch replays: counted as finish() and order_commits
  // count what the replay sends (captured errors, commit points).
  void placed(SessionBuild& sb, UnitBatch& b, uint32_t i) {
    b.order.push_back(i);
    const Unit& u = b.units[i];
    plan->summary.captured_errors += sb.tmp[i].errors;
    sb.changed = sb.changed || sb.tmp[i].changed;
    if (u.ready != 'I') return;
    if (sb.changed) ++plan->summary.commit_points;
    sb.changed = false;
  }

  // restore_prepared, streamed: the unit (appended to `b`) that re-prepares
  // what the session's units before its first replayed one (`first`) left
  // prepared, but for what `first` parses itself; kNone when nothing.
  uint32_t restore_streamed(SessionBuild& sb, UnitBatch& b, uint32_t first) {
    std::vector<const SessionBuild::OpenStmt*> todo;
    for (const SessionBuild::OpenStmt& e : sb.open) {
      const Unit& f = b.units[first];
      bool reparsed = false;
      for (uint32_t i = 0; i < f.n_ops; ++i) {
        const Op& o = b.ops[f.first_op + i];
        if (o.kind == OpKind::Prepare && e.name == o.name) reparsed = true;
      }
      if (!reparsed) todo.push_back(&e);
    }
    if (todo.empty()) return kNone;
    std::sort(todo.begin(), todo.end(), [](auto* x, auto* y) { return x->seq < y->seq; });
    Unit u;
    u.kind = UnitKind::Extended;
    u.session = sb.plan_index;
    u.ts = b.units[first].ts;
    u.first_op = static_cast<uint32_t>(b.ops.size());
    u.n_ops = static_cast<uint32_t>(todo.size());
    u.first_stmt = static_cast<uint32_t>(b.stmts.size());
    scratch.clear();
    for (const SessionBuild::OpenStmt* e : todo) {
      Op o;
      o.kind = OpKind::Prepare;
      o.name = b.arena.copy(e->name);
      o.sql = e->sql;
      o.types = static_cast<uint32_t>(b.types.size());
      o.nparams = static_cast<int>(e->types.size());
      b.types.insert(b.types.end(), e->types.begin(), e->types.end());
      b.ops.push_back(o);
      wire::parse(scratch, o.name, o.sql, e->types.data(), o.nparams);
    }
    wire::sync(scratch);
    u.wire = b.arena.copy(scratch);
    u.wire_len = static_cast<uint32_t>(scratch.size());
    b.units.push_back(u);
    sb.open.clear();
    return static_cast<uint32_t>(b.units.size() - 1);
  }

  void on(SessionBuild& sb, Nanos ts, const trace::SessionBegin& b) {
    Session& s = plan->sessions[sb.index];
    s.begin = ts;
    s.user = plan->arena.copy(b.user);
    s.database = plan->arena.copy(b.database);
    s.application_name = plan->arena.copy(b.application_name);
    sb.has_begin = true;
    sb.unknown_startup = (b.flags & trace::kSessionUnknownStartup) != 0;
  }
  void on(SessionBuild& sb, Nanos ts, const trace::SessionEnd&) {
    finish_ext(sb);
    plan->sessions[sb.index].end = ts;
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Query& q) {
    finish_ext(sb);  // a Query after unsynced extended messages ends them
    uint32_t fp;
    // Streamed, the text lives with its unit: texts with literals are many.
    const char* sql = stream ? T(sb).arena.copy(q.sql) : intern_sql(q.sql, &fp);
    if (stream) fp = query_fingerprint(q.sql);
    uint32_t u = new_unit(sb, UnitKind::Simple, ts);
    Unit& unit = T(sb).units[u];
    unit.sql = sql;
    if (unit.in_window) {
      scratch.clear();
      wire::query(scratch, q.sql);
      unit.wire = T(sb).arena.copy(scratch);
      unit.wire_len = static_cast<uint32_t>(scratch.size());
    }
    unit.first_stmt = static_cast<uint32_t>(T(sb).stmts.size());
    unit.n_stmts = 1;
    Stmt st;
    st.fp = fp;
    T(sb).stmts.push_back(st);
    sb.awaiting.push_back(u);
    sb.last_unit = u;
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Parse& p) {
    open_ext(sb, ts);
    wire::parse(sb.wire, p.statement, p.sql, p.param_types.data(), static_cast<int>(p.param_types.size()));
    Op op;
    op.kind = OpKind::Prepare;
    op.name = T(sb).arena.copy(p.statement);
    uint32_t fp;
    op.sql = intern_sql(p.sql, &fp);
    op.types = static_cast<uint32_t>(T(sb).types.size());
    op.nparams = static_cast<int>(p.param_types.size());
    T(sb).types.insert(T(sb).types.end(), p.param_types.begin(), p.param_types.end());
    sb.ops.push_back(op);
    sb.prepared[std::string(p.statement)] = Prepared{op.sql, fp, op.types, op.nparams};
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Bind& b) {
    open_ext(sb, ts);
    wire::bind(sb.wire, b.portal, b.statement, b.params, b.result_formats);
    if (sb.bind_pending) ++sb.libpq_unsupported;  // Bind never executed
    Op op;
    op.kind = OpKind::Execute;
    op.name = T(sb).arena.copy(b.statement);
    op.nparams = static_cast<int>(b.params.size());
    op.params = static_cast<uint32_t>(T(sb).param_values.size());
    for (const trace::Param& prm : b.params) {
      T(sb).param_values.push_back(prm.is_null ? nullptr : T(sb).arena.copy(prm.value));
      T(sb).param_lengths.push_back(static_cast<int>(prm.value.size()));
      T(sb).param_formats.push_back(prm.format);
    }
    // libpq asks for one result format for all columns: the first given.
    op.result_format = b.result_formats.empty() ? 0 : b.result_formats[0];
    auto it = sb.prepared.find(std::string(b.statement));
    if (it != sb.prepared.end()) {
      sb.bind_fp = it->second.fp;
      op.sql = it->second.sql;
    } else {
      sb.bind_fp = fp_for_text("EXECUTE " + std::string(b.statement) +
                               " /* prepared before the capture */");
    }
    sb.bind = op;
    sb.bind_pending = true;
    sb.portal_fp[std::string(b.portal)] = sb.bind_fp;
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Execute& e) {
    open_ext(sb, ts);
    wire::execute(sb.wire, e.portal, e.max_rows);
    if (!sb.bind_pending) {
      // Execute of a portal already run once (max_rows): libpq has no call
      // that resumes a portal; a directly driven session sends it.
      ++sb.libpq_unsupported;
      auto it = sb.portal_fp.find(std::string(e.portal));
      sb.execs.emplace_back(it != sb.portal_fp.end() ? it->second
                                                     : fp_for_text("EXECUTE /* a portal bound before the capture */"),
                            kNone);
      return;
    }
    sb.execs.emplace_back(sb.bind_fp, static_cast<uint32_t>(sb.ops.size()));
    sb.ops.push_back(sb.bind);
    sb.bind_pending = false;
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Describe& d) {
    open_ext(sb, ts);
    wire::describe(sb.wire, d.target, d.name);
    if (d.target == 'P' && sb.bind_pending) return;  // sent with the Execute
    Op op;
    op.kind = d.target == 'S' ? OpKind::DescribeStmt : OpKind::DescribePortal;
    op.name = T(sb).arena.copy(d.name);
    sb.ops.push_back(op);
  }
  void on(SessionBuild& sb, Nanos ts, const trace::Close& c) {
    open_ext(sb, ts);
    wire::close(sb.wire, c.target, c.name);
    // Through libpq, closing a portal or the unnamed statement needs no
    // message: the next Bind or Parse replaces them. A named statement is
    // deallocated.
    if (c.target != 'S' || c.name.empty()) return;
    Op op;
    op.kind = OpKind::Deallocate;
    op.name = T(sb).arena.copy(c.name);
    std::string ident = "DEALLOCATE \"";
    for (char ch : c.name) {
      if (ch == '"') ident += '"';
      ident += ch;
    }
    ident += '"';
    op.sql = T(sb).arena.copy(ident);
    sb.ops.push_back(op);
    sb.prepared.erase(std::string(c.name));
  }
  void on(SessionBuild& sb, Nanos, const trace::Sync&) {
    if (sb.ext_open) {
      wire::sync(sb.wire);
      sb.wire_synced = true;
    }
    finish_ext(sb);
  }
  void on(SessionBuild& sb, Nanos, const trace::Flush&) {
    if (sb.ext_open) wire::flush(sb.wire);
  }
  // COPY FROM STDIN data belongs to the unit that started the COPY: a Query
  // (the unit becomes a Copy unit) or an Execute. A client that sent the
  // Execute with Flush instead of Sync sends its data before any Sync: the
  // extended unit ends there (its replay gets a Sync, which the server
  // ignores in copy mode, as it ignores libpq's own one there).
  Unit* copy_unit(SessionBuild& sb) {
    if (sb.ext_open && !sb.execs.empty()) finish_ext(sb);
    if (sb.last_unit == kNone) return nullptr;  // the COPY began before the capture (or its unit was handed on)
    Unit& u = T(sb).units[sb.last_unit];
    if (u.kind == UnitKind::Simple) u.kind = UnitKind::Copy;
    return &u;
  }
  void on(SessionBuild& sb, Nanos, const trace::CopyData& d) {
    if (d.dir != trace::CopyDir::In || !copy_unit(sb)) return;
    sb.copy_tmp.push_back(
        CopyChunk{T(sb).arena.copy(d.data), static_cast<uint32_t>(d.data.size())});
  }
  void end_copy(SessionBuild& sb, bool fail) {
    Unit* unit = copy_unit(sb);
    if (!unit) {
      sb.copy_tmp.clear();
      return;
    }
    Unit& u = *unit;
    u.copy_fail = fail;
    u.first_copy = static_cast<uint32_t>(T(sb).copy_chunks.size());
    u.n_copy = static_cast<uint32_t>(sb.copy_tmp.size());
    T(sb).copy_chunks.insert(T(sb).copy_chunks.end(), sb.copy_tmp.begin(), sb.copy_tmp.end());
    if (u.in_window) {
      scratch.clear();
      for (const CopyChunk& ch : sb.copy_tmp) wire::copy_data(scratch, std::string_view(ch.data, ch.len));
      if (fail) wire::copy_fail(scratch, kCopyFailMessage);
      else wire::copy_done(scratch);
      // After a COPY started by Execute the server waits for a Sync: it
      // ignored the unit's while it read the data (libpq's PQputCopyEnd
      // sends one too).
      if (u.kind == UnitKind::Extended) wire::sync(scratch);
      u.copy_wire = T(sb).arena.copy(scratch);
      u.copy_wire_len = static_cast<uint32_t>(scratch.size());
    }
    sb.copy_tmp.clear();
  }
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
    const Plan& p = *plan;
    const Unit& u = p.units[ui];
    detail::SqlAccess out;
    if (ui < captured && unit_tmp[ui].errors > 0) {
      out.unknown = true;
      return out;
    }
    auto merge = [&](detail::SqlAccess a) {
      out.unknown = out.unknown || a.unknown;
      for (detail::RelAccess& r : a.rels) out.rels.push_back(std::move(r));
    };
    if (u.kind != UnitKind::Extended) {
      merge(detail::read_access(u.sql ? u.sql : ""));
      return out;
    }
    uint32_t executes = 0;
    std::vector<detail::ParamValue> params;
    for (uint32_t i = 0; i < u.n_ops; ++i) {
      const Op& op = p.ops[u.first_op + i];
      if (op.kind == OpKind::Prepare) {
        merge(detail::read_access(op.sql, {}, true));
      } else if (op.kind == OpKind::Execute) {
        ++executes;
        if (!op.sql) {  // prepared before the capture: its text is not known
          out.unknown = true;
          continue;
        }
        params.clear();
        for (int k = 0; k < op.nparams; ++k) {
          const char* v = p.param_values[op.params + k];
          if (!v || p.param_formats[op.params + k] != 0) params.emplace_back(std::nullopt);
          else params.emplace_back(std::string_view(v, p.param_lengths[op.params + k]));
        }
        merge(detail::read_access(op.sql, params));
      }
    }
    // An Execute that resumes a portal (no op): what it runs is not known.
    if (u.n_stmts > executes) out.unknown = true;
    return out;
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
  void order_commits(const std::vector<uint32_t>& start, uint32_t captured) {
    Plan& p = *plan;
    std::vector<std::pair<Nanos, uint32_t>> points;  // ReadyForQuery time, unit
    for (size_t i = 0; i + 1 < start.size(); ++i) {
      bool changed = false;
      for (uint32_t k = start[i]; k < start[i + 1]; ++k) {
        const uint32_t ui = p.session_units[k];
        const Unit& u = p.units[ui];
        if (ui < captured && unit_tmp[ui].changed) changed = true;
        if (u.ready != 'I') continue;
        if (changed) points.emplace_back(u.ready_ts, ui);
        changed = false;
      }
    }
    std::sort(points.begin(), points.end());
    std::vector<Nanos> at(points.size());
    for (size_t c = 0; c < points.size(); ++c) {
      p.units[points[c].second].commit = static_cast<uint32_t>(c);
      at[c] = points[c].first;
    }
    auto before = [&](Nanos t) {
      return static_cast<uint32_t>(std::lower_bound(at.begin(), at.end(), t) - at.begin());
    };
    // The transactions: from a unit that starts one to the unit whose
    // ReadyForQuery says idle (or the session's last).
    std::vector<detail::SyncTxn> txns;
    std::vector<uint32_t> first;  // per transaction: its first unit
    for (size_t i = 0; i + 1 < start.size(); ++i) {
      p.sessions[i].sync_all = before(p.sessions[i].begin);
      bool idle = true;  // the next unit starts a transaction
      for (uint32_t k = start[i]; k < start[i + 1]; ++k) {
        const uint32_t ui = p.session_units[k];
        Unit& u = p.units[ui];
        if (idle) {
          u.sync_all = before(u.ts);
          txns.emplace_back();
          txns.back().begin = u.ts;
          first.push_back(ui);
        }
        detail::SqlAccess a = unit_access(ui, captured);
        detail::SyncTxn& t = txns.back();
        t.unknown = t.unknown || a.unknown;
        for (detail::RelAccess& r : a.rels) t.rels.push_back(std::move(r));
        if (u.commit != kNoCommit) t.commit = u.commit;
        idle = u.ready == 'I' || u.ready == 0;
      }
    }
    const std::vector<detail::SyncNeed> needs = detail::sync_needs(txns, at);
    for (size_t t = 0; t < txns.size(); ++t) {
      Unit& u = p.units[first[t]];
      u.sync_need = needs[t].prefix;
      u.sync_dep = static_cast<uint32_t>(p.sync_deps.size());
      u.n_sync_deps = static_cast<uint32_t>(needs[t].deps.size());
      p.sync_deps.insert(p.sync_deps.end(), needs[t].deps.begin(), needs[t].deps.end());
    }
    p.commits = static_cast<uint32_t>(points.size());
    p.summary.commit_points = points.size();
  }

  std::shared_ptr<const Plan> finish() {
    for (auto& [id, sb] : sessions) finish_ext(sb);
    Plan& p = *plan;
    const uint32_t captured = static_cast<uint32_t>(p.units.size());
    const std::vector<uint32_t> restore = start_sessions_idle();  // appends to p.units
    // Which sessions take part, and their replay interval.
    std::vector<uint32_t> remap(p.sessions.size(), kNone);
    std::vector<uint32_t> counts(p.sessions.size(), 0);
    for (const Unit& u : p.units)
      if (u.in_window) ++counts[u.session];
    std::vector<Session> kept;
    const bool open_end = window.end == std::numeric_limits<Nanos>::max();
    for (size_t i = 0; i < p.sessions.size(); ++i) {
      Session s = p.sessions[i];
      bool overlaps = rel(s.begin) < window.end && rel(s.end) >= window.begin;
      if (counts[i] == 0 && !overlaps) continue;
      if (rel(s.begin) < window.begin) s.begin = origin + window.begin;
      if (!open_end && rel(s.end) > window.end) s.end = origin + window.end;
      remap[i] = static_cast<uint32_t>(kept.size());
      kept.push_back(s);
    }
    // Group unit indices by session: a session's re-prepare unit, then its
    // captured units in creation order (= send order).
    std::vector<uint32_t> start(kept.size() + 1, 0);
    for (const Unit& u : p.units)
      if (u.in_window && remap[u.session] != kNone) ++start[remap[u.session] + 1];
    for (size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
    p.session_units.assign(start.back(), 0);
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    uint64_t stmts = 0, units = 0;
    auto place = [&](uint32_t i) {
      Unit& u = p.units[i];
      if (!u.in_window || remap[u.session] == kNone) return;
      u.session = remap[u.session];
      p.session_units[fill[u.session]++] = i;
      stmts += u.n_stmts;
      ++units;
      // What the replay sends: the captured errors and COPY data of its units.
      if (i < captured) p.summary.captured_errors += unit_tmp[i].errors;
      for (uint32_t k = 0; k < u.n_copy; ++k) p.summary.copy_bytes += p.copy_chunks[u.first_copy + k].len;
    };
    for (uint32_t r : restore)
      if (r != kNone) place(r);
    for (uint32_t i = 0; i < captured; ++i) place(i);
    // Transactions as the replay counts them (engine.cpp): a unit whose
    // ReadyForQuery says idle closes one if statements ran since the last.
    uint64_t txns = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      uint64_t since_idle = 0;
      for (uint32_t k = start[i]; k < start[i + 1]; ++k) {
        const Unit& u = p.units[p.session_units[k]];
        since_idle += u.n_stmts;
        if (u.ready != 'I') continue;
        if (since_idle > 0) ++kept[i].captured_transactions;
        since_idle = 0;
      }
      txns += kept[i].captured_transactions;
    }
    for (size_t i = 0; i < kept.size(); ++i) {
      kept[i].first_unit = start[i];
      kept[i].n_units = start[i + 1] - start[i];
      if (kept[i].n_units) {
        const Unit& first = p.units[p.session_units[start[i]]];
        const Unit& last = p.units[p.session_units[start[i + 1] - 1]];
        kept[i].begin = std::min(kept[i].begin, first.ts);
        kept[i].end = std::max(kept[i].end, std::max(last.ts, last.ready_ts));
      }
    }
    p.sessions = std::move(kept);
    order_commits(start, captured);
    unit_tmp.clear();
    unit_tmp.shrink_to_fit();
    finish_sessions(units, stmts, txns);
    return plan;
  }

  // The schedule's origin, the capture's concurrency and the summary, from
  // the sessions kept (Plan::sessions) and the counts of what they replay.
  void finish_sessions(uint64_t units, uint64_t stmts, uint64_t txns) {
    Plan& p = *plan;
    p.t0 = 0;
    Nanos last = 0;
    std::vector<std::pair<Nanos, int>> edges;
    edges.reserve(p.sessions.size() * 2);
    for (size_t i = 0; i < p.sessions.size(); ++i) {
      const Session& s = p.sessions[i];
      if (i == 0 || s.begin < p.t0) p.t0 = s.begin;
      last = std::max(last, s.end);
      edges.emplace_back(s.begin, 1);
      edges.emplace_back(s.end, -1);
    }
    std::sort(edges.begin(), edges.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second < b.second;
    });
    // Sessions of the other shards the window keeps (as above: those that
    // overlap it): the schedule starts at the earliest of any shard.
    uint64_t other_sessions = 0;
    for (const auto& [id, span] : others) {
      const auto [b, e] = span;
      if (!(rel(b) < window.end && rel(e) >= window.begin)) continue;
      ++other_sessions;
      const Nanos begin = rel(b) < window.begin ? origin + window.begin : b;
      if (p.sessions.empty() && other_sessions == 1) p.t0 = begin;
      p.t0 = std::min(p.t0, begin);
    }
    int64_t open = 0, most = 0;
    for (const auto& e : edges) {
      open += e.second;
      most = std::max(most, open);
    }
    WorkloadSummary& sum = p.summary;
    sum.sessions = p.sessions.size();
    sum.units = units;
    sum.statements = stmts;
    sum.transactions = txns;
    sum.max_concurrency = static_cast<uint64_t>(most);
    sum.fingerprints = p.fingerprints.size();
    sum.duration_ns = p.sessions.empty() ? 0 : last - p.t0;
    sum.trace_end_ns = any_record ? rel(last_ts) : 0;
    sum.shard = shard;
    sum.trace_sessions = p.sessions.size() + other_sessions;
  }

  // Streamed, pass 1: what one session replays, counted as its batches go by.
  struct Replayed {
    uint32_t units = 0;
    uint64_t stmts = 0, transactions = 0, since_idle = 0;
    Nanos first_ts = 0, last_ts = 0, last_ready = 0;
  };
  std::vector<Replayed> replayed;  // by builder session index

  void count(const UnitBatch& b) {
    if (replayed.size() < plan->sessions.size()) replayed.resize(plan->sessions.size());
    Replayed& r = replayed[b.session];
    for (uint32_t i : b.order) {
      const Unit& u = b.units[i];
      if (r.units++ == 0) r.first_ts = u.ts;
      r.last_ts = u.ts;
      r.last_ready = u.ready_ts;
      r.stmts += u.n_stmts;
      r.since_idle += u.n_stmts;
      if (u.ready == 'I') {
        if (r.since_idle > 0) ++r.transactions;
        r.since_idle = 0;
      }
      for (uint32_t k = 0; k < u.n_copy; ++k) plan->summary.copy_bytes += b.copy_chunks[u.first_copy + k].len;
    }
  }

  // Streamed, pass 1, after the last record: the sessions kept and the
  // summary, as finish() has them, without a unit.
  std::shared_ptr<const Plan> finish_streamed() {
    flush_all();
    while (UnitBatch* b = take_ready()) {
      count(*b);
      recycle(b);
    }
    Plan& p = *plan;
    replayed.resize(p.sessions.size());
    std::vector<Session> kept;
    const bool open_end = window.end == std::numeric_limits<Nanos>::max();
    uint64_t units = 0, stmts = 0, txns = 0;
    for (size_t i = 0; i < p.sessions.size(); ++i) {
      Session s = p.sessions[i];
      const Replayed& r = replayed[i];
      bool overlaps = rel(s.begin) < window.end && rel(s.end) >= window.begin;
      if (r.units == 0 && !overlaps) continue;
      if (rel(s.begin) < window.begin) s.begin = origin + window.begin;
      if (!open_end && rel(s.end) > window.end) s.end = origin + window.end;
      s.first_unit = 0;
      s.n_units = r.units;
      s.captured_transactions = r.transactions;
      if (r.units) {
        s.begin = std::min(s.begin, r.first_ts);
        s.end = std::max(s.end, std::max(r.last_ts, r.last_ready));
      }
      units += r.units;
      stmts += r.stmts;
      txns += r.transactions;
      kept.push_back(s);
    }
    p.sessions = std::move(kept);
    p.streamed = true;
    for (const auto& [h, fp] : hash_fp) p.fp_by_hash.emplace(h, fp);
    finish_sessions(units, stmts, txns);
    return plan;
  }

  // Streamed, at the end of the records: every session's last units go on.
  void flush_all() {
    for (auto& [id, sb] : sessions) {
      finish_ext(sb);
      if (sb.batch) emit(sb);
    }
  }
};

uint32_t shard_of(uint64_t session_id, uint32_t count) {
  if (count <= 1) return 0;
  uint64_t z = session_id + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z % count);
}

PlanBuilder::PlanBuilder(const Window& window, Nanos trace_start, const Shard& shard)
    : impl_(std::make_unique<Impl>()) {
  impl_->window = window;
  impl_->shard = shard;
  impl_->origin = trace_start;
}
PlanBuilder::~PlanBuilder() = default;
void PlanBuilder::add(const trace::Record& r) { impl_->add(r); }
std::shared_ptr<const Plan> PlanBuilder::finish() { return impl_->finish(); }

Workload::Workload(std::shared_ptr<const Plan> plan) : plan_(std::move(plan)) {}
const WorkloadSummary& Workload::summary() const { return plan_->summary; }

Workload load(trace::Reader& reader, const Window& window, const Shard& shard) {
  if (shard.count == 0 || shard.index >= shard.count)
    throw InputError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                     ": the index must be below the count (0-based)");
  PlanBuilder b(window, reader.header().start_mono_ns, shard);
  trace::Record r;
  while (reader.next(r)) b.add(r);
  return Workload(b.finish());
}

std::shared_ptr<const Plan> plan_streamed(trace::Reader& reader, const Window& window, const Shard& shard) {
  if (shard.count == 0 || shard.index >= shard.count)
    throw InputError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                     ": the index must be below the count (0-based)");
  PlanBuilder b(window, reader.header().start_mono_ns, shard);
  PlanBuilder::Impl& m = *b.impl_;
  m.stream = true;
  trace::Record r;
  while (reader.next(r)) {
    m.add(r);
    while (UnitBatch* batch = m.take_ready()) {
      m.count(*batch);
      m.recycle(batch);
    }
  }
  return m.finish_streamed();
}

UnitStream::UnitStream(std::unique_ptr<trace::Reader> reader, const Plan& plan, const Window& window,
                       const Shard& shard, const std::vector<uint32_t>& sessions)
    : reader_(std::move(reader)), builder_(window, reader_->header().start_mono_ns, shard) {
  PlanBuilder::Impl& m = *builder_.impl_;
  m.stream = true;
  m.filtered = true;
  for (uint32_t i : sessions) m.keep.emplace(plan.sessions[i].id, i);
  m.fixed_fps = true;
  m.hash_fp.insert(plan.fp_by_hash.begin(), plan.fp_by_hash.end());
  m.fps = &plan.fingerprints;
}

UnitStream::~UnitStream() = default;

UnitBatch* UnitStream::next() {
  PlanBuilder::Impl& m = *builder_.impl_;
  for (;;) {
    if (UnitBatch* b = m.take_ready()) return b;
    if (ended_) return nullptr;
    if (reader_->next(rec_)) {
      m.add(rec_);
    } else {
      ended_ = true;
      m.flush_all();
    }
  }
}

void UnitStream::recycle(UnitBatch* b) { builder_.impl_->recycle(b); }
size_t UnitStream::batches() const { return builder_.impl_->batches.size(); }

Workload stream(const std::string& path, const Window& window, const Shard& shard) {
  std::unique_ptr<trace::Reader> reader = trace::open_reader(path);
  Workload w(plan_streamed(*reader, window, shard));
  w.path_ = path;
  w.window_ = window;
  w.shard_ = shard;
  return w;
}

std::vector<uint64_t> max_speed_gates(const Plan& plan) {
  std::vector<Nanos> ends;
  ends.reserve(plan.sessions.size());
  for (const Session& s : plan.sessions) ends.push_back(std::max(s.end, s.begin));
  std::sort(ends.begin(), ends.end());
  std::vector<uint64_t> gate(plan.sessions.size());
  for (size_t i = 0; i < plan.sessions.size(); ++i)
    gate[i] = static_cast<uint64_t>(std::lower_bound(ends.begin(), ends.end(), plan.sessions[i].begin) - ends.begin());
  return gate;
}

}  // namespace tierlab::replay
