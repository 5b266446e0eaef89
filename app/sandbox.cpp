// tierlab sandbox: a throwaway PostgreSQL for trying tierlab out, for demos
// and scripts. Starts a server in a temp dir (as `postgres` when run by root),
// optionally loads pgbench tables, prints its conninfo on one line, then runs
// a command against it (or waits for Ctrl-C), and always removes it again.
#include "app/command.h"
#include "common/error.h"
#include "pgtmp/pgtmp.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

extern char** environ;

namespace tierlab::app {
namespace {

struct SandboxOptions {
  int pgbench_scale = 0;             // 0: no pgbench tables
  std::vector<std::string> settings; // NAME=VALUE for postgresql.conf
  int port = 0;                      // 0: a free port
  bool keep_going = false;           // keep the server after COMMAND exits
  std::vector<std::string> command;  // empty: wait for SIGINT/SIGTERM
};

// Signals that end the sandbox. They are blocked and taken with
// sigtimedwait, so the command can finish and cleanup runs in order.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

// Waits up to `ms` for a stop signal; returns it, or 0.
int wait_signal(const sigset_t& set, int ms, siginfo_t* info) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  int sig = sigtimedwait(&set, info, &ts);
  return sig > 0 ? sig : 0;
}

pid_t start_command(const std::vector<std::string>& command, const std::vector<std::string>& add_env) {
  std::vector<std::string> env_s;
  for (char** e = environ; e && *e; ++e) {
    std::string v = *e;
    bool replaced = false;
    for (const auto& a : add_env)
      if (v.compare(0, a.find('=') + 1, a, 0, a.find('=') + 1) == 0) replaced = true;
    if (!replaced) env_s.push_back(std::move(v));
  }
  env_s.insert(env_s.end(), add_env.begin(), add_env.end());
  std::vector<char*> envp, argv;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::cout.flush();
  pid_t pid = fork();
  if (pid < 0) throw RuntimeError(errno_message("sandbox: fork", errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    const std::string msg = "tierlab: sandbox: cannot run " + command[0] + ": " + std::strerror(e) + "\n";
    ssize_t n = write(2, msg.data(), msg.size());
    (void)n;
    _exit(e == ENOENT ? 127 : 126);
  }
  return pid;
}

// What the server does at commit, in one line: a capture of a server whose
// commits do not wait for the device projects no storage latency.
std::string durability_line(const pgtmp::Server& server) {
  const std::string fsync = server.sql("SHOW fsync");
  const std::string sync_commit = server.sql("SHOW synchronous_commit");
  if (fsync == "off")
    return "fsync=off: commits do not wait for the device (a capture of it projects no commit latency)";
  if (sync_commit == "off")
    return "synchronous_commit=off: commits do not wait for the device (a capture of it projects no commit "
           "latency)";
  return "commits wait for the device (fsync on, synchronous_commit " + sync_commit +
         "); --set fsync=off trades that for speed";
}

void run_sandbox(const SandboxOptions& o) {
  pgtmp::Options po;
  if (o.port < 0 || o.port > 65535) throw InputError("--port " + std::to_string(o.port) + ": must be 1-65535");
  po.port = o.port;
  if (o.pgbench_scale < 0)
    throw InputError("--pgbench-init " + std::to_string(o.pgbench_scale) + ": must be a positive scale");
  for (const auto& s : o.settings) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw InputError("--set " + s + ": expected NAME=VALUE");
    po.settings.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }

  pgtmp::Server server(po);
  if (o.pgbench_scale > 0) {
    std::string out;
    int rc = server.run_tool("pgbench", {"-i", "-q", "-s", std::to_string(o.pgbench_scale)}, &out);
    if (rc != 0) {
      while (!out.empty() && out.back() == '\n') out.pop_back();
      auto nl = out.rfind('\n');
      throw RuntimeError("sandbox: pgbench -i -s " + std::to_string(o.pgbench_scale) + " failed (status " +
                         std::to_string(rc) + "): " + (nl == std::string::npos ? out : out.substr(nl + 1)));
    }
  }

  // From here on, stop signals are taken in order (see stop_signals()).
  const sigset_t set = stop_signals();
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &set, &old);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};

  std::cout << server.conninfo() << std::endl;
  std::cerr << "tierlab sandbox: " << durability_line(server) << std::endl;

  auto wait_for_stop = [&] {
    siginfo_t info;
    for (;;) {
      if (wait_signal(set, 500, &info)) return;
      if (!server.running())
        throw RuntimeError("sandbox: the server exited unexpectedly; see its log: " + server.log_path());
    }
  };

  if (o.command.empty()) {
    std::cerr << "tierlab sandbox: PostgreSQL running in " << server.temp_dir() << "; Ctrl-C stops and removes it"
              << std::endl;
    wait_for_stop();
    return;
  }

  const std::vector<std::string> env = {
      "PGHOST=127.0.0.1",
      "PGPORT=" + std::to_string(server.port()),
      "PGUSER=" + server.superuser(),
      "PGDATABASE=postgres",
      "TIERLAB_PG_SOCKET_DIR=" + server.socket_dir(),
      "TIERLAB_PG_BINDIR=" + server.bindir(),
      "TIERLAB_PG_DATA_DIR=" + server.data_dir(),
      "TIERLAB_PG_LOG=" + server.log_path(),
      "TIERLAB_PG_POSTMASTER_PID=" + std::to_string(server.postmaster_pid()),
  };
  const pid_t child = start_command(o.command, env);
  int status = 0;
  int signals_seen = 0;
  for (;;) {
    int st;
    pid_t r = waitpid(child, &st, WNOHANG);
    if (r == child) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    siginfo_t info;
    int sig = wait_signal(set, 100, &info);
    if (!sig) continue;
    // A terminal's Ctrl-C already reached the command (same process group);
    // a signal sent to tierlab alone is passed on. A second one is final.
    if (++signals_seen > 1) {
      kill(child, SIGKILL);
    } else if (info.si_code <= 0) {
      kill(child, sig);
    }
  }
  if (o.keep_going) {
    std::cerr << "tierlab sandbox: " << o.command[0] << " exited with status " << status
              << "; the server keeps running in " << server.temp_dir() << " until Ctrl-C" << std::endl;
    wait_for_stop();
  }
  set_exit_status(status);
}

void setup_sandbox(CLI::App& parent) {
  auto o = std::make_shared<SandboxOptions>();
  auto* sub = parent.add_subcommand(
      "sandbox",
      "start a throwaway PostgreSQL, print its conninfo, run a command against it (or wait for Ctrl-C), "
      "then remove it");
  sub->footer(
      "Usage: tierlab sandbox [OPTIONS] [-- COMMAND [ARGS...]]\n"
      "COMMAND runs with PGHOST, PGPORT, PGUSER and PGDATABASE set; the exit status is COMMAND's.\n"
      "COMMAND also gets TIERLAB_PG_SOCKET_DIR, TIERLAB_PG_BINDIR, TIERLAB_PG_DATA_DIR, TIERLAB_PG_LOG and\n"
      "TIERLAB_PG_POSTMASTER_PID. The conninfo line goes to stdout. Run as root, the server runs as postgres.\n"
      "The server runs with PostgreSQL's defaults for durability (fsync on: commits wait for the device),\n"
      "and says so on stderr; --set fsync=off trades that for speed, and a capture of it projects no\n"
      "commit latency.\n"
      "Example: tierlab sandbox --pgbench-init 10 -- pgbench -T 30 -c 8 -P 5");
  sub->add_option("--pgbench-init", o->pgbench_scale, "Load pgbench tables at this scale (pgbench -i -s SCALE)");
  sub->add_option("--set", o->settings, "postgresql.conf setting NAME=VALUE (repeatable)")->allow_extra_args(false);
  sub->add_option("--port", o->port, "TCP port on 127.0.0.1 (default: a free one)");
  sub->add_flag("--keep-going", o->keep_going, "Keep the server running after COMMAND exits, until Ctrl-C");
  sub->add_option("command", o->command, "Command to run against the server (after --)");
  sub->callback([o] { run_sandbox(*o); });
}

const Registration reg{"sandbox", 90, &setup_sandbox};

}  // namespace
}  // namespace tierlab::app
