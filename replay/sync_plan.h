// Private to replay/: which earlier commits each unit of work waits for
// under replay --sync commit (Plan::sync_deps, Unit::sync_need).
//
// The rule: a transaction (or an autocommit statement) waits for the
// commit points that completed at capture before it began AND that could
// conflict with it: an earlier commit that used a relation it uses, in a
// way where the order matters (sync_sql.h, AccessKind), on the same row key
// or on the whole relation. An INSERT also waits for earlier INSERTs into
// other relations (a foreign key may need their rows). A transaction with a
// statement the text does not place (unknown), or with an error at capture
// (it may come of another session's work, as a duplicate key does), waits
// for every commit before it, and every later one waits for it.
//
// Waits are transitive: a unit need not wait for a commit that another
// commit it waits for waited for itself (it began after that one's
// commit, and the two conflict). So each unit waits for few commits; one
// whose list would still be long (over kMaxDeps, or whose search reads
// more than kMaxScan earlier uses of a relation) waits for every commit
// before it instead, which is never wrong.
#pragma once

#include "replay/plan.h"
#include "replay/sync_sql.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tierlab::replay::detail {

struct SyncTxn {
  Nanos begin = 0;               // captured send of its first unit
  uint32_t commit = kNoCommit;   // its commit point, or none (it changed nothing)
  bool unknown = false;          // an unknown statement, or an error at capture
  std::vector<RelAccess> rels;   // what its statements touch (read_access)
};

struct SyncNeed {
  uint32_t prefix = 0;           // commit points 0..prefix-1 (all before it)
  std::vector<uint32_t> deps;    // and these, ascending
};

inline constexpr size_t kMaxDeps = 64;
inline constexpr size_t kMaxScan = 1024;
// A transaction also waits for every commit point more than kKeepCommits
// before it began (SyncNeed::prefix): in a replay that keeps up, long
// done. So the rule need not keep what a row key's commits did once that
// many commits have closed since (and no open transaction uses it): the
// keys held do not grow with the trace.
inline constexpr size_t kKeepCommits = 16384;

// Per relation, the one column whose equalities are its row keys: the one
// most used (`column = value` in a WHERE, Equality) over every transaction
// the plan has, counted in a pass of their own before any need is taken.
// Its memory grows with the relations and their columns, not with the
// transactions.
class KeyColumns {
 public:
  // A transaction's uses (or a unit's: counts add).
  void count(const std::vector<RelAccess>& rels);
  // Picks each relation's column; count() no more after it.
  void pick();
  // The relation's key column, nullptr when it has none.
  const std::string* column(const std::string& relation) const;

 private:
  std::unordered_map<std::string, std::map<std::string, size_t>> counts_;
  std::unordered_map<std::string, std::string> picked_;
};

// The rule, taken one transaction at a time in capture order, holding only
// what later needs can read: a transaction's need may be taken at any time
// between its begin and its commit (its uses are known only at its end,
// when the trace is read as it goes), from the commits that ended strictly
// before it began; the earlier uses kept per list are the last kMaxScan + 1
// before the begin of the oldest transaction whose need is still to be
// taken (a search reads no more), and those since.
//
// Commits are closed in the order of their numbering (non-decreasing end);
// a transaction is opened before any commit that ended at or after its
// begin is closed, and its need is taken before it is closed, once every
// commit that ended before its begin was closed.
class SyncPlanner {
 public:
  explicit SyncPlanner(const KeyColumns& keys);
  ~SyncPlanner();
  SyncPlanner(const SyncPlanner&) = delete;
  SyncPlanner& operator=(const SyncPlanner&) = delete;

  // A transaction began at `begin`; the handle names it until close().
  uint32_t open(Nanos begin);
  // What it touches: a statement's, or a unit's, read_access, added to what
  // it touched before. `unknown` makes it a barrier.
  void add(uint32_t txn, const SqlAccess& access);
  void add_unknown(uint32_t txn);
  // Its need (once), from the commits closed so far that ended before its
  // begin.
  SyncNeed need(uint32_t txn);
  // It ended: commit point `commit` at `end`, or kNoCommit (it changed
  // nothing). Its need was taken.
  void close(uint32_t txn, uint32_t commit, Nanos end);
  // The commit points closed that ended strictly before `t`; `t` no earlier
  // than the begin of a transaction whose need is still to be taken.
  uint32_t before(Nanos t) const;
  // Earlier uses held in all lists, and the row keys known (for tests of
  // the bound).
  size_t held() const;
  size_t keys() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Transactions as the planner reads them (sync_needs, and a loaded plan's
// units without a copy of what they touch): `access` gives what
// transaction t touches, one call of `f` per unit (or statement), in order;
// it is called twice per transaction (the key columns' pass, then the
// rule's), so that nothing of it need be held.
struct SyncSource {
  virtual ~SyncSource() = default;
  virtual size_t size() const = 0;
  virtual Nanos begin(size_t t) const = 0;
  virtual uint32_t commit(size_t t) const = 0;  // kNoCommit: none
  virtual void access(size_t t, const std::function<void(const SqlAccess&)>& f) const = 0;
};

// The need of each transaction of `src`, handed to `out` (transaction,
// need) in the order they are taken, each as late as SyncPlanner allows
// (a committing transaction's at its commit), as a plan read as it goes
// takes them. `commit_end` as sync_needs has it.
void plan_needs(const SyncSource& src, const std::vector<Nanos>& commit_end,
                const std::function<void(size_t, SyncNeed&&)>& out);

// `commit_end[c]`: commit point c's captured ReadyForQuery time, ascending
// (the Plan's numbering); every commit point is the `commit` of one of
// `txns`. A commit counts as before a transaction when it ended strictly
// before the transaction began. Returns one need per transaction, each
// taken as late as SyncPlanner allows (a committing transaction's at its
// commit), as a plan read as it goes takes them.
std::vector<SyncNeed> sync_needs(const std::vector<SyncTxn>& txns, const std::vector<Nanos>& commit_end);

}  // namespace tierlab::replay::detail
