// The replay dispatch path allocates nothing per statement on tierlab's
// side: a replay of ten times more statements makes the same number of C++
// allocations, for sessions driven directly and through libpq, on both
// backends of the workers' event loop (libpq's own
// mallocs for PGresults are not C++ allocations and are not counted: they
// are freed with PQclear at once; directly driven sessions make none).
//
// Allocations are counted by support/alloc_counter.h, which replaces
// operator new/delete for the whole replay unit test binary: this is the one
// file of the binary that includes it. The test needs a throwaway PostgreSQL.
//
// Over TLS (sessions driven directly through libpq's SSL object) OpenSSL's
// own allocations are counted too: this file gives OpenSSL counting
// malloc/realloc/free before anything in the process uses it. tierlab's
// side allocates nothing per statement there either; OpenSSL 3.0 itself
// allocates (and frees) a fixed few small blocks per record.
#include "replay/plan.h"
#include "replay/replay.h"
#include "support/alloc_counter.h"
#include "support/support.h"
#include "support/tls_server.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <openssl/crypto.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;
using trace::Nanos;

namespace {

std::atomic<uint64_t> openssl_allocs{0};

void* openssl_malloc(size_t n, const char*, int) {
  openssl_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n);
}
void* openssl_realloc(void* p, size_t n, const char*, int) {
  openssl_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::realloc(p, n);
}
void openssl_free(void* p, const char*, int) { std::free(p); }

// Set before main: OpenSSL refuses once it has allocated.
const bool openssl_counted = CRYPTO_set_mem_functions(openssl_malloc, openssl_realloc, openssl_free) == 1;

// 4 sessions, each: a simple query, a prepared statement executed `n`
// times, unnamed extended statements `n` times, simple queries `n` times,
// and a COPY: its records, to `out`.
void workload_records(int n, const std::function<void(const trace::Record&)>& out) {
  const Nanos ms = 1000000;
  std::vector<uint32_t> types{23};
  std::vector<int16_t> fmts;
  for (uint64_t s = 1; s <= 4; ++s) {
    Nanos ts = 0;
    auto add = [&](trace::Body body) { out(trace::Record{ts, s, std::move(body)}); };
    add(trace::SessionBegin{"", "", "", "", 0, 0});
    add(trace::Query{"CREATE TEMP TABLE t(a int)"});
    add(trace::Result{"CREATE TABLE", false, 0});
    add(trace::Ready{'I'});
    add(trace::Parse{"p", "SELECT $1::int + 1", types});
    add(trace::Sync{});
    add(trace::Ready{'I'});
    std::vector<std::string> values;
    for (int i = 0; i < n; ++i) values.push_back(std::to_string(i));
    for (int i = 0; i < n; ++i) {
      ts += ms;
      std::vector<trace::Param> ps{trace::Param{0, false, values[i]}};
      add(trace::Bind{"", "p", ps, fmts});
      add(trace::Describe{'P', ""});
      add(trace::Execute{"", 0});
      add(trace::Sync{});
      add(trace::Result{"SELECT", true, 1});
      add(trace::Ready{'I'});
      add(trace::Parse{"", "INSERT INTO t VALUES ($1)", types});
      add(trace::Bind{"", "", ps, fmts});
      add(trace::Execute{"", 0});
      add(trace::Sync{});
      add(trace::Result{"INSERT", true, 1});
      add(trace::Ready{'I'});
      add(trace::Query{"SELECT count(*) FROM t"});
      add(trace::Result{"SELECT", true, 1});
      add(trace::Ready{'I'});
    }
    add(trace::Query{"COPY t FROM STDIN"});
    add(trace::CopyData{trace::CopyDir::In, "1\n2\n"});
    add(trace::CopyDone{trace::CopyDir::In});
    add(trace::Result{"COPY", true, 2});
    add(trace::Ready{'I'});
    add(trace::SessionEnd{});
  }
}

std::shared_ptr<const Plan> workload(int n) {
  PlanBuilder b;
  workload_records(n, [&](const trace::Record& r) { b.add(r); });
  return b.finish();
}

// The same workload as a trace file, for a streamed replay.
void write_workload(const std::string& path, int n) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  auto w = trace::open_writer(path, o);
  workload_records(n, [&](const trace::Record& r) { w->write(r); });
  w->close();
}

// 4 sessions, each `n` times: a simple query on a table the target does
// not have (42P01) and an extended one that divides by zero (22012), both
// successful at capture.
std::shared_ptr<const Plan> failing_workload(int n) {
  PlanBuilder b;
  const Nanos ms = 1000000;
  std::vector<uint32_t> types{23};
  std::vector<int16_t> fmts;
  std::vector<trace::Param> zero{trace::Param{0, false, "0"}};
  for (uint64_t s = 1; s <= 4; ++s) {
    Nanos ts = 0;
    auto add = [&](trace::Body body) { b.add(trace::Record{ts, s, std::move(body)}); };
    add(trace::SessionBegin{"", "", "", "", 0, 0});
    add(trace::Ready{'I'});
    for (int i = 0; i < n; ++i) {
      ts += ms;
      add(trace::Query{"SELECT * FROM tierlab_alloc_missing"});
      add(trace::Result{"SELECT", true, 0});
      add(trace::Ready{'I'});
      add(trace::Parse{"", "SELECT 1 / $1::int", types});
      add(trace::Bind{"", "", zero, fmts});
      add(trace::Execute{"", 0});
      add(trace::Sync{});
      add(trace::Result{"SELECT", true, 1});
      add(trace::Ready{'I'});
    }
    add(trace::SessionEnd{});
  }
  return b.finish();
}

uint64_t allocations_of_run(const pgtmp::Server& pg, int n, bool direct, const std::string& io,
                            const std::string& log, Report* out, bool failing = false,
                            const std::string& conninfo = "") {
  Workload w(failing ? failing_workload(n) : workload(n));
  Options o;
  o.log_path = log;
  o.conninfo = conninfo.empty() ? pg.conninfo() : conninfo;
  o.user = pg.superuser();
  o.threads = 2;
  o.max_speed = true;
  o.direct = direct;
  o.io = io;
  uint64_t before = test::allocations_all_threads();
  Report r = run(w, o);
  uint64_t after = test::allocations_all_threads();
  *out = r;
  return after - before;
}

}  // namespace

TEST_CASE("replay dispatch allocates nothing per statement", "[replay][pg][alloc]") {
  auto& pg = tierlab::test::shared_server();
  const bool direct = GENERATE(true, false);
  const std::string io = GENERATE(std::string("io_uring"), std::string("epoll"));
  if (io == "io_uring" && !uring_unsupported().empty()) test::skip("io_uring loop: " + uring_unsupported());
  const bool logged = GENERATE(false, true);
  INFO((direct ? "driven directly" : "through libpq") << ", " << io << (logged ? ", with --log" : ""));
  tierlab::test::TempDir dir;
  const std::string log = logged ? dir.file("rt.log") : "";
  Report small, large;
  allocations_of_run(pg, 50, direct, io, log, &small);  // warm up libpq and the server
  uint64_t a_small = allocations_of_run(pg, 50, direct, io, log, &small);
  uint64_t a_large = allocations_of_run(pg, 500, direct, io, log, &large);
  INFO("allocations: " << a_small << " for " << small.statements << " statements, " << a_large << " for "
                       << large.statements);
  REQUIRE(small.statements == 4 * (3 * 50 + 2));
  REQUIRE(large.statements == 4 * (3 * 500 + 2));
  CHECK(large.errors == 0);
  CHECK(large.divergence_error_status == 0);
  CHECK(large.divergence_row_count == 0);
  CHECK(large.sessions_direct == (direct ? 4u : 0u));
  CHECK(large.io == io);
  // Every round trip logged: per session the CREATE, the PREPARE, three
  // per iteration and the COPY (tens of kB: the buffers were written out).
  CHECK(large.log_lines == (logged ? 4u * (3 * 500 + 3) : 0u));
  CHECK(large.log_error.empty());
  // Commit order kept (--sync commit, the default): each session's CREATE,
  // INSERTs and COPY are commit points the others' later units wait for.
  CHECK(large.sync);
  CHECK(large.commit_points == 4u * (500 + 2));
  CHECK(a_small > 0);  // the counter is live: set-up allocates
  // 5,400 more statements, the same allocations: only set-up (plan-sized
  // tables, threads, the report) allocates.
  CHECK(a_large == a_small);
}

TEST_CASE("replay dispatch allocates nothing per failed statement: each SQLSTATE's first message once",
          "[replay][pg][alloc]") {
  auto& pg = tierlab::test::shared_server();
  const bool direct = GENERATE(true, false);
  const std::string io = GENERATE(std::string("io_uring"), std::string("epoll"));
  if (io == "io_uring" && !uring_unsupported().empty()) test::skip("io_uring loop: " + uring_unsupported());
  INFO((direct ? "driven directly" : "through libpq") << ", " << io);
  Report small, large;
  allocations_of_run(pg, 50, direct, io, "", &small, true);
  uint64_t a_small = allocations_of_run(pg, 50, direct, io, "", &small, true);
  uint64_t a_large = allocations_of_run(pg, 500, direct, io, "", &large, true);
  INFO("allocations: " << a_small << " for " << small.errors << " errors, " << a_large << " for " << large.errors);
  REQUIRE(large.statements == 4 * 2 * 500);
  REQUIRE(large.errors == 4 * 2 * 500);
  CHECK(large.divergence_new_errors == large.statements);
  REQUIRE(large.first_errors.size() == 2);
  CHECK(large.first_errors[0].sqlstate == "22012");
  CHECK(large.first_errors[0].message == "division by zero");
  CHECK(large.first_errors[0].statement == "select ?/?::int");
  CHECK(large.first_errors[1].sqlstate == "42P01");
  CHECK(large.first_errors[1].message == "relation \"tierlab_alloc_missing\" does not exist");
  CHECK(large.first_errors[1].statement == "select * from tierlab_alloc_missing");
  // 3,600 more failed statements, the same allocations.
  CHECK(a_large == a_small);
}

TEST_CASE("replay dispatch over TLS allocates nothing per statement, OpenSSL included", "[replay][pg][alloc][tls]") {
  const std::string io = GENERATE(std::string("io_uring"), std::string("epoll"));
  if (io == "io_uring" && !uring_unsupported().empty()) test::skip("io_uring loop: " + uring_unsupported());
  INFO("driven directly over TLS, " << io);
  test::TlsServer srv;
  const std::string conninfo = srv.conninfo("sslmode=require");
  Report small, large;
  allocations_of_run(srv.pg, 50, true, io, "", &small, false, conninfo);  // warm up libpq, OpenSSL and the server
  const uint64_t ssl_0 = openssl_allocs.load();
  uint64_t a_small = allocations_of_run(srv.pg, 50, true, io, "", &small, false, conninfo);
  const uint64_t ssl_1 = openssl_allocs.load();
  uint64_t a_large = allocations_of_run(srv.pg, 500, true, io, "", &large, false, conninfo);
  const uint64_t ssl_2 = openssl_allocs.load();
  INFO("allocations: " << a_small << " for " << small.statements << " statements, " << a_large << " for "
                       << large.statements << "; OpenSSL's: " << ssl_1 - ssl_0 << ", " << ssl_2 - ssl_1);
  REQUIRE(small.statements == 4 * (3 * 50 + 2));
  REQUIRE(large.statements == 4 * (3 * 500 + 2));
  CHECK(small.sessions_failed == 0);
  CHECK(large.errors == 0);
  CHECK(large.divergence_row_count == 0);
  CHECK(large.sessions_direct == 4u);
  CHECK(a_large == a_small);
  // OpenSSL allocates per connection (libpq's SSL_CTX and handshake, the
  // stage's memory BIOs: the same 4 connections in both runs, give or take
  // a few), and OpenSSL 3.0's record layer a fixed two small blocks per
  // record it seals or opens (the WPACKETs of the record header and of
  // TLS 1.3's additional data), freed at once: a statement here is one
  // record each way, so at most 4 per statement, the same in both runs.
  // Neither the memory BIOs nor the stage's queue grow per record.
  REQUIRE(openssl_counted);
  CHECK(ssl_1 - ssl_0 > 0);  // the counter is live
  const double per_stmt = (static_cast<double>(ssl_2 - ssl_1) - static_cast<double>(ssl_1 - ssl_0)) /
                          static_cast<double>(large.statements - small.statements);
  INFO("OpenSSL's allocations per statement: " << per_stmt);
  CHECK(per_stmt <= 4.05);
}

TEST_CASE("a streamed replay allocates nothing per statement: unit batches are pooled", "[replay][pg][alloc][stream]") {
  auto& pg = tierlab::test::shared_server();
  const bool direct = GENERATE(true, false);
  INFO((direct ? "driven directly" : "through libpq"));
  tierlab::test::TempDir dir;
  write_workload(dir.file("small.tlt"), 50);
  write_workload(dir.file("large.tlt"), 500);
  auto allocations = [&](const std::string& path, Report* r) {
    Workload w = stream(path);  // pass 1 (not counted: it reads the trace before the replay)
    Options o;
    o.conninfo = pg.conninfo();
    o.user = pg.superuser();
    o.threads = 2;
    o.max_speed = true;
    o.direct = direct;
    o.sync = false;
    uint64_t before = test::allocations_all_threads();
    *r = run(w, o);
    return test::allocations_all_threads() - before;
  };
  Report small, large;
  allocations(dir.file("small.tlt"), &small);  // warm up libpq and the server
  const uint64_t a_small = allocations(dir.file("small.tlt"), &small);
  const uint64_t a_large = allocations(dir.file("large.tlt"), &large);
  INFO("allocations: " << a_small << " for " << small.statements << " statements, " << a_large << " for "
                       << large.statements);
  REQUIRE(small.statements == 4 * (3 * 50 + 2));
  REQUIRE(large.statements == 4 * (3 * 500 + 2));
  CHECK(large.errors == 0);
  CHECK(a_small > 0);
  // 5,400 more statements read, made into units and replayed: the same
  // allocations (the trace reader's, the stream's pool, set-up).
  CHECK(a_large == a_small);
}
