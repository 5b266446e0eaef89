// The clients of a capture that run on the server's machine (pgbench beside
// the server, an application on the same host): found by the client end of
// their TCP connections to the address the capture watches, and the CPU
// time they use, which competes with the server's for the same cores.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tierlab::capture {

// One socket line of /proc/net/tcp or /proc/net/tcp6.
struct TcpSocketLine {
  // The addresses as the kernel prints them: 32-bit words in the order and
  // byte order of the socket address (an IPv4 address in word 0).
  std::array<uint32_t, 4> local{}, remote{};
  bool v6 = false;
  uint16_t local_port = 0, remote_port = 0;
  int state = 0;  // 1: established
  uint64_t inode = 0;
};

// Parses one line of /proc/net/tcp (v6 false) or /proc/net/tcp6. False for
// the header line or a line it cannot read.
bool parse_proc_net_tcp(std::string_view line, bool v6, TcpSocketLine& out);

class LocalClients {
 public:
  // `host`: the address the clients connect to (a name or a numeric
  // address; "" matches any address), `port` its TCP port. Throws
  // InputError naming `host` if it does not resolve.
  LocalClients(const std::string& host, uint16_t port);

  // Finds the processes holding established connections to the endpoint
  // (`exclude`: pids that are not clients, e.g. the server's; this process
  // never counts) and returns the CPU time (user + system, ns) the clients
  // used since each was first seen; a client that exited keeps what it
  // used. Reads /proc/net/tcp{,6} on each call and scans /proc/*/fd only
  // when a connection of a process not yet known appears.
  int64_t cpu_ns(const std::unordered_set<int32_t>& exclude);

  // Client processes found so far.
  size_t processes() const { return clients_.size(); }

  // True if the socket line is a client's end of a connection to the
  // endpoint (established, remote port and address).
  bool matches(const TcpSocketLine& s) const;

 private:
  struct Client {
    int64_t first_ns = 0, last_ns = 0;
    bool gone = false;
  };
  uint16_t port_;
  std::vector<std::array<uint32_t, 4>> v6_;  // resolved addresses, as printed
  std::vector<uint32_t> v4_;
  std::unordered_map<uint64_t, int32_t> inode_pid_;  // sockets already placed (pid 0: no client)
  std::unordered_map<int32_t, Client> clients_;
  std::string line_;
};

}  // namespace tierlab::capture
