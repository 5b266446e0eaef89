// Pure logic of the replay engine: schedule, timer heap, state machine,
// fingerprints, user maps, time arguments, stats, and building a plan from
// in-memory record sequences.
#include "common/error.h"
#include "replay/plan.h"
#include "replay/replay.h"
#include "replay/schedule.h"
#include "replay/session.h"
#include "replay/stats.h"
#include "replay/unit_log.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>

using namespace tierlab;
using namespace tierlab::replay;
using trace::Record;

namespace {

constexpr Nanos kMs = 1000000;

Outcome ok_rows(uint64_t n) {
  Outcome o;
  o.status = Status::Ok;
  o.has_rows = true;
  o.rows = n;
  return o;
}

Outcome err(const char* state) {
  Outcome o;
  o.status = Status::Error;
  std::memcpy(o.sqlstate, state, 5);
  return o;
}

}  // namespace

TEST_CASE("schedule is absolute: epoch + (t - t0) / speed, no drift", "[replay][schedule]") {
  Schedule s;
  s.epoch = 1'000'000'000;
  s.t0 = 5'000'000'000;
  s.speed = 2.0;
  CHECK(s.at(5'000'000'000) == 1'000'000'000);
  CHECK(s.at(7'000'000'000) == 2'000'000'000);
  // Late sends do not move later deadlines: 100,000 steps of 1 ms each at
  // speed 3 land exactly where one division puts them.
  s.speed = 3.0;
  Nanos prev = s.at(s.t0);
  for (int i = 1; i <= 100000; ++i) {
    Nanos t = s.at(s.t0 + i * kMs);
    CHECK(t >= prev);
    prev = t;
  }
  CHECK(prev == s.epoch + static_cast<Nanos>(100000.0 * kMs / 3.0));
  s.max_speed = true;
  CHECK(s.at(s.t0 + 999 * kMs) == s.epoch);
}

TEST_CASE("timer heap pops in deadline order and supports move and cancel", "[replay][schedule]") {
  TimerHeap h(1000);
  std::mt19937_64 rng(42);
  std::vector<Nanos> due(1000);
  for (uint32_t i = 0; i < 1000; ++i) {
    due[i] = static_cast<Nanos>(rng() % 1000000);
    h.set(i, due[i]);
  }
  // move some earlier, some later, cancel some
  for (uint32_t i = 0; i < 1000; i += 7) {
    due[i] = static_cast<Nanos>(rng() % 1000000);
    h.set(i, due[i]);
  }
  for (uint32_t i = 3; i < 1000; i += 11) {
    h.cancel(i);
    due[i] = -1;
  }
  Nanos last = -1;
  size_t popped = 0;
  while (!h.empty()) {
    Nanos d = h.top_due();
    uint32_t s = h.pop();
    CHECK(d == due[s]);
    CHECK(d >= last);
    CHECK_FALSE(h.armed(s));
    last = d;
    ++popped;
  }
  size_t cancelled = 0;
  for (Nanos d : due) cancelled += d == -1;
  CHECK(popped + cancelled == 1000);
}

TEST_CASE("session state machine allows only the documented exits", "[replay][state]") {
  // The life of a session that runs a COPY and ends cleanly.
  State s = State::Pending;
  s = transition(s, Event::Due);
  CHECK(s == State::Connecting);
  s = transition(s, Event::Connected);
  CHECK(s == State::Idle);
  s = transition(s, Event::UnitSent);
  CHECK(s == State::Busy);
  s = transition(s, Event::CopyInStarted);
  CHECK(s == State::CopyIn);
  s = transition(s, Event::CopyFinished);
  CHECK(s == State::Busy);
  s = transition(s, Event::CopyOutStarted);
  CHECK(s == State::CopyOut);
  s = transition(s, Event::CopyFinished);
  CHECK(s == State::Busy);
  s = transition(s, Event::UnitDone);
  CHECK(s == State::Idle);
  s = transition(s, Event::Ended);
  CHECK(s == State::Done);

  // Every state but Done can fail or be stopped; Done has no exits.
  for (State st : {State::Pending, State::Connecting, State::Idle, State::Busy, State::CopyIn,
                   State::CopyOut}) {
    CHECK(transition(st, Event::Failed) == State::Done);
    CHECK(transition(st, Event::Stopped) == State::Done);
  }
  for (int e = 0; e <= static_cast<int>(Event::Stopped); ++e)
    CHECK(transition(State::Done, static_cast<Event>(e)) == State::Invalid);
  // Things that must not happen.
  CHECK(transition(State::Pending, Event::UnitSent) == State::Invalid);
  CHECK(transition(State::Connecting, Event::UnitSent) == State::Invalid);
  CHECK(transition(State::Idle, Event::UnitDone) == State::Invalid);
  CHECK(transition(State::Busy, Event::UnitSent) == State::Invalid);
  CHECK(transition(State::Busy, Event::Ended) == State::Invalid);
  CHECK(transition(State::CopyIn, Event::UnitDone) == State::Invalid);
  CHECK(std::string(state_name(State::CopyIn)) == "copy-in");
}

TEST_CASE("fingerprints ignore literals, parameter markers, case and whitespace", "[replay][fingerprint]") {
  CHECK(normalize_sql("SELECT abalance FROM pgbench_accounts WHERE aid = 42;") ==
        "select abalance from pgbench_accounts where aid=?");
  CHECK(fingerprint("SELECT abalance FROM pgbench_accounts WHERE aid = 42;") ==
        fingerprint("select abalance\n  from pgbench_accounts where aid=$1"));
  CHECK(fingerprint("UPDATE t SET v = v + -3012 WHERE id = 7") ==
        fingerprint("UPDATE t SET v = v + $1 WHERE id = $2"));
  CHECK(normalize_sql("insert into t values (1, 'it''s', 2.5e3, E'a\\'b', $$x$$)") ==
        "insert into t values(?, ?, ?, ?, ?)");
  CHECK(normalize_sql("SELECT \"MixedCase\".x FROM \"MixedCase\" -- trailing comment\n /* c */ LIMIT 10") ==
        "select \"MixedCase\".x from \"MixedCase\" limit ?");
  CHECK(normalize_sql("SELECT $1::int + 1") == "select ?::int+?");
  CHECK(normalize_sql("SELECT * FROM c") == "select * from c");
  CHECK(normalize_sql("select t1.c2 from t1") == "select t1.c2 from t1");  // digits in names stay
  CHECK(fingerprint("select 1") != fingerprint("select 1 from t"));
  CHECK(fingerprint("SELECT * FROM a") != fingerprint("SELECT * FROM b"));
}

TEST_CASE("user map parses captured=target lines and rejects malformed ones", "[replay][usermap]") {
  UserMap m = parse_user_map("# comment\n\n  app = replay_app \nreporting=ro\n", "users.map");
  REQUIRE(m.entries.size() == 2);
  REQUIRE(m.find("app"));
  CHECK(*m.find("app") == "replay_app");
  CHECK(*m.find("reporting") == "ro");
  CHECK(m.find("other") == nullptr);
  CHECK_THROWS_WITH(parse_user_map("a=b\nnonsense\n", "users.map"),
                    Catch::Contains("users.map:2: expected captured=target"));
  CHECK_THROWS_WITH(parse_user_map("a=\n", "m"), Catch::Contains("m:1:"));
  CHECK_THROWS_WITH(parse_user_map("a=b\na=c\n", "m"), Catch::Contains("m:2: user 'a' is mapped twice"));
  CHECK_THROWS_AS(load_user_map("/nonexistent/users.map"), InputError);
  // The library names the file; the app puts --user-map in front.
  CHECK_THROWS_WITH(load_user_map("/nonexistent/users.map"), "/nonexistent/users.map: No such file or directory");
}

TEST_CASE("divergence: error status and row counts, same failure is not divergence", "[replay][stats]") {
  CHECK_FALSE(compare(ok_rows(1), ok_rows(1)).error_status);
  CHECK_FALSE(compare(ok_rows(1), ok_rows(1)).row_count);
  CHECK(compare(ok_rows(1), ok_rows(0)).row_count);
  CHECK(compare(ok_rows(1), err("23505")).error_status);
  CHECK(compare(err("23505"), ok_rows(1)).error_status);
  CHECK(compare(err("23505"), err("42P01")).error_status);
  Divergence same = compare(err("42P01"), err("42P01"));
  CHECK_FALSE(same.error_status);
  CHECK_FALSE(same.row_count);
  Outcome skipped;
  skipped.status = Status::Skipped;
  CHECK_FALSE(compare(skipped, ok_rows(1)).error_status);
  Outcome no_rows;
  no_rows.status = Status::Ok;
  CHECK_FALSE(compare(no_rows, ok_rows(5)).row_count);
}

TEST_CASE("per-thread stats merge into the totals", "[replay][stats]") {
  Stmt st;
  st.fp = 1;
  st.captured = ok_rows(1);
  st.captured_latency = 2 * kMs;
  Stats a(2), b(2);
  for (int i = 0; i < 100; ++i) a.statement(st, ok_rows(1), 1 * kMs);
  for (int i = 0; i < 50; ++i) b.statement(st, ok_rows(2), 5 * kMs);
  a.errors.add("23505");
  b.errors.add("23505");
  b.errors.add("40001", 3);
  a.transactions = 7;
  b.transactions = 5;
  b.sessions_failed = 1;
  b.first_session_error = "boom";
  Stats total(2);
  total.merge(a);
  total.merge(b);
  CHECK(total.statements == 150);
  CHECK(total.transactions == 12);
  CHECK(total.div_row_count == 50);
  CHECK(total.lat.count() == 150);
  CHECK(total.lat.max() == b.lat.max());
  CHECK(total.errors.total() == 5);
  CHECK(total.errors.get("23505") == 2);
  CHECK(total.errors.get("40001") == 3);
  CHECK(total.fps[1].count == 150);
  CHECK(total.first_session_error == "boom");
  auto sorted = total.errors.sorted();
  REQUIRE(sorted.size() == 2);
  CHECK(sorted[0].first == "23505");

  Plan plan;
  plan.fingerprints = {"select ?", "update t set v=?"};
  plan.sessions.resize(3);
  Report r;
  fill_report(r, total, plan, 2'000'000'000);
  CHECK(r.tps == Approx(6.0));
  CHECK(r.statements == 150);
  CHECK(r.errors == 5);
  // mean (100 * 1 + 50 * 5) / 150 = 2.33 ms against 2 ms captured: slowed.
  REQUIRE(r.slowed.size() == 1);
  CHECK(r.sped_up.empty());
  CHECK(r.slowed[0].sql == "update t set v=?");
  CHECK(r.slowed[0].count == 150);
  CHECK(r.slowed[0].captured_ms == Approx(2.0));
  CHECK(r.slowed[0].replay_ms == Approx(350.0 / 150.0));
}

TEST_CASE("sqlstate table counts many distinct states", "[replay][stats]") {
  SqlstateCounts c;
  char s[6] = "00000";
  for (int i = 0; i < 300; ++i) {
    std::snprintf(s, sizeof s, "%05d", i);
    c.add(s);
  }
  CHECK(c.total() == 300);
  auto v = c.sorted();
  CHECK(v.back().first == "other");
}

TEST_CASE("divergence: a statement that succeeded at capture and fails now is a new error", "[replay][stats]") {
  CHECK(compare(ok_rows(1), err("42P01")).new_error);
  CHECK_FALSE(compare(err("42P01"), ok_rows(1)).new_error);
  CHECK_FALSE(compare(err("23505"), err("42P01")).new_error);
  CHECK_FALSE(compare(err("42P01"), err("42P01")).new_error);
  Outcome skipped;
  skipped.status = Status::Skipped;
  CHECK_FALSE(compare(ok_rows(1), skipped).new_error);
}

TEST_CASE("errors by SQLSTATE keep the first message and the statement it answered", "[replay][stats]") {
  Stmt update, select;
  update.fp = 0;
  update.captured = ok_rows(1);
  select.fp = 1;
  select.captured = ok_rows(1);
  Stats a(2), b(2);
  // Worker b sees its 42P01 first, worker a its 25P02 first.
  b.error("42P01", "relation \"accounts\" does not exist");
  b.statement(update, err("42P01"), kMs);
  a.error("25P02", "current transaction is aborted, commands ignored until end of transaction block");
  a.statement(select, err("25P02"), kMs);
  for (int i = 0; i < 3; ++i) {
    // Later ones keep neither their message nor their statement.
    a.error("42P01", "relation \"other\" does not exist");
    a.statement(select, err("42P01"), kMs);
    b.error("25P02", "a later message");
    b.statement(update, err("25P02"), kMs);
  }
  // An error no statement answers (a Parse): its statement is the next one
  // that fails the same way.
  a.error("42703", "column \"x\" does not exist");
  a.statement(update, ok_rows(1), kMs);
  a.statement(select, err("42703"), kMs);
  Stats total(2);
  total.merge(a);
  total.merge(b);
  CHECK(total.errors.get("42P01") == 4);
  CHECK(total.errors.get("25P02") == 4);
  auto f = total.errors.firsts();
  REQUIRE(f.size() == 3);
  CHECK(f[0].sqlstate == "25P02");
  CHECK(f[0].count == 4);
  CHECK(f[0].message == "current transaction is aborted, commands ignored until end of transaction block");
  CHECK(f[0].statement == 1);
  CHECK(f[1].sqlstate == "42703");
  CHECK(f[1].statement == 1);
  CHECK(f[2].sqlstate == "42P01");
  CHECK(f[2].message == "relation \"accounts\" does not exist");
  CHECK(f[2].statement == 0);
  // Merged the other way round, the earlier first message still wins.
  Stats other(2);
  other.merge(b);
  other.merge(a);
  CHECK(other.errors.firsts()[2].message == "relation \"accounts\" does not exist");
  CHECK(other.errors.firsts()[0].message == f[0].message);

  Plan plan;
  plan.fingerprints = {"update accounts set v = v + ? where id = ?", "select v from accounts where id = ?"};
  Report r;
  fill_report(r, total, plan, 1'000'000'000);
  REQUIRE(r.first_errors.size() == 3);
  CHECK(r.first_errors[2].statement == plan.fingerprints[0]);
  CHECK(r.first_errors[2].count == 4);
  // 9 of 10 statements failed that succeeded at capture.
  CHECK(r.divergence_new_errors == 9);
  CHECK(r.divergence_rate == Approx(0.9));
}

TEST_CASE("failed statements are left out of the slowed and sped up lists", "[replay][stats]") {
  Stmt fast_fail, slow_fail, ok;
  fast_fail.fp = 0;  // 5 ms at capture, fails at once now: not "sped up"
  fast_fail.captured = ok_rows(1);
  fast_fail.captured_latency = 5 * kMs;
  slow_fail.fp = 1;  // failed at capture and now, slower: not "slowed"
  slow_fail.captured = err("40001");
  slow_fail.captured_latency = kMs;
  ok.fp = 2;
  ok.captured = ok_rows(1);
  ok.captured_latency = 2 * kMs;
  Stats s(3);
  for (int i = 0; i < 10; ++i) {
    s.statement(fast_fail, err("42P01"), kMs / 10);
    s.statement(slow_fail, err("40001"), 9 * kMs);
    s.statement(ok, ok_rows(1), kMs);
  }
  // Half of the third fingerprint failed: only its successes are compared.
  for (int i = 0; i < 10; ++i) s.statement(ok, err("57014"), 50 * kMs);
  Plan plan;
  plan.fingerprints = {"update missing", "select failing", "select ok"};
  Report r;
  fill_report(r, s, plan, 1'000'000'000);
  CHECK(r.slowed.empty());
  REQUIRE(r.sped_up.size() == 1);
  CHECK(r.sped_up[0].sql == "select ok");
  CHECK(r.sped_up[0].count == 10);
  CHECK(r.sped_up[0].replay_ms == Approx(1.0));
}

TEST_CASE("report: first error per SQLSTATE on one line, divergence rate, CPU per transaction", "[replay][stats]") {
  Report r;
  r.transactions = 1;
  r.failed_transactions = 4474;
  r.statements = 22370;
  r.errors = 22366;
  r.cpu_s = 0.45;
  r.errors_by_sqlstate = {{"25P02", 17892}, {"42P01", 4474}};
  r.first_errors = {
      {"25P02", 17892, "current transaction is aborted, commands ignored until end of transaction block",
       "select abalance from pgbench_accounts where aid = ?"},
      {"42P01", 4474, "relation \"pgbench_accounts\" does not exist",
       "update pgbench_accounts\n   set abalance = abalance + ?  where aid = ? and bid in (select bid from "
       "pgbench_branches where bbalance > ?)"}};
  r.divergence_error_status = 22366;
  r.divergence_new_errors = 22366;
  r.divergence_rate = 22366.0 / 22370;
  std::ostringstream out;
  print_report(out, r);
  const std::string text = out.str();
  INFO(text);
  CHECK(text.find("errors by SQLSTATE: 25P02=17892 42P01=4474\n"
                  "  25P02 first: current transaction is aborted, commands ignored until end of transaction block\n"
                  "    in: select abalance from pgbench_accounts where aid = ?\n"
                  "  42P01 first: relation \"pgbench_accounts\" does not exist\n"
                  "    in: update pgbench_accounts set abalance = abalance + ? where aid = ? and bid in ...\n"
                  "divergence: 22366 error status, 0 row count; 22366 of 22370 statements failed that succeeded "
                  "at capture (99.98%)\n") != std::string::npos);
  // The replayer's CPU spread over every transaction that ended, not over
  // the one that did not fail.
  CHECK(text.find("replayer CPU = 0.450 s in the worker and connection threads (100.6 us per transaction, failed "
                  "ones included)\n") != std::string::npos);
  CHECK(r.cpu_us_per_transaction() == Approx(0.45e6 / 4475));
  // None ended: no figure.
  r.transactions = r.failed_transactions = 0;
  CHECK(r.cpu_us_per_transaction() < 0);
  std::ostringstream none;
  print_report(none, r);
  CHECK(none.str().find("replayer CPU = 0.450 s in the worker and connection threads (per transaction: n/a, none "
                        "ended)\n") != std::string::npos);
  CHECK(percent(0) == "0%");
  CHECK(percent(0.5) == "50.00%");
  CHECK(percent(0.000012) == "0.0012%");
}

// --- building plans from record sequences -------------------------------------

namespace {

struct Trace {
  std::vector<Record> recs;
  void add(Nanos ts, uint64_t sess, trace::Body b) { recs.push_back(Record{ts, sess, std::move(b)}); }
  std::shared_ptr<const Plan> build(Window w = {}) {
    PlanBuilder b(w);
    for (const auto& r : recs) b.add(r);
    return b.finish();
  }
};

trace::Result result(const char* tag, uint64_t rows) { return trace::Result{tag, true, rows}; }

}  // namespace

TEST_CASE("plan: simple queries, transactions, outcomes and latencies", "[replay][plan]") {
  Trace t;
  t.add(100 * kMs, 1, trace::SessionBegin{"alice", "shop", "app", "", 0, 0});
  t.add(101 * kMs, 1, trace::Query{"BEGIN"});
  t.add(102 * kMs, 1, trace::Result{"BEGIN", false, 0});
  t.add(102 * kMs, 1, trace::Ready{'T'});
  t.add(110 * kMs, 1, trace::Query{"UPDATE t SET v = 1 WHERE id = 3"});
  t.add(113 * kMs, 1, result("UPDATE", 1));
  t.add(113 * kMs, 1, trace::Ready{'T'});
  t.add(120 * kMs, 1, trace::Query{"COMMIT"});
  t.add(121 * kMs, 1, trace::Result{"COMMIT", false, 0});
  t.add(121 * kMs, 1, trace::Ready{'I'});
  t.add(130 * kMs, 1, trace::Query{"SELECT * FROM missing"});
  t.add(131 * kMs, 1, trace::Error{"42P01", "ERROR", "relation does not exist"});
  t.add(131 * kMs, 1, trace::Ready{'I'});
  t.add(140 * kMs, 1, trace::SessionEnd{});
  auto p = t.build();
  REQUIRE(p->sessions.size() == 1);
  const Session& s = p->sessions[0];
  CHECK(std::string(s.user) == "alice");
  CHECK(std::string(s.database) == "shop");
  CHECK(s.begin == 100 * kMs);
  CHECK(s.end == 140 * kMs);
  CHECK(s.n_units == 4);
  CHECK(p->summary.statements == 4);
  CHECK(p->summary.transactions == 2);  // BEGIN..COMMIT, and the failed SELECT
  CHECK(p->summary.captured_errors == 1);
  CHECK(p->summary.duration_ns == 40 * kMs);
  CHECK(p->t0 == 100 * kMs);
  const Unit& upd = p->units[p->session_units[s.first_unit + 1]];
  CHECK(upd.kind == UnitKind::Simple);
  CHECK(std::string(upd.sql) == "UPDATE t SET v = 1 WHERE id = 3");
  const Stmt& st = p->stmts[upd.first_stmt];
  CHECK(st.captured.status == Status::Ok);
  CHECK(st.captured.rows == 1);
  CHECK(st.captured_latency == 3 * kMs);
  const Unit& bad = p->units[p->session_units[s.first_unit + 3]];
  CHECK(p->stmts[bad.first_stmt].captured.status == Status::Error);
  CHECK(std::string(p->stmts[bad.first_stmt].captured.sqlstate) == "42P01");
}

TEST_CASE("plan: extended protocol groups up to Sync with parameters", "[replay][plan]") {
  Trace t;
  std::vector<uint32_t> types{23};
  std::vector<trace::Param> params{trace::Param{0, false, "42"}};
  std::vector<trace::Param> params2{trace::Param{0, false, "43"}};
  std::vector<int16_t> fmts;
  t.add(0, 7, trace::SessionBegin{"bob", "db", "", "", 0, 0});
  // pgbench -M prepared: Parse+Sync once, then Bind/Describe/Execute/Sync.
  t.add(1 * kMs, 7, trace::Parse{"P0_1", "SELECT abalance FROM a WHERE aid = $1", types});
  t.add(1 * kMs, 7, trace::Sync{});
  t.add(2 * kMs, 7, trace::Ready{'I'});
  for (int i = 0; i < 2; ++i) {
    Nanos at = (10 + 10 * i) * kMs;
    t.add(at, 7, trace::Bind{"", "P0_1", i ? params2 : params, fmts});
    t.add(at, 7, trace::Describe{'P', ""});
    t.add(at, 7, trace::Execute{"", 0});
    t.add(at, 7, trace::Sync{});
    t.add(at + 2 * kMs, 7, result("SELECT", 1));
    t.add(at + 2 * kMs, 7, trace::Ready{'I'});
  }
  // A Parse error: attributed to the Execute that follows; the second
  // Execute of the group is skipped by the server.
  t.add(40 * kMs, 7, trace::Parse{"", "SELEC 1", {}});
  t.add(40 * kMs, 7, trace::Bind{"", "", {}, fmts});
  t.add(40 * kMs, 7, trace::Execute{"", 0});
  t.add(40 * kMs, 7, trace::Bind{"", "", {}, fmts});
  t.add(40 * kMs, 7, trace::Execute{"", 0});
  t.add(40 * kMs, 7, trace::Sync{});
  t.add(41 * kMs, 7, trace::Error{"42601", "ERROR", "syntax error"});
  t.add(41 * kMs, 7, trace::Ready{'I'});
  t.add(50 * kMs, 7, trace::Close{'S', "P0_1"});
  t.add(50 * kMs, 7, trace::Sync{});
  t.add(51 * kMs, 7, trace::Ready{'I'});
  auto p = t.build();
  REQUIRE(p->sessions.size() == 1);
  const Session& s = p->sessions[0];
  REQUIRE(s.n_units == 5);
  CHECK(p->summary.statements == 4);
  CHECK(p->summary.transactions == 3);
  const Unit& prep = p->units[p->session_units[s.first_unit]];
  CHECK(prep.kind == UnitKind::Extended);
  REQUIRE(prep.n_ops == 1);
  const Op& parse = p->ops[prep.first_op];
  CHECK(parse.kind == OpKind::Prepare);
  CHECK(std::string(parse.name) == "P0_1");
  CHECK(parse.nparams == 1);
  CHECK(p->types[parse.types] == 23);
  const Unit& ex = p->units[p->session_units[s.first_unit + 2]];
  REQUIRE(ex.n_ops == 1);  // Describe 'P' travels with PQsendQueryPrepared
  const Op& exec = p->ops[ex.first_op];
  CHECK(exec.kind == OpKind::Execute);
  CHECK(std::string(exec.name) == "P0_1");
  CHECK(std::string(p->param_values[exec.params]) == "43");
  CHECK(p->param_lengths[exec.params] == 2);
  CHECK(p->stmts[exec.stmt].captured.rows == 1);
  CHECK(p->stmts[exec.stmt].captured_latency == 2 * kMs);
  const Unit& bad = p->units[p->session_units[s.first_unit + 3]];
  REQUIRE(bad.n_stmts == 2);
  CHECK(p->stmts[bad.first_stmt].captured.status == Status::Error);
  CHECK(std::string(p->stmts[bad.first_stmt].captured.sqlstate) == "42601");
  CHECK(p->stmts[bad.first_stmt + 1].captured.status == Status::Skipped);
  const Unit& close = p->units[p->session_units[s.first_unit + 4]];
  REQUIRE(close.n_ops == 1);
  CHECK(p->ops[close.first_op].kind == OpKind::Deallocate);
  CHECK(std::string(p->ops[close.first_op].sql) == "DEALLOCATE \"P0_1\"");
  // Both Executes share the fingerprint of their prepared statement.
  CHECK(p->stmts[p->units[p->session_units[s.first_unit + 1]].first_stmt].fp ==
        p->stmts[exec.stmt].fp);
  CHECK(p->fingerprints[p->stmts[exec.stmt].fp] == "select abalance from a where aid=?");
}

TEST_CASE("plan: COPY FROM STDIN keeps its data chunks", "[replay][plan]") {
  Trace t;
  t.add(0, 3, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(1 * kMs, 3, trace::Query{"COPY t FROM STDIN"});
  t.add(2 * kMs, 3, trace::CopyData{trace::CopyDir::In, "1\ta\n2\tb\n"});
  t.add(2 * kMs, 3, trace::CopyData{trace::CopyDir::In, "3\tc\n"});
  t.add(2 * kMs, 3, trace::CopyDone{trace::CopyDir::In});
  t.add(3 * kMs, 3, result("COPY", 3));
  t.add(3 * kMs, 3, trace::Ready{'I'});
  auto p = t.build();
  REQUIRE(p->sessions[0].n_units == 1);
  const Unit& u = p->units[p->session_units[0]];
  CHECK(u.kind == UnitKind::Copy);
  REQUIRE(u.n_copy == 2);
  CHECK(std::string(p->copy_chunks[u.first_copy].data) == "1\ta\n2\tb\n");
  CHECK(p->copy_chunks[u.first_copy + 1].len == 4);
  CHECK(p->stmts[u.first_stmt].captured.rows == 3);
  CHECK(p->summary.copy_bytes == 12);
}

TEST_CASE("plan: COPY FROM STDIN started by Execute keeps its data", "[replay][plan]") {
  Trace t;
  t.add(0, 3, trace::SessionBegin{"u", "d", "", "", 0, 0});
  // As libpq sends it: Parse, Bind, Describe, Execute, Sync, then the data,
  // CopyDone and a second Sync.
  t.add(1 * kMs, 3, trace::Parse{"", "COPY t FROM STDIN", {}});
  t.add(1 * kMs, 3, trace::Bind{"", "", {}, {}});
  t.add(1 * kMs, 3, trace::Describe{'P', ""});
  t.add(1 * kMs, 3, trace::Execute{"", 0});
  t.add(1 * kMs, 3, trace::Sync{});
  t.add(2 * kMs, 3, trace::CopyData{trace::CopyDir::In, "1\ta\n"});
  t.add(2 * kMs, 3, trace::CopyData{trace::CopyDir::In, "2\tb\n"});
  t.add(2 * kMs, 3, trace::CopyDone{trace::CopyDir::In});
  t.add(2 * kMs, 3, trace::Sync{});
  t.add(3 * kMs, 3, result("COPY", 2));
  t.add(3 * kMs, 3, trace::Ready{'I'});
  // A client that sent Flush, not Sync, before its data, and failed it.
  t.add(4 * kMs, 3, trace::Parse{"", "COPY t FROM STDIN", {}});
  t.add(4 * kMs, 3, trace::Bind{"", "", {}, {}});
  t.add(4 * kMs, 3, trace::Execute{"", 0});
  t.add(4 * kMs, 3, trace::Flush{});
  t.add(5 * kMs, 3, trace::CopyData{trace::CopyDir::In, "3\tc\n"});
  t.add(5 * kMs, 3, trace::CopyFail{"gave up"});
  t.add(5 * kMs, 3, trace::Sync{});
  trace::Error e;
  e.sqlstate = "57014";
  t.add(6 * kMs, 3, e);
  t.add(6 * kMs, 3, trace::Ready{'I'});
  auto p = t.build();
  CHECK(p->summary.unsupported == 0);
  CHECK(p->summary.libpq_unsupported == 0);
  CHECK(p->summary.copy_bytes == 12);
  CHECK(p->summary.captured_errors == 1);
  // A window counts the COPY data and captured errors of what it replays.
  Window second;
  second.begin = 4 * kMs;
  auto w = t.build(second);
  CHECK(w->summary.copy_bytes == 4);
  CHECK(w->summary.captured_errors == 1);
  Window first;
  first.end = 4 * kMs;
  auto f = t.build(first);
  CHECK(f->summary.copy_bytes == 8);
  CHECK(f->summary.captured_errors == 0);
  REQUIRE(p->sessions[0].n_units == 2);
  const Unit& done = p->units[p->session_units[0]];
  CHECK(done.kind == UnitKind::Extended);
  REQUIRE(done.n_copy == 2);
  CHECK(std::string(p->copy_chunks[done.first_copy + 1].data) == "2\tb\n");
  CHECK(p->stmts[done.first_stmt].captured.rows == 2);
  // CopyData, CopyData, CopyDone, then the Sync the server waits for.
  REQUIRE(done.copy_wire_len == 2 * (5 + 4) + 5 + 5);
  CHECK(done.copy_wire[0] == 'd');
  CHECK(done.copy_wire[18] == 'c');
  CHECK(done.copy_wire[23] == 'S');
  // The unit itself ends with its captured Sync.
  CHECK(done.wire[done.wire_len - 5] == 'S');
  const Unit& failed = p->units[p->session_units[1]];
  CHECK(failed.kind == UnitKind::Extended);
  CHECK(failed.copy_fail);
  REQUIRE(failed.n_copy == 1);
  CHECK(failed.wire[failed.wire_len - 5] == 'S');  // added for the Flush
  CHECK(failed.copy_wire[9] == 'f');
  CHECK(failed.copy_wire[failed.copy_wire_len - 5] == 'S');
  CHECK(p->stmts[failed.first_stmt].captured.status == Status::Error);
  CHECK(std::string(p->stmts[failed.first_stmt].captured.sqlstate) == "57014");
}

TEST_CASE("plan: max speed gates count sessions that ended before one began, and never hold the first back",
          "[replay][plan]") {
  Plan p;
  p.sessions.resize(4);
  p.sessions[0].begin = 0, p.sessions[0].end = 10 * kMs;
  p.sessions[1].begin = 0, p.sessions[1].end = 0;              // ended as it began
  p.sessions[2].begin = 20 * kMs, p.sessions[2].end = -5 * kMs;  // an end before its begin (a bad trace)
  p.sessions[3].begin = 5 * kMs, p.sessions[3].end = 100 * kMs;
  const std::vector<uint64_t> gate = max_speed_gates(p);
  // The first to begin wait for nothing, not even for a session that ended
  // as it began, or for an end stamped before any begin.
  CHECK(gate[0] == 0);
  CHECK(gate[1] == 0);
  CHECK(gate[3] == 1);  // session 1 ended before 5 ms
  CHECK(gate[2] == 2);  // sessions 1 and 0 ended before 20 ms; its own end is not before its begin
}

TEST_CASE("plan: window drops units, re-prepares statements, concurrency counted", "[replay][plan]") {
  Trace t;
  std::vector<trace::Param> none;
  std::vector<int16_t> fmts;
  for (uint64_t s = 1; s <= 3; ++s)
    t.add(static_cast<Nanos>(s) * kMs, s, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(5 * kMs, 1, trace::Parse{"q", "SELECT 1", {}});
  t.add(5 * kMs, 1, trace::Sync{});
  t.add(6 * kMs, 1, trace::Ready{'I'});
  for (int i = 0; i < 10; ++i) {
    Nanos at = (100 + 100 * i) * kMs;
    t.add(at, 1, trace::Bind{"", "q", none, fmts});
    t.add(at, 1, trace::Execute{"", 0});
    t.add(at, 1, trace::Sync{});
    t.add(at + kMs, 1, result("SELECT", 1));
    t.add(at + kMs, 1, trace::Ready{'I'});
  }
  t.add(1500 * kMs, 1, trace::SessionEnd{});
  t.add(50 * kMs, 2, trace::SessionEnd{});  // short session: 2 ms .. 50 ms
  t.add(1400 * kMs, 3, trace::SessionEnd{});
  auto all = t.build();
  CHECK(all->sessions.size() == 3);
  CHECK(all->summary.statements == 10);
  CHECK(all->summary.max_concurrency == 3);
  CHECK(all->summary.duration_ns == 1499 * kMs);

  // From 0.5 s to 0.8 s after the trace start (0 here): units at 500, 600
  // and 700 ms fall in [500, 800).
  Window w;
  w.begin = 500 * kMs;
  w.end = 800 * kMs;
  auto part = t.build(w);
  CHECK(part->summary.statements == 3);
  REQUIRE(part->sessions.size() == 2);  // session 2 ended before the window
  const Session& s = part->sessions[0];
  REQUIRE(s.n_units == 4);               // re-prepare + 3 executes
  const Unit& restore = part->units[part->session_units[s.first_unit]];
  REQUIRE(restore.n_ops == 1);
  CHECK(part->ops[restore.first_op].kind == OpKind::Prepare);
  CHECK(std::string(part->ops[restore.first_op].name) == "q");
  CHECK(restore.n_stmts == 0);
  CHECK(s.begin == 500 * kMs);
}

namespace {

// `recs` written to a trace in memory whose clock starts at `start`, then
// loaded as the replay command loads a file.
Workload load_memory(const std::vector<Record>& recs, Nanos start, const Window& w) {
  auto sink = std::make_unique<trace::MemorySink>();
  trace::MemorySink* raw = sink.get();
  trace::WriterOptions o;
  o.start_mono_ns = start;
  std::vector<uint8_t> bytes;
  {
    trace::Writer wr(std::move(sink), o);
    for (const auto& r : recs) wr.write(r);
    wr.close();
    bytes = raw->bytes();
  }
  trace::Reader rd(trace::memory_source(std::move(bytes)));
  return load(rd, w);
}

}  // namespace

TEST_CASE("plan: the window counts from the trace start, idle time before the first session included",
          "[replay][plan]") {
  // A proxy started at 1000 s (its clock), idle for 3 s, then two psql
  // sessions: 'a' at 3.1 s and 'b' at 5.2 s after the start, as `trace
  // dump` prints them.
  const Nanos start = 1000'000 * kMs;
  Trace t;
  t.add(start + 3000 * kMs, 1, trace::SessionBegin{"u", "d", "psql", "", 0, 0});
  t.add(start + 3000 * kMs, 1, trace::Ready{'I'});
  t.add(start + 3100 * kMs, 1, trace::Query{"select 'a'"});
  t.add(start + 3101 * kMs, 1, result("SELECT", 1));
  t.add(start + 3101 * kMs, 1, trace::Ready{'I'});
  t.add(start + 3102 * kMs, 1, trace::SessionEnd{});
  t.add(start + 5100 * kMs, 2, trace::SessionBegin{"u", "d", "psql", "", 0, 0});
  t.add(start + 5100 * kMs, 2, trace::Ready{'I'});
  t.add(start + 5200 * kMs, 2, trace::Query{"select 'b'"});
  t.add(start + 5201 * kMs, 2, result("SELECT", 1));
  t.add(start + 5201 * kMs, 2, trace::Ready{'I'});
  t.add(start + 5202 * kMs, 2, trace::SessionEnd{});

  auto sql_of = [](const Workload& w) {
    std::vector<std::string> v;
    const Plan& p = w.plan();
    for (uint32_t i : p.session_units) v.push_back(p.units[i].sql);
    return v;
  };
  Window until4;
  until4.end = 4000 * kMs;
  Workload a = load_memory(t.recs, start, until4);
  CHECK(a.summary().statements == 1);
  CHECK(a.summary().sessions == 1);
  CHECK(sql_of(a) == std::vector<std::string>{"select 'a'"});
  Window from4;
  from4.begin = 4000 * kMs;
  Workload b = load_memory(t.recs, start, from4);
  CHECK(b.summary().statements == 1);
  CHECK(b.summary().sessions == 1);
  CHECK(sql_of(b) == std::vector<std::string>{"select 'b'"});
  // [3 s, 3.1 s) holds session 1's start but none of its statements.
  Window before_a;
  before_a.begin = 3000 * kMs;
  before_a.end = 3100 * kMs;
  CHECK(load_memory(t.recs, start, before_a).summary().statements == 0);

  // A record stamped before the trace start (a clock the capture did not
  // share exactly) counts as at 0: the whole trace still replays, and a
  // window from 0 keeps it.
  Trace early;
  early.add(start - 5 * kMs, 3, trace::SessionBegin{"u", "d", "", "", 0, 0});
  early.add(start - 4 * kMs, 3, trace::Query{"select 'early'"});
  early.add(start - 3 * kMs, 3, result("SELECT", 1));
  early.add(start - 3 * kMs, 3, trace::Ready{'I'});
  early.recs.insert(early.recs.end(), t.recs.begin(), t.recs.end());
  CHECK(load_memory(early.recs, start, Window{}).summary().statements == 3);
  Window first_ms;
  first_ms.end = 1 * kMs;
  CHECK(load_memory(early.recs, start, first_ms).summary().statements == 1);

  // The trace's length, for a --begin past it: its last record from the
  // start, whatever the window, and records of no session count too.
  CHECK(load_memory(t.recs, start, Window{}).summary().trace_end_ns == 5202 * kMs);
  CHECK(load_memory(t.recs, start, until4).summary().trace_end_ns == 5202 * kMs);
  Trace io = t;
  io.add(start + 7000 * kMs, 0, trace::BlockIo{});
  CHECK(load_memory(io.recs, start, Window{}).summary().trace_end_ns == 7000 * kMs);
  CHECK(load_memory({}, start, Window{}).summary().trace_end_ns == 0);
}

namespace {

// A simple Query answered 1 ms later with `ready`.
void query(Trace& t, Nanos ts, uint64_t s, const char* sql, char ready) {
  t.add(ts, s, trace::Query{sql});
  t.add(ts + kMs, s, trace::Result{"X", false, 0});
  t.add(ts + kMs, s, trace::Ready{ready});
}

// The SQL of session `i`'s replayed units with statements, in order.
std::vector<std::string> replayed_sql(const Plan& p, size_t i) {
  std::vector<std::string> v;
  const Session& s = p.sessions[i];
  for (uint32_t k = 0; k < s.n_units; ++k) {
    const Unit& u = p.units[p.session_units[s.first_unit + k]];
    if (u.n_stmts) v.push_back(u.sql ? u.sql : "(extended)");
  }
  return v;
}

}  // namespace

TEST_CASE("check_speed: names the speed and what is wrong with it, not a flag", "[replay][plan]") {
  Trace t;
  t.add(0, 1, trace::SessionBegin{"u", "d", "psql", "", 0, 0});
  t.add(0, 1, trace::Ready{'I'});
  t.add(10 * kMs, 1, trace::Query{"select 1"});
  t.add(11 * kMs, 1, result("SELECT", 1));
  t.add(11 * kMs, 1, trace::Ready{'I'});
  t.add(2000 * kMs, 1, trace::SessionEnd{});
  Workload w = load_memory(t.recs, 0, Window{});
  CHECK_NOTHROW(check_speed(w, 1.0));
  CHECK_THROWS_WITH(check_speed(w, 1e-12), "1e-12: the captured 2.000 s would take more than 146 years");
  CHECK_THROWS_WITH(check_speed(w, 0), "0: must be greater than 0");
  Options o;
  o.speed = 1e-12;
  CHECK_THROWS_WITH(run(w, o), "speed 1e-12: the captured 2.000 s would take more than 146 years");
}

TEST_CASE("plan: a window that starts inside a captured transaction joins the session at its next idle point",
          "[replay][plan]") {
  Trace t;
  for (uint64_t s = 1; s <= 3; ++s) {
    t.add(0, s, trace::SessionBegin{"u", "d", "", "", 0, 0});
    t.add(0, s, trace::Ready{'I'});
  }
  // Session 1 is inside BEGIN ... ROLLBACK at 1 s, then runs a statement on
  // its own and a whole transaction.
  query(t, 100 * kMs, 1, "BEGIN", 'T');
  query(t, 200 * kMs, 1, "INSERT INTO t VALUES (1)", 'T');
  t.add(300 * kMs, 1, trace::Query{"SELECT pg_sleep(1)"});
  t.add(1300 * kMs, 1, result("SELECT", 1));
  t.add(1300 * kMs, 1, trace::Ready{'T'});
  query(t, 1400 * kMs, 1, "INSERT INTO t VALUES (2)", 'T');
  query(t, 1500 * kMs, 1, "ROLLBACK", 'I');
  query(t, 1600 * kMs, 1, "SELECT 'after'", 'I');
  query(t, 1700 * kMs, 1, "BEGIN", 'T');
  query(t, 1800 * kMs, 1, "UPDATE t SET v = 1", 'T');
  query(t, 1900 * kMs, 1, "COMMIT", 'I');
  // Session 2 is idle at 1 s.
  query(t, 1450 * kMs, 2, "SELECT 2", 'I');
  // Session 3 is in a failed transaction at 1 s ('E').
  query(t, 800 * kMs, 3, "BEGIN", 'T');
  t.add(900 * kMs, 3, trace::Query{"SELECT * FROM missing"});
  t.add(901 * kMs, 3, trace::Error{"42P01", "ERROR", "relation does not exist"});
  t.add(901 * kMs, 3, trace::Ready{'E'});
  query(t, 1100 * kMs, 3, "ROLLBACK", 'I');
  query(t, 1200 * kMs, 3, "SELECT 3", 'I');

  auto all = t.build();
  CHECK(all->summary.statements == 14);
  CHECK(all->summary.transactions == 6);
  CHECK(all->summary.captured_errors == 1);

  Window from1;
  from1.begin = 1000 * kMs;
  auto p = t.build(from1);
  REQUIRE(p->sessions.size() == 3);
  // INSERT (2) and ROLLBACK ran inside the transaction begun at 0.1 s:
  // neither is replayed; the session joins after the ROLLBACK.
  CHECK(replayed_sql(*p, 0) == std::vector<std::string>{"SELECT 'after'", "BEGIN", "UPDATE t SET v = 1", "COMMIT"});
  CHECK(replayed_sql(*p, 1) == std::vector<std::string>{"SELECT 2"});
  CHECK(replayed_sql(*p, 2) == std::vector<std::string>{"SELECT 3"});
  CHECK(p->summary.statements == 6);
  CHECK(p->summary.units == 6);
  CHECK(p->summary.transactions == 4);  // 'after', BEGIN..COMMIT, SELECT 2, SELECT 3
  CHECK(p->summary.captured_errors == 0);  // session 3's failed SELECT is before the window
  CHECK(p->sessions[0].captured_transactions == 2);
  // The session still opens at the window's start.
  CHECK(p->sessions[0].begin == 1000 * kMs);

  // A transaction cut by the window's end: its head is sent (and, the
  // session closing, rolled back by the target), not counted as a
  // transaction.
  Window cut;
  cut.begin = 1000 * kMs;
  cut.end = 1750 * kMs;
  auto c = t.build(cut);
  REQUIRE(c->sessions.size() == 3);
  CHECK(replayed_sql(*c, 0) == std::vector<std::string>{"SELECT 'after'", "BEGIN"});
  CHECK(c->summary.statements == 4);
  CHECK(c->summary.transactions == 3);

  // A window inside one transaction replays nothing of it.
  Window inside;
  inside.begin = 1000 * kMs;
  inside.end = 1450 * kMs;
  auto in = t.build(inside);
  CHECK(in->summary.statements == 1);  // SELECT 3
  CHECK(in->summary.transactions == 1);
}

TEST_CASE("plan: a session the capture joined inside a transaction replays from its next idle point",
          "[replay][plan]") {
  const uint32_t joined = trace::kSessionUnknownStartup;
  Trace t;
  for (uint64_t s = 1; s <= 5; ++s) t.add(0, s, trace::SessionBegin{"u", "d", "", "", 0, s == 5 ? 0 : joined});
  // 1: the tail of a transaction opened before the capture, rolled back.
  query(t, 10 * kMs, 1, "UPDATE t SET v = 1", 'T');
  query(t, 20 * kMs, 1, "ROLLBACK", 'I');
  query(t, 30 * kMs, 1, "SELECT 1", 'I');
  // 2: idle when joined, opening a transaction first: all of it replays.
  query(t, 11 * kMs, 2, "  /* app */ Begin Isolation Level Repeatable Read", 'T');
  query(t, 21 * kMs, 2, "SELECT 2", 'T');
  query(t, 31 * kMs, 2, "COMMIT", 'I');
  // 3: inside a failed transaction when joined.
  t.add(12 * kMs, 3, trace::Query{"SELECT * FROM missing"});
  t.add(13 * kMs, 3, trace::Error{"42P01", "ERROR", "relation does not exist"});
  t.add(13 * kMs, 3, trace::Ready{'E'});
  query(t, 22 * kMs, 3, "ROLLBACK", 'I');
  query(t, 32 * kMs, 3, "SELECT 3", 'I');
  // 4: its first statement ends a transaction: replayed (a COMMIT outside
  // one only warns).
  query(t, 14 * kMs, 4, "COMMIT", 'I');
  query(t, 24 * kMs, 4, "SELECT 4", 'I');
  // 5: captured from its start; "START TRANSACTION" opens one.
  query(t, 15 * kMs, 5, "start  transaction", 'T');
  query(t, 25 * kMs, 5, "COMMIT", 'I');

  auto p = t.build();
  REQUIRE(p->sessions.size() == 5);
  CHECK(replayed_sql(*p, 0) == std::vector<std::string>{"SELECT 1"});
  CHECK(replayed_sql(*p, 1) ==
        std::vector<std::string>{"  /* app */ Begin Isolation Level Repeatable Read", "SELECT 2", "COMMIT"});
  CHECK(replayed_sql(*p, 2) == std::vector<std::string>{"SELECT 3"});
  CHECK(replayed_sql(*p, 3) == std::vector<std::string>{"COMMIT", "SELECT 4"});
  CHECK(replayed_sql(*p, 4) == std::vector<std::string>{"start  transaction", "COMMIT"});
  CHECK(p->summary.joined_in_transaction == 2);
  CHECK(p->summary.statements == 9);
  CHECK(p->summary.transactions == 6);  // SELECT 1, 2's, SELECT 3, COMMIT, SELECT 4, 5's

  // A session whose first statement ends inside a transaction it did not
  // open is passed over until idle, with or without a window; a window that
  // starts after it changes nothing.
  Window later;
  later.begin = 25 * kMs;
  auto w = t.build(later);
  CHECK(w->summary.joined_in_transaction == 0);
  CHECK(replayed_sql(*w, 0) == std::vector<std::string>{"SELECT 1"});
}

TEST_CASE("plan: statements prepared in the transaction tail a window passes over are prepared again",
          "[replay][plan]") {
  Trace t;
  std::vector<trace::Param> none;
  std::vector<int16_t> fmts;
  auto prepare = [&](Nanos at, const char* name, const char* sql, char ready) {
    t.add(at, 1, trace::Parse{name, sql, {}});
    t.add(at, 1, trace::Sync{});
    t.add(at + kMs, 1, trace::Ready{ready});
  };
  auto exec = [&](Nanos at, const char* name, char ready) {
    t.add(at, 1, trace::Bind{"", name, none, fmts});
    t.add(at, 1, trace::Execute{"", 0});
    t.add(at, 1, trace::Sync{});
    t.add(at + kMs, 1, result("SELECT", 1));
    t.add(at + kMs, 1, trace::Ready{ready});
  };
  t.add(0, 1, trace::SessionBegin{"u", "d", "", "", 0, 0});
  t.add(0, 1, trace::Ready{'I'});
  prepare(10 * kMs, "q", "SELECT 1", 'I');
  prepare(20 * kMs, "gone", "SELECT 0", 'I');
  query(t, 100 * kMs, 1, "BEGIN", 'T');
  // In the window, still inside the transaction: passed over.
  prepare(600 * kMs, "r", "SELECT 2", 'T');
  t.add(700 * kMs, 1, trace::Close{'S', "gone"});
  t.add(700 * kMs, 1, trace::Sync{});
  t.add(701 * kMs, 1, trace::Ready{'T'});
  exec(750 * kMs, "q", 'T');
  query(t, 800 * kMs, 1, "COMMIT", 'I');
  // Idle again: replayed.
  exec(900 * kMs, "r", 'I');
  exec(950 * kMs, "q", 'I');

  Window w;
  w.begin = 500 * kMs;
  auto p = t.build(w);
  REQUIRE(p->sessions.size() == 1);
  const Session& s = p->sessions[0];
  REQUIRE(s.n_units == 3);  // re-prepare, then the two Executes
  const Unit& restore = p->units[p->session_units[s.first_unit]];
  CHECK(restore.n_stmts == 0);
  CHECK(restore.ts == 900 * kMs);
  std::vector<std::string> names;
  for (uint32_t i = 0; i < restore.n_ops; ++i) {
    CHECK(p->ops[restore.first_op + i].kind == OpKind::Prepare);
    names.push_back(p->ops[restore.first_op + i].name);
  }
  // In the order they were parsed; "gone" was closed before.
  CHECK(names == std::vector<std::string>{"q", "r"});
  REQUIRE(restore.wire_len > 0);
  CHECK(restore.wire[0] == 'P');
  CHECK(restore.wire[restore.wire_len - 5] == 'S');
  CHECK(p->summary.statements == 2);
  CHECK(p->summary.transactions == 2);
  CHECK(p->summary.units == 3);
}

TEST_CASE("plan: for any window over a TPC-B-like trace the counted transactions are those the replay ends",
          "[replay][plan]") {
  // pgbench's built-in script, simple protocol: BEGIN; 5 statements; END,
  // ReadyForQuery 'T' inside, 'I' after END; 3 clients, out of step.
  const char* script[] = {"BEGIN;", "UPDATE a", "SELECT a", "UPDATE t", "UPDATE b", "INSERT h", "END;"};
  Trace t;
  const Nanos start = 7000 * kMs;  // the first client connects 7 s after the trace start
  for (uint64_t c = 1; c <= 3; ++c) {
    Nanos ts = start + static_cast<Nanos>(c) * 3 * kMs;
    t.add(ts, c, trace::SessionBegin{"u", "d", "", "", 0, 0});
    t.add(ts, c, trace::Ready{'I'});
    for (int x = 0; x < 20; ++x)
      for (int k = 0; k < 7; ++k) {
        ts += static_cast<Nanos>(1 + c) * kMs;
        query(t, ts, c, script[k], k == 6 ? 'I' : 'T');
      }
    t.add(ts + 2 * kMs, c, trace::SessionEnd{});
  }
  // What the target does with the units kept: statements outside
  // BEGIN ... END run on their own (autocommit), and the replay counts a
  // transaction at each idle ReadyForQuery after statements.
  auto replayed_transactions = [](const Plan& p) {
    uint64_t n = 0;
    for (const Session& s : p.sessions) {
      bool in_txn = false;
      uint64_t since_idle = 0;
      for (uint32_t k = 0; k < s.n_units; ++k) {
        const Unit& u = p.units[p.session_units[s.first_unit + k]];
        if (!u.n_stmts) continue;
        std::string sql = u.sql;
        if (sql == "BEGIN;") in_txn = true;
        if (sql == "END;") in_txn = false;
        since_idle += u.n_stmts;
        if (!in_txn) {
          if (since_idle) ++n;
          since_idle = 0;
        }
      }
    }
    return n;
  };
  auto whole = t.build();
  uint64_t windows = 0, cut_at_begin = 0;
  for (Nanos b = 6990 * kMs; b < 7200 * kMs; b += 7 * kMs)
    for (Nanos len : {20 * kMs, 55 * kMs, 1000 * kMs}) {
      Window w;
      w.begin = b;
      w.end = b + len;
      auto p = t.build(w);
      INFO("window [" << b / kMs << " ms, " << (b + len) / kMs << " ms)");
      ++windows;
      CHECK(p->summary.transactions == replayed_transactions(*p));
      // Every session replays from an idle point: its first statement is a
      // BEGIN, and it is never inside a transaction it did not begin.
      for (size_t i = 0; i < p->sessions.size(); ++i) {
        auto sql = replayed_sql(*p, i);
        if (sql.empty()) continue;
        CHECK(sql.front() == "BEGIN;");
      }
      // Statements: whole transactions, and at most one cut by the end per
      // session.
      uint64_t ends = 0;
      for (size_t i = 0; i < p->sessions.size(); ++i)
        for (const auto& q : replayed_sql(*p, i)) ends += q == "END;";
      CHECK(ends == p->summary.transactions);
      CHECK(p->summary.statements >= 7 * ends);
      CHECK(p->summary.statements < 7 * ends + 7 * p->sessions.size());
      // Windows whose begin falls inside some client's transaction: a
      // session's first unit sent from then on is not a BEGIN.
      for (const Session& s : whole->sessions)
        for (uint32_t k = 0; k < s.n_units; ++k) {
          const Unit& u = whole->units[whole->session_units[s.first_unit + k]];
          if (u.ts < b) continue;
          if (std::string(u.sql) != "BEGIN;") ++cut_at_begin;
          break;
        }
    }
  CHECK(windows > 50);
  CHECK(cut_at_begin > 20);  // the case this test is about does occur
}

TEST_CASE("round-trip log lines: pgbench -l's columns, then tierlab's share of the lag, the captured latency and the result",
          "[replay][log]") {
  char buf[kUnitLogLineMax];
  UnitLogLine l;
  l.session = 17;
  l.unit = 3;
  l.latency = 1'234'567;                   // 1234.567 us: whole microseconds, as pgbench
  l.end_unix = 1'796'190'000'123'456'789;  // s and us of the end
  l.lag = 250'999;
  l.own_lag = 40'000;
  l.captured = 999;
  CHECK(std::string(buf, format_unit_log_line(buf, l)) == "17 3 1234 0 1796190000 123456 250 40 0 ok\n");

  l.captured = -1;  // unknown
  l.failed = true;
  std::memcpy(l.sqlstate, "22012", 6);
  CHECK(std::string(buf, format_unit_log_line(buf, l)) == "17 3 1234 0 1796190000 123456 250 40 - 22012\n");
  l.sqlstate[0] = 0;  // an error without a SQLSTATE
  CHECK(std::string(buf, format_unit_log_line(buf, l)) == "17 3 1234 0 1796190000 123456 250 40 - error\n");

  // The widest line fits the bound the buffers are sized by.
  UnitLogLine w;
  w.session = UINT64_MAX;
  w.unit = UINT32_MAX;
  w.latency = w.lag = w.own_lag = w.captured = w.end_unix = INT64_MAX;
  w.failed = true;
  std::memcpy(w.sqlstate, "XX000", 6);
  size_t n = format_unit_log_line(buf, w);
  CHECK(n <= kUnitLogLineMax);
  CHECK(buf[n - 1] == '\n');
  CHECK(std::count(buf, buf + n, ' ') == 9);
}

TEST_CASE("round-trip log: a file that cannot be made is a SettingError naming the path, not a flag",
          "[replay][log]") {
  const std::string path = "/nonexistent-tierlab-dir/x.log";
  try {
    open_unit_log(path);
    FAIL("opened " << path);
  } catch (const SettingError& e) {
    CHECK(e.setting() == "log_path");
    CHECK(std::string(e.what()) == path + ": No such file or directory");
  }
}

TEST_CASE("plan: an Execute that resumes a portal and a Bind of a statement prepared before the capture get their fingerprints",
          "[replay][plan]") {
  Trace t;
  t.add(0, 4, trace::SessionBegin{"u", "d", "", "", 0, 0});
  // A name longer than std::string keeps inline, and a named portal run in
  // two steps (max_rows), then a statement the capture never saw prepared.
  t.add(1 * kMs, 4, trace::Parse{"__asyncpg_stmt_1f__", "SELECT a FROM t WHERE id = $1", {}});
  t.add(1 * kMs, 4, trace::Bind{"cursor_one", "__asyncpg_stmt_1f__", {}, {}});
  t.add(1 * kMs, 4, trace::Execute{"cursor_one", 1});
  t.add(1 * kMs, 4, trace::Execute{"cursor_one", 1});
  t.add(1 * kMs, 4, trace::Bind{"", "S_9", {}, {}});
  t.add(1 * kMs, 4, trace::Execute{"", 0});
  t.add(1 * kMs, 4, trace::Sync{});
  t.add(2 * kMs, 4, trace::Ready{'I'});
  auto p = t.build();
  REQUIRE(p->sessions[0].n_units == 1);
  const Unit& u = p->units[p->session_units[0]];
  REQUIRE(u.n_stmts == 3);
  const auto text = [&](uint32_t i) { return p->fingerprints[p->stmts[u.first_stmt + i].fp]; };
  CHECK(text(0) == normalize_sql("SELECT a FROM t WHERE id = $1"));
  CHECK(text(1) == text(0));  // the resumed portal is the statement it was bound to
  CHECK(text(2) == normalize_sql("EXECUTE S_9 /* prepared before the capture */"));
  CHECK(p->summary.libpq_unsupported == 1);  // the resumed portal
}
