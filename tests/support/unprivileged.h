// Runs a piece of code in a child process without the right to real-time
// priority (no root: uid and gid 65534; an RLIMIT_RTPRIO of 0), for tests of
// what a command says when it lacks that right.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <exception>
#include <string>

namespace tierlab::test {

// The message of what `f` throws in such a child; "" when it throws nothing.
template <class F>
std::string thrown_unprivileged(F f) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    rlimit none{0, 0};
    ::setrlimit(RLIMIT_RTPRIO, &none);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    std::string msg;
    try {
      f();
    } catch (const std::exception& e) {
      msg = e.what();
    }
    if (::write(p[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(4);
    ::_exit(0);
  }
  ::close(p[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return msg;
}

}  // namespace tierlab::test
