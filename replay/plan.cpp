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

#include "replay/plan_builder.h"
#include "replay/wire.h"

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

UnitBatch* PlanBuilder::Impl::take_batch() {
  if (free_batches.empty()) {
    batches.push_back(std::make_unique<UnitBatch>());
    free_batches.push_back(batches.back().get());
  }
  UnitBatch* b = free_batches.back();
  free_batches.pop_back();
  return b;
}

Tables& PlanBuilder::Impl::T(SessionBuild& sb) {
  if (!stream) return *plan;
  if (!sb.batch) {
    sb.batch = take_batch();
    sb.batch->session = sb.plan_index;
    sb.tmp.clear();
  }
  return *sb.batch;
}

// The fingerprint of normalised text `norm`: a new number in a loaded or
// first pass, the first pass's number in the second.
uint32_t PlanBuilder::Impl::fp_of_norm(std::string&& norm) {
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

const char* PlanBuilder::Impl::intern_sql(std::string_view sql, uint32_t* fp_out) {
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

uint32_t PlanBuilder::Impl::fp_for_text(const std::string& text) {
  uint32_t fp;
  intern_sql(text, &fp);
  return fp;
}

bool PlanBuilder::Impl::in_window(Nanos ts) const {
  Nanos r = rel(ts);
  return r >= window.begin && r < window.end;
}

SessionBuild& PlanBuilder::Impl::session(uint64_t id, Nanos ts) {
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

uint32_t PlanBuilder::Impl::new_unit(SessionBuild& sb, UnitKind kind, Nanos ts) {
  Unit u;
  u.kind = kind;
  u.session = sb.index;
  u.ts = ts;
  u.in_window = in_window(ts);
  Tables& t = T(sb);
  t.units.push_back(u);
  TMP(sb).emplace_back().seq = unit_seq++;
  return static_cast<uint32_t>(t.units.size() - 1);
}

void PlanBuilder::Impl::finish_ext(SessionBuild& sb) {
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

void PlanBuilder::Impl::open_ext(SessionBuild& sb, Nanos ts) {
  if (sb.ext_open) return;
  sb.ext_open = true;
  sb.ext_ts = ts;
}

void PlanBuilder::Impl::on_answer(SessionBuild& sb, Nanos ts, bool is_error, std::string_view sqlstate,
               bool has_rows, uint64_t rows, std::string_view tag) {
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

void PlanBuilder::Impl::on_ready(SessionBuild& sb, Nanos ts, char status) {
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

void PlanBuilder::Impl::add(const trace::Record& r) {
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
  const size_t known = plan->sessions.size();
  SessionBuild& sb = session(r.session, r.ts);
  sb.plan_index = filtered ? plan_index : sb.index;
  Session& s = plan->sessions[sb.index];
  s.end = std::max(s.end, r.ts);
  if (sync) {
    if (r.ts < sync_now && !sync_rule) {  // pass 1: how far out of time order records come
      sync_skew = std::max(sync_skew, sync_now - r.ts);
      if (sync_skew > kMaxSkew && unplanned.empty())
        unplanned = "session " + std::to_string(r.session) + "'s record at " + std::to_string(rel(r.ts)) +
                    " ns from the trace start comes " + std::to_string(sync_skew) +
                    " ns before a record read earlier (records out of time order by more than 1 s)";
    }
    sync_now = std::max(sync_now, r.ts);
    if (!sync_rule && plan->sessions.size() != known) {  // pass 1: the session's start among the commits
      const Nanos t = rel(r.ts) < window.begin ? origin + window.begin : r.ts;
      events.push_back(SyncEvent{t, SyncEvent::Start, 0, sb.index});
      std::push_heap(events.begin(), events.end());
    }
  }
  std::visit([&](const auto& b) { on(sb, r.ts, b); }, r.body);
  if (!stream) return;
  // Streamed: the session's units go on once every answer is in (at its
  // end, whatever it has).
  const bool end = std::holds_alternative<trace::SessionEnd>(r.body);
  if (sb.batch) {
    const bool whole = !sb.ext_open && sb.copy_tmp.empty();  // no unit half made
    if (end || (whole && sb.awaiting.empty())) emit(sb);
    else if (whole && sb.awaiting.front() >= kSplitUnits) split(sb);
  }
  if (!sync) return;
  if (end) sync_end_txn(sb);
  sync_pending(sb);
  if (!events.empty()) sync_release(sync_floor());
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::SessionBegin& b) {
  Session& s = plan->sessions[sb.index];
  s.begin = ts;
  s.user = plan->arena.copy(b.user);
  s.database = plan->arena.copy(b.database);
  s.application_name = plan->arena.copy(b.application_name);
  sb.has_begin = true;
  sb.unknown_startup = (b.flags & trace::kSessionUnknownStartup) != 0;
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::SessionEnd&) {
  finish_ext(sb);
  plan->sessions[sb.index].end = ts;
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Query& q) {
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

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Parse& p) {
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

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Bind& b) {
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
  auto it = sb.prepared.find(b.statement);
  if (it != sb.prepared.end()) {
    sb.bind_fp = it->second.fp;
    op.sql = it->second.sql;
  } else {
    sb.bind_fp = fp_for_text("EXECUTE " + std::string(b.statement) +
                             " /* prepared before the capture */");
  }
  sb.bind = op;
  sb.bind_pending = true;
  if (auto p = sb.portal_fp.find(b.portal); p != sb.portal_fp.end())
    p->second = sb.bind_fp;
  else
    sb.portal_fp.emplace(std::string(b.portal), sb.bind_fp);
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Execute& e) {
  open_ext(sb, ts);
  wire::execute(sb.wire, e.portal, e.max_rows);
  if (!sb.bind_pending) {
    // Execute of a portal already run once (max_rows): libpq has no call
    // that resumes a portal; a directly driven session sends it.
    ++sb.libpq_unsupported;
    auto it = sb.portal_fp.find(e.portal);
    sb.execs.emplace_back(it != sb.portal_fp.end() ? it->second
                                                   : fp_for_text("EXECUTE /* a portal bound before the capture */"),
                          kNone);
    return;
  }
  sb.execs.emplace_back(sb.bind_fp, static_cast<uint32_t>(sb.ops.size()));
  sb.ops.push_back(sb.bind);
  sb.bind_pending = false;
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Describe& d) {
  open_ext(sb, ts);
  wire::describe(sb.wire, d.target, d.name);
  if (d.target == 'P' && sb.bind_pending) return;  // sent with the Execute
  Op op;
  op.kind = d.target == 'S' ? OpKind::DescribeStmt : OpKind::DescribePortal;
  op.name = T(sb).arena.copy(d.name);
  sb.ops.push_back(op);
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos ts, const trace::Close& c) {
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

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos, const trace::Sync&) {
  if (sb.ext_open) {
    wire::sync(sb.wire);
    sb.wire_synced = true;
  }
  finish_ext(sb);
}

// COPY FROM STDIN data belongs to the unit that started the COPY: a Query
// (the unit becomes a Copy unit) or an Execute. A client that sent the
// Execute with Flush instead of Sync sends its data before any Sync: the
// extended unit ends there (its replay gets a Sync, which the server
// ignores in copy mode, as it ignores libpq's own one there).
Unit* PlanBuilder::Impl::copy_unit(SessionBuild& sb) {
  if (sb.ext_open && !sb.execs.empty()) finish_ext(sb);
  if (sb.last_unit == kNone) return nullptr;  // the COPY began before the capture (or its unit was handed on)
  Unit& u = T(sb).units[sb.last_unit];
  if (u.kind == UnitKind::Simple) u.kind = UnitKind::Copy;
  return &u;
}

void PlanBuilder::Impl::on(SessionBuild& sb, Nanos, const trace::CopyData& d) {
  if (d.dir != trace::CopyDir::In || !copy_unit(sb)) return;
  sb.copy_tmp.push_back(
      CopyChunk{T(sb).arena.copy(d.data), static_cast<uint32_t>(d.data.size())});
}

void PlanBuilder::Impl::end_copy(SessionBuild& sb, bool fail) {
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
const std::string& Workload::sync_unplanned() const { return plan_->sync_unplanned; }

Workload load(trace::Reader& reader, const Window& window, const Shard& shard) {
  if (shard.count == 0 || shard.index >= shard.count)
    throw InputError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                     ": the index must be below the count (0-based)");
  PlanBuilder b(window, reader.header().start_mono_ns, shard);
  trace::Record r;
  while (reader.next(r)) b.add(r);
  return Workload(b.finish());
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
