#include "capture/local_clients.h"

#include "capture/run.h"
#include "common/error.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tierlab::capture {
namespace {

// A hexadecimal number of 1 to 8 digits.
bool hex(std::string_view s, uint32_t& out) {
  if (s.empty() || s.size() > 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  out = v;
  return true;
}

// "0100007F:1538" (v4) or 32 hex digits and a port (v6).
bool endpoint(std::string_view s, bool v6, std::array<uint32_t, 4>& addr, uint16_t& port) {
  auto colon = s.find(':');
  const size_t words = v6 ? 4 : 1;
  if (colon != words * 8 || s.size() != colon + 5) return false;
  addr = {};
  for (size_t i = 0; i < words; ++i)
    if (!hex(s.substr(i * 8, 8), addr[i])) return false;
  uint32_t p = 0;
  if (!hex(s.substr(colon + 1), p)) return false;
  port = static_cast<uint16_t>(p);
  return true;
}

// The next space-separated field of `s` from `pos`.
std::string_view field(std::string_view s, size_t& pos) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
  size_t b = pos;
  while (pos < s.size() && s[pos] != ' ' && s[pos] != '\n') ++pos;
  return s.substr(b, pos - b);
}

// The word the kernel prints for a 32-bit value stored in network order.
uint32_t printed(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

bool parse_proc_net_tcp(std::string_view line, bool v6, TcpSocketLine& out) {
  // "  0: 0100007F:8CA1 0100007F:1538 01 00000000:00000000 00:00000000 00000000   108        0 4719431 ..."
  size_t pos = 0;
  std::string_view sl = field(line, pos);
  if (sl.empty() || sl.back() != ':') return false;
  TcpSocketLine s;
  s.v6 = v6;
  if (!endpoint(field(line, pos), v6, s.local, s.local_port)) return false;
  if (!endpoint(field(line, pos), v6, s.remote, s.remote_port)) return false;
  std::string_view st = field(line, pos);
  if (st.size() != 2) return false;
  s.state = static_cast<int>(std::strtol(std::string(st).c_str(), nullptr, 16));
  for (int i = 0; i < 5; ++i) field(line, pos);  // tx:rx queue, timer, retransmits, uid, timeout
  std::string_view ino = field(line, pos);
  if (ino.empty() || !std::all_of(ino.begin(), ino.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  s.inode = std::strtoull(std::string(ino).c_str(), nullptr, 10);
  out = s;
  return true;
}

LocalClients::LocalClients(const std::string& host, uint16_t port) : port_(port) {
  if (host.empty()) return;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0)
    throw InputError(host + ": " + gai_strerror(rc));
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      v4_.push_back(printed(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr));
    } else if (a->ai_family == AF_INET6) {
      const auto* b = reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr.s6_addr;
      v6_.push_back({printed(b), printed(b + 4), printed(b + 8), printed(b + 12)});
    }
  }
  freeaddrinfo(res);
}

bool LocalClients::matches(const TcpSocketLine& s) const {
  if (s.state != 1 || s.remote_port != port_) return false;
  if (v4_.empty() && v6_.empty()) return true;
  if (!s.v6) return std::find(v4_.begin(), v4_.end(), s.remote[0]) != v4_.end();
  if (std::find(v6_.begin(), v6_.end(), s.remote) != v6_.end()) return true;
  // An IPv4 address mapped into IPv6 (::ffff:a.b.c.d).
  static const unsigned char mapped[4] = {0, 0, 0xff, 0xff};
  return s.remote[0] == 0 && s.remote[1] == 0 && s.remote[2] == printed(mapped) &&
         std::find(v4_.begin(), v4_.end(), s.remote[3]) != v4_.end();
}

int64_t LocalClients::cpu_ns(const std::unordered_set<int32_t>& exclude) {
  // The client ends of connections to the endpoint now.
  std::vector<uint64_t> unknown;
  for (bool v6 : {false, true}) {
    FILE* f = std::fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
    if (!f) continue;
    char buf[512];
    TcpSocketLine s;
    while (std::fgets(buf, sizeof buf, f))
      if (parse_proc_net_tcp(buf, v6, s) && s.inode != 0 && matches(s) && !inode_pid_.count(s.inode))
        unknown.push_back(s.inode);
    std::fclose(f);
  }
  if (!unknown.empty()) {
    // Which processes hold them: one pass over every process's descriptors.
    std::sort(unknown.begin(), unknown.end());
    const int32_t self = static_cast<int32_t>(::getpid());
    if (DIR* d = opendir("/proc")) {
      char path[320], link[64];
      while (dirent* e = readdir(d)) {
        char* end = nullptr;
        long pid = std::strtol(e->d_name, &end, 10);
        if (!end || *end || pid <= 0 || pid == self || exclude.count(static_cast<int32_t>(pid))) continue;
        std::snprintf(path, sizeof path, "/proc/%ld/fd", pid);
        DIR* fds = opendir(path);
        if (!fds) continue;
        while (dirent* fe = readdir(fds)) {
          if (fe->d_name[0] == '.') continue;
          std::snprintf(path, sizeof path, "/proc/%ld/fd/%s", pid, fe->d_name);
          ssize_t n = ::readlink(path, link, sizeof link - 1);
          if (n <= 8 || std::strncmp(link, "socket:[", 8) != 0) continue;
          link[n] = 0;
          uint64_t ino = std::strtoull(link + 8, nullptr, 10);
          if (!std::binary_search(unknown.begin(), unknown.end(), ino)) continue;
          inode_pid_[ino] = static_cast<int32_t>(pid);
          auto [it, fresh] = clients_.try_emplace(static_cast<int32_t>(pid));
          if (fresh && !process_cpu_ns(static_cast<int32_t>(pid), it->second.first_ns)) it->second.gone = true;
          it->second.last_ns = it->second.first_ns;
        }
        closedir(fds);
      }
      closedir(d);
    }
    // Sockets no process here holds (this process's own, an excluded one's,
    // or closed since): not looked for again.
    for (uint64_t ino : unknown) inode_pid_.try_emplace(ino, 0);
    if (inode_pid_.size() > (1u << 16)) inode_pid_.clear();
  }
  int64_t total = 0;
  for (auto& [pid, c] : clients_) {
    int64_t now = 0;
    if (!c.gone && process_cpu_ns(pid, now) && now >= c.last_ns)
      c.last_ns = now;
    else
      c.gone = true;  // its last reading stays (a pid reused later is not this client)
    total += c.last_ns - c.first_ns;
  }
  return total;
}

}  // namespace tierlab::capture
