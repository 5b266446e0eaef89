// tierlab sandbox: a throwaway PostgreSQL for trying tierlab out, for demos
// and scripts. Starts a server in a temp dir (as `postgres` when run by root),
// optionally loads pgbench tables, prints its conninfo on one line, then runs
// a command against it (or waits for Ctrl-C), and always removes it again.
#include "app/command.h"
#include "common/error.h"
#include "common/units.h"
#include "iosim/emulate.h"
#include "tiers/tiers.h"
#include "pgtmp/pgtmp.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
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
  std::string tier;                  // "": the server's files on the temp dir's disk
  std::string tiers_file;
  std::string tier_size = "4G";      // the emulated device
  std::string memory;                // "": no memory limit for the server
};

// A cgroup v1 memory group that the server joins (--memory): its processes
// and the page cache they fill are held to `limit` bytes (a group inside
// tierlab's own); tierlab itself,
// and so the emulator serving the server's disk, stays outside. The
// postmaster joins it through a prefix command before it execs (children
// inherit the group). The destructor removes the group once empty.
class MemoryCgroup {
 public:
  MemoryCgroup(uint64_t limit, const std::string& run_as) {
    const std::string root = "/sys/fs/cgroup/memory";
    if (access((root + "/memory.limit_in_bytes").c_str(), F_OK) != 0)
      throw RuntimeError("sandbox: --memory needs the cgroup v1 memory controller at " + root);
    // Under tierlab's own group, so that whatever limits that has still apply.
    std::string own;
    if (FILE* f = std::fopen("/proc/self/cgroup", "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, f)) {
        std::string l = line;
        const auto at = l.find(":memory:");
        if (at == std::string::npos) continue;
        own = l.substr(at + 8);
        while (!own.empty() && (own.back() == '\n' || own.back() == '/')) own.pop_back();
      }
      std::fclose(f);
    }
    dir_ = root + own + "/tierlab-sandbox-" + std::to_string(getpid());
    if (mkdir(dir_.c_str(), 0755) != 0) {
      const int e = errno;
      dir_.clear();
      throw RuntimeError(errno_message("sandbox: creating the memory cgroup", e));
    }
    write_file(dir_ + "/memory.limit_in_bytes", std::to_string(limit));
    // The server user moves its own postmaster in.
    if (geteuid() == 0) {
      if (const passwd* pw = getpwnam(run_as.c_str()))
        if (chown((dir_ + "/cgroup.procs").c_str(), pw->pw_uid, pw->pw_gid) != 0)
          throw RuntimeError(errno_message("sandbox: chown " + dir_ + "/cgroup.procs", errno));
    }
  }
  ~MemoryCgroup() {
    if (dir_.empty()) return;
    for (int i = 0; i < 100 && rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i) usleep(20'000);
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  // The prefix that puts the command it execs into the group.
  std::vector<std::string> exec_prefix() const {
    return {"/bin/sh", "-c", "echo $$ > " + dir_ + "/cgroup.procs && exec \"$@\"", "sh"};
  }
  const std::string& path() const { return dir_; }

 private:
  static void write_file(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    bool ok = f && std::fputs(text.c_str(), f) >= 0;
    if (f && std::fclose(f) != 0) ok = false;
    if (!ok) throw RuntimeError(errno_message("sandbox: writing " + text + " to " + path, errno));
  }
  std::string dir_;
};

// The server's disk for --tier: an ext4 file system on a device emulating
// the tier (iosim/emulate.h), its image a temporary file under $TMPDIR (or
// /var/tmp). The destructor unmounts it, detaches the device and removes
// the image, in that order, whatever failed before.
class TierDisk {
 public:
  TierDisk(const tiers::Tier& tier, uint64_t size) {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/var/tmp") + "/tierlab-sandbox.XXXXXX";
    if (!mkdtemp(tmpl.data())) throw RuntimeError(errno_message("sandbox: mkdtemp " + tmpl, errno));
    dir_ = tmpl;
    iosim::EmulateOptions eo;
    eo.image = dir_ + "/image";
    eo.size = size;
    emu_.emplace(tier, eo);
    run({"mkfs.ext4", "-q", "-F", emu_->device()});
    mnt_ = dir_ + "/mnt";
    if (mkdir(mnt_.c_str(), 0755) != 0) throw RuntimeError(errno_message("sandbox: mkdir " + mnt_, errno));
    if (mount(emu_->device().c_str(), mnt_.c_str(), "ext4", 0, nullptr) != 0)
      throw RuntimeError(errno_message("sandbox: mounting " + emu_->device() + " on " + mnt_, errno));
    mounted_ = true;
    chmod(mnt_.c_str(), 0755);
    chmod(dir_.c_str(), 0755);
  }
  ~TierDisk() {
    if (mounted_ && umount2(mnt_.c_str(), 0) != 0) umount2(mnt_.c_str(), MNT_DETACH);
    if (emu_) {
      emu_->detach_loop();
      for (int i = 0; i < 100 && !emu_->loop_detached(); ++i) usleep(50'000);
      emu_->shutdown();
    }
    if (!mnt_.empty()) rmdir(mnt_.c_str());
    if (!dir_.empty()) {
      unlink((dir_ + "/image").c_str());
      rmdir(dir_.c_str());
    }
  }
  TierDisk(const TierDisk&) = delete;
  TierDisk& operator=(const TierDisk&) = delete;

  const std::string& mountpoint() const { return mnt_; }
  iosim::Emulator& emulator() { return *emu_; }

 private:
  static void run(const std::vector<std::string>& argv) {
    std::vector<char*> a;
    std::vector<std::string> copy = argv;
    for (auto& s : copy) a.push_back(s.data());
    a.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) throw RuntimeError(errno_message("sandbox: fork", errno));
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 1);
      execvp(a[0], a.data());
      _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      throw RuntimeError("sandbox: " + argv[0] + " " + argv.back() + " failed (status " +
                         std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) + ")");
  }

  std::string dir_, mnt_;
  std::optional<iosim::Emulator> emu_;
  bool mounted_ = false;
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

  uint64_t memory_limit = 0;
  if (!o.memory.empty()) {
    memory_limit = parse_size("--memory", o.memory);
    if (memory_limit < (32u << 20)) throw InputError("--memory " + o.memory + ": must be at least 32M");
  }
  const uint64_t tier_size = parse_size("--tier-size", o.tier_size);
  if (tier_size < (64u << 20)) throw InputError("--tier-size " + o.tier_size + ": must be at least 64M");
  // --tier: the emulator's threads start with the stop signals blocked, so
  // that only this thread takes them (and cleans up in order).
  const sigset_t early = stop_signals();
  sigset_t before_tier;
  if (!o.tier.empty()) pthread_sigmask(SIG_BLOCK, &early, &before_tier);
  std::optional<TierDisk> disk;
  if (!o.tier.empty()) {
    const tiers::Catalog catalog = tiers::load_catalog(o.tiers_file);
    const tiers::Tier& tier = catalog.get(o.tier);
    disk.emplace(tier, tier_size);
    po.tmp_parent = disk->mountpoint();
    std::cerr << "tierlab sandbox: the server's files are on " << disk->emulator().device() << ", ext4, emulating "
              << tier.name << std::endl;
    const iosim::Emulator& emu = disk->emulator();
    for (const std::string& l : emu.leftovers()) std::cerr << "tierlab sandbox: " << l << std::endl;
    if (const std::string w = iosim::faster_than_disk(tier, emu.disk(), emu.round_trip_ns()); !w.empty())
      std::cerr << "tierlab sandbox: " << w << std::endl;
  } else if (!o.tiers_file.empty()) {
    throw InputError("--tiers-file is only used with --tier NAME");
  }
  struct Totals {
    std::optional<TierDisk>& d;
    ~Totals() {
      if (!d) return;
      const iosim::EmulateInterval t = d->emulator().totals();
      std::fprintf(stderr,
                   "tierlab sandbox: %s served read %llu I/Os, write %llu I/Os, flush %llu; %llu counted I/Os; "
                   "lat p50 %.3f p99 %.3f ms\n",
                   d->emulator().device().c_str(), (unsigned long long)t.ios[0], (unsigned long long)t.ios[1],
                   (unsigned long long)t.ios[2], (unsigned long long)t.counted_ios, t.lat.quantile(0.5) / 1e6,
                   t.lat.quantile(0.99) / 1e6);
    }
  } totals{disk};
  std::optional<MemoryCgroup> memory;
  if (!o.memory.empty()) {
    const uint64_t limit = memory_limit;
    memory.emplace(limit, po.run_as);
    po.exec_prefix = memory->exec_prefix();
    std::cerr << "tierlab sandbox: the server runs in the memory cgroup " << memory->path() << ", limit "
              << format_bytes(double(limit)) << std::endl;
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

}  // namespace

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
  sub->add_option("--tier", o->tier,
                  "put the server's files on ext4 on a device emulating this tier (tierlab iosim emulate; root)");
  sub->add_option("--tiers-file", o->tiers_file, "JSON file with more tiers");
  sub->add_option("--tier-size", o->tier_size, "size of the emulated device (its image is a temporary file)")
      ->capture_default_str();
  sub->add_option("--memory", o->memory,
                  "hold the server's memory, page cache included, to this (512M) in a cgroup v1 memory group "
                  "(root); tierlab stays outside it");
  sub->add_option("command", o->command, "Command to run against the server (after --)");
  sub->callback([o] { run_sandbox(*o); });
}

}  // namespace tierlab::app
