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

// `commit_end[c]`: commit point c's captured ReadyForQuery time, ascending
// (the Plan's numbering); every commit point is the `commit` of one of
// `txns`. A commit counts as before a transaction when it ended strictly
// before the transaction began. Returns one need per transaction.
std::vector<SyncNeed> sync_needs(const std::vector<SyncTxn>& txns, const std::vector<Nanos>& commit_end);

}  // namespace tierlab::replay::detail
