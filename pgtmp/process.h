// Private to pgtmp: starting programs with fork + exec, optionally as another
// user, and removing a directory tree with async-signal-safe calls only.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tierlab::pgtmp::detail {

struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is the program path (absolute or found in PATH)
  std::vector<std::string> env;   // complete environment, "NAME=value"
  uid_t uid = static_cast<uid_t>(-1);  // -1: keep the caller's identity
  gid_t gid = static_cast<gid_t>(-1);
  std::string cwd;                // empty: keep
  int stdin_fd = -1;              // -1: /dev/null
  int stdout_fd = -1;             // -1: inherit
  int stderr_fd = -1;             // -1: inherit
  // Ask the kernel to send SIGQUIT to the child when the *thread* that called
  // spawn() exits (prctl PR_SET_PDEATHSIG, set after the identity change,
  // which would clear it).
  bool die_with_parent = false;
  bool new_process_group = false;
};

// Forks and execs `spec`. The child starts with an empty signal mask and
// SIGPIPE at its default action. Returns the child's pid; throws RuntimeError
// naming the program and the failing step (setuid, chdir, exec...) when the
// child could not exec.
pid_t spawn(const SpawnSpec& spec);

// Waits for `pid` up to `timeout_ms` (negative: forever). Returns true and
// sets *status when it exited, false on timeout. A pid that is not our child
// (already reaped) counts as exited with status 0.
bool wait_for(pid_t pid, int timeout_ms, int* status);

// Exit status as a shell reports it: the exit code, or 128 + signal.
int shell_status(int wait_status);

// Runs spec to completion, capturing stdout+stderr into *out (when given).
int run_capture(SpawnSpec spec, std::string* out);

// The caller's environment minus variables whose name starts with one of
// `drop_prefixes`, plus `add`.
std::vector<std::string> environment(const std::vector<std::string>& drop_prefixes,
                                     const std::vector<std::string>& add);

// Removes `path` and everything under it using only async-signal-safe system
// calls (open, getdents64, unlinkat). Safe in a signal handler. Returns 0 or
// an errno value.
int remove_tree_signal_safe(const char* path);

}  // namespace tierlab::pgtmp::detail
