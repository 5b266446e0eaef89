// A streamed plan (replay::stream, replay/plan.h): the builder's streamed
// mode (PlanBuilder::Impl, replay/plan_builder.h) makes each session's
// units into pooled batches and hands each on once its answers are in,
// applying the window's rule one unit at a time; pass 1 counts them,
// pass 2 (UnitStream) gives them to a worker.
#include "replay/plan_builder.h"
#include "replay/wire.h"

namespace tierlab::replay {

void PlanBuilder::Impl::recycle(UnitBatch* b) {
  b->clear();
  b->order.clear();
  b->pos = 0;
  b->next = nullptr;
  free_batches.push_back(b);
}

UnitBatch* PlanBuilder::Impl::take_ready() {
  UnitBatch* b = ready_head;
  if (b) {
    ready_head = b->next;
    if (!ready_head) ready_tail = nullptr;
    b->next = nullptr;
  }
  return b;
}

// A simple query's fingerprint, streamed: its text is not kept.
uint32_t PlanBuilder::Impl::query_fingerprint(std::string_view sql) {
  const uint64_t h = hash_text(sql);
  auto it = query_fp.find(h);
  if (it != query_fp.end()) return it->second;
  if (query_fp.size() >= kQueryCache) query_fp.clear();
  const uint32_t fp = fp_of_norm(normalize_sql(sql));
  query_fp.emplace(h, fp);
  return fp;
}

// Streamed: hands on the session's batch (ready_*), its units to replay
// in `order`, by the window's rule as start_sessions_idle applies it.
void PlanBuilder::Impl::emit(SessionBuild& sb) {
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
void PlanBuilder::Impl::placed(SessionBuild& sb, UnitBatch& b, uint32_t i) {
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
uint32_t PlanBuilder::Impl::restore_streamed(SessionBuild& sb, UnitBatch& b, uint32_t first) {
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

// by builder session index
void PlanBuilder::Impl::count(const UnitBatch& b) {
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
std::shared_ptr<const Plan> PlanBuilder::Impl::finish_streamed() {
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
void PlanBuilder::Impl::flush_all() {
  for (auto& [id, sb] : sessions) {
    finish_ext(sb);
    if (sb.batch) emit(sb);
  }
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

}  // namespace tierlab::replay
