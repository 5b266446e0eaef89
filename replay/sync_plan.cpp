// Which earlier commits each unit of work waits for (replay/sync_plan.h).
#include "replay/sync_plan.h"

#include <algorithm>
#include <cassert>
#include <deque>
#include <limits>
#include <map>
#include <set>
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
// One row key: its earlier uses, the open transactions that use it, and
// the last commit that used it (kNoCommit: none).
struct KeyUses {
  std::vector<Entry> by_kind[kKinds];
  uint32_t refs = 0;
  uint32_t last = kNoCommit;
  std::unordered_map<std::string, uint32_t>::iterator name;  // in key_id
};

}  // namespace

struct SyncPlanner::Impl {
  explicit Impl(const KeyColumns& k) : keys(k) {}

  struct Txn {
    Nanos begin = 0;
    bool unknown = false;
    bool needed = false;         // need() taken
    bool all = false;            // it waits for every commit before it
    std::vector<Use> uses;
    std::multiset<Nanos>::iterator pending;  // in `pending` until needed
  };

  const KeyColumns& keys;
  std::vector<Txn> txns;                  // by handle; reused once closed
  std::vector<uint32_t> free;
  std::multiset<Nanos> pending;           // begins of the transactions not yet needed
  std::unordered_map<std::string, uint32_t> rel_id;
  std::vector<const std::string*> rel_key;  // per relation: its key column, or nullptr
  std::unordered_map<std::string, uint32_t> key_id;  // relation id, NUL, value -> key
  uint32_t next_key = 0;
  std::vector<RelUses> rels;
  std::unordered_map<uint32_t, KeyUses> key_uses;  // by key
  // The keys' uses by commit, in commit order: those of a key whose last
  // commit falls behind the oldest commit a need may still read (see
  // kKeepCommits), and that no open transaction uses, are forgotten.
  std::deque<std::pair<uint32_t, uint32_t>> key_commits;  // commit, key
  uint32_t cutoff = 0;                    // need(): commits below this are in its prefix
  std::vector<uint32_t> appended;        // relations with appends, in the order of their first
  std::vector<Entry> barriers;
  std::vector<Entry> picks;
  size_t scanned = 0;
  // The ends of the commits closed since the oldest pending begin, and how
  // many closed before them.
  std::deque<Nanos> ends;
  uint32_t ends_dropped = 0;
  Nanos last_end = std::numeric_limits<Nanos>::min();

  Nanos horizon() const { return pending.empty() ? std::numeric_limits<Nanos>::max() : *pending.begin(); }
  // The entries of `list` that ended before `t`: its first n.
  static size_t visible(const std::vector<Entry>& list, Nanos t) {
    return static_cast<size_t>(
        std::lower_bound(list.begin(), list.end(), t, [](const Entry& e, Nanos x) { return e.end < x; }) -
        list.begin());
  }
  // Keeps of `list` what a need still to be taken may read (see SyncPlanner).
  void trim(std::vector<Entry>& list) {
    constexpr size_t kKeep = kMaxScan + 1;
    if (list.size() <= 2 * kKeep) return;
    const size_t v = visible(list, horizon());
    if (v <= kKeep) return;
    list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(v - kKeep));
  }
  void push(std::vector<Entry>& list, const Entry& e) {
    list.push_back(e);
    trim(list);
  }

  bool scan(const std::vector<Entry>& list, const Entry& me, bool any_key);
  uint32_t before(Nanos t) const {
    return ends_dropped + static_cast<uint32_t>(std::lower_bound(ends.begin(), ends.end(), t) - ends.begin());
  }
  void forget(uint32_t key) {
    auto it = key_uses.find(key);
    key_id.erase(it->second.name);
    key_uses.erase(it);
  }
  bool covered(const Entry& e) const {
    for (const Entry& p : picks)
      if (e.end < p.begin && (p.all || conflicts(p, e))) return true;
    return false;
  }
};

SyncPlanner::SyncPlanner(const KeyColumns& keys) : impl_(std::make_unique<Impl>(keys)) {}
SyncPlanner::~SyncPlanner() = default;

uint32_t SyncPlanner::open(Nanos begin) {
  Impl& m = *impl_;
  uint32_t h;
  if (!m.free.empty()) {
    h = m.free.back();
    m.free.pop_back();
  } else {
    h = static_cast<uint32_t>(m.txns.size());
    m.txns.emplace_back();
  }
  Impl::Txn& t = m.txns[h];
  t.begin = begin;
  t.unknown = false;
  t.needed = false;
  t.all = false;
  t.uses.clear();
  t.pending = m.pending.insert(begin);
  return h;
}

void SyncPlanner::add_unknown(uint32_t txn) { impl_->txns[txn].unknown = true; }

void SyncPlanner::add(uint32_t txn, const SqlAccess& access) {
  Impl& m = *impl_;
  Impl::Txn& t = m.txns[txn];
  if (access.unknown) t.unknown = true;
  for (const RelAccess& a : access.rels) {
    auto [it, fresh] = m.rel_id.try_emplace(a.relation, static_cast<uint32_t>(m.rel_id.size()));
    if (fresh) {
      m.rels.emplace_back();
      m.rel_key.push_back(m.keys.column(a.relation));
    }
    Use u;
    u.rel = it->second;
    u.kind = a.kind;
    const std::string* column = m.rel_key[u.rel];
    if (column && (a.kind == AccessKind::Read || a.kind == AccessKind::Write || a.kind == AccessKind::Add))
      for (const Equality& e : a.keys)
        if (e.column == *column) {
          std::string k = std::to_string(u.rel) + '\0' + e.value;
          auto [kit, fresh_key] = m.key_id.try_emplace(std::move(k), m.next_key);
          if (fresh_key) m.key_uses[m.next_key++].name = kit;
          u.key = kit->second;
          break;
        }
    // One use per (relation, key): two kinds make a Write, but Schema
    // adds nothing to another kind.
    auto same = std::find_if(t.uses.begin(), t.uses.end(), [&](const Use& o) { return o.rel == u.rel && o.key == u.key; });
    if (same == t.uses.end()) {
      t.uses.push_back(u);
      if (u.key != kWhole) ++m.key_uses[u.key].refs;
    } else if (same->kind != u.kind) {
      if (same->kind == AccessKind::Schema) same->kind = u.kind;
      else if (u.kind != AccessKind::Schema) same->kind = AccessKind::Write;
    }
  }
}

uint32_t SyncPlanner::before(Nanos t) const { return impl_->before(t); }

size_t SyncPlanner::keys() const { return impl_->key_uses.size(); }

size_t SyncPlanner::held() const {
  const Impl& m = *impl_;
  size_t n = m.barriers.size();
  for (const RelUses& r : m.rels)
    for (int k = 0; k < kKinds; ++k) n += r.whole[k].size() + r.keyed[k].size();
  for (const auto& [key, k] : m.key_uses)
    for (int i = 0; i < kKinds; ++i) n += k.by_kind[i].size();
  return n;
}

bool SyncPlanner::Impl::scan(const std::vector<Entry>& list, const Entry& me, bool any_key) {
  // Only the entries that ended before `me` began exist for it.
  const size_t n = visible(list, me.begin);
  // Entries older than `stop` are covered by a pick that conflicts with
  // every entry of the list: the search ends there.
  Nanos stop = 0;
  auto uniform = [&](const Entry& p) {
    if (p.all || p.barrier) return true;
    if (n == 0) return false;
    const Entry& last = list[n - 1];
    if (any_key && p.use.rel == last.use.rel && p.use.key != kWhole) return false;
    return conflicts(p, last);
  };
  for (const Entry& p : picks)
    if (uniform(p)) stop = std::max(stop, p.begin);
  for (size_t i = n; i-- > 0;) {
    const Entry& e = list[i];
    if (e.end < stop || e.commit < cutoff) break;
    if (++scanned > kMaxScan) return false;
    if (!conflicts(me, e) || covered(e)) continue;
    if (picks.size() >= kMaxDeps) return false;
    picks.push_back(e);
    if (uniform(e)) stop = std::max(stop, e.begin);
  }
  return true;
}

SyncNeed SyncPlanner::need(uint32_t txn) {
  Impl& m = *impl_;
  Impl::Txn& t = m.txns[txn];
  assert(!t.needed);
  t.needed = true;
  m.pending.erase(t.pending);
  SyncNeed n;
  if (t.unknown) {
    t.all = true;
    n.prefix = before(t.begin);
    return n;
  }
  m.picks.clear();
  m.scanned = 0;
  // The commits more than kKeepCommits before its begin: in its prefix.
  const uint32_t seen = before(t.begin);
  m.cutoff = seen > kKeepCommits ? seen - static_cast<uint32_t>(kKeepCommits) : 0;
  n.prefix = m.cutoff;
  Entry me;
  me.begin = t.begin;
  me.barrier = true;  // for the barriers: every one conflicts
  bool ok = m.scan(m.barriers, me, false);
  me.barrier = false;
  for (const Use& u : t.uses) {
    if (!ok) break;
    me.use = u;
    const RelUses& r = m.rels[u.rel];
    // Each list whose kind conflicts with this use: those of the whole
    // relation, and those of its key (a use of the whole relation: of
    // every key).
    const KeyUses* k = nullptr;
    if (u.key != kWhole) {
      auto it = m.key_uses.find(u.key);
      if (it != m.key_uses.end()) k = &it->second;
    }
    // Writes first: they cover the most of what comes after.
    static constexpr AccessKind kOrder[] = {AccessKind::Write, AccessKind::Read, AccessKind::Append, AccessKind::Add,
                                            AccessKind::Schema};
    for (AccessKind kk : kOrder) {
      if (!ok) break;
      const int kind = kind_index(kk);
      Entry rep;
      rep.use = Use{u.rel, kWhole, static_cast<AccessKind>(kind)};
      if (conflicts(me, rep)) ok = m.scan(r.whole[kind], me, false);
      rep.use.key = u.key == kWhole ? 0 : u.key;
      if (!ok || !conflicts(me, rep)) continue;
      if (u.key == kWhole) ok = m.scan(r.keyed[kind], me, true);
      else if (k) ok = m.scan(k->by_kind[kind], me, false);
    }
    if (u.kind == AccessKind::Append)
      for (uint32_t other : m.appended)
        if (ok && other != u.rel) ok = m.scan(m.rels[other].whole[kind_index(AccessKind::Append)], me, false);
  }
  if (!ok) {
    t.all = true;
    n.prefix = before(t.begin);
    return n;
  }
  // A pick that a later pick covers (waited for it) need not be waited for.
  for (size_t i = 0; i < m.picks.size(); ++i) {
    bool redundant = false;
    for (size_t j = 0; j < m.picks.size() && !redundant; ++j)
      redundant = j != i && m.picks[i].end < m.picks[j].begin && (m.picks[j].all || conflicts(m.picks[j], m.picks[i]));
    if (!redundant) n.deps.push_back(m.picks[i].commit);
  }
  std::sort(n.deps.begin(), n.deps.end());
  n.deps.erase(std::unique(n.deps.begin(), n.deps.end()), n.deps.end());
  return n;
}

void SyncPlanner::close(uint32_t txn, uint32_t commit, Nanos end) {
  Impl& m = *impl_;
  Impl::Txn& t = m.txns[txn];
  assert(t.needed);
  m.free.push_back(txn);
  // Commits below `floor` no need still to be taken reads.
  auto floor = [&m] {
    const uint32_t seen = m.before(m.horizon());
    return seen > kKeepCommits ? seen - static_cast<uint32_t>(kKeepCommits) : 0;
  };
  for (const Use& u : t.uses)
    if (u.key != kWhole) {
      KeyUses& k = m.key_uses[u.key];
      --k.refs;
      if (commit != kNoCommit && !t.unknown) k.last = commit;
      else if (k.refs == 0 && (k.last == kNoCommit || k.last < floor())) m.forget(u.key);  // by no one now
    }
  if (commit == kNoCommit) return;
  // Invariant: commits close in end order, so every list is in end order
  // (Impl::visible searches it).
  assert(end >= m.last_end);
  m.last_end = end;
  m.ends.push_back(end);
  for (const Nanos h = m.horizon(); !m.ends.empty() && m.ends.front() < h;) {
    m.ends.pop_front();
    ++m.ends_dropped;
  }
  Entry e;
  e.begin = t.begin;
  e.end = end;
  e.commit = commit;
  e.all = t.all;
  if (t.unknown) {
    e.barrier = true;
    m.push(m.barriers, e);
    return;
  }
  for (const Use& u : t.uses) {
    e.use = u;
    RelUses& r = m.rels[u.rel];
    const int kind = kind_index(u.kind);
    if (u.key == kWhole) {
      if (u.kind == AccessKind::Append && r.whole[kind].empty()) m.appended.push_back(u.rel);
      m.push(r.whole[kind], e);
      continue;
    }
    m.push(m.key_uses[u.key].by_kind[kind], e);
    m.push(r.keyed[kind], e);
    m.key_commits.emplace_back(commit, u.key);
  }
  // Keys last used by a commit no need still to be taken reads.
  const uint32_t below = floor();
  while (!m.key_commits.empty() && m.key_commits.front().first < below) {
    const auto [c, key] = m.key_commits.front();
    m.key_commits.pop_front();
    auto it = m.key_uses.find(key);
    if (it != m.key_uses.end() && it->second.last == c && it->second.refs == 0) m.forget(key);
  }
}

void KeyColumns::count(const std::vector<RelAccess>& rels) {
  for (const RelAccess& a : rels) {
    auto& cols = counts_[a.relation];
    for (const Equality& e : a.keys) ++cols[e.column];
  }
}

void KeyColumns::pick() {
  for (const auto& [rel, cols] : counts_) {
    size_t best = 0;
    for (const auto& [col, n] : cols)
      if (n > best) {
        best = n;
        picked_[rel] = col;
      }
  }
  counts_.clear();
}

const std::string* KeyColumns::column(const std::string& relation) const {
  auto it = picked_.find(relation);
  return it == picked_.end() ? nullptr : &it->second;
}

void plan_needs(const SyncSource& src, const std::vector<Nanos>& commit_end,
                const std::function<void(size_t, SyncNeed&&)>& out) {
  const size_t n = src.size();
  KeyColumns keys;
  for (size_t t = 0; t < n; ++t) src.access(t, [&](const SqlAccess& a) { keys.count(a.rels); });
  keys.pick();
  SyncPlanner planner(keys);
  // Transactions open in begin order as the commits close (one that begins
  // when a commit ends opens first). A committing one's need is taken at
  // its commit; another's at the next commit after it opened (the commits
  // between are not before it).
  std::vector<uint32_t> by_begin(n);
  for (size_t t = 0; t < n; ++t) by_begin[t] = static_cast<uint32_t>(t);
  std::stable_sort(by_begin.begin(), by_begin.end(),
                   [&](uint32_t a, uint32_t b) { return src.begin(a) < src.begin(b); });
  std::vector<uint32_t> committer(commit_end.size(), UINT32_MAX);
  for (size_t t = 0; t < n; ++t)
    if (src.commit(t) != kNoCommit) committer[src.commit(t)] = static_cast<uint32_t>(t);
  std::vector<uint32_t> handle(n, UINT32_MAX);
  std::vector<uint32_t> readers;  // opened, committing nothing, need not taken
  auto open = [&](uint32_t t) {
    handle[t] = planner.open(src.begin(t));
    src.access(t, [&](const SqlAccess& a) { planner.add(handle[t], a); });
    if (src.commit(t) == kNoCommit) readers.push_back(t);
  };
  auto take_readers = [&] {
    for (uint32_t t : readers) {
      out(t, planner.need(handle[t]));
      planner.close(handle[t], kNoCommit, 0);
    }
    readers.clear();
  };
  size_t next = 0;
  for (uint32_t c = 0; c < commit_end.size(); ++c) {
    take_readers();
    while (next < n && src.begin(by_begin[next]) <= commit_end[c]) open(by_begin[next++]);
    const uint32_t t = committer[c];
    if (t == UINT32_MAX) continue;
    if (handle[t] == UINT32_MAX) open(t);  // a commit stamped before its own begin
    out(t, planner.need(handle[t]));
    planner.close(handle[t], c, commit_end[c]);
  }
  take_readers();
  for (; next < n; ++next) {
    if (handle[by_begin[next]] != UINT32_MAX) continue;
    open(by_begin[next]);
    take_readers();
  }
}

std::vector<SyncNeed> sync_needs(const std::vector<SyncTxn>& txns, const std::vector<Nanos>& commit_end) {
  struct Source : SyncSource {
    const std::vector<SyncTxn>& v;
    explicit Source(const std::vector<SyncTxn>& x) : v(x) {}
    size_t size() const override { return v.size(); }
    Nanos begin(size_t t) const override { return v[t].begin; }
    uint32_t commit(size_t t) const override { return v[t].commit; }
    void access(size_t t, const std::function<void(const SqlAccess&)>& f) const override {
      SqlAccess a;
      a.unknown = v[t].unknown;
      a.rels = v[t].rels;
      f(a);
    }
  } src(txns);
  std::vector<SyncNeed> needs(txns.size());
  plan_needs(src, commit_end, [&](size_t t, SyncNeed&& n) { needs[t] = std::move(n); });
  return needs;
}

}  // namespace tierlab::replay::detail
