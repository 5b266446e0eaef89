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
  if (sync) sync_take(sb, b);
  else ready_push(&b);
}

void PlanBuilder::Impl::ready_push(UnitBatch* b) {
  if (ready_tail) ready_tail->next = b;
  else ready_head = b;
  ready_tail = b;
}

// --- commit order over a window (StreamSync, replay/plan_builder.h) --------

void PlanBuilder::Impl::sync_take(SessionBuild& sb, UnitBatch& b) {
  b.unplanned = 0;
  b.sync_next = nullptr;
  for (uint32_t i : b.order) {
    Unit& u = b.units[i];
    const bool captured = i < sb.tmp.size();  // else the unit that re-prepares
    if (sync_rule && (sb.sync_idle || sb.txn == kNone)) {
      uint32_t h;
      if (!free_txns.empty()) {
        h = free_txns.back();
        free_txns.pop_back();
      } else {
        h = static_cast<uint32_t>(txns.size());
        txns.emplace_back();
      }
      StreamTxn& t = txns[h];
      t.begin = u.ts;
      t.sb = &sb;
      t.first_b = &b;
      t.first_i = i;
      t.commit_b = nullptr;
      t.handle = kNone;
      t.ended = false;
      t.early.clear();
      ++b.unplanned;
      sb.txn = h;
      events.push_back(SyncEvent{u.ts, SyncEvent::Open, captured ? sb.tmp[i].seq : 0, h});
      std::push_heap(events.begin(), events.end());
    }
    if (sync_rule) {
      StreamTxn& t = txns[sb.txn];
      detail::SqlAccess a = access_of(b, i, captured && sb.tmp[i].errors > 0);
      if (t.handle != kNone) planner->add(t.handle, a);
      else t.early.push_back(std::move(a));
    } else {
      keys->count(access_of(b, i, captured && sb.tmp[i].errors > 0).rels);
    }
    if (captured && sb.tmp[i].changed) sb.sync_changed = true;
    if (u.ready == 'I') {
      if (sb.sync_changed) {
        uint32_t ref = 0;
        if (sync_rule) {
          StreamTxn& t = txns[sb.txn];
          t.commit_b = &b;
          t.commit_i = i;
          ++b.unplanned;
          ref = sb.txn;
        }
        events.push_back(SyncEvent{u.ready_ts, SyncEvent::Commit, captured ? sb.tmp[i].seq : 0, ref});
        std::push_heap(events.begin(), events.end());
      }
      sb.sync_changed = false;
    }
    sb.sync_idle = u.ready == 'I' || u.ready == 0;
    if (sb.sync_idle && sync_rule) sync_end_txn(sb);
  }
  if (sb.plan_tail) sb.plan_tail->sync_next = &b;
  else sb.plan_head = &b;
  sb.plan_tail = &b;
  ++b.unplanned;  // held while it is being queued
  sync_resolve(&b, sb);
}

// The session's open transaction ended (idle, or the session ended): a
// reader's need is taken once it has opened; a committer's at its commit.
void PlanBuilder::Impl::sync_end_txn(SessionBuild& sb) {
  if (!sync_rule || sb.txn == kNone) return;
  StreamTxn& t = txns[sb.txn];
  sb.txn = kNone;
  t.ended = true;
  if (!t.commit_b && t.handle != kNone) sync_need(t);
}

// Takes a transaction's need (its first unit's wait) and closes it as a
// reader, or, with its commit point, as the commit numbered next.
void PlanBuilder::Impl::sync_need(StreamTxn& t) {
  detail::SyncNeed n = planner->need(t.handle);
  Unit& f = t.first_b->units[t.first_i];
  f.sync_need = n.prefix;
  f.sync_dep = static_cast<uint32_t>(t.first_b->sync_deps.size());
  f.n_sync_deps = static_cast<uint32_t>(n.deps.size());
  t.first_b->sync_deps.insert(t.first_b->sync_deps.end(), n.deps.begin(), n.deps.end());
  SessionBuild& sb = *t.sb;
  UnitBatch* first = t.first_b;
  UnitBatch* commit = t.commit_b;
  if (commit) {
    const uint32_t c = next_commit++;
    Unit& u = commit->units[t.commit_i];
    u.commit = c;
    planner->close(t.handle, c, u.ready_ts);
    if (commit_hook) commit_hook(commit_ctx, commit->session, c);
  } else {
    planner->close(t.handle, kNoCommit, 0);
  }
  free_txns.push_back(static_cast<uint32_t>(&t - txns.data()));
  sync_resolve(first, sb);
  if (commit) sync_resolve(commit, sb);
}

void PlanBuilder::Impl::sync_resolve(UnitBatch* b, SessionBuild& sb) {
  assert(b->unplanned > 0);
  --b->unplanned;
  while (UnitBatch* h = sb.plan_head) {
    if (h->unplanned > 0) break;
    sb.plan_head = h->sync_next;
    if (!sb.plan_head) sb.plan_tail = nullptr;
    h->sync_next = nullptr;
    sync_deliver(h);
  }
}

void PlanBuilder::Impl::sync_deliver(UnitBatch* b) {
  if (filtered && !mine[b->session]) recycle(b);  // planned for the others' sake only
  else ready_push(b);
}

// After a record of the session: whether it holds units not handed on, and
// since when (the time of the first, which no later unit of it precedes).
void PlanBuilder::Impl::sync_pending(SessionBuild& sb) {
  const bool now = sb.batch || sb.ext_open;
  if (!now) {
    sb.pending = false;
    return;
  }
  Nanos since = sb.ext_open ? sb.ext_ts : std::numeric_limits<Nanos>::max();
  if (sb.batch && !sb.batch->units.empty()) since = std::min(since, sb.batch->units.front().ts);
  if (sb.pending && since == sb.pend_since) return;
  sb.pending = true;
  sb.pend_since = since;
  pend.push_back(PendEntry{since, ++sb.pend_stamp, &sb});
  std::push_heap(pend.begin(), pend.end());
}

// No event still to come is earlier than this: a record comes at most
// sync_skew before one read earlier (pass 1 measured it), so a unit not
// handed on, its answers and its commit are no earlier than its session's
// first pending record less that, and a record still to read no earlier
// than the latest read less that.
Nanos PlanBuilder::Impl::sync_floor() {
  if (sync_now == std::numeric_limits<Nanos>::min()) return sync_now;  // nothing read
  while (!pend.empty()) {
    const PendEntry& e = pend.front();
    if (e.sb->pending && e.sb->pend_stamp == e.stamp) return std::min(sync_now, e.since) - sync_skew;
    std::pop_heap(pend.begin(), pend.end());
    pend.pop_back();
  }
  return sync_now - sync_skew;
}

void PlanBuilder::Impl::sync_release(Nanos floor) {
  while (!events.empty() && events.front().t < floor) {
    std::pop_heap(events.begin(), events.end());
    const SyncEvent e = events.back();
    events.pop_back();
    if (e.kind == SyncEvent::Start) {
      if (start_commits.size() <= e.ref) start_commits.resize(e.ref + 1, 0);
      start_commits[e.ref] = next_commit;
      continue;
    }
    if (!sync_rule) {  // pass 1: numbered only
      ++next_commit;
      continue;
    }
    StreamTxn& t = txns[e.ref];
    if (e.kind == SyncEvent::Open) {
      t.handle = planner->open(t.begin);
      for (const detail::SqlAccess& a : t.early) planner->add(t.handle, a);
      t.early.clear();
      t.first_b->units[t.first_i].sync_all = next_commit;
      if (t.ended && !t.commit_b) sync_need(t);
      continue;
    }
    if (t.handle == kNone) t.handle = planner->open(t.begin);  // a commit stamped before its own begin
    sync_need(t);  // its commit: every commit before it is closed
  }
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
    if (sync && i < start_commits.size()) s.sync_all = start_commits[i];
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
  if (sync) {
    p.sync = true;
    p.commits = next_commit;
    p.sync_unplanned = unplanned;
    p.sync_skew = sync_skew;
    keys->pick();
    p.key_columns = std::move(keys);
  }
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
  if (!sync) return;
  // A transaction still open at the end is a reader; every event goes.
  for (auto& [id, sb] : sessions) {
    sync_end_txn(sb);
    sb.pending = false;
  }
  sync_release(std::numeric_limits<Nanos>::max());
}

std::shared_ptr<const Plan> plan_streamed(trace::Reader& reader, const Window& window, const Shard& shard,
                                          bool sync) {
  if (shard.count == 0 || shard.index >= shard.count)
    throw InputError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                     ": the index must be below the count (0-based)");
  PlanBuilder b(window, reader.header().start_mono_ns, shard);
  PlanBuilder::Impl& m = *b.impl_;
  m.stream = true;
  if (sync) {
    m.sync = true;
    m.keys = std::make_unique<detail::KeyColumns>();
  }
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
  if (plan.sync) {
    // Every session is planned (the commit points are numbered across all
    // of them); only this worker's are handed on.
    m.sync = m.sync_rule = true;
    m.sync_skew = plan.sync_skew;
    m.planner = std::make_unique<detail::SyncPlanner>(*plan.key_columns);
    m.mine.assign(plan.sessions.size(), false);
    for (uint32_t i : sessions) m.mine[i] = true;
    m.keep.clear();
    for (uint32_t i = 0; i < plan.sessions.size(); ++i) m.keep.emplace(plan.sessions[i].id, i);
  }
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
void UnitStream::on_commit(void (*f)(void*, uint32_t, uint32_t), void* ctx) {
  builder_.impl_->commit_hook = f;
  builder_.impl_->commit_ctx = ctx;
}
size_t UnitStream::sync_held() const {
  const PlanBuilder::Impl& m = *builder_.impl_;
  return m.planner ? m.planner->held() : 0;
}

Workload stream(const std::string& path, const Window& window, const Shard& shard, bool sync) {
  std::unique_ptr<trace::Reader> reader = trace::open_reader(path);
  Workload w(plan_streamed(*reader, window, shard, sync));
  w.path_ = path;
  w.window_ = window;
  w.shard_ = shard;
  return w;
}

}  // namespace tierlab::replay
