#include "pgtmp/process.h"

#include "common/clock.h"
#include "common/error.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

namespace tierlab::pgtmp::detail {
namespace {

// What the child reports through the close-on-exec pipe when it fails
// before exec. A successful exec closes the pipe with nothing written.
struct ChildFailure {
  int step;
  int err;
};

const char* const kSteps[] = {"setpgid", "setgroups", "setgid", "setuid", "prctl",
                              "chdir",   "dup2",      "exec"};

[[noreturn]] void child_fail(int fd, int step) {
  ChildFailure f{step, errno};
  ssize_t n = write(fd, &f, sizeof f);
  (void)n;
  _exit(127);
}

std::string find_in_path(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string candidate = end > start ? p.substr(start, end - start) + "/" + prog : "./" + prog;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return prog;  // exec will report ENOENT
}

struct linux_dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

bool is_dot(const char* n) { return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0)); }

// Removes `name` in directory `dirfd`, recursing into directories.
// Only async-signal-safe system calls; bounded stack (4 KiB per level).
int remove_at(int dirfd, const char* name, int depth) {
  if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  if (depth > 64) return ELOOP;
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  int first_error = 0;
  alignas(8) char buf[4096];
  // Invariant: every pass starts at offset 0; stop when a pass removes nothing.
  for (;;) {
    if (lseek(fd, 0, SEEK_SET) < 0) break;
    int removed = 0, remaining = 0;
    for (;;) {
      long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        auto* d = reinterpret_cast<linux_dirent64*>(buf + off);
        off += d->d_reclen;
        if (is_dot(d->d_name)) continue;
        int e = remove_at(fd, d->d_name, depth + 1);
        if (e == 0) {
          ++removed;
        } else {
          ++remaining;
          if (!first_error) first_error = e;
        }
      }
    }
    if (remaining == 0 || removed == 0) break;
  }
  close(fd);
  if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && !first_error)
    first_error = errno;
  return first_error;
}

}  // namespace

pid_t spawn(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw RuntimeError("spawn: empty command");
  const std::string program = find_in_path(spec.argv[0]);
  // Everything the child touches is prepared before fork: between fork and
  // exec only async-signal-safe calls are made.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (size_t i = 1; i < spec.argv.size(); ++i) argv.push_back(const_cast<char*>(spec.argv[i].c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  const bool change_id = spec.uid != static_cast<uid_t>(-1);
  const pid_t parent = getpid();

  int devnull = -1;
  if (spec.stdin_fd < 0) {
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) throw RuntimeError(errno_message("open /dev/null", errno));
  }
  const int in_fd = spec.stdin_fd < 0 ? devnull : spec.stdin_fd;
  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) != 0) {
    int e = errno;
    if (devnull >= 0) close(devnull);
    throw RuntimeError(errno_message("pipe", e));
  }

  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(errpipe[0]);
    close(errpipe[1]);
    if (devnull >= 0) close(devnull);
    throw RuntimeError(errno_message("fork " + program, e));
  }
  if (pid == 0) {
    const int ep = errpipe[1];
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    if (spec.new_process_group && setpgid(0, 0) != 0) child_fail(ep, 0);
    if (change_id) {
      gid_t g = spec.gid;
      if (setgroups(1, &g) != 0) child_fail(ep, 1);
      if (setgid(spec.gid) != 0) child_fail(ep, 2);
      if (setuid(spec.uid) != 0) child_fail(ep, 3);
    }
    // After the identity change: changing credentials clears the setting.
    if (spec.die_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, SIGQUIT) != 0) child_fail(ep, 4);
      if (getppid() != parent) _exit(1);  // the parent is already gone
    }
    if (cwd && chdir(cwd) != 0) child_fail(ep, 5);
    // Descriptors the caller forgot to mark close-on-exec (sockets, pipes)
    // must not live on in a long-running server. Best effort: needs Linux 5.11.
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    if (dup2(in_fd, 0) < 0) child_fail(ep, 6);
    if (spec.stdout_fd >= 0 && dup2(spec.stdout_fd, 1) < 0) child_fail(ep, 6);
    if (spec.stderr_fd >= 0 && dup2(spec.stderr_fd, 2) < 0) child_fail(ep, 6);
    execve(argv[0], argv.data(), envp.data());
    child_fail(ep, 7);
  }
  close(errpipe[1]);
  if (devnull >= 0) close(devnull);
  ChildFailure f{};
  ssize_t n;
  do {
    n = read(errpipe[0], &f, sizeof f);
  } while (n < 0 && errno == EINTR);
  close(errpipe[0]);
  if (n == static_cast<ssize_t>(sizeof f)) {
    int status;
    waitpid(pid, &status, 0);
    throw RuntimeError(errno_message(program + ": " + kSteps[f.step], f.err));
  }
  return pid;
}

bool wait_for(pid_t pid, int timeout_ms, int* status) {
  int st = 0;
  if (timeout_ms < 0) {
    for (;;) {
      pid_t r = waitpid(pid, &st, 0);
      if (r == pid) break;
      if (r < 0 && errno == EINTR) continue;
      st = 0;  // not our child any more
      break;
    }
    if (status) *status = st;
    return true;
  }
  const Nanos deadline = now_ns() + Nanos{timeout_ms} * 1'000'000;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (status) *status = st;
      return true;
    }
    if (r < 0 && errno != EINTR) {
      if (status) *status = 0;
      return true;
    }
    if (now_ns() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int shell_status(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 255;
}

int run_capture(SpawnSpec spec, std::string* out) {
  int p[2] = {-1, -1};
  if (out) {
    if (pipe2(p, O_CLOEXEC) != 0) throw RuntimeError(errno_message("pipe", errno));
    spec.stdout_fd = p[1];
    spec.stderr_fd = p[1];
  }
  pid_t pid;
  try {
    pid = spawn(spec);
  } catch (...) {
    if (out) {
      close(p[0]);
      close(p[1]);
    }
    throw;
  }
  if (out) {
    close(p[1]);
    char buf[65536];
    for (;;) {
      ssize_t n = read(p[0], buf, sizeof buf);
      if (n > 0) {
        out->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    close(p[0]);
  }
  int st = 0;
  wait_for(pid, -1, &st);
  return shell_status(st);
}

std::vector<std::string> environment(const std::vector<std::string>& drop_prefixes,
                                     const std::vector<std::string>& add) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string v = *e;
    bool drop = false;
    for (const auto& p : drop_prefixes)
      if (v.compare(0, p.size(), p) == 0) drop = true;
    // Anything `add` sets replaces the inherited value.
    for (const auto& a : add) {
      auto eq = a.find('=');
      if (v.compare(0, eq + 1, a, 0, eq + 1) == 0) drop = true;
    }
    if (!drop) env.push_back(std::move(v));
  }
  env.insert(env.end(), add.begin(), add.end());
  return env;
}

int remove_tree_signal_safe(const char* path) { return remove_at(AT_FDCWD, path, 0); }

}  // namespace tierlab::pgtmp::detail
