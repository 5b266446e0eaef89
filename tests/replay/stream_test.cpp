// A streamed workload (replay::stream: pass 1 plan_streamed, pass 2
// UnitStream) is the loaded one (replay::load), unit for unit: the same
// sessions, summary and units in the same order, with the window's rule
// (a session joins at its first idle point, re-preparing what it left
// prepared) and shards applied the same way; and the stream holds a few
// batches, not the trace.
#include "replay/plan.h"
#include "replay/replay.h"
#define TIERLAB_ALLOC_COUNTER_READ_ONLY  // replay_alloc_test.cpp counts for the binary
#include "support/alloc_counter.h"
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <span>
#include <random>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;
using trace::Record;

namespace {

constexpr Nanos kStreamMs = 1000000;

// Records refer to their strings and parameters: these keep them.
std::string_view keep(std::string s) {
  static std::deque<std::string> strings;
  return strings.emplace_back(std::move(s));
}
std::span<const trace::Param> keep(std::vector<trace::Param> p) {
  static std::deque<std::vector<trace::Param>> params;
  return params.emplace_back(std::move(p));
}

// Records of several kinds of session, interleaved by time as a capture
// writes them. `rounds` sets the length.
std::vector<Record> mixed_trace(int rounds) {
  std::vector<std::pair<Record, uint64_t>> recs;  // record, sequence (ties keep session order)
  uint64_t seq = 0;
  auto add = [&](Nanos ts, uint64_t s, trace::Body b) { recs.push_back({Record{ts, s, std::move(b)}, seq++}); };
  static const std::vector<uint32_t> int4{23};
  static const std::vector<int16_t> none;
  for (uint64_t s = 1; s <= 6; ++s) {
    Nanos ts = static_cast<Nanos>(s) * kStreamMs / 3;
    if (s != 3) {  // session 3: joined mid-stream, inside a transaction
      add(ts, s, trace::SessionBegin{keep("u" + std::to_string(s)), "db", "app", "", 0, 0});
      add(ts, s, trace::Ready{'I'});
    }
    if (s == 2) {
      add(ts, s, trace::Parse{"p", "SELECT abalance FROM acc WHERE aid = $1", int4});
      add(ts, s, trace::Parse{"q", "UPDATE acc SET abalance = abalance + 1 WHERE aid = $1", int4});
      add(ts, s, trace::Sync{});
      add(ts + kStreamMs / 10, s, trace::Ready{'I'});
    }
    if (s == 3) {
      add(ts, s, trace::Query{"UPDATE acc SET abalance = 0 WHERE aid = 7"});
      add(ts + kStreamMs / 10, s, trace::Result{"UPDATE 1", false, 0});
      add(ts + kStreamMs / 10, s, trace::Ready{'T'});
      add(ts + kStreamMs / 5, s, trace::Query{"COMMIT"});
      add(ts + kStreamMs / 4, s, trace::Result{"COMMIT", false, 0});
      add(ts + kStreamMs / 4, s, trace::Ready{'I'});
    }
    for (int k = 0; k < rounds; ++k) {
      ts = static_cast<Nanos>(k + 1) * kStreamMs + static_cast<Nanos>(s) * 10000;
      const std::string_view v = keep(std::to_string(k * 7 + static_cast<int>(s)));
      const Nanos a = ts + 50000;  // the answer
      switch (s) {
        case 1:  // simple queries, a transaction every fourth round
          if (k % 4 == 0) {
            add(ts, s, trace::Query{"BEGIN"});
            add(a, s, trace::Result{"BEGIN", false, 0});
            add(a, s, trace::Ready{'T'});
            add(a + 1000, s, trace::Query{keep("UPDATE acc SET abalance = 1 WHERE aid = " + std::string(v))});
            add(a + 2000, s, trace::Result{"UPDATE 1", false, 0});
            add(a + 2000, s, trace::Ready{'T'});
            add(a + 3000, s, trace::Query{"COMMIT"});
            add(a + 4000, s, trace::Result{"COMMIT", false, 0});
            add(a + 4000, s, trace::Ready{'I'});
          } else {
            add(ts, s, trace::Query{keep("SELECT " + std::string(v))});
            add(a, s, trace::Result{"SELECT 1", true, 1});
            add(a, s, trace::Ready{'I'});
          }
          break;
        case 2: {  // prepared statements, a Close now and then
          auto ps = keep(std::vector<trace::Param>{trace::Param{0, false, v}});
          const char* name = k % 3 == 0 ? "q" : "p";
          add(ts, s, trace::Bind{"", name, ps, none});
          add(ts, s, trace::Describe{'P', ""});
          add(ts, s, trace::Execute{"", 0});
          add(ts, s, trace::Sync{});
          add(a, s, trace::Result{k % 3 == 0 ? "UPDATE 1" : "SELECT 1", k % 3 != 0, 1});
          add(a, s, trace::Ready{'I'});
          if (k % 10 == 9) {
            add(a + 1000, s, trace::Close{'S', "q"});
            add(a + 1000, s, trace::Parse{"q", "UPDATE acc SET abalance = abalance + 1 WHERE aid = $1", int4});
            add(a + 1000, s, trace::Sync{});
            add(a + 2000, s, trace::Ready{'I'});
          }
          break;
        }
        case 3: {  // unnamed extended statements
          auto ps = keep(std::vector<trace::Param>{trace::Param{0, false, v}});
          add(ts, s, trace::Parse{"", "INSERT INTO hist VALUES ($1)", int4});
          add(ts, s, trace::Bind{"", "", ps, none});
          add(ts, s, trace::Execute{"", 0});
          add(ts, s, trace::Sync{});
          add(a, s, trace::Result{"INSERT 0 1", false, 1});
          add(a, s, trace::Ready{'I'});
          break;
        }
        case 4:  // COPY FROM STDIN every other round, else a query
          if (k % 2 == 0) {
            add(ts, s, trace::Query{"COPY hist FROM STDIN"});
            add(ts + 1000, s, trace::CopyData{trace::CopyDir::In, keep(std::string(v) + "\n" + std::string(v) + "\n")});
            add(ts + 2000, s, trace::CopyDone{trace::CopyDir::In});
            add(a, s, trace::Result{"COPY 2", true, 2});
            add(a, s, trace::Ready{'I'});
          } else {
            add(ts, s, trace::Query{"SELECT count(*) FROM hist"});
            add(a, s, trace::Result{"SELECT 1", true, 1});
            add(a, s, trace::Ready{'I'});
          }
          break;
        case 5: {  // errors, simple and extended
          add(ts, s, trace::Query{keep("SELECT * FROM missing_" + std::string(v))});
          add(a, s, trace::Error{"42P01", "ERROR", "no such table"});
          add(a, s, trace::Ready{'I'});
          auto ps = keep(std::vector<trace::Param>{trace::Param{0, false, "0"}});
          add(a + 1000, s, trace::Parse{"", "SELECT 1 / $1::int", int4});
          add(a + 1000, s, trace::Bind{"", "", ps, none});
          add(a + 1000, s, trace::Execute{"", 0});
          add(a + 1000, s, trace::Parse{"", "SELECT 2", {}});
          add(a + 1000, s, trace::Bind{"", "", {}, none});
          add(a + 1000, s, trace::Execute{"", 0});
          add(a + 1000, s, trace::Sync{});
          add(a + 2000, s, trace::Error{"22012", "ERROR", "division by zero"});
          add(a + 2000, s, trace::Ready{'I'});
          break;
        }
        case 6: {  // two Sync groups in flight at once (a pipeline)
          auto ps = keep(std::vector<trace::Param>{trace::Param{0, false, v}});
          for (int g = 0; g < 2; ++g) {
            add(ts, s, trace::Parse{"", "SELECT $1::int", int4});
            add(ts, s, trace::Bind{"", "", ps, none});
            add(ts, s, trace::Execute{"", 0});
            add(ts, s, trace::Sync{});
          }
          for (int g = 0; g < 2; ++g) {
            add(a + g * 1000, s, trace::Result{"SELECT 1", true, 1});
            add(a + g * 1000, s, trace::Ready{'I'});
          }
          break;
        }
      }
    }
    if (s != 6) add(static_cast<Nanos>(rounds + 2) * kStreamMs, s, trace::SessionEnd{trace::EndReason::Clean});
  }
  std::stable_sort(recs.begin(), recs.end(), [](const auto& x, const auto& y) { return x.first.ts < y.first.ts; });
  std::vector<Record> out;
  for (auto& r : recs) out.push_back(std::move(r.first));
  return out;
}

void write_trace(const std::string& path, const std::vector<Record>& recs) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  auto w = trace::open_writer(path, o);
  for (const Record& r : recs) w->write(r);
  w->close();
}

std::string text(const char* p) { return p ? std::string("'") + p + "'" : "null"; }

// Everything the replay reads of a unit, as text, so that a difference
// shows where it is.
std::string describe(const Tables& t, const Unit& u, const std::vector<std::string>& fps) {
  std::string d = "kind " + std::to_string(int(u.kind)) + " fail " + std::to_string(u.copy_fail) + " ready " +
                  std::to_string(int(u.ready)) + " ts " + std::to_string(u.ts) + " ready_ts " +
                  std::to_string(u.ready_ts) + " sql " + text(u.sql) + " unsupported " +
                  std::to_string(u.libpq_unsupported);
  d += " wire " + (u.wire ? std::string(u.wire, u.wire_len) : "null");
  d += " copy_wire " + (u.copy_wire ? std::string(u.copy_wire, u.copy_wire_len) : "null");
  for (uint32_t i = 0; i < u.n_stmts; ++i) {
    const Stmt& s = t.stmts[u.first_stmt + i];
    d += " | stmt " + fps.at(s.fp) + " status " + std::to_string(int(s.captured.status)) + " state " +
         s.captured.sqlstate + " rows " + std::to_string(s.captured.rows) + " has " +
         std::to_string(s.captured.has_rows) + " lat " + std::to_string(s.captured_latency);
  }
  for (uint32_t i = 0; i < u.n_ops; ++i) {
    const Op& o = t.ops[u.first_op + i];
    d += " | op " + std::to_string(int(o.kind)) + " " + text(o.name) + " " + text(o.sql) + " fmt " +
         std::to_string(o.result_format) + " n " + std::to_string(o.nparams);
    if (o.kind == OpKind::Prepare)
      for (int k = 0; k < o.nparams; ++k) d += " type " + std::to_string(t.types[o.types + k]);
    if (o.kind == OpKind::Execute) {
      for (int k = 0; k < o.nparams; ++k)
        d += " param " + text(t.param_values[o.params + k]) + "/" + std::to_string(t.param_lengths[o.params + k]) +
             "/" + std::to_string(t.param_formats[o.params + k]);
      d += " stmt " + fps.at(t.stmts[o.stmt].fp);
    }
  }
  for (uint32_t i = 0; i < u.n_copy; ++i) {
    const CopyChunk& c = t.copy_chunks[u.first_copy + i];
    d += " | copy " + std::string(c.data, c.len);
  }
  return d;
}

// A unit's commit order: its commit point, what it waits for under --sync
// commit and under --sync all.
std::string describe_sync(const Tables& t, const Unit& u) {
  std::string d = " commit " + std::to_string(u.commit) + " need " + std::to_string(u.sync_need) + " deps";
  for (uint32_t i = 0; i < u.n_sync_deps; ++i) d += " " + std::to_string(t.sync_deps[u.sync_dep + i]);
  return d + " all " + std::to_string(u.sync_all);
}

// `most_units`: set to the most units a batch held. `sync`: the streamed
// plan with commit order, whose every unit's wait is the loaded one's.
void check_same(const std::string& path, const Window& window, const Shard& shard, size_t* most_units = nullptr,
                bool sync = false, size_t max_batches = 0) {
  auto reader = trace::open_reader(path);
  Workload loaded = load(*reader, window, shard);
  Workload streamed = stream(path, window, shard, sync);
  if (sync) {
    REQUIRE(streamed.sync_unplanned() == "");
    CHECK(streamed.plan().commits == loaded.plan().commits);
  }
  const Plan& lp = loaded.plan();
  const Plan& sp = streamed.plan();
  REQUIRE(sp.streamed);
  REQUIRE(sp.units.empty());
  const WorkloadSummary& a = lp.summary;
  const WorkloadSummary& b = sp.summary;
  CHECK(a.sessions == b.sessions);
  CHECK(a.units == b.units);
  CHECK(a.statements == b.statements);
  CHECK(a.transactions == b.transactions);
  CHECK(a.captured_errors == b.captured_errors);
  CHECK(a.copy_bytes == b.copy_bytes);
  CHECK(a.max_concurrency == b.max_concurrency);
  CHECK(a.fingerprints == b.fingerprints);
  CHECK(a.unsupported == b.unsupported);
  CHECK(a.libpq_unsupported == b.libpq_unsupported);
  CHECK(a.joined_in_transaction == b.joined_in_transaction);
  CHECK(a.commit_points == b.commit_points);
  CHECK(a.duration_ns == b.duration_ns);
  CHECK(a.trace_end_ns == b.trace_end_ns);
  CHECK(a.trace_sessions == b.trace_sessions);
  CHECK(lp.t0 == sp.t0);
  CHECK(lp.fingerprints == sp.fingerprints);
  REQUIRE(lp.sessions.size() == sp.sessions.size());
  std::vector<uint32_t> all;
  for (uint32_t i = 0; i < sp.sessions.size(); ++i) {
    const Session& x = lp.sessions[i];
    const Session& y = sp.sessions[i];
    INFO("session " << x.id);
    CHECK(x.id == y.id);
    CHECK(std::string(x.user) == y.user);
    CHECK(std::string(x.database) == y.database);
    CHECK(x.begin == y.begin);
    CHECK(x.end == y.end);
    CHECK(x.n_units == y.n_units);
    CHECK(x.captured_transactions == y.captured_transactions);
    if (sync) CHECK(x.sync_all == y.sync_all);
    all.push_back(i);
  }
  CHECK(max_speed_gates(lp) == max_speed_gates(sp));
  // Pass 2, all sessions in one stream: each session's units in order.
  std::vector<std::vector<std::string>> got(sp.sessions.size());
  UnitStream us(trace::open_reader(path), sp, window, shard, all);
  size_t held = 0, most = 0;
  while (UnitBatch* batch = us.next()) {
    ++held;
    most = std::max(most, held);
    for (uint32_t i : batch->order)
      got[batch->session].push_back(describe(*batch, batch->units[i], sp.fingerprints) +
                                    (sync ? describe_sync(*batch, batch->units[i]) : ""));
    if (most_units) *most_units = std::max(*most_units, batch->units.size());
    us.recycle(batch);
    --held;
  }
  for (uint32_t i = 0; i < lp.sessions.size(); ++i) {
    const Session& s = lp.sessions[i];
    INFO("session " << s.id);
    REQUIRE(got[i].size() == s.n_units);
    for (uint32_t k = 0; k < s.n_units; ++k) {
      INFO("unit " << k);
      const Unit& u = lp.units[lp.session_units[s.first_unit + k]];
      CHECK(got[i][k] == describe(lp, u, lp.fingerprints) + (sync ? describe_sync(lp, u) : ""));
    }
  }
  // Each batch recycled before the next: the stream made only a few
  // (those of the sessions with units in the making, and with commit
  // order those of the transactions still open).
  INFO("batches made: " << us.batches());
  CHECK(us.batches() <= (max_batches ? max_batches : sync ? 64u : 8u));
}

}  // namespace

TEST_CASE("a streamed workload is the loaded one, unit for unit", "[replay][stream]") {
  tierlab::test::TempDir dir;
  const std::string path = dir.file("mixed.tlt");
  write_trace(path, mixed_trace(40));
  SECTION("the whole trace") { check_same(path, {}, {}); }
  SECTION("a window that starts inside transactions and after statements were prepared") {
    Window w;
    w.begin = 9 * kStreamMs + 200000;  // session 1 is inside its BEGIN ... COMMIT then
    w.end = 30 * kStreamMs;
    check_same(path, w, {});
  }
  SECTION("a window that ends before some sessions begin") {
    Window w;
    w.end = kStreamMs / 2;
    check_same(path, w, {});
  }
  SECTION("shards") {
    for (uint32_t k = 0; k < 3; ++k) check_same(path, {}, Shard{k, 3});
  }
}

namespace {

// Sessions whose transactions conflict: 5 sessions over 4 accounts, each
// round a transaction (BEGIN, a SELECT and an UPDATE of one account,
// COMMIT), an autocommit UPDATE, or a read; now and then an INSERT, a
// failed statement (waits for everything before it) and commits that end
// at the same time (ties). Interleaved by time.
std::vector<Record> conflicting_trace(int rounds) {
  std::vector<std::pair<Record, uint64_t>> recs;
  uint64_t seq = 0;
  auto add = [&](Nanos ts, uint64_t s, trace::Body b) { recs.push_back({Record{ts, s, std::move(b)}, seq++}); };
  std::mt19937 rng(7);
  for (uint64_t s = 1; s <= 5; ++s) {
    add(0, s, trace::SessionBegin{"u", "db", "app", "", 0, 0});
    add(0, s, trace::Ready{'I'});
    Nanos ts = static_cast<Nanos>(s) * 1000;
    for (int k = 0; k < rounds; ++k) {
      const std::string aid = std::to_string(rng() % 4 + 1);
      const int kind = static_cast<int>(rng() % 8);
      // Every 16th round of sessions 1 and 2 ends at the same time (a tie).
      if (s <= 2 && k % 16 == 0) ts = (k + 1) * 400000;
      auto q = [&](const std::string& sql, const char* tag, char ready, bool error = false) {
        add(ts, s, trace::Query{keep(sql)});
        ts += 20000 + static_cast<Nanos>(rng() % 30000);
        if (error) add(ts, s, trace::Error{"23505", "ERROR", "duplicate key"});
        else add(ts, s, trace::Result{tag, false, 1});
        add(ts, s, trace::Ready{ready});
        ts += 5000 + static_cast<Nanos>(rng() % 10000);
      };
      if (kind <= 2) {
        q("BEGIN", "BEGIN", 'T');
        q("SELECT abalance FROM acc WHERE aid = " + aid, "SELECT 1", 'T');
        q("UPDATE acc SET abalance = " + std::to_string(k) + " WHERE aid = " + aid, "UPDATE 1", 'T');
        q("COMMIT", "COMMIT", 'I');
      } else if (kind <= 4) {
        q("UPDATE acc SET abalance = abalance - 1 WHERE aid = " + aid, "UPDATE 1", 'I');
      } else if (kind == 5) {
        q("INSERT INTO hist VALUES (" + aid + ")", "INSERT 0 1", 'I', k % 5 == 0);
      } else {
        q("SELECT abalance FROM acc WHERE aid = " + aid, "SELECT 1", 'I');
      }
    }
    add(ts, s, trace::SessionEnd{trace::EndReason::Clean});
  }
  std::stable_sort(recs.begin(), recs.end(), [](const auto& x, const auto& y) { return x.first.ts < y.first.ts; });
  std::vector<Record> out;
  for (auto& r : recs) out.push_back(std::move(r.first));
  return out;
}

}  // namespace

TEST_CASE("a streamed workload with commit order plans every unit's wait as the loaded one",
          "[replay][stream][sync]") {
  tierlab::test::TempDir dir;
  SECTION("transactions that conflict") {
    const std::string path = dir.file("conflicts.tlt");
    write_trace(path, conflicting_trace(300));
    SECTION("the whole trace") { check_same(path, {}, {}, nullptr, true); }
    SECTION("a window") {
      Window w;
      w.begin = 20 * kMs + 10000;
      w.end = 60 * kMs;
      check_same(path, w, {}, nullptr, true);
    }
    SECTION("shards") {
      for (uint32_t k = 0; k < 2; ++k) check_same(path, {}, Shard{k, 2}, nullptr, true);
    }
  }
  SECTION("records a little out of time order (the stream holds its events that much longer)") {
    const std::string path = dir.file("skewed.tlt");
    std::vector<Record> recs = conflicting_trace(300);
    for (size_t i = 0; i + 1 < recs.size(); i += 37)
      if (recs[i].session != recs[i + 1].session) std::swap(recs[i], recs[i + 1]);
    write_trace(path, recs);
    check_same(path, {}, {}, nullptr, true, SIZE_MAX);  // held as long as the records are out of order
  }
  SECTION("sessions of every kind") {
    const std::string path = dir.file("mixed.tlt");
    write_trace(path, mixed_trace(40));
    check_same(path, {}, {}, nullptr, true);
  }
}

TEST_CASE("a trace out of time order cannot be planned as it is read, and says why", "[replay][stream][sync]") {
  tierlab::test::TempDir dir;
  const std::string path = dir.file("unordered.tlt");
  std::vector<Record> recs = conflicting_trace(20);
  recs[40].ts = recs[60].ts + 2'000'000'000;  // 2 s ahead of the records after it
  write_trace(path, recs);
  Workload w = stream(path, {}, {}, true);
  CHECK_THAT(w.sync_unplanned(), Catch::Contains("out of time order"));
  Options o;
  o.sync = true;
  REQUIRE_THROWS_WITH(run(w, o), Catch::Contains("cannot be planned as the trace is read"));
}

namespace {

// Session 1 pipelines and is never idle: it sends each Sync group (a
// prepared UPDATE, an unnamed SELECT with its Parse, now and then a Close
// and a COPY) before the answers of the one before arrive. Session 2 runs
// simple queries beside it.
void pipelining_trace(const std::string& path, int rounds) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  auto w = trace::open_writer(path, o);
  const std::vector<uint32_t> int4{23};
  const std::vector<int16_t> none;
  for (uint64_t s = 1; s <= 2; ++s) {
    w->write(0, s, trace::SessionBegin{"", "", "", "", 0, 0});
    w->write(0, s, trace::Ready{'I'});
  }
  w->write(1000, 1, trace::Parse{"up", "UPDATE acc SET abalance = abalance + 1 WHERE aid = $1", int4});
  w->write(1000, 1, trace::Sync{});
  std::vector<std::string> answers;  // of the group sent last: its records' kinds
  for (int k = 0; k < rounds; ++k) {
    const Nanos ts = (k + 1) * kStreamMs / 10;
    const std::string v = std::to_string(k);
    std::vector<trace::Param> ps{trace::Param{0, false, v}};
    w->write(ts, 1, trace::Bind{"", "up", ps, none});
    w->write(ts, 1, trace::Execute{"", 0});
    w->write(ts, 1, trace::Parse{"", "SELECT $1::int AS x", int4});
    w->write(ts, 1, trace::Bind{"", "", ps, none});
    w->write(ts, 1, trace::Execute{"", 0});
    if (k % 7 == 3) w->write(ts, 1, trace::Close{'S', "gone"});
    w->write(ts, 1, trace::Sync{});
    if (k % 5 == 2) {
      w->write(ts, 1, trace::Query{"COPY hist FROM STDIN"});
      w->write(ts, 1, trace::CopyData{trace::CopyDir::In, v + "\n"});
      w->write(ts, 1, trace::CopyDone{trace::CopyDir::In});
    }
    // The answers of the round before (the first Sync's, at round 0).
    const Nanos a = ts + 500;
    if (k == 0) {
      w->write(a, 1, trace::Ready{'I'});
    } else {
      w->write(a, 1, trace::Result{"UPDATE 1", false, 1});
      w->write(a, 1, trace::Result{"SELECT 1", true, 1});
      w->write(a, 1, trace::Ready{'I'});
      if ((k - 1) % 5 == 2) {
        w->write(a, 1, trace::Result{"COPY 1", true, 1});
        w->write(a, 1, trace::Ready{'I'});
      }
    }
    w->write(ts + 100, 2, trace::Query{"SELECT " + v});
    w->write(ts + 200, 2, trace::Result{"SELECT 1", true, 1});
    w->write(ts + 200, 2, trace::Ready{'I'});
  }
  w->write((rounds + 1) * kStreamMs / 10, 1, trace::SessionEnd{trace::EndReason::Clean});
  w->write((rounds + 1) * kStreamMs / 10, 2, trace::SessionEnd{trace::EndReason::Clean});
  w->close();
}

}  // namespace

TEST_CASE("a streamed session that pipelines and is never idle is handed on in bounded batches", "[replay][stream]") {
  tierlab::test::TempDir dir;
  const std::string path = dir.file("pipeline.tlt");
  const int rounds = 500;
  pipelining_trace(path, rounds);
  size_t most = 0;
  SECTION("the whole trace") { check_same(path, {}, {}, &most); }
  SECTION("a window") {
    Window w;
    w.begin = 10 * kStreamMs + 300;
    w.end = 40 * kStreamMs;
    check_same(path, w, {}, &most);
  }
  // Before: the session's one batch held every unit of the trace (over
  // 1,000). Now the answered units go on 32 at a time, with the few in
  // flight.
  INFO("most units in a batch: " << most);
  CHECK(most > 0);
  CHECK(most <= 40);
}

TEST_CASE("a streamed workload with a statement pass 1 did not see fails with a message", "[replay][stream]") {
  tierlab::test::TempDir dir;
  const std::string a = dir.file("a.tlt"), b = dir.file("b.tlt");
  write_trace(a, mixed_trace(5));
  std::vector<Record> other = mixed_trace(5);
  for (Record& r : other)
    if (auto* q = std::get_if<trace::Query>(&r.body)) q->sql = keep("SELECT 'changed' FROM t" + std::string(q->sql));
  write_trace(b, other);
  Workload w = stream(a);
  std::vector<uint32_t> all;
  for (uint32_t i = 0; i < w.plan().sessions.size(); ++i) all.push_back(i);
  UnitStream us(trace::open_reader(b), w.plan(), {}, {}, all);
  auto drain = [&] {
    while (UnitBatch* batch = us.next()) us.recycle(batch);
  };
  REQUIRE_THROWS_WITH(drain(), Catch::Contains("the trace changed while it was replayed"));
}

namespace {

// A pgbench -M prepared -S like trace of 4 sessions, `rounds` each: a
// prepared SELECT and a simple query with a literal (texts all different).
void pgbench_like(const std::string& path, int rounds) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  auto w = trace::open_writer(path, o);
  const std::vector<uint32_t> int4{23};
  const std::vector<int16_t> none;
  for (uint64_t s = 1; s <= 4; ++s) {
    w->write(0, s, trace::SessionBegin{"", "", "", "", 0, 0});
    w->write(0, s, trace::Ready{'I'});
    w->write(0, s, trace::Parse{"p", "SELECT $1::int + 1", int4});
    w->write(0, s, trace::Sync{});
    w->write(1000, s, trace::Ready{'I'});
  }
  for (int k = 0; k < rounds; ++k) {
    const Nanos ts = (k + 1) * kStreamMs / 10;
    const std::string v = std::to_string(k);
    const std::string q = "SELECT " + v + " AS round";
    std::vector<trace::Param> ps{trace::Param{0, false, v}};
    for (uint64_t s = 1; s <= 4; ++s) {
      w->write(ts, s, trace::Bind{"", "p", ps, none});
      w->write(ts, s, trace::Execute{"", 0});
      w->write(ts, s, trace::Sync{});
      w->write(ts + 1000, s, trace::Result{"SELECT 1", true, 1});
      w->write(ts + 1000, s, trace::Ready{'I'});
      w->write(ts + 2000, s, trace::Query{q});
      w->write(ts + 3000, s, trace::Result{"SELECT 1", true, 1});
      w->write(ts + 3000, s, trace::Ready{'I'});
    }
  }
  for (uint64_t s = 1; s <= 4; ++s) w->write((rounds + 1) * kStreamMs / 10, s, trace::SessionEnd{trace::EndReason::Clean});
  w->close();
}

// The most heap (operator new) held at once while `f` runs, above what
// was held before it.
template <typename F>
int64_t peak_heap(F&& f) {
  const int64_t base = test::live_heap_bytes();
  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{0};
  std::thread sampler([&] {
    while (!done.load()) {
      peak.store(std::max(peak.load(), test::live_heap_bytes() - base));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  f();
  done.store(true);
  sampler.join();
  return std::max(peak.load(), test::live_heap_bytes() - base);
}

}  // namespace

namespace {

// pgbench -M prepared like, by account: 8 sessions, `rounds` each of a
// SELECT of one account (nine in ten) or an autocommit UPDATE of one (a
// commit point), each its own transaction.
void accounts_trace(const std::string& path, int rounds) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  auto w = trace::open_writer(path, o);
  const std::vector<uint32_t> int4{23};
  const std::vector<int16_t> none;
  for (uint64_t s = 1; s <= 8; ++s) {
    w->write(0, s, trace::SessionBegin{"", "", "", "", 0, 0});
    w->write(0, s, trace::Ready{'I'});
    w->write(0, s, trace::Parse{"sel", "SELECT abalance FROM pgbench_accounts WHERE aid = $1", int4});
    w->write(0, s, trace::Parse{"upd", "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = $1", int4});
    w->write(0, s, trace::Sync{});
    w->write(1000, s, trace::Ready{'I'});
  }
  for (int k = 0; k < rounds; ++k) {
    for (uint64_t s = 1; s <= 8; ++s) {
      const Nanos ts = (k + 1) * kStreamMs / 10 + static_cast<Nanos>(s) * 1000;
      const std::string v = std::to_string((k * 8 + static_cast<int>(s)) * 7919 % 100000 + 1);
      std::vector<trace::Param> ps{trace::Param{0, false, v}};
      const bool update = (k + static_cast<int>(s)) % 10 == 0;
      w->write(ts, s, trace::Bind{"", update ? "upd" : "sel", ps, none});
      w->write(ts, s, trace::Execute{"", 0});
      w->write(ts, s, trace::Sync{});
      w->write(ts + 500, s, trace::Result{update ? "UPDATE 1" : "SELECT 1", !update, 1});
      w->write(ts + 500, s, trace::Ready{'I'});
    }
  }
  for (uint64_t s = 1; s <= 8; ++s) w->write((rounds + 1) * kStreamMs / 10, s, trace::SessionEnd{trace::EndReason::Clean});
  w->close();
}

}  // namespace

TEST_CASE("a loaded plan's commit order holds no copy of what its transactions touch", "[replay][stream][sync]") {
  tierlab::test::TempDir dir;
  const std::string path = dir.file("accounts.tlt");
  const int rounds = 20000;  // 160,000 statements
  accounts_trace(path, rounds);
  const int64_t peak = peak_heap([&] {
    auto reader = trace::open_reader(path);
    Workload w = load(*reader);
    REQUIRE(w.summary().statements == 8u * rounds);
    REQUIRE(w.summary().commit_points > 0);
  });
  // The plan and, while it is made, the commit order's planning: before,
  // that held a copy of every transaction's relations, keys and values
  // (826 bytes a statement at the peak; 593 without it).
  const int64_t statements = 8 * rounds;
  INFO("peak heap " << peak << " B, " << peak / statements << " B a statement");
  CHECK(peak / statements < 700);
}

TEST_CASE("a streamed replay holds a window of the trace, not the trace", "[replay][pg][stream]") {
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  const int rounds = 2000;
  const std::string small = dir.file("small.tlt"), large = dir.file("large.tlt");
  pgbench_like(small, rounds);
  pgbench_like(large, 4 * rounds);
  Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.threads = 2;
  o.max_speed = true;
  o.sync = false;  // commit order plans over the loaded trace
  auto streamed = [&](const std::string& path, Report* r) {
    return peak_heap([&] {
      Workload w = stream(path);
      *r = run(w, o);
    });
  };
  auto loaded = [&](const std::string& path, Report* r) {
    return peak_heap([&] {
      auto reader = trace::open_reader(path);
      Workload w = load(*reader);
      *r = run(w, o);
    });
  };
  Report r;
  streamed(small, &r);  // warm up libpq and the server
  const int64_t s_small = streamed(small, &r);
  REQUIRE(r.statements == 4u * 2 * rounds);
  CHECK(r.errors == 0);
  const int64_t s_large = streamed(large, &r);
  REQUIRE(r.statements == 4u * 2 * 4 * rounds);
  CHECK(r.errors == 0);
  CHECK(r.divergence_row_count == 0);
  const int64_t l_small = loaded(small, &r);
  const int64_t l_large = loaded(large, &r);
  INFO("peak heap, streamed: " << s_small << " B for " << rounds << " rounds, " << s_large << " B for "
                                << 4 * rounds << "; loaded: " << l_small << " B, " << l_large << " B");
  // Loaded, the plan grows with the trace (what this test tells apart)...
  CHECK(l_large > l_small + 3 * 200 * 8 * rounds);
  // ... streamed, four times the trace takes about the same memory: what
  // grows is bounded caches (the simple queries' fingerprints by text,
  // filled up to their limit), not the units.
  CHECK(s_large - s_small < (l_large - l_small) / 10);
  CHECK(s_large <= s_small + s_small / 4);
}

namespace {

// What two replays of one workload must agree on, whatever their timing.
void check_same_report(const Report& a, const Report& b) {
  CHECK(a.sessions == b.sessions);
  CHECK(a.sessions_failed == b.sessions_failed);
  CHECK(a.statements == b.statements);
  CHECK(a.transactions == b.transactions);
  CHECK(a.failed_transactions == b.failed_transactions);
  CHECK(a.errors == b.errors);
  CHECK(a.errors_by_sqlstate == b.errors_by_sqlstate);
  CHECK(a.divergence_error_status == b.divergence_error_status);
  CHECK(a.divergence_row_count == b.divergence_row_count);
  CHECK(a.divergence_new_errors == b.divergence_new_errors);
  CHECK(a.unsupported == b.unsupported);
  CHECK(a.log_lines == b.log_lines);
  REQUIRE(a.fingerprints.size() == b.fingerprints.size());
  for (size_t i = 0; i < a.fingerprints.size(); ++i) {
    CHECK(a.fingerprints[i].sql == b.fingerprints[i].sql);
    CHECK(a.fingerprints[i].count == b.fingerprints[i].count);
    CHECK(a.fingerprints[i].pairs == b.fingerprints[i].pairs);
    CHECK(a.fingerprints[i].captured_ns == b.fingerprints[i].captured_ns);
  }
}

// A --log file's lines without their times: session, unit, captured
// latency and result, sorted.
std::vector<std::string> log_without_times(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::vector<std::string> col;
    for (std::string c; f >> c;) col.push_back(c);
    REQUIRE(col.size() == 10);
    out.push_back(col[0] + " " + col[1] + " " + col[8] + " " + col[9]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a streamed replay reports what the loaded one does: max speed, timed, --log, shards, a window",
          "[replay][pg][stream]") {
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  const std::string path = dir.file("mixed.tlt");
  write_trace(path, mixed_trace(30));
  Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.database = "postgres";  // the trace's sessions name "db"
  o.threads = 2;
  o.sync = false;
  Window window;
  Shard shard;
  SECTION("max speed") { o.max_speed = true; }
  SECTION("timed") { o.speed = 2; }
  SECTION("max speed, direct, one thread, --log") {
    o.max_speed = true;
    o.threads = 1;
    o.direct = true;
  }
  SECTION("shards") {
    o.max_speed = true;
    shard = Shard{1, 2};
  }
  SECTION("a window") {
    o.max_speed = true;
    window.begin = 9 * kStreamMs + 200000;
    window.end = 25 * kStreamMs;
  }
  o.log_path = dir.file("loaded.log");
  auto reader = trace::open_reader(path);
  const Report a = run(load(*reader, window, shard), o);
  o.log_path = dir.file("streamed.log");
  const Report b = run(stream(path, window, shard), o);
  CHECK(a.statements > 0);
  check_same_report(a, b);
  CHECK(log_without_times(dir.file("loaded.log")) == log_without_times(dir.file("streamed.log")));
}

TEST_CASE("a streamed replay does not stall when sessions start as others end, with more units than its window",
          "[replay][pg][stream]") {
  // One worker: a long session throughout, and 12 short ones one after
  // another, each of more units than a session's read-ahead, so that one
  // session's queue is full while others wait for the trace (max speed:
  // each short session starts once the one before it has ended).
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  const std::string path = dir.file("relay.tlt");
  {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    auto w = trace::open_writer(path, wo);
    std::vector<std::pair<Nanos, std::pair<uint64_t, int>>> sends;  // time, (session, kind)
    for (int k = 0; k < 1200; ++k) sends.push_back({k * kStreamMs / 10, {1, 0}});
    for (uint64_t s = 2; s < 14; ++s) {
      const Nanos begin = static_cast<Nanos>(s - 2) * 10 * kStreamMs + kStreamMs / 20;
      sends.push_back({begin, {s, 1}});  // begin
      for (int k = 0; k < 60; ++k) sends.push_back({begin + 1000 + k * (kStreamMs / 7), {s, 0}});
      sends.push_back({begin + 9 * kStreamMs, {s, 2}});  // end
    }
    std::stable_sort(sends.begin(), sends.end(), [](auto& x, auto& y) { return x.first < y.first; });
    w->write(0, 1, trace::SessionBegin{"", "", "", "", 0, 0});
    w->write(0, 1, trace::Ready{'I'});
    for (auto& [ts, what] : sends) {
      const auto [s, kind] = what;
      if (kind == 1) {
        w->write(ts, s, trace::SessionBegin{"", "", "", "", 0, 0});
        w->write(ts, s, trace::Ready{'I'});
      } else if (kind == 2) {
        w->write(ts, s, trace::SessionEnd{trace::EndReason::Clean});
      } else {
        w->write(ts, s, trace::Query{"SELECT 1"});
        w->write(ts + 500, s, trace::Result{"SELECT 1", true, 1});
        w->write(ts + 500, s, trace::Ready{'I'});
      }
    }
    w->write(130 * kStreamMs, 1, trace::SessionEnd{trace::EndReason::Clean});
    w->close();
  }
  Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.threads = 1;
  o.sync = false;
  o.max_speed = GENERATE(true, false);
  INFO((o.max_speed ? "max speed" : "timed"));
  const Report r = run(stream(path), o);
  CHECK(r.sessions == 13);
  CHECK(r.sessions_failed == 0);
  CHECK(r.statements == 1200 + 12 * 60);
  CHECK(r.errors == 0);
}

TEST_CASE("a streamed replay does not deadlock when a session with a full read-ahead waits on a lock a starved one holds",
          "[replay][pg][stream]") {
  // One worker. Session 1 takes a row lock in a transaction and commits
  // late in the trace; session 2 updates that row (so waits for the lock on
  // the server) and then has far more units than a session's read-ahead
  // before session 1's COMMIT. Session 1 needs the trace past session 2's
  // queue to commit, and session 2 cannot send until session 1 commits:
  // the read-ahead bound must give way.
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  pg.sql("DROP TABLE IF EXISTS lockt; CREATE TABLE lockt (id int PRIMARY KEY, v int); INSERT INTO lockt VALUES (1, 0)");
  const std::string path = dir.file("lock.tlt");
  {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    auto w = trace::open_writer(path, wo);
    auto q = [&](Nanos ts, uint64_t s, std::string_view sql, std::string_view tag, char ready) {
      w->write(ts, s, trace::Query{sql});
      w->write(ts + 500, s, trace::Result{tag, false, 0});
      w->write(ts + 500, s, trace::Ready{ready});
    };
    for (uint64_t s = 1; s <= 2; ++s) {
      w->write(0, s, trace::SessionBegin{"", "", "", "", 0, 0});
      w->write(0, s, trace::Ready{'I'});
    }
    q(1 * kStreamMs, 1, "BEGIN", "BEGIN", 'T');
    q(2 * kStreamMs, 1, "UPDATE lockt SET v = v + 1 WHERE id = 1", "UPDATE 1", 'T');
    q(20 * kStreamMs, 2, "UPDATE lockt SET v = v + 1 WHERE id = 1", "UPDATE 1", 'I');
    for (int k = 0; k < 300; ++k) q(21 * kStreamMs + k * (kStreamMs / 5), 2, "SELECT 1", "SELECT 1", 'I');
    q(90 * kStreamMs, 1, "COMMIT", "COMMIT", 'I');
    w->write(95 * kStreamMs, 1, trace::SessionEnd{trace::EndReason::Clean});
    w->write(95 * kStreamMs, 2, trace::SessionEnd{trace::EndReason::Clean});
    w->close();
  }
  Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.threads = 1;
  o.sync = false;
  o.speed = 1;  // timed: session 1 holds the lock before session 2 asks for it
  const auto t0 = std::chrono::steady_clock::now();
  o.wait_stop = [&](long timeout_ns) -> const char* {
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(timeout_ns, 50'000'000L)));
    return std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20) ? "deadlocked" : nullptr;
  };
  const Report r = run(stream(path), o);
  CHECK(r.stopped == "");
  CHECK(r.statements == 304);
  CHECK(r.errors == 0);
  CHECK(pg.sql("SELECT v FROM lockt WHERE id = 1") == "2");
}

TEST_CASE("a streamed replay with commit order replays what the loaded one does, commit points and all",
          "[replay][pg][stream][sync]") {
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  const std::string path = dir.file("conflicts.tlt");
  write_trace(path, conflicting_trace(200));
  Options o;
  o.conninfo = pg.conninfo();
  o.user = pg.superuser();
  o.database = "postgres";
  o.threads = 2;
  o.max_speed = true;
  o.sync = true;
  o.sync_timeout_ns = 0;  // a wait the plan got wrong would hang, not pass
  SECTION("--sync commit") {}
  SECTION("--sync all") { o.sync_all = true; }
  auto reader = trace::open_reader(path);
  const Report a = run(load(*reader), o);
  Workload w = stream(path, {}, {}, true);
  REQUIRE(w.sync_unplanned() == "");
  const Report b = run(w, o);
  CHECK(a.statements > 0);
  CHECK(a.commit_points > 0);
  CHECK(a.commit_points == b.commit_points);
  CHECK(b.sync_timeouts == 0);
  check_same_report(a, b);
}
