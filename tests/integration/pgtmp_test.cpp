// The throwaway PostgreSQL against a real server: starting, SQL over the
// unix socket and TCP, several servers at once, restart, and cleanup on
// destruction, SIGINT and the death of the starting process.
#include "pgtmp/pgtmp.h"
#include "common/error.h"
#include "support/support.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <libpq-fe.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace fs = std::filesystem;
using tierlab::pgtmp::Options;
using tierlab::pgtmp::Server;

namespace {

// Runs one query over libpq with `conninfo`; returns the first value or the
// connection error (prefixed "ERROR: ").
std::string query(const std::string& conninfo, const std::string& sql) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    std::string e = std::string("ERROR: ") + PQerrorMessage(c);
    PQfinish(c);
    return e;
  }
  PGresult* r = PQexec(c, sql.c_str());
  std::string out = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0
                        ? PQgetvalue(r, 0, 0)
                        : std::string("ERROR: ") + PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(c);
  return out;
}

bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// What a forked child that started a server tells its parent.
struct ChildServer {
  pid_t child = 0;
  pid_t postmaster = 0;
  std::string temp_dir;
};

// Forks a child that starts a server, reports its postmaster pid and temp dir
// through a pipe, and then waits to be signalled.
ChildServer start_in_child() {
  int p[2];
  // Close-on-exec: the postmaster must not hold the write end open.
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(p[0]);
    // As a plain program would have it: no test framework handlers.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    std::string msg;
    try {
      static Server s;  // never destroyed: the child dies of a signal
      msg = std::to_string(s.postmaster_pid()) + " " + s.temp_dir();
    } catch (const std::exception& e) {
      msg = std::string("ERROR ") + e.what();
    }
    ssize_t n = write(p[1], msg.data(), msg.size());
    (void)n;
    close(p[1]);
    for (;;) pause();
  }
  close(p[1]);
  std::string msg;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  close(p[0]);
  INFO(msg);
  REQUIRE(msg.rfind("ERROR", 0) != 0);
  ChildServer cs;
  cs.child = child;
  auto sp = msg.find(' ');
  cs.postmaster = std::stoi(msg.substr(0, sp));
  cs.temp_dir = msg.substr(sp + 1);
  return cs;
}

}  // namespace

TEST_CASE("pgtmp: a server starts and answers SQL on the unix socket and over TCP", "[pgtmp][parallel]") {
  Server s;
  CHECK(s.sql("select 1") == "1");
  CHECK(s.port() > 0);
  CHECK(s.host() == "127.0.0.1");
  CHECK(fs::exists(s.data_dir() + "/PG_VERSION"));
  CHECK(s.sql("select current_setting('max_connections')") == "2500");
  // Commits wait for the device, as on any server: the server's defaults.
  CHECK(s.sql("select current_setting('fsync')") == "on");
  CHECK(s.sql("select current_setting('synchronous_commit')") == "on");
  CHECK(s.sql("select current_setting('listen_addresses')") == "127.0.0.1");
  // TCP through libpq with the advertised conninfo.
  CHECK(query(s.conninfo(), "select inet_server_port()") == std::to_string(s.port()));
  CHECK(query(s.conninfo(), "select current_user") == "postgres");
  CHECK(query(s.conninfo_unix(), "select 2") == "2");
  // Several rows come back one per line; server errors carry the message.
  CHECK(s.sql("select g from generate_series(1,3) g") == "1\n2\n3");
  CHECK_THROWS_WITH(s.sql("select * from no_such_table"), Catch::Contains("no_such_table"));
  CHECK(s.client_env().size() == 4);
  if (geteuid() == 0) {
    // PostgreSQL refuses root: the data dir belongs to the unprivileged user.
    struct stat st {};
    REQUIRE(stat(s.data_dir().c_str(), &st) == 0);
    const passwd* pw = getpwnam("postgres");
    REQUIRE(pw != nullptr);
    CHECK(st.st_uid == pw->pw_uid);
  }
}

TEST_CASE("pgtmp: settings are appended to postgresql.conf and win over the defaults", "[pgtmp][parallel]") {
  Options o;
  o.settings = {{"work_mem", "7MB"}, {"fsync", "off"}, {"application_name", "it's quoted"}};
  Server s(o);
  CHECK(s.sql("show work_mem") == "7MB");
  CHECK(s.sql("show fsync") == "off");
  CHECK(s.sql("show application_name") == "it's quoted");
}

TEST_CASE("pgtmp: a server that cannot start reports the server log", "[pgtmp][parallel]") {
  Options o;
  o.settings = {{"shared_buffers", "lots"}};
  CHECK_THROWS_WITH(Server(o), Catch::Contains("shared_buffers") && Catch::Contains("server log"));
}

TEST_CASE("pgtmp: two servers run at once on different ports", "[pgtmp][parallel]") {
  Server a, b;
  CHECK(a.port() != b.port());
  CHECK(a.temp_dir() != b.temp_dir());
  a.sql("create table only_in_a (x int)");
  CHECK(query(a.conninfo(), "select count(*) from only_in_a") == "0");
  CHECK(query(b.conninfo(), "select count(*) from only_in_a").rfind("ERROR", 0) == 0);
}

TEST_CASE("pgtmp: restart keeps data and port", "[pgtmp][parallel]") {
  Server s;
  const int port = s.port();
  const pid_t first = s.postmaster_pid();
  s.sql("create table kept (x int); insert into kept values (1), (2)");
  s.restart();
  CHECK(s.port() == port);
  CHECK(s.postmaster_pid() != first);
  CHECK(s.sql("select count(*) from kept") == "2");
  s.restart(/*immediate=*/true);
  CHECK(s.sql("select sum(x) from kept") == "3");
  s.stop();
  CHECK_FALSE(s.running());
  CHECK(s.postmaster_pid() == 0);
  s.start();
  CHECK(s.running());
  CHECK(query(s.conninfo(), "select count(*) from kept") == "2");
}

TEST_CASE("pgtmp: the destructor stops the postmaster and removes the temp dir", "[pgtmp][parallel]") {
  pid_t pm;
  std::string dir;
  {
    Server s;
    pm = s.postmaster_pid();
    dir = s.temp_dir();
    REQUIRE(pm > 0);
    REQUIRE(fs::exists(dir));
  }
  CHECK_FALSE(process_exists(pm));
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("pgtmp: SIGINT to the starting process stops the server and removes its dir", "[pgtmp][parallel]") {
  ChildServer cs = start_in_child();
  REQUIRE(process_exists(cs.postmaster));
  REQUIRE(fs::exists(cs.temp_dir));
  REQUIRE(kill(cs.child, SIGINT) == 0);
  int st = 0;
  REQUIRE(waitpid(cs.child, &st, 0) == cs.child);
  // The signal took its default course after the cleanup.
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGINT);
  CHECK_FALSE(process_exists(cs.postmaster));
  CHECK_FALSE(fs::exists(cs.temp_dir));
}

TEST_CASE("pgtmp: a postmaster exits when the process that started it is SIGKILLed", "[pgtmp][parallel]") {
  // Orphans are reparented to us, so we can reap the postmaster and see it go.
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  ChildServer cs = start_in_child();
  REQUIRE(kill(cs.child, SIGKILL) == 0);
  int st = 0;
  REQUIRE(waitpid(cs.child, &st, 0) == cs.child);
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    pid_t r = waitpid(cs.postmaster, &st, WNOHANG);
    gone = r == cs.postmaster || (r < 0 && errno == ECHILD && !process_exists(cs.postmaster));
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
  // SIGKILL leaves the temp dir behind; that is the documented limit.
  std::error_code ec;
  fs::remove_all(cs.temp_dir, ec);
}

TEST_CASE("pgtmp: run_tool runs pgbench against the server", "[pgtmp][parallel]") {
  Server s;
  std::string out;
  int rc = s.run_tool("pgbench", {"-i", "-s", "1"}, &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(s.sql("select count(*) from pgbench_accounts") == "100000");
  out.clear();
  rc = s.run_tool("pgbench", {"-t", "20", "-c", "2", "-n"}, &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("number of transactions actually processed: 40") != std::string::npos);
  out.clear();
  CHECK(s.run_tool("psql", {"-c", "select * from no_such_table"}, &out) != 0);
  CHECK(out.find("no_such_table") != std::string::npos);
}

TEST_CASE("pgtmp: a missing run_as user is a clear error", "[pgtmp][parallel]") {
  tierlab::test::require_root("running PostgreSQL as another user");
  Options o;
  o.run_as = "tierlab-no-such-user";
  CHECK_THROWS_AS(Server(o), tierlab::RuntimeError);
  CHECK_THROWS_WITH(Server(o), Catch::Contains("tierlab-no-such-user") && Catch::Contains("does not exist"));
}

TEST_CASE("pgtmp: scram-sha-256 over TCP needs the password", "[pgtmp][parallel]") {
  Options o;
  o.host_auth = "scram-sha-256";
  Server s(o);
  s.sql("alter user postgres password 'sekret'");
  const std::string base = s.conninfo() + " passfile=/nonexistent";
  CHECK(query(base, "select 1").find("password") != std::string::npos);
  CHECK(query(base + " password=wrong", "select 1").find("password authentication failed") != std::string::npos);
  CHECK(query(base + " password=sekret", "select 1") == "1");
  // The unix socket still trusts.
  CHECK(s.sql("select 1") == "1");
  Options bad;
  bad.host_auth = "bogus";
  CHECK_THROWS_AS(Server(bad), tierlab::InputError);
}

TEST_CASE("pgtmp: servers copied from the cached initdb result are independent of it", "[pgtmp][parallel]") {
  Options fresh;
  fresh.reuse_initdb = false;  // runs initdb, and fills the cache if it was empty
  Server a(fresh);
  a.sql("create table only_in_a (x int)");
  Server b;  // from the cache
  CHECK(b.sql("select count(*) from pg_class where relname = 'only_in_a'") == "0");
  b.sql("create table only_in_b (x int)");
  Server c;
  CHECK(c.sql("select count(*) from pg_class where relname like 'only_in_%'") == "0");
  struct stat st {};
  REQUIRE(stat(c.data_dir().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("pgtmp: started by an unprivileged user, the server runs as that user", "[pgtmp][parallel]") {
  tierlab::test::require_root("switching to an unprivileged user for this test");
  const passwd* pw = getpwnam("postgres");
  if (!pw) tierlab::test::skip("no user postgres to switch to");
  const uid_t uid = pw->pw_uid;
  const gid_t gid = pw->pw_gid;
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(p[0]);
    std::string msg;
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
      msg = "ERROR cannot switch user";
    } else {
      try {
        Server s;
        struct stat st {};
        stat(s.data_dir().c_str(), &st);
        msg = s.sql("select current_user") + " " + std::to_string(st.st_uid) + " " + s.sql("select 6*7");
      } catch (const std::exception& e) {
        msg = std::string("ERROR ") + e.what();
      }
    }
    ssize_t n = write(p[1], msg.data(), msg.size());
    (void)n;
    _exit(0);  // skips the parent's static destructors
  }
  close(p[1]);
  std::string msg;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int st = 0;
  waitpid(child, &st, 0);
  CHECK(msg == "postgres " + std::to_string(uid) + " 42");
}

TEST_CASE("pgtmp: a temp dir the server user cannot reach is a clear error", "[pgtmp][parallel]") {
  tierlab::test::require_root("running PostgreSQL as another user");
  tierlab::test::TempDir private_parent;  // mode 0700, owned by root
  Options o;
  o.tmp_parent = private_parent.path();
  CHECK_THROWS_WITH(Server(o), Catch::Contains("cannot reach") && Catch::Contains(private_parent.path()));
  CHECK(std::distance(fs::directory_iterator(private_parent.path()), fs::directory_iterator()) == 0);
}
