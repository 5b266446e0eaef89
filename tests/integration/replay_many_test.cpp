// 10,000 concurrent sessions. A PostgreSQL on this kind of machine cannot
// fork 10,000 backends, so the sessions go through pgbouncer (transaction
// pooling, 20 server connections): the replay side really opens, holds and
// drives 10,000 connections at once (descriptor limit, epoll, timers).
#include "replay/replay.h"
#include "support/support.h"
#include "tests/integration/replay_traces.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

using namespace tierlab;
using namespace replay_test;

namespace {

// pgbouncer as the unprivileged server user (it refuses to run as root),
// with a descriptor limit that fits 10,000 clients.
class Bouncer {
 public:
  Bouncer(const tierlab::test::TempDir& dir, const pgtmp::Server& pg) {
    passwd* pw = getpwnam("postgres");
    if (!pw) tierlab::test::skip("no 'postgres' user to run pgbouncer as");
    if (access("/usr/sbin/pgbouncer", X_OK) != 0) tierlab::test::skip("pgbouncer is not installed");
    port_ = pgtmp::free_port();
    std::string ini = dir.file("pgbouncer.ini");
    std::ofstream(dir.file("userlist.txt")) << "\"" << pg.superuser() << "\" \"\"\n";
    std::ofstream(ini) << "[databases]\n"
                       << "postgres = host=127.0.0.1 port=" << pg.port() << " dbname=postgres\n"
                       << "[pgbouncer]\n"
                       << "listen_addr = 127.0.0.1\nlisten_port = " << port_ << "\n"
                       << "unix_socket_dir =\nauth_type = trust\n"
                       << "auth_file = " << dir.file("userlist.txt") << "\n"
                       << "pool_mode = transaction\nmax_client_conn = 11000\ndefault_pool_size = 20\n"
                       << "listen_backlog = 4096\n"
                       << "logfile = " << dir.file("pgbouncer.log") << "\n";
    chown(dir.path().c_str(), pw->pw_uid, pw->pw_gid);
    chown(ini.c_str(), pw->pw_uid, pw->pw_gid);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      rlimit rl{24000, 24000};
      setrlimit(RLIMIT_NOFILE, &rl);
      if (setgroups(0, nullptr) != 0 || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) _exit(126);
      execl("/usr/sbin/pgbouncer", "pgbouncer", "-q", ini.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready when it accepts a query.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      std::string out;
      if (pg.run_tool("psql", {"-h", "127.0.0.1", "-p", std::to_string(port_), "-Atc", "SELECT 1", "postgres"},
                      &out) == 0)
        break;
      if (std::chrono::steady_clock::now() > deadline) FAIL("pgbouncer did not start: " << out);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~Bouncer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace

TEST_CASE("10,000 concurrent sessions replay (through pgbouncer)", "[replay][pg][many]") {
  if (geteuid() != 0) tierlab::test::skip("needs root to run pgbouncer as the postgres user");
  auto& pg = tierlab::test::shared_server();
  tierlab::test::TempDir dir;
  Bouncer bouncer(dir, pg);
  const int n = 10000;
  std::string path = dir.file("10k.tlt");
  {
    TraceBuilder b(path);
    for (int i = 0; i < n; ++i) {
      uint64_t s = static_cast<uint64_t>(i + 1);
      b.begin(i * 100000, s, pg.superuser());  // all open within 1 s
      b.query(1500 * kMs + i * 50000, s, "SELECT " + std::to_string(i), "SELECT", true, 1);
      b.end(2500 * kMs, s);
    }
    b.close();
  }
  auto reader = trace::open_reader(path);
  replay::Workload w = replay::load(*reader);
  REQUIRE(w.summary().max_concurrency == n);
  replay::Options o;
  o.conninfo = "host=127.0.0.1 port=" + std::to_string(bouncer.port()) + " dbname=postgres";
  o.threads = 2;
  replay::Report r = replay::run(w, o);
  INFO(r.first_session_error);
  CHECK(r.sessions == n);
  CHECK(r.sessions_failed == 0);
  CHECK(r.statements == n);
  CHECK(r.transactions == n);
  CHECK(r.errors == 0);
  rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  CHECK(rl.rlim_cur >= static_cast<rlim_t>(n));
}
