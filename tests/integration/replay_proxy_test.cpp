// Traffic captured through `tierlab capture proxy`, then replayed: pgbench
// in every protocol mode runs exactly the captured statements and
// transactions, with zero errors and no divergence; libpq's COPY FROM STDIN
// by PQexecParams loads the same rows again.
#include "replay/replay.h"
#include "support/io_env.h"
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

using namespace tierlab;

namespace {

// `tierlab capture proxy` as a child process; the constructor returns once
// it printed its "listening on HOST:PORT" line.
class ProxyChild {
 public:
  ProxyChild(const std::string& upstream, const std::string& out) {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], 2);
      execl(TIERLAB_BINARY, TIERLAB_BINARY, "capture", "proxy", "--listen", "127.0.0.1:0", "--upstream",
            upstream.c_str(), "--out", out.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    err_ = fds[0];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (port_ == 0) {
      pollfd p{err_, POLLIN, 0};
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      ssize_t n = read(err_, buf, sizeof buf);
      if (n <= 0) FAIL("capture proxy exited before listening: " << text_);
      text_.append(buf, static_cast<size_t>(n));
      size_t at = text_.find("listening on ");
      if (at == std::string::npos) continue;
      size_t end = text_.find_first_of(", \n", at + 13);
      if (end == std::string::npos) continue;
      std::string addr = text_.substr(at + 13, end - at - 13);
      port_ = std::stoi(addr.substr(addr.rfind(':') + 1));
    }
  }
  ~ProxyChild() { stop(); }

  int port() const { return port_; }

  // SIGTERM, then wait: the proxy closes the trace on the way out.
  int stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    close(err_);
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int err_ = -1;
  int port_ = 0;
  int status_ = -1;
  std::string text_;
};

}  // namespace

TEST_CASE("pgbench captured through the proxy replays exactly, in each protocol mode",
          "[replay][pg][proxy]") {
  auto& pg = tierlab::test::shared_server();
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-s", "1", "-q", "postgres"}, &out) == 0);
  tierlab::test::TempDir dir;
  for (std::string mode : {"simple", "extended", "prepared"}) {
    INFO("pgbench -M " << mode);
    std::string path = dir.file(mode + ".tlt");
    {
      ProxyChild proxy(pg.host() + ":" + std::to_string(pg.port()), path);
      std::string log;
      int rc = pg.run_tool("pgbench", {"-h", "127.0.0.1", "-p", std::to_string(proxy.port()), "-n", "-M", mode,
                                       "-c", "4", "-j", "2", "-t", "40", "postgres"},
                           &log);
      INFO(log);
      REQUIRE(rc == 0);
      REQUIRE(proxy.stop() == 0);
    }
    auto reader = trace::open_reader(path);
    trace::Summary cap = trace::summarize(*reader);
    // 4 clients x 40 transactions of the TPC-B-like script (7 statements).
    CHECK(cap.transactions >= 160);
    CHECK(cap.statements >= 160 * 7);
    CHECK(cap.errors == 0);

    auto reader2 = trace::open_reader(path);
    replay::Workload w = replay::load(*reader2);
    CHECK(w.summary().statements == cap.statements);
    CHECK(w.summary().transactions == cap.transactions);
    replay::Options o;
    o.conninfo = pg.conninfo();
    o.threads = 2;
    o.max_speed = true;
    o.io = tierlab::test::replay_io();
    replay::Report r = replay::run(w, o);
    CHECK(r.sessions_failed == 0);
    CHECK(r.first_session_error == "");
    CHECK(r.statements == cap.statements);
    CHECK(r.transactions == cap.transactions);
    CHECK(r.errors == 0);
    CHECK(r.divergence_error_status == 0);
    CHECK(r.divergence_row_count == 0);
    CHECK(r.unsupported == 0);
  }
}

TEST_CASE("COPY FROM STDIN started by Execute, captured through the proxy, replays its data",
          "[replay][pg][proxy]") {
  auto& pg = tierlab::test::shared_server();
  pg.sql("CREATE TABLE IF NOT EXISTS copy_ext (id int, name text)");
  pg.sql("TRUNCATE copy_ext");
  tierlab::test::TempDir dir;
  std::string path = dir.file("copy.tlt");
  {
    ProxyChild proxy(pg.host() + ":" + std::to_string(pg.port()), path);
    std::string conninfo = "host=127.0.0.1 port=" + std::to_string(proxy.port()) +
                           " dbname=postgres user=" + pg.superuser();
    PGconn* c = PQconnectdb(conninfo.c_str());
    REQUIRE(PQstatus(c) == CONNECTION_OK);
    // PQexecParams: Parse, Bind, Describe, Execute, Sync; then the data,
    // CopyDone and libpq's second Sync. Then one the client fails.
    for (bool fail : {false, true}) {
      PGresult* res = PQexecParams(c, "COPY copy_ext FROM STDIN", 0, nullptr, nullptr, nullptr, nullptr, 0);
      REQUIRE(PQresultStatus(res) == PGRES_COPY_IN);
      PQclear(res);
      for (int i = 1; i <= 1000; ++i) {
        std::string row = std::to_string(fail ? -i : i) + "\tname " + std::to_string(i) + "\n";
        REQUIRE(PQputCopyData(c, row.data(), static_cast<int>(row.size())) == 1);
      }
      REQUIRE(PQputCopyEnd(c, fail ? "abandoned" : nullptr) == 1);
      res = PQgetResult(c);
      CHECK(PQresultStatus(res) == (fail ? PGRES_FATAL_ERROR : PGRES_COMMAND_OK));
      PQclear(res);
      while ((res = PQgetResult(c))) PQclear(res);
    }
    PQfinish(c);
    REQUIRE(proxy.stop() == 0);
  }
  const std::string before = pg.sql("SELECT count(*), md5(string_agg(id || name, ',' ORDER BY id)) FROM copy_ext");
  CHECK(pg.sql("SELECT count(*) FROM copy_ext") == "1000");
  auto reader = trace::open_reader(path);
  replay::Workload w = replay::load(*reader);
  CHECK(w.summary().unsupported == 0);
  CHECK(w.summary().copy_bytes > 10000);
  for (bool direct : {true, false}) {
    INFO((direct ? "direct" : "libpq"));
    pg.sql("TRUNCATE copy_ext");
    replay::Options o;
    o.conninfo = pg.conninfo();
    o.max_speed = true;
    o.direct = direct;
    o.io = tierlab::test::replay_io();
    replay::Report r = replay::run(w, o);
    CHECK(r.sessions_failed == 0);
    CHECK(r.statements == 2);
    CHECK(r.unsupported == 0);
    CHECK(r.errors == 1);  // 57014, as at capture
    CHECK(r.divergence_error_status == 0);
    CHECK(r.divergence_row_count == 0);
    CHECK(pg.sql("SELECT count(*), md5(string_agg(id || name, ',' ORDER BY id)) FROM copy_ext") == before);
  }
}
