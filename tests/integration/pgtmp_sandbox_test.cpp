// tierlab sandbox end to end: the real binary starts a throwaway PostgreSQL,
// runs a command against it and removes it again.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

using tierlab::test::run_tierlab;

namespace {

// Output of psql running `select 42` against 127.0.0.1:port.
std::string select_42(const std::string& port) {
  std::string cmd = tierlab::pgtmp::find_bindir() + "/psql -h 127.0.0.1 -p " + port +
                    " -U postgres -d postgres -Atc 'select 42' 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

}  // namespace

TEST_CASE("sandbox: runs a command against a fresh server and exits with its status", "[sandbox]") {
  auto r = run_tierlab({"sandbox", "--pgbench-init", "1", "--set", "work_mem=5MB", "--", "sh", "-c",
                        "\"$TIERLAB_PG_BINDIR/psql\" -Atc 'show work_mem' &&"
                        " \"$TIERLAB_PG_BINDIR/psql\" -Atc 'show fsync' &&"
                        " \"$TIERLAB_PG_BINDIR/psql\" -Atc 'select count(*) from pgbench_accounts' &&"
                        " echo \"$PGHOST $PGUSER $PGDATABASE\" && echo \"$TIERLAB_PG_SOCKET_DIR\" && exit 3"});
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.status == 3);
  auto l = lines(r.out);
  REQUIRE(l.size() == 6);
  CHECK(l[0].rfind("host=127.0.0.1 port=", 0) == 0);
  CHECK(l[1] == "5MB");
  CHECK(l[2] == "on");  // the server's default: commits wait for the device
  CHECK(l[3] == "100000");
  CHECK(l[4] == "127.0.0.1 postgres postgres");
  CHECK_FALSE(l[5].empty());
  CHECK_FALSE(std::filesystem::exists(l[5]));  // removed on the way out
  CHECK(r.err.find("fsync on") != std::string::npos);
}

TEST_CASE("sandbox: --set fsync=off is taken and said", "[sandbox]") {
  auto r = run_tierlab({"sandbox", "--set", "fsync=off", "--", "sh", "-c",
                        "\"$TIERLAB_PG_BINDIR/psql\" -Atc 'show fsync'"});
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  auto l = lines(r.out);
  REQUIRE(l.size() == 2);
  CHECK(l[1] == "off");
  CHECK(r.err.find("fsync=off: commits do not wait for the device") != std::string::npos);
}

TEST_CASE("sandbox: a command that cannot be run is status 127", "[sandbox]") {
  auto r = run_tierlab({"sandbox", "--", "/nonexistent/tierlab-command"});
  CHECK(r.status == 127);
  CHECK(r.err.find("cannot run /nonexistent/tierlab-command") != std::string::npos);
}

TEST_CASE("sandbox: without a command it serves until SIGTERM, then cleans up", "[sandbox]") {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], 1);
    execl(TIERLAB_BINARY, TIERLAB_BINARY, "sandbox", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  // A failed REQUIRE must not leave the sandbox running.
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid > 0 && kill(pid, SIGTERM) == 0) waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  INFO(line);
  REQUIRE(line.rfind("host=127.0.0.1 port=", 0) == 0);
  const std::string port = line.substr(std::string("host=127.0.0.1 port=").size(),
                                       line.find(' ', 20) - std::string("host=127.0.0.1 port=").size());
  // The server answers while the sandbox waits.
  CHECK(select_42(port) == "42\n");
  REQUIRE(kill(pid, SIGTERM) == 0);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  reap.pid = 0;
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  close(out[0]);
  // Nothing listens on the port any more: psql no longer gets the answer
  // (its error names the port, which may itself contain "42").
  CHECK(select_42(port) != "42\n");
}
