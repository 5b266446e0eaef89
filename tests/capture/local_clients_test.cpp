// Clients on the server's machine: /proc/net/tcp lines, and a real process
// holding a connection to a listener found, with its CPU time.
#include "capture/local_clients.h"

#include "common/error.h"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

using namespace tierlab;
using capture::LocalClients;
using capture::TcpSocketLine;

TEST_CASE("local clients: /proc/net/tcp lines are read, the header and bad lines are not", "[local_clients]") {
  TcpSocketLine s;
  CHECK_FALSE(capture::parse_proc_net_tcp(
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode", false, s));
  REQUIRE(capture::parse_proc_net_tcp(
      "   3: 0100007F:8CA1 0100007F:1538 01 00000000:00000000 00:00000000 00000000   108        0 4719431 1 "
      "0000000000000000 20 4 30 10 -1",
      false, s));
  CHECK(s.local_port == 0x8CA1);
  CHECK(s.remote_port == 5432);
  CHECK(s.state == 1);
  CHECK(s.inode == 4719431);
  in_addr lo{};
  ::inet_pton(AF_INET, "127.0.0.1", &lo);
  CHECK(s.remote[0] == lo.s_addr);
  CHECK_FALSE(capture::parse_proc_net_tcp("   3: 0100007F:8CA1 0100007G:1538 01", false, s));
  CHECK_FALSE(capture::parse_proc_net_tcp("   3: 0100007F:8CA1", false, s));
  REQUIRE(capture::parse_proc_net_tcp(
      "   0: 00000000000000000000000001000000:D2F0 0000000000000000FFFF00000100007F:1538 01 00000000:00000000 "
      "00:00000000 00000000   108        0 99 1 0000000000000000 20 4 0 10 -1",
      true, s));
  CHECK(s.inode == 99);
  CHECK(s.remote_port == 5432);
}

TEST_CASE("local clients: a connection matches by the endpoint's port and address", "[local_clients]") {
  TcpSocketLine s;
  REQUIRE(capture::parse_proc_net_tcp(
      "   3: 0100007F:8CA1 0100007F:1538 01 00000000:00000000 00:00000000 00000000   108        0 7 1", false, s));
  CHECK(LocalClients("127.0.0.1", 5432).matches(s));
  CHECK(LocalClients("", 5432).matches(s));
  CHECK_FALSE(LocalClients("127.0.0.2", 5432).matches(s));
  CHECK_FALSE(LocalClients("127.0.0.1", 5433).matches(s));
  TcpSocketLine listening = s;
  listening.state = 0x0A;
  CHECK_FALSE(LocalClients("127.0.0.1", 5432).matches(listening));
  // An IPv4 address mapped into IPv6 (a client on an AF_INET6 socket).
  REQUIRE(capture::parse_proc_net_tcp(
      "   0: 00000000000000000000000001000000:D2F0 0000000000000000FFFF00000100007F:1538 01 00000000:00000000 "
      "00:00000000 00000000   108        0 99 1",
      true, s));
  CHECK(LocalClients("127.0.0.1", 5432).matches(s));
  CHECK_THROWS_AS(LocalClients("no-such-host.invalid", 5432), InputError);
}

TEST_CASE("local clients: a process connected to the endpoint is found and its CPU time counted",
          "[local_clients]") {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const uint16_t port = ntohs(a.sin_port);

  // A client: connects, then spins on the CPU until killed.
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(1);
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  int conn = ::accept(lfd, nullptr, nullptr);
  REQUIRE(conn >= 0);

  LocalClients clients("127.0.0.1", port);
  clients.cpu_ns({});
  CHECK(clients.processes() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  int64_t used = clients.cpu_ns({});
  // The child spun for 0.4 s; on a busy machine it got less of a core, but
  // some (the clock ticks at 100 Hz).
  CHECK(used >= 20'000'000);
  CHECK(used <= 1'000'000'000);
  // An excluded process (the server's) and another port are not clients.
  LocalClients other("127.0.0.1", static_cast<uint16_t>(port + 1));
  other.cpu_ns({});
  CHECK(other.processes() == 0);
  LocalClients excluded("127.0.0.1", port);
  excluded.cpu_ns({child});
  CHECK(excluded.processes() == 0);
  // This process holds the server end only: not a client of its own port.
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // A client that exited keeps what it used.
  CHECK(clients.cpu_ns({}) >= used);
  ::close(conn);
  ::close(lfd);
}
