// Workload profile from synthetic record streams whose every figure is known.
#include "models/profile.h"
#include "replay/replay.h"

#include "common/error.h"

#include <catch2/catch.hpp>

#include <deque>
#include <sstream>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::models;
using trace::Nanos;
using trace::Record;

namespace {

constexpr Nanos kMs = 1000000;

// Records hold string_views: the SQL text lives here for the test's duration.
std::deque<std::string> g_text;
std::string_view keep(std::string s) { return g_text.emplace_back(std::move(s)); }

// Two sessions (backends 100 and 101), each running `n` transactions of
// "BEGIN; UPDATE t SET v = v + <k> WHERE id = <k>; END;" taking 4 ms, with
// 1 ms of think time between them, and a read-only autocommit SELECT every
// 4th transaction. Each update transaction reads two blocks and writes one
// (commit) in its backend; a background process writes once every 10 ms.
std::vector<Record> workload(int n) {
  std::vector<Record> out;
  for (uint64_t s = 1; s <= 2; ++s) {
    out.push_back({0, s, trace::SessionBegin{"u", "db", "app", "127.0.0.1:1", int32_t(99 + s), 0}});
  }
  for (uint64_t s = 1; s <= 2; ++s) {
    Nanos t = kMs;
    int32_t pid = int32_t(99 + s);
    for (int i = 0; i < n; ++i) {
      if (i % 4 == 3) {
        out.push_back({t, s, trace::Query{keep("SELECT v FROM t WHERE id = " + std::to_string(i))}});
        out.push_back({t + 2 * kMs, s, trace::Ready{'I'}});
        t += 3 * kMs;
        continue;
      }
      std::string k = std::to_string(i * 7 + 1);
      out.push_back({t, s, trace::Query{"BEGIN"}});
      out.push_back({t + kMs / 10, s, trace::Ready{'T'}});
      out.push_back({t + kMs / 5, s, trace::Query{keep("UPDATE t SET v = v + " + k + " WHERE id = " + k)}});
      out.push_back({t + kMs / 2, s, trace::BlockIo{t + kMs, 0x00fe00000, uint64_t(i) * 8192 * 3, 8192, trace::IoOp::Read, 0, pid}});
      out.push_back({t + kMs + 1, s, trace::BlockIo{t + 2 * kMs, 0x00fe00000, uint64_t(i) * 8192 * 3 + 8192, 8192, trace::IoOp::Read, 0, pid}});
      out.push_back({t + 3 * kMs, s, trace::Ready{'T'}});
      out.push_back({t + 3 * kMs + kMs / 10, s, trace::Query{"END"}});
      out.push_back({t + 3 * kMs + kMs / 5, s, trace::BlockIo{t + 3 * kMs + kMs / 2, 0x00fe00000, 1u << 30, 4096, trace::IoOp::Write, trace::kIoSync, pid}});
      out.push_back({t + 4 * kMs, s, trace::Ready{'I'}});
      t += 5 * kMs;
    }
    out.push_back({t, s, trace::SessionEnd{}});
  }
  for (Nanos t = 0; t < 5 * kMs * n; t += 10 * kMs)
    out.push_back({t, 0, trace::BlockIo{t + kMs, 0x00fe00000, 2u << 30, 8192, trace::IoOp::Write, 0, 999}});
  // CPU samples: the server burns 1 ms per transaction.
  out.push_back({0, 0, trace::Sample{"cpu.user_ns", 0}});
  out.push_back({0, 0, trace::Sample{"cpu.system_ns", 0}});
  out.push_back({Nanos(5) * kMs * n + kMs, 0, trace::Sample{"cpu.user_ns", 0.75e6 * 2 * n}});
  out.push_back({Nanos(5) * kMs * n + kMs, 0, trace::Sample{"cpu.system_ns", 0.25e6 * 2 * n}});
  // The capture itself: a quarter of a core over the same span.
  out.push_back({0, 0, trace::Sample{"capture.cpu_ns", 1e9}});
  out.push_back({Nanos(5) * kMs * n + kMs, 0, trace::Sample{"capture.cpu_ns", 1e9 + 0.25 * double(5 * kMs * n + kMs)}});
  out.push_back({0, 0, trace::Meta{"setting.shared_buffers", "128MB"}});
  out.push_back({0, 0, trace::Meta{"memory.bytes", "1GB"}});
  std::stable_sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.ts < b.ts; });
  return out;
}

}  // namespace

TEST_CASE("profile: templates, latency, think time and clients", "[profile]") {
  ProfileBuilder b;
  for (const auto& r : workload(400)) b.add(r);
  Profile p = b.finish("synthetic");
  CHECK(p.transactions == 800);
  CHECK(p.sessions == 2);
  CHECK(p.clients == 2);
  REQUIRE(p.templates.size() == 2);
  CHECK(p.templates[0].count == 600);
  CHECK(p.templates[0].statements == 3);
  CHECK(p.templates[0].text == "begin; update t set v=v+? where id=?; end");
  CHECK(p.templates[0].mean_latency_s == Approx(0.004));
  CHECK(p.templates[1].text == "select v from t where id=?");
  CHECK(p.templates[1].mean_latency_s == Approx(0.002));
  CHECK(p.templates[1].share == Approx(0.25));
  CHECK(p.latency.mean_s == Approx(0.75 * 0.004 + 0.25 * 0.002));
  CHECK(p.think_time_s == Approx(0.001));
  // 2 sessions, each busy 3.5 ms of every 4.5 ms on average.
  CHECK(p.concurrency == Approx(2 * 3.5 / 4.5).epsilon(0.01));
  CHECK(p.tps == Approx(800 / (0.0045 * 400)).epsilon(0.01));
}

TEST_CASE("profile: device I/O is attributed to the transaction's backend", "[profile]") {
  ProfileBuilder b;
  for (const auto& r : workload(400)) b.add(r);
  Profile p = b.finish("synthetic");
  CHECK(p.has_block_io);
  CHECK(p.reads_per_tx == Approx(2 * 0.75));
  CHECK(p.templates[0].reads_per_tx == Approx(2.0));
  CHECK(p.templates[1].reads_per_tx == Approx(0.0));
  CHECK(p.sync_writes_per_tx == Approx(0.75));
  CHECK(p.read_bytes_per_tx == Approx(2 * 0.75 * 8192));
  CHECK(p.background_writes_per_s == Approx(100).epsilon(0.02));
  CHECK(p.unattributed_backend_ios == 0);
  // Reads take 0.5 ms and 1 ms; 600 commit writes 0.3 ms, 200 background 1 ms.
  CHECK(p.native_read.mean_s == Approx(0.00075).epsilon(0.01));
  CHECK(p.native_write.count == 800);
  CHECK(p.native_write.mean_s == Approx((600 * 0.3 + 200 * 1.0) / 800 * 1e-3).epsilon(0.01));
}

TEST_CASE("profile: background writes of the server's processes apart from the kernel's", "[profile]") {
  // Without the server's pids every background write is just background.
  {
    ProfileBuilder b;
    for (const auto& r : workload(400)) b.add(r);
    Profile p = b.finish("synthetic");
    CHECK_FALSE(p.knows_server_processes);
    CHECK(p.server_writes_per_s == 0);
  }
  // Pid 999 (writing every 10 ms) is the server's; a kernel thread (pid 5)
  // writes back every 5 ms.
  auto w = workload(400);
  w.push_back({0, 0, trace::Meta{"postmaster_pid", "98"}});
  w.push_back({0, 0, trace::Meta{"server.pid", "999"}});
  for (Nanos t = 0; t < 5 * kMs * 400; t += 5 * kMs)
    w.push_back({t, 0, trace::BlockIo{t + kMs, 0x00fe00000, 3u << 30, 16384, trace::IoOp::Write, 0, 5}});
  std::stable_sort(w.begin(), w.end(), [](const Record& a, const Record& b) { return a.ts < b.ts; });
  ProfileBuilder b;
  for (const auto& r : w) b.add(r);
  Profile p = b.finish("synthetic");
  CHECK(p.knows_server_processes);
  CHECK(p.server_writes_per_s == Approx(100).epsilon(0.02));
  CHECK(p.server_write_bytes_per_s == Approx(100 * 8192).epsilon(0.02));
  CHECK(p.background_writes_per_s == Approx(300).epsilon(0.02));
  CHECK(p.sync_writes_per_tx == Approx(0.75));
}

TEST_CASE("profile: CPU per transaction, memory and the miss-ratio curve", "[profile]") {
  ProfileBuilder b;
  for (const auto& r : workload(400)) b.add(r);
  Profile p = b.finish("synthetic");
  REQUIRE(p.has_cpu);
  CHECK(p.cpu_s_per_tx == Approx(0.001).epsilon(0.001));
  CHECK(p.capture_cores_busy == Approx(0.25).epsilon(1e-9));
  CHECK(p.shared_buffers_bytes == 128.0 * 1024 * 1024);
  CHECK(p.memory_bytes == 1024.0 * 1024 * 1024);
  // Both sessions read the same pages once each: half the reads hit a
  // cache large enough to hold them.
  CHECK(p.mrc.source == "block_io");
  CHECK(p.mrc.references == 1200);
  CHECK(p.mrc.distinct_pages == 600);
  CHECK(p.mrc.at(1e9) == Approx(0.5));
  std::ostringstream out;
  print_profile(out, p);
  CHECK(out.str().find("select v from t where id=?") != std::string::npos);
  CHECK(profile_json(p).find("\"reads_per_tx\"") != std::string::npos);
}

TEST_CASE("profile: file reads give the curve, re-reads hit", "[profile]") {
  ProfileBuilder b;
  b.add({0, 1, trace::SessionBegin{"u", "db", "", "", 7, 0}});
  Nanos t = 0;
  for (int round = 0; round < 4; ++round)
    for (uint64_t page = 0; page < 100; ++page)
      b.add({t += 1000, 0, trace::FileIo{7, "base/5/16384", page * 8192, 8192, trace::IoOp::Read, 0, 500}});
  b.add({t + 1, 1, trace::Query{"select 1"}});
  b.add({t + 2, 1, trace::Ready{'I'}});
  Profile p = b.finish("f");
  CHECK(p.mrc.source == "file_io");
  CHECK(p.mrc.references == 400);
  CHECK(p.mrc.distinct_pages == 100);
  CHECK(p.mrc.at(50 * 8192.0) == Approx(1.0));
  CHECK(p.mrc.at(120 * 8192.0) == Approx(0.25));
}

TEST_CASE("profile: a trace without transactions is bad input", "[profile]") {
  ProfileBuilder b;
  b.add({0, 1, trace::SessionBegin{}});
  b.add({1, 1, trace::Ready{'I'}});
  CHECK_THROWS_AS(b.finish("empty.tlt"), InputError);
}

TEST_CASE("profile: statement fingerprints", "[profile]") {
  CHECK(fingerprint_sql("SELECT  abalance FROM pgbench_accounts WHERE aid = 12345;") ==
        "select abalance from pgbench_accounts where aid=?");
  CHECK(fingerprint_sql("insert into t1 values ('it''s', -3.5, $1)") == "insert into t1 values(?, ?, ?)");
  CHECK(fingerprint_sql("UPDATE a SET v = v + -5 WHERE id = 3") == fingerprint_sql("UPDATE a SET v = v + 5 WHERE id = 3"));
  CHECK(fingerprint_sql("SELECT a - 1 FROM t") == "select a-? from t");
  CHECK(fingerprint_sql("SELECT \"MixedCase\" FROM x2") == "select \"MixedCase\" from x2");
  // A statement sent with parameters is the one sent with literals.
  CHECK(fingerprint_sql("SELECT abalance FROM pgbench_accounts WHERE aid = $1") ==
        fingerprint_sql("select abalance from pgbench_accounts where aid = 7"));
}

TEST_CASE("profile and replay agree on what the same statement is", "[profile]") {
  // The profile's templates and the replay's divergence report name
  // statements by one fingerprint (common/sql.h).
  for (const char* sql : {"SELECT  abalance FROM pgbench_accounts WHERE aid = 12345;",
                          "insert into t1 values ('it''s', -3.5, $1)",
                          "UPDATE a SET v = v + -5 WHERE id = 3",
                          "select $$x$$, E'a\\'b', 2.5e3 -- note\n /* c */ FROM \"T\"",
                          "SELECT a - 1 FROM t"}) {
    INFO(sql);
    CHECK(fingerprint_sql(sql) == tierlab::replay::normalize_sql(sql));
  }
  CHECK(fingerprint_sql("select 1 -- one\n") == fingerprint_sql("SELECT 2"));
  CHECK(fingerprint_sql("SELECT x FROM t WHERE a = $1") == fingerprint_sql("SELECT x FROM t WHERE a = 'v'"));
}

TEST_CASE("profile: the client's turns inside a transaction, apart from the think time", "[profile][clients]") {
  // Two sessions. One runs BEGIN; UPDATE; END in simple protocol: 0.3 ms
  // and 0.2 ms from a ReadyForQuery 'T' to its next statement, 0.5 ms of
  // think time after the 'I'. The other runs the UPDATE in the extended
  // protocol inside a transaction: the turn ends at the Parse (0.4 ms),
  // not at the Execute after it.
  constexpr Nanos kUs = 1000;
  std::vector<Record> recs;
  recs.push_back({0, 1, trace::SessionBegin{"u", "db", "app", "", 0, 0}});
  recs.push_back({0, 2, trace::SessionBegin{"u", "db", "app", "", 0, 0}});
  for (int i = 0; i < 2; ++i) {
    const Nanos t = i * 1500 * kUs;
    recs.push_back({t, 1, trace::Query{"BEGIN"}});
    recs.push_back({t + 100 * kUs, 1, trace::Ready{'T'}});
    recs.push_back({t + 400 * kUs, 1, trace::Query{"UPDATE a SET b = 1"}});
    recs.push_back({t + 600 * kUs, 1, trace::Ready{'T'}});
    recs.push_back({t + 800 * kUs, 1, trace::Query{"END"}});
    recs.push_back({t + 1000 * kUs, 1, trace::Ready{'I'}});

    recs.push_back({t, 2, trace::Query{"BEGIN"}});
    recs.push_back({t + 100 * kUs, 2, trace::Ready{'T'}});
    recs.push_back({t + 500 * kUs, 2, trace::Parse{"", "UPDATE a SET b = $1", {}}});
    recs.push_back({t + 550 * kUs, 2, trace::Bind{"", "", {}, {}}});
    recs.push_back({t + 560 * kUs, 2, trace::Execute{"", 0}});
    recs.push_back({t + 700 * kUs, 2, trace::Ready{'T'}});
    recs.push_back({t + 700 * kUs, 2, trace::Query{"COMMIT"}});
    recs.push_back({t + 1000 * kUs, 2, trace::Ready{'I'}});
  }
  ProfileBuilder b;
  for (const auto& r : recs) b.add(r);
  Profile p = b.finish("synthetic");
  CHECK(p.transactions == 4);
  // Session 1: 0.5 ms a transaction; session 2: 0.4 ms.
  CHECK(p.client_in_tx_s == Approx(0.00045).epsilon(1e-9));
  CHECK(p.think_time_s == Approx(0.0005).epsilon(1e-9));
  std::ostringstream text;
  print_profile(text, p);
  CHECK(text.str().find("think time 0.500 ms, the client's turns inside a transaction 0.450 ms") != std::string::npos);
  CHECK(profile_json(p).find("\"client_in_tx_ms\": 0.45") != std::string::npos);
}

TEST_CASE("profile: the server's CPU split into a fixed part and a part per transaction", "[profile][cpu]") {
  // 20 seconds, alternately 200 and 600 transactions; the server's CPU
  // each second 0.05 cores plus 0.1 ms a transaction (user and system
  // counters, 60/40).
  constexpr Nanos kS = 1'000'000'000;
  std::vector<Record> recs;
  recs.push_back({0, 1, trace::SessionBegin{"u", "db", "app", "", 0, 0}});
  double cpu = 0;
  recs.push_back({0, 0, trace::Sample{"cpu.user_ns", 0}});
  recs.push_back({0, 0, trace::Sample{"cpu.system_ns", 0}});
  for (int sec = 0; sec < 20; ++sec) {
    const int n = sec % 2 ? 600 : 200;
    for (int i = 0; i < n; ++i) {
      const Nanos t = sec * kS + 1'000'000 + i * (kS - 2'000'000) / n;
      recs.push_back({t, 1, trace::Query{"SELECT 1"}});
      recs.push_back({t + 100'000, 1, trace::Ready{'I'}});
    }
    cpu += 0.05e9 + n * 1e5;
    recs.push_back({(sec + 1) * kS, 0, trace::Sample{"cpu.user_ns", 0.6 * cpu}});
    recs.push_back({(sec + 1) * kS, 0, trace::Sample{"cpu.system_ns", 0.4 * cpu}});
  }
  ProfileBuilder b;
  for (const auto& r : recs) b.add(r);
  Profile p = b.finish("synthetic");
  REQUIRE(p.cpu_split);
  CHECK(p.cpu_fixed_cores == Approx(0.05).epsilon(1e-9));
  CHECK(p.cpu_marginal_s_per_tx == Approx(0.0001).epsilon(1e-9));
  std::ostringstream text;
  print_profile(text, p);
  CHECK(text.str().find("cpu over the capture's sample intervals: 0.100 ms a transaction plus 0.050 cores") !=
        std::string::npos);
  CHECK(profile_json(p).find("\"fixed_cores\": 0.05") != std::string::npos);

  // The same at a steady rate: the two parts cannot be told apart.
  std::vector<Record> steady;
  steady.push_back({0, 1, trace::SessionBegin{"u", "db", "app", "", 0, 0}});
  steady.push_back({0, 0, trace::Sample{"cpu.user_ns", 0}});
  for (int sec = 0; sec < 20; ++sec) {
    for (int i = 0; i < 400; ++i) {
      const Nanos t = sec * kS + 1'000'000 + i * (kS - 2'000'000) / 400;
      steady.push_back({t, 1, trace::Query{"SELECT 1"}});
      steady.push_back({t + 100'000, 1, trace::Ready{'I'}});
    }
    steady.push_back({(sec + 1) * kS, 0, trace::Sample{"cpu.user_ns", (sec + 1) * (0.05e9 + 400 * 1e5)}});
  }
  ProfileBuilder bs;
  for (const auto& r : steady) bs.add(r);
  Profile ps = bs.finish("synthetic");
  CHECK(ps.has_cpu);
  CHECK_FALSE(ps.cpu_split);
}
