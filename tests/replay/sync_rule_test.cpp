// replay --sync commit's dependency rule, as pure logic: what a statement
// touches by its text (replay/sync_sql.h), and which earlier commits a unit
// of work waits for (replay/sync_plan.h).
#include "replay/sync.h"
#include "replay/sync_plan.h"
#include "replay/sync_sql.h"

#include <catch2/catch.hpp>

#include <poll.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;
using namespace tierlab::replay::detail;

namespace {

std::string show(const SqlAccess& a) {
  std::string out = a.unknown ? "unknown" : "";
  for (const RelAccess& r : a.rels) {
    static const char* const kKind[] = {"schema", "read", "append", "write", "add"};
    if (!out.empty()) out += "; ";
    out += std::string(kKind[static_cast<int>(r.kind)]) + " " + r.relation;
    for (const Equality& e : r.keys) out += " " + e.column + "=" + e.value;
  }
  return out;
}

std::string show(std::string_view sql, std::vector<ParamValue> params = {}) {
  return show(read_access(sql, params));
}

constexpr Nanos kOneMs = 1000000;

}  // namespace

TEST_CASE("sync sql: pgbench's statements touch their relations, by row where the WHERE names one",
          "[replay][sync]") {
  CHECK(show("UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2;", {"-17", "4711"}) ==
        "add pgbench_accounts aid=4711");
  CHECK(show("SELECT abalance FROM pgbench_accounts WHERE aid = $1", {"0042"}) == "read pgbench_accounts aid=42");
  CHECK(show("UPDATE pgbench_branches SET bbalance = bbalance + 5 WHERE bid = 3") == "add pgbench_branches bid=3");
  // Increments (Add) only when every SET adds a constant to its own column.
  CHECK(show("UPDATE t SET a = a + 1, \"B\" = \"B\" - $1::int WHERE k = 1", {"2"}) == "add t k=1");
  CHECK(show("UPDATE t SET a = a + b WHERE k = 1") == "write t k=1");
  CHECK(show("UPDATE t SET a = a + 1 WHERE k = 1 RETURNING a") == "write t k=1");
  CHECK(show("UPDATE t SET a = 1 + a WHERE k = 1") == "write t k=1");
  CHECK(show("UPDATE t SET a = a * 2 WHERE k = 1") == "write t k=1");
  CHECK(show("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
             {"1", "2", "3", "4"}) == "append pgbench_history");
  CHECK(show("BEGIN").empty());
  CHECK(show("END;").empty());
  CHECK(show("select 1").empty());
  CHECK(show("SELECT pg_sleep(0.5)").empty());
  // No key: a NULL or binary parameter, an OR, an expression, a join.
  CHECK(show("SELECT * FROM t WHERE k = $1", {std::nullopt}) == "read t");
  CHECK(show("SELECT * FROM t WHERE k = 1 OR k = 2") == "read t");
  CHECK(show("SELECT * FROM t WHERE k = 1 + j") == "read t");
  CHECK(show("SELECT * FROM t JOIN u ON t.a = u.a WHERE t.k = 1") == "read t; read u");
  CHECK(show("SELECT * FROM s.t x, u WHERE k = 1") == "read t; read u");
  // Keys: literals, casts, qualified columns, ANDs, a subquery's relation.
  CHECK(show("select * from t where a = 'x''y' and \"B\" = 7::bigint and c > 2") == "read t a=x'y B=7");
  CHECK(show("SELECT * FROM t WHERE t.k = -1 AND x IN (SELECT x FROM u)") == "read t k=-1; read u");
  CHECK(show("SELECT * FROM t WHERE k = 1 FOR UPDATE") == "write t k=1");
  // UPDATE that moves the key, or with FROM: no key.
  CHECK(show("UPDATE t SET k = 2 WHERE k = 1") == "write t");
  CHECK(show("UPDATE t SET v = u.v FROM u WHERE t.k = 1") == "write t; read u");
  CHECK(show("DELETE FROM t WHERE k = $1 RETURNING *", {"9"}) == "write t k=9");
  // INSERTs: an append, but a write with ON CONFLICT or RETURNING.
  CHECK(show("INSERT INTO t SELECT * FROM u WHERE k = 1") == "append t; read u");
  CHECK(show("INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING") == "write t");
  CHECK(show("INSERT INTO t VALUES (1) RETURNING id") == "write t");
  CHECK(show("INSERT INTO sync_seqlog SELECT 's1', nextval('sync_seq')") == "append sync_seqlog; write sync_seq");
  CHECK(show("COPY t (a, b) FROM STDIN") == "append t");
  CHECK(show("COPY t TO STDOUT") == "read t");
  // DDL: the relations it creates, changes, drops and references.
  CHECK(show("CREATE TABLE IF NOT EXISTS c (id int REFERENCES p (id))") == "write c; write p");
  CHECK(show("CREATE UNIQUE INDEX CONCURRENTLY i ON ONLY t (a)") == "write i; write t");
  CHECK(show("DROP TABLE IF EXISTS a, b CASCADE") == "write a; write b");
  CHECK(show("ALTER TABLE ONLY t ADD COLUMN x int") == "write t");
  CHECK(show("TRUNCATE TABLE a, public.b") == "write a; write b");
  CHECK(show("LOCK TABLE t IN EXCLUSIVE MODE") == "write t");
  // Several statements in one Query.
  CHECK(show("BEGIN; UPDATE t SET v = 1 WHERE k = 2; COMMIT") == "write t k=2");
  // What the text cannot place.
  for (const char* sql : {"DO $$ BEGIN PERFORM 1; END $$", "CALL p()", "CREATE FUNCTION f() ...",
                          "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "SELECT lastval()",
                          "SELECT pg_notify('c', 'x')", "NOTIFY c", "LISTEN c", "SELECT * INTO t2 FROM t",
                          "CREATE VIEW v AS SELECT 1", "SELECT nextval($1)", "EXPLAIN ANALYZE DELETE FROM t",
                          "COMMIT PREPARED 'x'", "GRANT SELECT ON t TO u", "EXECUTE s(1)"}) {
    INFO(sql);
    CHECK(read_access(sql).unknown);
  }
  // A Parse names relations (Schema) and runs nothing.
  CHECK(show(read_access("UPDATE t SET v = 1 WHERE k = $1", {}, true)) == "schema t");
  CHECK(show(read_access("DO $$ $$", {}, true)).empty());
  CHECK(key_value("+007") == "7");
  CHECK(key_value("-0") == "0");
  CHECK(key_value("7.0") == "7.0");
}

namespace {

// A transaction for the rule: begun at `begin` ms, committed as point
// `commit` (or none), touching what `sql` touches.
SyncTxn txn(Nanos begin, uint32_t commit, std::vector<std::string> sql) {
  SyncTxn t;
  t.begin = begin * kOneMs;
  t.commit = commit;
  for (const std::string& s : sql) {
    SqlAccess a = read_access(s);
    t.unknown = t.unknown || a.unknown;
    for (RelAccess& r : a.rels) t.rels.push_back(std::move(r));
  }
  return t;
}

std::vector<Nanos> ends(std::vector<Nanos> ms) {
  for (Nanos& t : ms) t *= kOneMs;
  return ms;
}

std::string tpcb_sql(int aid, int tid, int bid) {
  return "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = " + std::to_string(aid) +
         "; SELECT abalance FROM pgbench_accounts WHERE aid = " + std::to_string(aid) +
         "; UPDATE pgbench_tellers SET tbalance = tbalance + 1 WHERE tid = " + std::to_string(tid) +
         "; UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = " + std::to_string(bid) +
         "; INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 2, 3, 4, now())";
}

}  // namespace

TEST_CASE("sync rule: a transaction waits only for earlier commits that touched its rows or relations",
          "[replay][sync]") {
  SECTION("tpcb-like: increments and history inserts do not order; a read of the row waits for its increments") {
    // Commits 0-3 (ends 10, 20, 30, 40 ms), each begun after the one before
    // committed; 0, 1 and 3 on branch 1, 2 on branch 2 and account 1.
    std::vector<SyncTxn> t = {txn(1, 0, {tpcb_sql(1, 1, 1)}), txn(11, 1, {tpcb_sql(2, 2, 1)}),
                              txn(21, 2, {tpcb_sql(1, 3, 2)}), txn(31, 3, {tpcb_sql(4, 4, 1)}),
                              txn(41, kNoCommit, {"SELECT bbalance FROM pgbench_branches WHERE bid = 1"})};
    auto n = sync_needs(t, ends({10, 20, 30, 40}));
    CHECK(n[0].deps.empty());
    CHECK(n[1].deps.empty());
    CHECK(n[2].deps == std::vector<uint32_t>{0});  // account 1: its balance read back
    CHECK(n[3].deps.empty());
    CHECK(n[4].deps == std::vector<uint32_t>{0, 1, 3});
    for (const SyncNeed& x : n) CHECK(x.prefix == 0);
  }
  SECTION("two writers of one row that overlapped at capture: a later one waits for both") {
    std::vector<SyncTxn> t = {txn(1, 0, {"UPDATE t SET v = v + 1 WHERE k = 1"}),
                              txn(5, 1, {"UPDATE t SET v = v + 2 WHERE k = 1"}),
                              txn(30, kNoCommit, {"SELECT v FROM t WHERE k = 1"})};
    auto n = sync_needs(t, ends({10, 20}));
    CHECK(n[1].deps.empty());  // began before 0 committed
    CHECK(n[2].deps == std::vector<uint32_t>{0, 1});
  }
  SECTION("a read of the whole relation waits for every insert and row write not already waited for") {
    std::vector<SyncTxn> t = {txn(1, 0, {"INSERT INTO h VALUES (1)"}), txn(15, 1, {"INSERT INTO h VALUES (2)"}),
                              txn(3, 2, {"UPDATE h SET v = 0 WHERE id = 7"}), txn(30, kNoCommit, {"SELECT count(*) FROM h"}),
                              txn(31, 3, {"DELETE FROM h"}), txn(50, kNoCommit, {"SELECT count(*) FROM h"})};
    auto n = sync_needs(t, ends({10, 20, 25, 40}));
    CHECK(n[1].deps.empty());  // inserts into one relation do not order
    CHECK(n[2].deps.empty());  // began before any commit
    CHECK(n[3].deps == std::vector<uint32_t>{0, 1, 2});
    CHECK(n[4].deps == std::vector<uint32_t>{0, 1, 2});
    CHECK(n[5].deps == std::vector<uint32_t>{3});  // the DELETE waited for the rest
  }
  SECTION("an INSERT waits for earlier INSERTs into other relations (a foreign key may need them)") {
    std::vector<SyncTxn> t = {txn(1, 0, {"INSERT INTO parent VALUES (1)"}),
                              txn(20, 1, {"INSERT INTO child VALUES (1, 1)"}),
                              txn(40, 2, {"INSERT INTO parent VALUES (2)"})};
    auto n = sync_needs(t, ends({10, 30, 50}));
    CHECK(n[1].deps == std::vector<uint32_t>{0});
    CHECK(n[2].deps == std::vector<uint32_t>{1});  // the child insert, which waited for 0
  }
  SECTION("DDL orders every use of its relation; a prepared statement waits for it too") {
    std::vector<SyncTxn> t = {txn(1, 0, {"CREATE TABLE t (k int)"}), txn(20, 1, {"INSERT INTO t VALUES (1)"}),
                              txn(20, kNoCommit, {"SELECT * FROM u"})};
    SyncTxn parse;
    parse.begin = 21 * kOneMs;
    parse.rels = read_access("SELECT * FROM t WHERE k = $1", {}, true).rels;
    t.push_back(parse);
    auto n = sync_needs(t, ends({10, 30}));
    CHECK(n[1].deps == std::vector<uint32_t>{0});
    CHECK(n[2].deps.empty());
    CHECK(n[3].deps == std::vector<uint32_t>{0});
  }
  SECTION("an unknown transaction waits for all before it, and all after it wait for it") {
    std::vector<SyncTxn> t = {txn(1, 0, {"UPDATE a SET v = 1 WHERE k = 1"}), txn(2, 1, {"UPDATE b SET v = 1"}),
                              txn(20, 2, {"CALL p()"}), txn(40, kNoCommit, {"SELECT * FROM c"}),
                              txn(41, kNoCommit, {"SELECT 1"})};
    auto n = sync_needs(t, ends({10, 11, 30}));
    CHECK(n[2].prefix == 2);
    CHECK(n[2].deps.empty());
    CHECK(n[3].deps == std::vector<uint32_t>{2});
    CHECK(n[4].deps == std::vector<uint32_t>{2});
  }
  SECTION("a list that would be long becomes a wait for every commit before") {
    std::vector<SyncTxn> t;
    std::vector<Nanos> e;
    for (uint32_t i = 0; i < kMaxDeps + 1; ++i) {
      t.push_back(txn(1, i, {"UPDATE t SET v = 1 WHERE k = " + std::to_string(i)}));
      e.push_back(static_cast<Nanos>(10 + i));
    }
    t.push_back(txn(100, kNoCommit, {"SELECT sum(v) FROM t"}));
    auto n = sync_needs(t, ends(e));
    CHECK(n.back().prefix == kMaxDeps + 1);
    CHECK(n.back().deps.empty());
  }
}

namespace {

// The rule taken at each transaction's begin (every commit closed ended
// before it), as a plan holding the whole trace would: the reference for
// needs taken later.
std::vector<SyncNeed> needs_at_begin(const std::vector<SyncTxn>& txns, const std::vector<Nanos>& commit_end) {
  KeyColumns keys;
  for (const SyncTxn& t : txns) keys.count(t.rels);
  keys.pick();
  SyncPlanner p(keys);
  struct Event {
    Nanos at;
    bool is_commit;
    size_t txn;
  };
  std::vector<Event> ev;
  for (size_t t = 0; t < txns.size(); ++t) {
    ev.push_back({txns[t].begin, false, t});
    if (txns[t].commit != kNoCommit) ev.push_back({commit_end[txns[t].commit], true, t});
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
    return a.at != b.at ? a.at < b.at : (!a.is_commit && b.is_commit);
  });
  std::vector<SyncNeed> needs(txns.size());
  std::vector<uint32_t> h(txns.size());
  for (const Event& e : ev) {
    const SyncTxn& t = txns[e.txn];
    if (e.is_commit) {
      p.close(h[e.txn], t.commit, e.at);
      continue;
    }
    h[e.txn] = p.open(t.begin);
    SqlAccess a;
    a.unknown = t.unknown;
    a.rels = t.rels;
    p.add(h[e.txn], a);
    needs[e.txn] = p.need(h[e.txn]);
    if (t.commit == kNoCommit) p.close(h[e.txn], kNoCommit, 0);
  }
  return needs;
}

// `n` transactions of `sessions` sessions, each beginning after its
// session's last one ended, on `relations` relations (up to 3) by a few keys: reads,
// increments, writes, inserts, DDL now and then, unknown ones.
void random_history(std::mt19937& rng, size_t n, int sessions, int relations, std::vector<SyncTxn>* txns,
                    std::vector<Nanos>* commit_end) {
  std::vector<Nanos> free_at(static_cast<size_t>(sessions), 0);
  std::vector<std::pair<Nanos, size_t>> commits;  // end, transaction
  static const char* const kRel[] = {"a", "b", "c"};
  for (size_t i = 0; i < n; ++i) {
    const size_t s = rng() % static_cast<size_t>(sessions);
    SyncTxn t;
    t.begin = free_at[s] + static_cast<Nanos>(rng() % 50);
    const int stmts = 1 + static_cast<int>(rng() % 3);
    bool writes = false;
    for (int k = 0; k < stmts; ++k) {
      const std::string rel = kRel[rng() % static_cast<uint32_t>(relations)];
      const std::string key = std::to_string(rng() % 12);
      std::string sql;
      switch (rng() % 12) {
        case 0: case 1: case 2: sql = "SELECT v FROM " + rel + " WHERE id = " + key; break;
        case 3: sql = "SELECT count(*) FROM " + rel; break;
        case 4: case 5: sql = "UPDATE " + rel + " SET v = v + 1 WHERE id = " + key; writes = true; break;
        case 6: sql = "UPDATE " + rel + " SET v = 0 WHERE id = " + key; writes = true; break;
        case 7: case 8: sql = "INSERT INTO " + rel + " VALUES (" + key + ")"; writes = true; break;
        case 9: sql = "DELETE FROM " + rel + " WHERE other = " + key; writes = true; break;
        case 10: sql = rng() % 8 == 0 ? "CALL p()" : "SELECT v FROM " + rel + " WHERE other = " + key; break;
        default: sql = rng() % 6 == 0 ? "ALTER TABLE " + rel + " ADD x int" : "SELECT 1"; writes = true; break;
      }
      SqlAccess a = read_access(sql);
      t.unknown = t.unknown || a.unknown;
      for (RelAccess& r : a.rels) t.rels.push_back(std::move(r));
    }
    // Now and then a long transaction: others commit thousands of times
    // while it is open, so lists are trimmed while its need is still to
    // be taken.
    const bool longer = i % 997 == 500;
    if (longer) {  // it reads the whole relation others write, and writes a row
      for (RelAccess& r : read_access("SELECT count(*) FROM a; UPDATE a SET v = 0 WHERE id = 1").rels)
        t.rels.push_back(std::move(r));
      writes = true;
    }
    const Nanos end = t.begin + 1 + static_cast<Nanos>(longer ? 200000 : rng() % 400);
    free_at[s] = end;
    if (writes || t.unknown) commits.emplace_back(end, i);
    txns->push_back(std::move(t));
  }
  std::stable_sort(commits.begin(), commits.end());
  for (size_t c = 0; c < commits.size(); ++c) {
    (*txns)[commits[c].second].commit = static_cast<uint32_t>(c);
    commit_end->push_back(commits[c].first);
  }
}

}  // namespace

TEST_CASE("sync rule: a need taken at the transaction's end, from lists kept short, is the one taken at its begin",
          "[replay][sync]") {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    std::vector<SyncTxn> txns;
    std::vector<Nanos> ends;
    // Long enough that lists pass kMaxScan and get trimmed.
    // Long ones on one relation: lists pass 2 (kMaxScan + 1) and are trimmed.
    const bool longer = seed % 8 == 0;
    random_history(rng, longer ? 12000 : 400, 2 + static_cast<int>(seed % 7), longer ? 1 : 3, &txns, &ends);
    const std::vector<SyncNeed> late = sync_needs(txns, ends);
    const std::vector<SyncNeed> early = needs_at_begin(txns, ends);
    REQUIRE(late.size() == early.size());
    for (size_t t = 0; t < txns.size(); ++t) {
      INFO("seed " << seed << ", transaction " << t);
      CHECK(late[t].prefix == early[t].prefix);
      CHECK(late[t].deps == early[t].deps);
    }
  }
}

TEST_CASE("sync rule: a transaction open while thousands commit still waits for what committed before it began",
          "[replay][sync]") {
  // Ten row writes commit, then T begins; 5,000 more row writes commit
  // while T is open (the lists are trimmed meanwhile); T reads the whole
  // relation and commits last. Its need is the ten (taken at its commit,
  // from lists that kept them for it).
  std::vector<SyncTxn> t;
  std::vector<Nanos> e;
  const uint32_t before = 10, during = 5000;
  for (uint32_t i = 0; i < before + during; ++i) {
    const Nanos begin = (i < before ? 1 : 3) + 2 * static_cast<Nanos>(i);
    t.push_back(SyncTxn{begin, i, false, read_access("UPDATE a SET v = 0 WHERE id = " + std::to_string(i)).rels});
    e.push_back(begin + 1);
  }
  t.push_back(SyncTxn{2 * static_cast<Nanos>(before) + 1, before + during, false,
                      read_access("SELECT count(*) FROM a; UPDATE b SET v = 1").rels});
  e.push_back(e.back() + 1);
  const std::vector<SyncNeed> n = sync_needs(t, e);
  std::vector<uint32_t> ten;
  for (uint32_t i = 0; i < before; ++i) ten.push_back(i);
  CHECK(n.back().prefix == 0);
  CHECK(n.back().deps == ten);
  CHECK(needs_at_begin(t, e).back().deps == ten);
}

TEST_CASE("sync rule: the earlier uses held do not grow with the transactions", "[replay][sync]") {
  // One hot row written by every transaction, one after another, and a
  // reader of the relation: each list reaches kMaxScan entries and stays
  // near it.
  auto held_after = [](size_t n) {
    KeyColumns keys;
    SqlAccess w = read_access("UPDATE t SET v = 0 WHERE id = 1");
    keys.count(w.rels);
    keys.pick();
    SyncPlanner p(keys);
    size_t most = 0;
    for (size_t i = 0; i < n; ++i) {
      const Nanos begin = static_cast<Nanos>(i) * 10;
      const uint32_t h = p.open(begin);
      p.add(h, w);
      (void)p.need(h);
      p.close(h, static_cast<uint32_t>(i), begin + 5);
      most = std::max(most, p.held());
    }
    return most;
  };
  const size_t small = held_after(5000), large = held_after(40000);
  INFO("earlier uses held: " << small << " after 5,000 commits, " << large << " after 40,000");
  CHECK(large == small);
  CHECK(large <= 3 * 2 * (kMaxScan + 1));  // three lists (whole, keyed, the key's), each at most twice the kept
}

TEST_CASE("sync rule: the row keys held do not grow with the keys the trace touches", "[replay][sync]") {
  // Each commit writes a row no commit wrote before, each reader reads one
  // no one wrote: the keys of commits more than kKeepCommits behind, and
  // those only read, are forgotten; a commit's need takes them in its
  // prefix.
  auto keys_after = [](uint32_t n, SyncNeed* last) {
    KeyColumns keys;
    keys.count(read_access("UPDATE t SET v = 0 WHERE id = 1").rels);
    keys.pick();
    SyncPlanner p(keys);
    size_t most = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const Nanos begin = static_cast<Nanos>(i) * 10;
      const uint32_t r = p.open(begin);
      p.add(r, read_access("SELECT v FROM t WHERE id = -" + std::to_string(i)));
      (void)p.need(r);
      p.close(r, kNoCommit, 0);
      const uint32_t h = p.open(begin);
      p.add(h, read_access("UPDATE t SET v = 0 WHERE id = " + std::to_string(i % (n / 2))));
      *last = p.need(h);
      p.close(h, i, begin + 5);
      most = std::max(most, p.keys());
    }
    return most;
  };
  SyncNeed a, b;
  const size_t small = keys_after(4 * kKeepCommits, &a), large = keys_after(16 * kKeepCommits, &b);
  INFO("row keys held: " << small << " and " << large);
  CHECK(large <= kKeepCommits + 2);
  CHECK(small <= kKeepCommits + 2);
  // The last commit rewrites the row of the commit n / 2 before it: far
  // behind, in its prefix, not listed.
  CHECK(b.prefix == 16 * kKeepCommits - 1 - kKeepCommits);
  CHECK(b.deps.empty());
}

TEST_CASE("commit order: a worker watching a commit point is signalled when it completes, not before",
          "[replay][sync]") {
  CommitOrder o(3, 2);
  Waiter& w = o.waiter(1);
  auto readable = [&] {
    pollfd pf{w.fd, POLLIN, 0};
    return ::poll(&pf, 1, 0) == 1;
  };
  CHECK_FALSE(o.watch(2, 1));
  o.complete(0);
  o.signal(o.take_watchers(0), 0);
  CHECK_FALSE(readable());
  o.complete(2);
  const uint64_t m = o.take_watchers(2);
  CHECK(m == 2);
  o.signal(m, 0);
  CHECK(readable());
  CHECK(o.take_watchers(2) == 0);  // taken once
  CHECK(o.is_done(2));
  CHECK_FALSE(o.is_done(1));
  CHECK(o.watch(2, 1));  // done already: no wait
  // The prefix is not moved by 2 alone.
  CHECK(o.done() == 1);
}
