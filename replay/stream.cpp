// A streamed plan (replay::stream, replay/plan.h): the builder's streamed
// mode (PlanBuilder::Impl, replay/plan_builder.h) makes each session's
// units into pooled batches and hands each on once its answers are in,
// applying the window's rule one unit at a time; pass 1 counts them,
// pass 2 (UnitStream) gives them to a worker.
#include "replay/plan_builder.h"
#include "replay/wire.h"

#include <cassert>

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

void PlanBuilder::Impl::move_unit(const Tables& from, uint32_t i, Tables& to) {
  Unit u = from.units[i];
  Arena& a = to.arena;
  if (u.sql) u.sql = a.copy(u.sql);  // a streamed Query's text lives in its batch
  if (u.wire) u.wire = a.copy(std::string_view(u.wire, u.wire_len));
  if (u.copy_wire) u.copy_wire = a.copy(std::string_view(u.copy_wire, u.copy_wire_len));
  const uint32_t first_stmt = static_cast<uint32_t>(to.stmts.size());
  to.stmts.insert(to.stmts.end(), from.stmts.begin() + u.first_stmt, from.stmts.begin() + u.first_stmt + u.n_stmts);
  const uint32_t first_op = static_cast<uint32_t>(to.ops.size());
  for (uint32_t k = 0; k < u.n_ops; ++k) {
    Op o = from.ops[u.first_op + k];
    o.name = a.copy(o.name);
    // A Prepare's or an Execute's text is the plan's (interned); a
    // Deallocate's is made in the batch.
    if (o.kind == OpKind::Deallocate) o.sql = a.copy(o.sql);
    if (o.kind == OpKind::Prepare) {
      const uint32_t t = static_cast<uint32_t>(to.types.size());
      to.types.insert(to.types.end(), from.types.begin() + o.types, from.types.begin() + o.types + o.nparams);
      o.types = t;
    }
    if (o.kind == OpKind::Execute) {
      const uint32_t p = static_cast<uint32_t>(to.param_values.size());
      for (int k2 = 0; k2 < o.nparams; ++k2) {
        const char* v = from.param_values[o.params + k2];
        const int len = from.param_lengths[o.params + k2];
        to.param_values.push_back(v ? a.copy(std::string_view(v, static_cast<size_t>(len))) : nullptr);
        to.param_lengths.push_back(len);
        to.param_formats.push_back(from.param_formats[o.params + k2]);
      }
      o.params = p;
      if (o.stmt != kNone) o.stmt = o.stmt - u.first_stmt + first_stmt;
    }
    to.ops.push_back(o);
  }
  const uint32_t first_copy = static_cast<uint32_t>(to.copy_chunks.size());
  for (uint32_t k = 0; k < u.n_copy; ++k) {
    const CopyChunk& c = from.copy_chunks[u.first_copy + k];
    to.copy_chunks.push_back(CopyChunk{a.copy(std::string_view(c.data, c.len)), c.len});
  }
  u.first_stmt = first_stmt;
  u.first_op = first_op;
  u.first_copy = first_copy;
  to.units.push_back(u);
}

void PlanBuilder::Impl::split(SessionBuild& sb) {
  UnitBatch& old = *sb.batch;
  const uint32_t from = sb.awaiting.front();
  const uint32_t n = static_cast<uint32_t>(old.units.size());
  // Invariant: every unit before the first one waiting is answered, and
  // no unit is half made (the caller checked), so none refers to `old`
  // once moved.
  assert(from > 0 && from <= n && sb.last_unit != kNone && sb.last_unit >= from);
  UnitBatch& nb = *take_batch();
  nb.session = old.session;
  for (uint32_t i = from; i < n; ++i) move_unit(old, i, nb);
  split_tmp.assign(sb.tmp.begin() + from, sb.tmp.end());
  split_await.clear();
  for (; !sb.awaiting.empty(); sb.awaiting.pop_front()) split_await.push_back(sb.awaiting.front() - from);
  const uint32_t last = sb.last_unit - from;
  old.units.resize(from);
  sb.tmp.resize(from);
  emit(sb);  // the answered units go on
  sb.batch = &nb;
  sb.tmp.swap(split_tmp);
  for (uint32_t u : split_await) sb.awaiting.push_back(u);
  sb.last_unit = last;
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
