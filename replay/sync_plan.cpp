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

constexpr int kKinds = 5;  // AccessKind's values
int kind_index(AccessKind k) { return static_cast<int>(k); }

// The earlier uses of one relation, by kind; each list in commit order.
struct RelUses {
  std::vector<Entry> whole[kKinds];  // of the whole relation
  std::vector<Entry> keyed[kKinds];  // by a key, all keys
};
struct KeyUses {
  std::vector<Entry> by_kind[kKinds];
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
      if (a.kind == AccessKind::Read || a.kind == AccessKind::Write || a.kind == AccessKind::Add)
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
    // Each list whose kind conflicts with this use: those of the whole
    // relation, and those of its key (a use of the whole relation: of
    // every key).
    const KeyUses* k = nullptr;
    if (u.key != kWhole) {
      auto it = keys_.find(uint64_t{u.rel} << 32 | u.key);
      if (it != keys_.end()) k = &it->second;
    }
    // Writes first: they cover the most of what comes after.
    static constexpr AccessKind kOrder[] = {AccessKind::Write, AccessKind::Read, AccessKind::Append, AccessKind::Add,
                                            AccessKind::Schema};
    for (AccessKind kk : kOrder) {
      if (!ok) break;
      const int kind = kind_index(kk);
      Entry rep;
      rep.use = Use{u.rel, kWhole, static_cast<AccessKind>(kind)};
      if (conflicts(me, rep)) ok = scan(r.whole[kind], me, false);
      rep.use.key = u.key == kWhole ? 0 : u.key;
      if (!ok || !conflicts(me, rep)) continue;
      if (u.key == kWhole) ok = scan(r.keyed[kind], me, true);
      else if (k) ok = scan(k->by_kind[kind], me, false);
    }
    if (u.kind == AccessKind::Append)
      for (uint32_t other : appended_)
        if (ok && other != u.rel) ok = scan(rels_[other].whole[kind_index(AccessKind::Append)], me, false);
  }
  if (!ok) {
    all_[t] = true;
    n.prefix = before(txn.begin);
    return n;
  }
  // A pick that a later pick covers (waited for it) need not be waited for.
  for (size_t i = 0; i < picks_.size(); ++i) {
    bool redundant = false;
    for (size_t j = 0; j < picks_.size() && !redundant; ++j)
      redundant = j != i && picks_[i].end < picks_[j].begin && (picks_[j].all || conflicts(picks_[j], picks_[i]));
    if (!redundant) n.deps.push_back(picks_[i].commit);
  }
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
    const int kind = kind_index(u.kind);
    if (u.key == kWhole) {
      if (u.kind == AccessKind::Append && r.whole[kind].empty()) appended_.push_back(u.rel);
      r.whole[kind].push_back(e);
      continue;
    }
    keys_[uint64_t{u.rel} << 32 | u.key].by_kind[kind].push_back(e);
    r.keyed[kind].push_back(e);
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
