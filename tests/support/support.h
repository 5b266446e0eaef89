// Helpers shared by every test binary.
//
//   tierlab::test::TempDir dir;                  // removed when it goes out of scope
//   auto r = tierlab::test::run_tierlab({"trace", "info", f});  // the real binary
//   tierlab::test::require_root("tracefs");      // exits 77 (skipped) unless root
//   auto& pg = tierlab::test::shared_server();   // one throwaway PostgreSQL per process
//
// Each Catch2 test case runs as its own ctest entry (its own process), so
// shared_server() is in effect one server per test case.
#pragma once

#include "pgtmp/pgtmp.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tierlab::test {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it by
// the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tmpfs of `size` ("512k") mounted on a new directory in `dir`, for a
// disk that fills; unmounted by the destructor. skip()s if it cannot be
// mounted (it needs root).
class SmallTmpfs {
 public:
  SmallTmpfs(const TempDir& dir, const std::string& size);
  ~SmallTmpfs();
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int status = -1;  // exit code, or 128 + signal number
  std::string out;  // everything written to stdout
  std::string err;  // everything written to stderr
};

// Runs the built tierlab executable (TIERLAB_BINARY) with `args` (without
// argv[0]), feeding `stdin_text` (or /dev/null) and capturing stdout, stderr
// and the exit status. `env` entries ("NAME=value") are added to the
// environment. `missing_syscalls` (SYS_* numbers) fail with ENOSYS in the
// child, as on a kernel that lacks them (a seccomp filter installed before
// exec; status kNoSeccomp if the filter cannot be installed). Waits for it
// to exit.
RunResult run_tierlab(const std::vector<std::string>& args,
                      const std::optional<std::string>& stdin_text = std::nullopt,
                      const std::vector<std::string>& env = {},
                      const std::vector<long>& missing_syscalls = {});
constexpr int kNoSeccomp = 125;

// Prints "SKIP: why" and exits with status 77, which ctest reports as skipped.
[[noreturn]] void skip(const std::string& why);

// skip()s unless running as root; `what` names what needs root.
void require_root(const char* what);

// Starts `args` (args[0] the binary's path) with stdout and stderr written
// to the two files; returns its pid (the caller waits for it).
int spawn_to_files(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path);

// The whole of a file's bytes ("" if it cannot be read).
std::string slurp(const std::string& path);

// Options for a test server whose commits do not wait for the device
// (fsync=off): for tests that measure tierlab, not the machine's flush time.
pgtmp::Options fast_server_options();

// A throwaway PostgreSQL (fast_server_options(): fsync off) started on
// first use and kept until the process exits. Throws RuntimeError (the test
// fails) if it cannot start.
pgtmp::Server& shared_server();

// The number of lines in `s` (a last line without '\n' counts).
size_t count_lines(const std::string& s);

// What `cmd` (run by /bin/sh) printed on stdout, trailing newlines removed;
// empty if it could not be run.
std::string shell_output(const std::string& cmd);

// Peak resident set of this process so far (VmHWM), in bytes.
uint64_t peak_rss();

// Waits up to five seconds for a listener on 127.0.0.1:port (a tierlab
// subcommand started in the background); true once a connect succeeds.
bool wait_listening(int port);

}  // namespace tierlab::test
