// Commit order (replay --sync commit): which statements change state, the
// plan's commit points and the counts units wait for, and the lock-free
// done prefix the workers share.
#include "replay/plan.h"
#include "replay/replay.h"
#include "replay/sync.h"

#include <catch2/catch.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;

namespace {

constexpr Nanos kSyncMs = 1000000;

struct Builder {
  PlanBuilder b;
  void add(Nanos ts, uint64_t s, trace::Body body) { b.add(trace::Record{ts, s, std::move(body)}); }
  // A simple Query answered `tag` and ReadyForQuery `ready` 1 ms later.
  void query(Nanos ts, uint64_t s, const char* sql, const char* tag, char ready = 'I') {
    add(ts, s, trace::Query{sql});
    add(ts + kSyncMs, s, trace::Result{tag, false, 0});
    add(ts + kSyncMs, s, trace::Ready{ready});
  }
};

const Unit& unit(const Plan& p, uint32_t session, uint32_t k) {
  return p.units[p.session_units[p.sessions[session].first_unit + k]];
}

std::vector<uint32_t> deps(const Plan& p, const Unit& u) {
  return std::vector<uint32_t>(p.sync_deps.begin() + u.sync_dep, p.sync_deps.begin() + u.sync_dep + u.n_sync_deps);
}

}  // namespace

TEST_CASE("changes_state: writes, DDL, sequences and NOTIFY change state, reads and transaction control do not",
          "[replay][sync]") {
  CHECK(changes_state("INSERT", "insert into t values(?)", false));
  CHECK(changes_state("INSERT 0 1", "insert into t values(?)", false));  // a whole tag reads the same
  CHECK(changes_state("UPDATE", "update t set a = ?", false));
  CHECK(changes_state("DELETE", "delete from t", false));
  CHECK(changes_state("MERGE", "merge into t using s on true when matched then delete", false));
  CHECK(changes_state("CREATE TABLE", "create table t(a int)", false));
  CHECK(changes_state("DROP TABLE", "drop table t", false));
  CHECK(changes_state("ALTER TABLE", "alter table t add b int", false));
  CHECK(changes_state("TRUNCATE TABLE", "truncate t", false));
  CHECK(changes_state("CREATE SEQUENCE", "create sequence s", false));
  CHECK(changes_state("NOTIFY", "notify ch", false));
  CHECK(changes_state("LISTEN", "listen ch", false));
  CHECK(changes_state("CALL", "call p()", false));
  CHECK(changes_state("DO", "do ?", false));
  CHECK(changes_state("COPY", "copy t from stdin", true));
  CHECK(changes_state("COPY", "copy t from ?", false));  // a server-side file
  CHECK_FALSE(changes_state("COPY", "copy t to stdout", false));
  CHECK_FALSE(changes_state("COPY", "copy(select a from t) to stdout", false));
  // SELECT: a plain one reads; one that moves a sequence, notifies, fills
  // a table (SELECT INTO, CREATE TABLE AS answer SELECT) or has a WITH
  // (that may hold an INSERT) changes state.
  CHECK_FALSE(changes_state("SELECT", "select abalance from pgbench_accounts where aid = ?", false));
  CHECK_FALSE(changes_state("SELECT", "select count(*) from t", false));
  CHECK_FALSE(changes_state("SELECT", "values(?)", false));
  CHECK(changes_state("SELECT", "select nextval(?)", false));
  CHECK(changes_state("SELECT", "select setval(?, ?)", false));
  CHECK(changes_state("SELECT", "select pg_notify(?, ?)", false));
  CHECK(changes_state("SELECT", "select * into t2 from t", false));
  CHECK(changes_state("SELECT", "create table t2 as select * from t", false));
  CHECK(changes_state("SELECT", "with x as(insert into t values(?) returning a) select * from x", false));
  for (const char* tag : {"BEGIN", "START TRANSACTION", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET",
                          "RESET", "SHOW", "FETCH", "MOVE", "EXPLAIN", "DISCARD ALL", "PREPARE", "DEALLOCATE",
                          "DECLARE CURSOR", "CLOSE CURSOR", "LOCK TABLE"}) {
    INFO(tag);
    CHECK_FALSE(changes_state(tag, "", false));
  }
  CHECK_FALSE(changes_state("", "", false));
}

TEST_CASE("plan: commit points in capture order, and what each transaction's first unit waits for",
          "[replay][sync]") {
  Builder t;
  // Session 1: CREATE (autocommit, ends at 11 ms), then a read-only
  // transaction (not a commit point), then an INSERT transaction
  // committed at 61 ms.
  t.add(0, 1, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(0, 1, trace::Ready{'I'});
  t.query(10 * kSyncMs, 1, "CREATE TABLE t(a int)", "CREATE TABLE");
  t.query(20 * kSyncMs, 1, "BEGIN", "BEGIN", 'T');
  t.query(21 * kSyncMs, 1, "SELECT * FROM t", "SELECT", 'T');
  t.query(22 * kSyncMs, 1, "COMMIT", "COMMIT");
  t.query(40 * kSyncMs, 1, "BEGIN", "BEGIN", 'T');
  t.query(50 * kSyncMs, 1, "INSERT INTO t VALUES (1)", "INSERT 0 1", 'T');
  t.query(60 * kSyncMs, 1, "COMMIT", "COMMIT");
  t.add(70 * kSyncMs, 1, trace::SessionEnd{});
  // Session 2 starts after the CREATE committed: its start and first unit
  // wait for 1; a SELECT sent at 30 ms (after the CREATE, before the
  // INSERT's commit) waits for 1; the transaction begun at 55 ms, before
  // the INSERT committed, waits for 1 too, and its statements inside it
  // for nothing; the nextval at 80 ms waits for 2 and is a commit point.
  t.add(15 * kSyncMs, 2, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(15 * kSyncMs, 2, trace::Ready{'I'});
  t.query(30 * kSyncMs, 2, "SELECT count(*) FROM t", "SELECT");
  t.query(55 * kSyncMs, 2, "BEGIN", "BEGIN", 'T');
  t.query(65 * kSyncMs, 2, "SELECT count(*) FROM t", "SELECT", 'T');
  t.query(66 * kSyncMs, 2, "COMMIT", "COMMIT");
  t.query(80 * kSyncMs, 2, "SELECT nextval('s')", "SELECT");
  t.add(90 * kSyncMs, 2, trace::SessionEnd{});
  // Session 3: a failed INSERT in autocommit changes nothing.
  t.add(5 * kSyncMs, 3, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(5 * kSyncMs, 3, trace::Ready{'I'});
  t.add(6 * kSyncMs, 3, trace::Query{"INSERT INTO t VALUES (0)"});
  t.add(7 * kSyncMs, 3, trace::Error{"42P01", "ERROR", "relation \"t\" does not exist"});
  t.add(7 * kSyncMs, 3, trace::Ready{'I'});
  t.add(8 * kSyncMs, 3, trace::SessionEnd{});
  auto p = t.b.finish();
  REQUIRE(p->sessions.size() == 3);
  CHECK(p->commits == 3);
  CHECK(p->summary.commit_points == 3);
  const Plan& plan = *p;
  // Session 1 (index 0): CREATE is commit 0, the INSERT's COMMIT commit 1.
  CHECK(unit(plan, 0, 0).commit == 0);
  CHECK(unit(plan, 0, 3).commit == kNoCommit);  // read-only COMMIT
  CHECK(unit(plan, 0, 5).commit == kNoCommit);  // INSERT inside the transaction
  CHECK(unit(plan, 0, 6).commit == 1);
  // --sync all: every commit point before the unit was sent.
  CHECK(unit(plan, 0, 0).sync_all == 0);
  CHECK(unit(plan, 0, 1).sync_all == 1);  // BEGIN at 20 ms: after the CREATE
  CHECK(unit(plan, 0, 2).sync_all == 0);  // inside a transaction: no wait
  CHECK(plan.sessions[1].sync_all == 1);
  CHECK(unit(plan, 1, 0).sync_all == 1);
  CHECK(unit(plan, 1, 1).sync_all == 1);
  CHECK(unit(plan, 1, 2).sync_all == 0);
  CHECK(unit(plan, 1, 3).sync_all == 0);
  CHECK(unit(plan, 1, 4).sync_all == 2);
  CHECK(unit(plan, 1, 4).commit == 2);
  // --sync commit: of those, the ones that touched what the unit touches.
  // Every use of t after the CREATE waits for it; the nextval of s, for
  // nothing (neither it nor the INSERT's commit touched s).
  CHECK(deps(plan, unit(plan, 0, 0)) == std::vector<uint32_t>{});
  CHECK(deps(plan, unit(plan, 0, 1)) == std::vector<uint32_t>{0});
  CHECK(deps(plan, unit(plan, 0, 4)) == std::vector<uint32_t>{0});
  CHECK(deps(plan, unit(plan, 1, 0)) == std::vector<uint32_t>{0});
  CHECK(deps(plan, unit(plan, 1, 1)) == std::vector<uint32_t>{0});  // the INSERT committed after it began
  CHECK(deps(plan, unit(plan, 1, 4)) == std::vector<uint32_t>{});
  for (uint32_t k = 0; k < 5; ++k) CHECK(unit(plan, 1, k).sync_need == 0);
  // Session 3 (index 2): started before any commit; its failed INSERT is
  // no commit point (and, failed, waits for every commit before it: none).
  CHECK(plan.sessions[2].sync_all == 0);
  CHECK(unit(plan, 2, 0).commit == kNoCommit);
  CHECK(unit(plan, 2, 0).sync_need == 0);
}

TEST_CASE("plan: a statement that failed at capture waits for every commit before it, Execute binds its parameters",
          "[replay][sync]") {
  Builder t;
  t.add(0, 1, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(0, 1, trace::Ready{'I'});
  t.query(10 * kSyncMs, 1, "UPDATE a SET v = 1 WHERE k = 1", "UPDATE 1");  // commit 0
  t.query(20 * kSyncMs, 1, "UPDATE b SET v = 1 WHERE k = 1", "UPDATE 1");  // commit 1
  t.add(100 * kSyncMs, 1, trace::SessionEnd{});
  t.add(0, 2, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(0, 2, trace::Ready{'I'});
  // A duplicate key on a: it waits for both commits, though the text names a only.
  t.add(30 * kSyncMs, 2, trace::Query{"INSERT INTO a VALUES (1)"});
  t.add(31 * kSyncMs, 2, trace::Error{"23505", "ERROR", "duplicate key"});
  t.add(31 * kSyncMs, 2, trace::Ready{'I'});
  // Prepared and executed with k = 1, then with k = 2: the first waits
  // for the UPDATE of b's row 1, the second for nothing.
  static const trace::Param one[] = {{0, false, "1"}};
  static const trace::Param two[] = {{0, false, "2"}};
  t.add(40 * kSyncMs, 2, trace::Parse{"s", "SELECT v FROM b WHERE k = $1", {}});
  t.add(40 * kSyncMs, 2, trace::Bind{"", "s", one, {}});
  t.add(40 * kSyncMs, 2, trace::Execute{"", 0});
  t.add(40 * kSyncMs, 2, trace::Sync{});
  t.add(41 * kSyncMs, 2, trace::Result{"SELECT 1", true, 1});
  t.add(41 * kSyncMs, 2, trace::Ready{'I'});
  t.add(50 * kSyncMs, 2, trace::Bind{"", "s", two, {}});
  t.add(50 * kSyncMs, 2, trace::Execute{"", 0});
  t.add(50 * kSyncMs, 2, trace::Sync{});
  t.add(51 * kSyncMs, 2, trace::Result{"SELECT 0", true, 0});
  t.add(51 * kSyncMs, 2, trace::Ready{'I'});
  t.add(100 * kSyncMs, 2, trace::SessionEnd{});
  auto p = t.b.finish();
  const Plan& plan = *p;
  REQUIRE(plan.commits == 2);
  CHECK(unit(plan, 1, 0).sync_need == 2);
  CHECK(deps(plan, unit(plan, 1, 0)).empty());
  CHECK(unit(plan, 1, 1).sync_need == 0);
  CHECK(deps(plan, unit(plan, 1, 1)) == std::vector<uint32_t>{1});
  CHECK(deps(plan, unit(plan, 1, 2)).empty());
}

TEST_CASE("commit order: the done prefix grows only over completed commits, in any completion order",
          "[replay][sync]") {
  detail::CommitOrder o(5, 1);
  CHECK(o.done() == 0);
  CHECK(o.complete(2) == 0);
  CHECK(o.complete(1) == 0);
  CHECK(o.complete(0) == 3);
  CHECK(o.complete(0) == 3);  // twice: no effect
  CHECK(o.complete(4) == 3);
  CHECK(o.complete(3) == 5);
  CHECK(o.done() == 5);
}

TEST_CASE("commit order: threads completing commits out of order end with the whole prefix", "[replay][sync]") {
  constexpr uint32_t kCommits = 200000;
  constexpr int kThreads = 4;
  for (int round = 0; round < 3; ++round) {
    detail::CommitOrder o(kCommits, kThreads);
    std::vector<uint32_t> ids(kCommits);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(round));
    std::vector<std::thread> th;
    for (int t = 0; t < kThreads; ++t)
      th.emplace_back([&, t] {
        for (uint32_t i = t; i < kCommits; i += kThreads) o.complete(ids[i]);
      });
    for (auto& x : th) x.join();
    CHECK(o.done() == kCommits);
  }
}

TEST_CASE("commit order: a waiter is signalled once its need is reached, not before, and once until it reads",
          "[replay][sync]") {
  detail::CommitOrder o(3, 2);
  detail::Waiter& w = o.waiter(1);
  auto readable = [&] {
    pollfd pf{w.fd, POLLIN, 0};
    return ::poll(&pf, 1, 0) == 1;
  };
  w.need.store(2);
  o.wake(o.complete(0), 0);
  CHECK_FALSE(readable());
  CHECK_FALSE(w.signalled.load());
  o.wake(o.complete(1), 0);
  CHECK(readable());
  CHECK(w.signalled.load());
  o.wake(o.complete(2), 0);  // signalled already: no second write
  uint64_t v = 0;
  REQUIRE(::read(w.fd, &v, sizeof v) == sizeof v);
  CHECK(v == 1);
  // The waker never signals itself.
  detail::Waiter& self = o.waiter(0);
  self.need.store(0);
  o.wake(3, 0);
  CHECK_FALSE(self.signalled.load());
}
