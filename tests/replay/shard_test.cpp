// Sharding a workload: the session hash (stable, balanced) and plans built
// for shard K of N, which together are the whole trace.
#include "common/error.h"
#include "replay/plan.h"
#include "replay/replay.h"

#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;
using trace::Record;

namespace {

constexpr Nanos kShardMs = 1000000;

struct ShardTrace {
  std::vector<Record> recs;
  void add(Nanos ts, uint64_t sess, trace::Body b) { recs.push_back(Record{ts, sess, std::move(b)}); }
  std::shared_ptr<const Plan> build(Window w = {}, Shard s = {}) {
    PlanBuilder b(w, 0, s);
    for (const auto& r : recs) b.add(r);
    return b.finish();
  }
};

// `clients` pgbench-like sessions with ids `first_id`, `first_id + step`,
// ...: each sends 5 transactions (BEGIN, UPDATE, SELECT, END), the k-th
// client starting k * 2 ms after 1 s into the trace.
ShardTrace tpcb_trace(int clients, uint64_t first_id, uint64_t step) {
  ShardTrace t;
  for (int c = 0; c < clients; ++c) {
    const uint64_t id = first_id + static_cast<uint64_t>(c) * step;
    Nanos ts = 1000 * kShardMs + c * 2 * kShardMs;
    t.add(ts, id, trace::SessionBegin{"u", "d", "", "", 0, 0});
    t.add(ts, id, trace::Ready{'I'});
    const char* script[] = {"BEGIN", "UPDATE a SET v = v + 1 WHERE id = 7", "SELECT v FROM a WHERE id = 7", "END"};
    for (int x = 0; x < 5; ++x)
      for (int k = 0; k < 4; ++k) {
        ts += kShardMs;
        t.add(ts, id, trace::Query{script[k]});
        t.add(ts + kShardMs / 2, id, trace::Result{"X", false, 0});
        t.add(ts + kShardMs / 2, id, trace::Ready{k == 3 ? 'I' : 'T'});
      }
    t.add(ts + kShardMs, id, trace::SessionEnd{});
  }
  return t;
}

// Each session's replayed SQL, by trace session id.
std::map<uint64_t, std::vector<std::string>> sql_by_session(const Plan& p) {
  std::map<uint64_t, std::vector<std::string>> m;
  for (const Session& s : p.sessions) {
    auto& v = m[s.id];
    for (uint32_t k = 0; k < s.n_units; ++k) v.emplace_back(p.units[p.session_units[s.first_unit + k]].sql);
  }
  return m;
}

}  // namespace

TEST_CASE("shard hash: fixed values, so every host and version agrees", "[replay][shard]") {
  // splitmix64's finaliser of the id, modulo the count: pinned (the values
  // as an independent implementation of the formula gives them).
  CHECK(shard_of(1, 4) == 1);
  CHECK(shard_of(2, 4) == 2);
  CHECK(shard_of(3, 4) == 1);
  CHECK(shard_of(12345, 7) == 5);
  CHECK(shard_of(0xFFFFFFFFFFFFFFFFull, 1000) == 936);
  for (uint64_t id = 0; id < 1000; ++id) {
    CHECK(shard_of(id, 1) == 0);
    CHECK(shard_of(id, 5) < 5);
    CHECK(shard_of(id, 5) == shard_of(id, 5));
  }
}

TEST_CASE("shard hash: consecutive and scattered ids spread evenly", "[replay][shard]") {
  for (uint32_t n : {2u, 3u, 4u, 8u}) {
    std::vector<uint64_t> seq(n, 0), rnd(n, 0), pids(n, 0);
    std::mt19937_64 rng(7);
    const uint64_t total = 20000;
    for (uint64_t id = 1; id <= total; ++id) {
      ++seq[shard_of(id, n)];
      ++rnd[shard_of(rng(), n)];
      ++pids[shard_of(4096 + id * 8, n)];  // ids with a stride, as process ids of a busy server
    }
    const double fair = static_cast<double>(total) / n;
    for (uint32_t k = 0; k < n; ++k) {
      INFO("N=" << n << " K=" << k);
      CHECK(std::abs(static_cast<double>(seq[k]) - fair) < 0.05 * fair);
      CHECK(std::abs(static_cast<double>(rnd[k]) - fair) < 0.05 * fair);
      CHECK(std::abs(static_cast<double>(pids[k]) - fair) < 0.05 * fair);
    }
  }
}

TEST_CASE("plan: the shards of a trace are its sessions, each whole, in order, on one shared schedule",
          "[replay][shard][plan]") {
  ShardTrace t = tpcb_trace(40, 1, 1);
  auto whole = t.build();
  REQUIRE(whole->sessions.size() == 40);
  const auto want = sql_by_session(*whole);
  for (const Window& w : {Window{}, Window{1010 * kShardMs, 1060 * kShardMs}}) {
    auto all = t.build(w);
    const auto want_w = sql_by_session(*all);
    for (uint32_t n : {1u, 2u, 4u, 7u}) {
      INFO("N=" << n << " window [" << w.begin / kShardMs << ", " << (w.end == Window{}.end ? -1 : w.end / kShardMs) << ")");
      std::map<uint64_t, std::vector<std::string>> got;
      uint64_t stmts = 0, txns = 0, units = 0, errors = 0;
      for (uint32_t k = 0; k < n; ++k) {
        auto p = t.build(w, Shard{k, n});
        CHECK(p->summary.shard.index == k);
        CHECK(p->summary.shard.count == n);
        CHECK(p->summary.trace_sessions == all->sessions.size());
        // The schedule's origin is the whole trace's, whichever sessions
        // this shard has.
        CHECK(p->t0 == all->t0);
        for (const Session& s : p->sessions) CHECK(shard_of(s.id, n) == k);
        for (auto& [id, sql] : sql_by_session(*p)) {
          CHECK(got.count(id) == 0);  // on one shard only
          got[id] = sql;
        }
        stmts += p->summary.statements;
        txns += p->summary.transactions;
        units += p->summary.units;
        errors += p->summary.captured_errors;
      }
      CHECK(got == want_w);  // every session, its units in their order
      CHECK(stmts == all->summary.statements);
      CHECK(txns == all->summary.transactions);
      CHECK(units == all->summary.units);
      CHECK(errors == all->summary.captured_errors);
    }
  }
  CHECK(want.size() == 40);
}

TEST_CASE("plan: a shard with no session keeps the trace's origin and counts", "[replay][shard][plan]") {
  ShardTrace t = tpcb_trace(1, 1, 1);  // session 1 is on shard 3 of 4
  auto p = t.build({}, Shard{0, 4});
  CHECK(p->sessions.empty());
  CHECK(p->summary.trace_sessions == 1);
  CHECK(p->t0 == 1000 * kShardMs);
}
