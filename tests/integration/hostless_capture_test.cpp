// A host-less capture, as in front of a managed server (RDS, Aurora): the
// proxy for the transactions and PostgreSQL's own counters over SQL, with a
// role that has only pg_monitor; no process CPU, no block I/O.
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

bool listening(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

struct Seen {
  std::map<std::string, uint64_t> samples;  // name -> records
  std::map<std::string, std::string> meta;
  uint64_t block_ios = 0, transactions = 0;
};

Seen read_trace(const std::string& path) {
  Seen s;
  auto r = trace::open_reader(path);
  trace::Record rec;
  while (r->next(rec)) {
    if (auto* x = std::get_if<trace::Sample>(&rec.body)) ++s.samples[std::string(x->name)];
    if (auto* m = std::get_if<trace::Meta>(&rec.body)) s.meta[std::string(m->key)] = std::string(m->value);
    if (std::holds_alternative<trace::BlockIo>(rec.body)) ++s.block_ios;
    if (auto* rd = std::get_if<trace::Ready>(&rec.body); rd && rd->status == 'I') ++s.transactions;
  }
  return s;
}

// pgbench through `capture run --hostless` for `seconds`, sampled as a
// pg_monitor role; returns the capture's result.
test::RunResult hostless_capture(pgtmp::Server& pg, const std::string& trace, int seconds) {
  pg.sql("DO $$ BEGIN CREATE ROLE watcher LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$");
  pg.sql("GRANT pg_monitor TO watcher");
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "2"}, &out) == 0);
  const int port = pgtmp::free_port();
  std::vector<std::string> args = {"capture", "run", "--hostless", "--listen", "127.0.0.1:" + std::to_string(port),
                                   "--upstream", pg.host() + ":" + std::to_string(pg.port()),
                                   "--conninfo", "host=127.0.0.1 port=" + std::to_string(pg.port()) +
                                                     " dbname=postgres user=watcher",
                                   "--out", trace, "--duration", std::to_string(seconds + 2) + "s",
                                   "--sample-interval", "200ms"};
  test::RunResult capture;
  std::thread t([&] { capture = test::run_tierlab(args); });
  for (int i = 0; i < 100 && !listening(port); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int rc = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", std::to_string(port), "-c", "4", "-j", "2",
                                   "-T", std::to_string(seconds)},
                       &out);
  t.join();
  INFO(out);
  REQUIRE(rc == 0);
  return capture;
}

}  // namespace

TEST_CASE("capture run --hostless: transactions through the proxy and the server's counters over SQL only",
          "[integration][hostless]") {
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("hostless.tlt");
  auto capture = hostless_capture(pg, trace, 3);
  INFO(capture.out << capture.err);
  REQUIRE(capture.status == 0);
  CHECK(capture.err.find("host-less capture of 127.0.0.1:") != std::string::npos);
  // PostgreSQL 15 has no pg_stat_io: said once, and the capture goes on.
  CHECK(occurrences(capture.err, "pg_stat_io not sampled: PostgreSQL 15 has none") == 1);
  CHECK(occurrences(capture.err, "pg_stat_statements not sampled") == 1);
  CHECK(capture.err.find("CPU samples skipped") == std::string::npos);

  Seen s = read_trace(trace);
  CHECK(s.transactions > 100);
  CHECK(s.block_ios == 0);
  CHECK(s.samples.count("cpu.user_ns") == 0);
  for (const char* name : {"pg.blks_read", "pg.blks_hit", "pg.xact_commit", "pg.xact_rollback", "pg.tup_returned",
                           "pg.tup_inserted", "pg.tup_updated", "pg.temp_bytes", "pg.wal_bytes",
                           "pg.buffers_checkpoint", "pg.bgwriter.buffers_alloc", "pg.wal.wal_records",
                           "pg.wal.wal_bytes", "pg.wal.wal_sync"}) {
    INFO(name);
    CHECK(s.samples[name] >= 10);  // every 200 ms over 5 s
  }
  CHECK(s.meta["capture.hostless"] == pg.host() + ":" + std::to_string(pg.port()));
  CHECK(s.meta["server_version"].rfind("15", 0) == 0);
  CHECK(s.meta["setting.server_version_num"].rfind("15", 0) == 0);
  for (const char* k : {"setting.shared_buffers", "setting.effective_cache_size", "setting.max_connections",
                        "setting.wal_sync_method", "setting.synchronous_commit"}) {
    INFO(k);
    CHECK(!s.meta[k].empty());
  }
  CHECK(s.meta.count("postmaster_pid") == 0);
}

TEST_CASE("capture run --hostless samples pg_stat_statements per queryid when it is installed",
          "[integration][hostless]") {
  pgtmp::Options o = test::fast_server_options();
  o.settings.push_back({"shared_preload_libraries", "pg_stat_statements"});
  pgtmp::Server pg(o);
  pg.sql("CREATE EXTENSION pg_stat_statements");
  TempDir dir;
  const std::string trace = dir.file("stmts.tlt");
  auto capture = hostless_capture(pg, trace, 2);
  INFO(capture.out << capture.err);
  REQUIRE(capture.status == 0);
  CHECK(capture.err.find("pg_stat_statements not sampled") == std::string::npos);
  Seen s = read_trace(trace);
  size_t calls = 0, texts = 0;
  for (const auto& [name, n] : s.samples)
    if (name.rfind("pg.stmt.", 0) == 0 && name.size() > 6 && name.compare(name.size() - 6, 6, ".calls") == 0) ++calls;
  for (const auto& [k, v] : s.meta)
    if (k.rfind("pg.stmt.", 0) == 0 && v.find("pgbench_accounts") != std::string::npos) ++texts;
  CHECK(calls >= 5);  // pgbench's statements, each its queryid
  CHECK(texts >= 2);  // UPDATE and SELECT of pgbench_accounts
}
