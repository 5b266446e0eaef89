// capture run records the server's file I/O (root, syscall tracepoints), so
// that project --memory below the captured memory changes the projection:
// a throwaway PostgreSQL with a small shared_buffers, pgbench reading more
// than it holds through the capture proxy.
#include "support/background.h"
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>


#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

TEST_CASE("capture run records the server's file I/O, and project --memory below the capture's uses it",
          "[integration][capture][file_io]") {
  test::require_root("recording file I/O (tracefs syscall tracepoints)");
  if (::access("/sys/kernel/tracing/events/syscalls/sys_enter_pread64", F_OK) != 0 &&
      ::access("/sys/kernel/debug/tracing/events/syscalls/sys_enter_pread64", F_OK) != 0)
    test::skip("the kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)");
  // fsync on: commits call fdatasync on the WAL.
  pgtmp::Options so;
  so.settings = {{"shared_buffers", "16MB"}};
  pgtmp::Server pg(so);
  TempDir dir;
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "5"}, &out) == 0);  // 75 MB of accounts
  const std::string dboid = pg.sql("select oid from pg_database where datname = 'postgres'");
  REQUIRE_FALSE(dboid.empty());

  const int port = pgtmp::free_port();
  const std::string trace_path = dir.file("run.tlt");
  // A fixed number of transactions, not a duration: a slow machine gives the
  // same page references (every page read again), and the capture stops on
  // SIGINT once they are done.
  test::Background cap({TIERLAB_BINARY, "capture", "run", "--listen", "127.0.0.1:" + std::to_string(port),
                        "--upstream", pg.host() + ":" + std::to_string(pg.port()), "--conninfo", pg.conninfo(),
                        "--device", pg.data_dir(), "--out", trace_path, "--duration", "120s",
                        "--sample-interval", "500ms"},
                       dir.file("run.out"));
  REQUIRE(cap.wait_for("listening on"));
  const std::string p = std::to_string(port);
  int rc = pg.run_tool("pgbench", {"-n", "-S", "-h", "127.0.0.1", "-p", p, "-c", "4", "-j", "2", "-t", "2500"}, &out);
  int rc2 = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", p, "-c", "2", "-t", "100"}, &out);
  const int cap_status = cap.stop(SIGINT);
  INFO(cap.out() << cap.err() << out);
  REQUIRE(rc == 0);
  REQUIRE(rc2 == 0);
  REQUIRE(cap_status == 0);
  CHECK(cap.out().find("file I/O: ") != std::string::npos);
  CHECK(cap.err().find("file I/O not recorded") == std::string::npos);

  // Reads of the database's relation files, 8 KiB pages at page offsets;
  // syncs of the WAL.
  uint64_t rel_reads = 0, rel_read_bytes = 0, odd = 0, wal_syncs = 0, wal_writes = 0;
  auto r = trace::open_reader(trace_path);
  for (trace::Record rec; r->next(rec);) {
    auto* f = std::get_if<trace::FileIo>(&rec.body);
    if (!f) continue;
    const std::string file(f->file);
    if (file.rfind("base/" + dboid + "/", 0) == 0 && f->op == trace::IoOp::Read) {
      ++rel_reads;
      rel_read_bytes += f->length;
      if (f->length != 8192 || f->offset % 8192 != 0) ++odd;
    }
    if (file.rfind("pg_wal/", 0) == 0 && f->op == trace::IoOp::Flush) ++wal_syncs;
    if (file.rfind("pg_wal/", 0) == 0 && f->op == trace::IoOp::Write) ++wal_writes;
  }
  CHECK(rel_reads > 1000);
  CHECK(odd == 0);
  CHECK(rel_read_bytes == rel_reads * 8192);
  CHECK(rel_read_bytes > 16u * 1024 * 1024);  // more than shared_buffers: the reads missed it
  CHECK(wal_syncs > 10);
  CHECK(wal_writes > 10);

  auto prof = test::run_tierlab({"profile", "--json", trace_path});
  REQUIRE(prof.status == 0);
  auto pj = nlohmann::json::parse(prof.out);
  CHECK(pj["mrc"]["source"] == "file_io");

  // Less memory than at capture: more device reads, fewer transactions.
  auto as_captured = test::run_tierlab({"project", trace_path, "--tier", "rds-16k", "--json", "-"});
  auto smaller = test::run_tierlab({"project", trace_path, "--tier", "rds-16k", "--memory", "40M", "--json", "-"});
  INFO(as_captured.err << smaller.err);
  REQUIRE(as_captured.status == 0);
  REQUIRE(smaller.status == 0);
  auto a = nlohmann::json::parse(as_captured.out), b = nlohmann::json::parse(smaller.out);
  INFO(as_captured.out << smaller.out);
  CHECK(b["per_transaction"]["device_reads"].get<double>() >
        a["per_transaction"]["device_reads"].get<double>() + 0.1);
  CHECK(b["tiers"][0]["tps"].get<double>() < a["tiers"][0]["tps"].get<double>());

  // --no-file-io leaves it out.
  const std::string plain = dir.file("plain.tlt");
  const int port2 = pgtmp::free_port();
  std::vector<std::string> args2 = {"capture", "run", "--listen", "127.0.0.1:" + std::to_string(port2), "--upstream",
                                    pg.host() + ":" + std::to_string(pg.port()), "--conninfo", pg.conninfo(),
                                    "--out", plain, "--duration", "2s", "--no-file-io"};
  test::RunResult plain_cap;
  std::thread t2([&] { plain_cap = test::run_tierlab(args2); });
  REQUIRE(tierlab::test::wait_listening(port2));
  rc = pg.run_tool("pgbench", {"-n", "-S", "-h", "127.0.0.1", "-p", std::to_string(port2), "-T", "1"}, &out);
  t2.join();
  REQUIRE(rc == 0);
  REQUIRE(plain_cap.status == 0);
  CHECK(plain_cap.out.find("file I/O: ") == std::string::npos);
  uint64_t file_ios = 0;
  auto r2 = trace::open_reader(plain);
  for (trace::Record rec; r2->next(rec);) file_ios += std::holds_alternative<trace::FileIo>(rec.body);
  CHECK(file_ios == 0);
}
