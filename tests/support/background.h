// A program in the background for integration tests: stdout to a file,
// stderr read through a pipe until an expected line shows up.
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tierlab::test {

class Background {
 public:
  Background(const std::vector<std::string>& args, const std::string& stdout_path) {
    std::vector<std::string> a = args;
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    int err[2];
    REQUIRE(pipe2(err, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      int out = open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out, 1);
      dup2(err[1], 2);
      int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(err[1]);
    err_ = err[0];
    out_path_ = stdout_path;
  }
  ~Background() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (err_ >= 0) close(err_);
  }

  // Reads stderr until `needle` appears; false on timeout or exit.
  bool wait_for(const std::string& needle, int timeout_ms = 20000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (err_text_.find(needle) == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      pollfd p{err_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      ssize_t n = read(err_, buf, sizeof buf);
      if (n <= 0) return false;
      err_text_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  // Sends `sig` and returns: SIGSTOP and SIGCONT pause and resume the process.
  void signal(int sig) { kill(pid_, sig); }

  // Sends `sig`, waits for the exit; returns the exit status.
  int stop(int sig = SIGINT) {
    kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    char buf[4096];
    ssize_t n;
    while ((n = read(err_, buf, sizeof buf)) > 0) err_text_.append(buf, static_cast<size_t>(n));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  std::string out() const {
    std::ifstream f(out_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  const std::string& err() const { return err_text_; }

 private:
  pid_t pid_ = -1;
  int err_ = -1;
  std::string out_path_;
  std::string err_text_;
};

}  // namespace tierlab::test
