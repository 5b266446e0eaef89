// A loaded plan's last steps (PlanBuilder::Impl, replay/plan_builder.h):
// the window's rule over each session's leading units, the sessions kept
// and their counts, the commit order (replay/sync_plan.h), the schedule's
// origin and the summary.
#include "replay/plan_builder.h"
#include "replay/sync_plan.h"
#include "replay/wire.h"

namespace tierlab::replay {

// The unit that re-prepares statements (made here, not captured) as
// protocol messages: its Parses and a Sync.
void PlanBuilder::Impl::encode_restore(uint32_t ui) {
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
uint32_t PlanBuilder::Impl::restore_prepared(uint32_t first,
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
std::vector<uint32_t> PlanBuilder::Impl::start_sessions_idle() {
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

// storage records, meta, loss

// What unit `ui` of `t` touches (replay/sync_sql.h): its SQL, with the
// parameters an Execute binds; a Parse only names relations (Schema). A
// unit with an error at capture (`failed`) counts as unknown: the error may
// come of another session's work (a duplicate key, a missing row),
// whatever the text says.
detail::SqlAccess PlanBuilder::Impl::access_of(const Tables& p, uint32_t ui, bool failed) const {
  const Unit& u = p.units[ui];
  detail::SqlAccess out;
  if (failed) {
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
void PlanBuilder::Impl::order_commits(const std::vector<uint32_t>& start, uint32_t captured) {
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
  // ReadyForQuery says idle (or the session's last), as ranges of
  // session_units; what they touch is read from their units when the rule
  // asks (twice), not held.
  struct Span {
    Nanos begin = 0;
    uint32_t from = 0, to = 0;  // in session_units
    uint32_t commit = kNoCommit;
  };
  std::vector<Span> txns;
  for (size_t i = 0; i + 1 < start.size(); ++i) {
    p.sessions[i].sync_all = before(p.sessions[i].begin);
    bool idle = true;  // the next unit starts a transaction
    for (uint32_t k = start[i]; k < start[i + 1]; ++k) {
      Unit& u = p.units[p.session_units[k]];
      if (idle) {
        u.sync_all = before(u.ts);
        txns.push_back(Span{u.ts, k, k, kNoCommit});
      }
      Span& t = txns.back();
      t.to = k + 1;
      if (u.commit != kNoCommit) t.commit = u.commit;
      idle = u.ready == 'I' || u.ready == 0;
    }
  }
  struct Source : detail::SyncSource {
    const Impl& m;
    const std::vector<Span>& txns;
    uint32_t captured;
    Source(const Impl& i, const std::vector<Span>& t, uint32_t c) : m(i), txns(t), captured(c) {}
    size_t size() const override { return txns.size(); }
    Nanos begin(size_t t) const override { return txns[t].begin; }
    uint32_t commit(size_t t) const override { return txns[t].commit; }
    void access(size_t t, const std::function<void(const detail::SqlAccess&)>& f) const override {
      for (uint32_t k = txns[t].from; k < txns[t].to; ++k) f(m.unit_access(m.plan->session_units[k], captured));
    }
  } src(*this, txns, captured);
  detail::plan_needs(src, at, [&](size_t t, detail::SyncNeed&& need) {
    Unit& u = p.units[p.session_units[txns[t].from]];
    u.sync_need = need.prefix;
    u.sync_dep = static_cast<uint32_t>(p.sync_deps.size());
    u.n_sync_deps = static_cast<uint32_t>(need.deps.size());
    p.sync_deps.insert(p.sync_deps.end(), need.deps.begin(), need.deps.end());
  });
  p.commits = static_cast<uint32_t>(points.size());
  p.summary.commit_points = points.size();
}

std::shared_ptr<const Plan> PlanBuilder::Impl::finish() {
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
void PlanBuilder::Impl::finish_sessions(uint64_t units, uint64_t stmts, uint64_t txns) {
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

}  // namespace tierlab::replay
