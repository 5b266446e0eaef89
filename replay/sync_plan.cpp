// Which earlier commits each unit of work waits for (replay/sync_plan.h).
#include "replay/sync_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

namespace tierlab::replay::detail {
namespace {

constexpr uint32_t kWhole = UINT32_MAX;  // key of a use of the whole relation

// One use of a relation by a transaction, as the rule compares them.
struct Use {
  uint32_t rel = 0;
  uint32_t key = kWhole;
  AccessKind kind = AccessKind::Read;
};

// A committed use, in a list of earlier uses.
struct Entry {
  Nanos begin = 0, end = 0;   // its transaction's begin and commit, at capture
  uint32_t commit = 0;
  Use use;
  bool barrier = false;       // an unknown transaction: conflicts with everything
  bool all = false;           // it waited for every commit before it began
};

bool conflicts(const Entry& a, const Entry& b) {
  if (a.barrier || b.barrier) return true;
  const Use& x = a.use;
  const Use& y = b.use;
  if (x.rel != y.rel) return x.kind == AccessKind::Append && y.kind == AccessKind::Append;
  if (x.key != kWhole && y.key != kWhole && x.key != y.key) return false;
  if (x.kind == AccessKind::Schema) return y.key == kWhole && y.kind == AccessKind::Write;
  if (y.kind == AccessKind::Schema) return x.key == kWhole && x.kind == AccessKind::Write;
  return !(x.kind == y.kind && x.kind != AccessKind::Write);
}

// The earlier uses of one relation, by kind; each list in commit order.
struct RelUses {
  std::vector<Entry> writes, reads, appends, schema;   // whole relation
  std::vector<Entry> key_reads, key_writes;            // by key, all keys
};
struct KeyUses {
  std::vector<Entry> reads, writes;
};

class Rule {
 public:
  explicit Rule(const std::vector<Nanos>& commit_end) : commit_end_(commit_end) {}

  // Interns the transactions' uses: relation ids, and per relation the one
  // column whose equalities are its row keys (the one most used).
  void prepare(const std::vector<SyncTxn>& txns);

  // The need of transaction t (its uses in uses_[t]), from the commits so far.
  SyncNeed need(size_t t, const SyncTxn& txn);

  // Transaction t committed: its uses join the lists.
  void commit(size_t t, const SyncTxn& txn, Nanos end);

 private:
  uint32_t before(Nanos t) const {
    return static_cast<uint32_t>(std::lower_bound(commit_end_.begin(), commit_end_.end(), t) - commit_end_.begin());
  }
  // Scans `list` from its latest entry: picks what conflicts with `me` and
  // no pick covers. `any_key`: the list mixes keys. False when the search
  // went over its limits.
  bool scan(const std::vector<Entry>& list, const Entry& me, bool any_key);
  bool covered(const Entry& e) const {
    for (const Entry& p : picks_)
      if (e.end < p.begin && (p.all || conflicts(p, e))) return true;
    return false;
  }

  const std::vector<Nanos>& commit_end_;
  std::vector<std::vector<Use>> uses_;   // per transaction
  std::vector<bool> all_;                // per transaction: waited for all before it
  std::vector<RelUses> rels_;
  std::unordered_map<uint64_t, KeyUses> keys_;  // (relation, key) -> uses
  std::vector<uint32_t> appended_;       // relations with appends
  std::vector<Entry> barriers_;
  std::vector<Entry> picks_;
  size_t scanned_ = 0;
};

void Rule::prepare(const std::vector<SyncTxn>& txns) {
  std::unordered_map<std::string, uint32_t> rel_id;
  std::vector<std::map<std::string, size_t>> column_uses;
  for (const SyncTxn& t : txns)
    for (const RelAccess& a : t.rels) {
      auto [it, fresh] = rel_id.try_emplace(a.relation, static_cast<uint32_t>(rel_id.size()));
      if (fresh) column_uses.emplace_back();
      for (const Equality& e : a.keys) ++column_uses[it->second][e.column];
    }
  std::vector<std::string> key_column(rel_id.size());
  for (size_t r = 0; r < column_uses.size(); ++r) {
    size_t best = 0;
    for (const auto& [col, n] : column_uses[r])
      if (n > best) {
        best = n;
        key_column[r] = col;
      }
  }
  rels_.resize(rel_id.size());
  std::unordered_map<std::string, uint32_t> key_id;  // relation id, NUL, value
  uses_.resize(txns.size());
  all_.assign(txns.size(), false);
  for (size_t t = 0; t < txns.size(); ++t) {
    std::vector<Use>& uses = uses_[t];
    for (const RelAccess& a : txns[t].rels) {
      Use u;
      u.rel = rel_id.at(a.relation);
      u.kind = a.kind;
      if (a.kind == AccessKind::Read || a.kind == AccessKind::Write)
        for (const Equality& e : a.keys)
          if (e.column == key_column[u.rel]) {
            std::string k = std::to_string(u.rel) + '\0' + e.value;
            u.key = key_id.try_emplace(std::move(k), static_cast<uint32_t>(key_id.size())).first->second;
            break;
          }
      // One use per (relation, key): two kinds make a Write, but Schema
      // adds nothing to another kind.
      auto same = std::find_if(uses.begin(), uses.end(), [&](const Use& o) { return o.rel == u.rel && o.key == u.key; });
      if (same == uses.end()) {
        uses.push_back(u);
      } else if (same->kind != u.kind) {
        if (same->kind == AccessKind::Schema) same->kind = u.kind;
        else if (u.kind != AccessKind::Schema) same->kind = AccessKind::Write;
      }
    }
  }
}

bool Rule::scan(const std::vector<Entry>& list, const Entry& me, bool any_key) {
  // Entries older than `stop` are covered by a pick that conflicts with
  // every entry of the list: the search ends there.
  Nanos stop = 0;
  auto uniform = [&](const Entry& p) {
    if (p.all || p.barrier) return true;
    if (list.empty()) return false;
    if (any_key && p.use.rel == list.back().use.rel && p.use.key != kWhole) return false;
    return conflicts(p, list.back());
  };
  for (const Entry& p : picks_)
    if (uniform(p)) stop = std::max(stop, p.begin);
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    const Entry& e = *it;
    if (e.end < stop) break;
    if (++scanned_ > kMaxScan) return false;
    if (!conflicts(me, e) || covered(e)) continue;
    if (picks_.size() >= kMaxDeps) return false;
    picks_.push_back(e);
    if (uniform(e)) stop = std::max(stop, e.begin);
  }
  return true;
}

SyncNeed Rule::need(size_t t, const SyncTxn& txn) {
  SyncNeed n;
  if (txn.unknown) {
    all_[t] = true;
    n.prefix = before(txn.begin);
    return n;
  }
  picks_.clear();
  scanned_ = 0;
  Entry me;
  me.begin = txn.begin;
  me.barrier = true;  // for the barriers: every one conflicts
  bool ok = scan(barriers_, me, false);
  me.barrier = false;
  for (const Use& u : uses_[t]) {
    if (!ok) break;
    me.use = u;
    const RelUses& r = rels_[u.rel];
    const bool whole = u.key == kWhole;
    ok = scan(r.writes, me, false);
    if (u.kind == AccessKind::Schema) continue;
    if (ok && u.kind != AccessKind::Read) ok = scan(r.reads, me, false);
    if (ok && u.kind != AccessKind::Append) ok = scan(r.appends, me, false);
    if (ok && whole && u.kind == AccessKind::Write) ok = scan(r.schema, me, false);
    if (whole) {
      if (ok && u.kind != AccessKind::Read) ok = scan(r.key_reads, me, true);
      if (ok) ok = scan(r.key_writes, me, true);
    } else {
      auto k = keys_.find(uint64_t{u.rel} << 32 | u.key);
      if (k != keys_.end()) {
        if (ok && u.kind == AccessKind::Write) ok = scan(k->second.reads, me, false);
        if (ok) ok = scan(k->second.writes, me, false);
      }
    }
    if (u.kind == AccessKind::Append)
      for (uint32_t other : appended_)
        if (ok && other != u.rel) ok = scan(rels_[other].appends, me, false);
  }
  if (!ok) {
    all_[t] = true;
    n.prefix = before(txn.begin);
    return n;
  }
  for (const Entry& p : picks_) n.deps.push_back(p.commit);
  std::sort(n.deps.begin(), n.deps.end());
  n.deps.erase(std::unique(n.deps.begin(), n.deps.end()), n.deps.end());
  return n;
}

void Rule::commit(size_t t, const SyncTxn& txn, Nanos end) {
  Entry e;
  e.begin = txn.begin;
  e.end = end;
  e.commit = txn.commit;
  e.all = all_[t];
  if (txn.unknown) {
    e.barrier = true;
    barriers_.push_back(e);
    return;
  }
  for (const Use& u : uses_[t]) {
    e.use = u;
    RelUses& r = rels_[u.rel];
    if (u.key == kWhole) {
      switch (u.kind) {
        case AccessKind::Schema: r.schema.push_back(e); break;
        case AccessKind::Read: r.reads.push_back(e); break;
        case AccessKind::Append:
          if (r.appends.empty()) appended_.push_back(u.rel);
          r.appends.push_back(e);
          break;
        case AccessKind::Write: r.writes.push_back(e); break;
      }
      continue;
    }
    KeyUses& k = keys_[uint64_t{u.rel} << 32 | u.key];
    (u.kind == AccessKind::Read ? k.reads : k.writes).push_back(e);
    (u.kind == AccessKind::Read ? r.key_reads : r.key_writes).push_back(e);
  }
}

}  // namespace

std::vector<SyncNeed> sync_needs(const std::vector<SyncTxn>& txns, const std::vector<Nanos>& commit_end) {
  Rule rule(commit_end);
  rule.prepare(txns);
  // Events in capture order: a transaction's start sees the commits that
  // ended strictly before it (at one time, starts go first).
  struct Event {
    Nanos at;
    bool is_commit;
    size_t txn;
  };
  std::vector<Event> events;
  events.reserve(txns.size() * 2);
  for (size_t t = 0; t < txns.size(); ++t) {
    events.push_back({txns[t].begin, false, t});
    if (txns[t].commit != kNoCommit) events.push_back({commit_end[txns[t].commit], true, t});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.at != b.at ? a.at < b.at : (!a.is_commit && b.is_commit);
  });
  std::vector<SyncNeed> needs(txns.size());
  for (const Event& e : events) {
    if (e.is_commit) rule.commit(e.txn, txns[e.txn], e.at);
    else needs[e.txn] = rule.need(e.txn, txns[e.txn]);
  }
  return needs;
}

}  // namespace tierlab::replay::detail
