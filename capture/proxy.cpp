#include "capture/proxy.h"

#include "capture/queue_impl.h"
#include "capture/wire.h"
#include "common/error.h"
#include "trace/writer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

namespace tierlab::capture {
namespace {

using trace::EndReason;
using trace::Nanos;

inline Nanos now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<Nanos>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

struct Addr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string text;
  bool is_unix = false;
  int port = 0;
};

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 5 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Addr resolve(const std::string& flag, const std::string& value, bool passive) {
  std::string host, port;
  if (!value.empty() && value[0] == '[') {
    auto close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':')
      throw InputError(flag + " " + value + ": expected [HOST]:PORT");
    host = value.substr(1, close - 1);
    port = value.substr(close + 2);
  } else {
    auto colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw InputError(flag + " " + value + ": expected HOST:PORT");
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
  }
  if (!all_digits(port) || std::stoi(port) > 65535 || (!passive && std::stoi(port) == 0))
    throw InputError(flag + " " + value + ": bad port '" + port + "'");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) throw InputError(flag + " " + value + ": " + gai_strerror(rc));
  Addr a;
  std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  a.text = value;
  a.port = std::stoi(port);
  return a;
}

Addr unix_addr(const std::string& flag, const std::string& dir, int port) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError(flag + " " + dir + ": not a directory");
  Addr a;
  a.is_unix = true;
  a.port = port;
  a.text = dir + "/.s.PGSQL." + std::to_string(port);
  auto* un = reinterpret_cast<sockaddr_un*>(&a.ss);
  if (a.text.size() >= sizeof un->sun_path)
    throw InputError(flag + " " + dir + ": socket path too long");
  un->sun_family = AF_UNIX;
  std::memcpy(un->sun_path, a.text.c_str(), a.text.size() + 1);
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + a.text.size() + 1);
  return a;
}

Addr parse_upstream(const std::string& value) {
  if (value.empty()) throw InputError("--upstream: missing (HOST:PORT or SOCKET_DIR[:PORT])");
  if (value[0] == '/') {
    std::string dir = value;
    int port = 5432;
    auto colon = value.rfind(':');
    if (colon != std::string::npos && value.find('/', colon) == std::string::npos) {
      std::string p = value.substr(colon + 1);
      if (!all_digits(p) || std::stoi(p) == 0 || std::stoi(p) > 65535)
        throw InputError("--upstream " + value + ": bad port '" + p + "'");
      port = std::stoi(p);
      dir = value.substr(0, colon);
    }
    return unix_addr("--upstream", dir, port);
  }
  return resolve("--upstream", value, false);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string format_peer(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
    return std::string("[") + host + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// epoll tags below this are not sessions.
constexpr uint64_t kStopTag = 1;
constexpr uint64_t kTcpTag = 2;
constexpr uint64_t kUnixTag = 3;
constexpr uint64_t kUpstreamBit = 1;

struct Buf {
  uint8_t* data = nullptr;
  uint32_t head = 0;
  uint32_t tail = 0;
  uint32_t cap = 0;
  bool pending() const { return head < tail; }
  bool full() const { return tail == cap && head == 0; }
};

enum class State : uint8_t { Free, Startup, Connecting, Forward, Closed };

struct LoopStats {
  uint64_t connections = 0, sessions = 0, statements = 0, transactions = 0, errors = 0;
  uint64_t to_server = 0, to_client = 0, protocol_errors = 0, upstream_failures = 0;
};

struct Loop;

struct Session {
  Session(RecordSink& sink, const WireLimits& limits, uint32_t buf_bytes)
      : dec(sink, limits), mem(new uint8_t[2 * static_cast<size_t>(buf_bytes)]) {
    c2u.data = mem.get();
    c2u.cap = buf_bytes;
    u2c.data = mem.get() + buf_bytes;
    u2c.cap = buf_bytes;
  }
  SessionDecoder dec;
  std::unique_ptr<uint8_t[]> mem;
  Buf c2u, u2c;
  int cfd = -1, ufd = -1;
  uint32_t cev = 0, uev = 0;  // events registered with epoll
  State state = State::Free;
  uint64_t id = 0;
  Session* prev = nullptr;  // live list
  Session* next = nullptr;  // live list or free list
  char addr[64] = {};
};

// What every event loop reads.
struct Shared {
  ProxyOptions opts;
  WireLimits limits;
  Addr upstream;
  int unix_fd = -1;
  std::atomic<uint64_t> next_id{1};
};

struct Loop {
  Loop(Shared& px, int index, RecordSink& sink) : px(px), index(index), sink(sink) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) throw RuntimeError(errno_message("epoll_create1", errno));
    closed.reserve(kMaxEvents * 2);
    for (int i = 0; i < 16; ++i) grow();
  }
  ~Loop() {
    if (tcp_fd >= 0) ::close(tcp_fd);
    if (ep >= 0) ::close(ep);
  }

  static constexpr int kMaxEvents = 256;

  Shared& px;
  int index;
  RecordSink& sink;
  int ep = -1;
  int tcp_fd = -1;
  std::vector<std::unique_ptr<Session>> pool;
  Session* free_list = nullptr;
  Session* live = nullptr;
  std::vector<Session*> closed;
  LoopStats stats;
  std::thread thread;

  void grow() {
    pool.push_back(std::make_unique<Session>(sink, px.limits, static_cast<uint32_t>(px.opts.buffer_bytes)));
    Session* s = pool.back().get();
    s->next = free_list;
    free_list = s;
  }

  void add(int fd, uint32_t events, uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
      throw RuntimeError(errno_message("epoll_ctl", errno));
  }

  static uint64_t tag(Session* s, bool upstream) {
    return reinterpret_cast<uint64_t>(s) | (upstream ? kUpstreamBit : 0);
  }

  void set_events(Session* s, bool upstream, uint32_t want) {
    int fd = upstream ? s->ufd : s->cfd;
    uint32_t& cur = upstream ? s->uev : s->cev;
    if (fd < 0 || cur == want) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = tag(s, upstream);
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    cur = want;
  }

  // Makes both fds' registered events match the session's buffers.
  void update(Session* s) {
    uint32_t c = 0, u = 0;
    switch (s->state) {
      case State::Startup:
        c = EPOLLIN;
        break;
      case State::Connecting:
        u = EPOLLOUT;
        break;
      case State::Forward:
        c = (s->c2u.full() ? 0u : uint32_t{EPOLLIN}) | (s->u2c.pending() ? uint32_t{EPOLLOUT} : 0u);
        u = (s->u2c.full() ? 0u : uint32_t{EPOLLIN}) | (s->c2u.pending() ? uint32_t{EPOLLOUT} : 0u);
        break;
      default:
        return;
    }
    set_events(s, false, c);
    set_events(s, true, u);
  }

  void run() {
    epoll_event evs[kMaxEvents];
    bool stopping = false;
    while (!stopping) {
      int n = epoll_wait(ep, evs, kMaxEvents, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "tierlab: capture proxy: epoll_wait: %s\n", std::strerror(errno));
        break;
      }
      for (int i = 0; i < n; ++i) {
        uint64_t t = evs[i].data.u64;
        uint32_t e = evs[i].events;
        if (t == kStopTag) {
          stopping = true;
        } else if (t == kTcpTag) {
          accept_all(tcp_fd, false);
        } else if (t == kUnixTag) {
          accept_all(px.unix_fd, true);
        } else {
          Session* s = reinterpret_cast<Session*>(t & ~kUpstreamBit);
          if (s->state == State::Closed || s->state == State::Free) continue;  // closed in this batch
          if (t & kUpstreamBit) on_upstream(s, e);
          else on_client(s, e);
        }
      }
      recycle();
    }
    // Take what already arrived (a Terminate, a last reply) before ending
    // the sessions still open.
    int n = epoll_wait(ep, evs, kMaxEvents, 0);
    for (int i = 0; i < n; ++i) {
      uint64_t t = evs[i].data.u64;
      if (t <= kUnixTag) continue;
      Session* s = reinterpret_cast<Session*>(t & ~kUpstreamBit);
      if (s->state == State::Closed || s->state == State::Free) continue;
      if (t & kUpstreamBit) on_upstream(s, evs[i].events);
      else on_client(s, evs[i].events);
    }
    recycle();
    while (live) close_session(live, EndReason::CaptureEnd);
    recycle();
  }

  void recycle() {
    for (Session* s : closed) {
      s->state = State::Free;
      s->next = free_list;
      free_list = s;
    }
    closed.clear();
  }

  void accept_all(int lfd, bool is_unix) {
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int fd = accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          std::fprintf(stderr, "tierlab: capture proxy: accept: %s\n", std::strerror(errno));
        return;
      }
      if (!free_list) grow();
      Session* s = free_list;
      free_list = s->next;
      s->prev = nullptr;
      s->next = live;
      if (live) live->prev = s;
      live = s;
      s->cfd = fd;
      s->ufd = -1;
      s->cev = s->uev = 0;
      s->c2u.head = s->c2u.tail = s->u2c.head = s->u2c.tail = 0;
      s->id = px.next_id.fetch_add(1, std::memory_order_relaxed);
      uint32_t flags = 0;
      if (is_unix) {
        flags |= trace::kSessionUnixSocket;
        std::snprintf(s->addr, sizeof s->addr, "unix");
      } else {
        set_nodelay(fd);
        std::string peer = format_peer(ss);
        std::snprintf(s->addr, sizeof s->addr, "%s", peer.c_str());
      }
      s->state = State::Startup;
      s->dec.begin(s->id, s->addr, flags, now_ns());
      ++stats.connections;
      add(fd, EPOLLIN, tag(s, false));
      s->cev = EPOLLIN;
    }
  }

  void on_client(Session* s, uint32_t e) {
    switch (s->state) {
      case State::Startup:
        startup_read(s);
        return;
      case State::Connecting:
        if (e & (EPOLLHUP | EPOLLERR)) close_session(s, EndReason::ClientAbort);
        return;
      case State::Forward:
        if ((e & EPOLLOUT) && !write_out(s, Direction::Backend)) return;
        if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) pump(s, Direction::Frontend);
        return;
      default:
        return;
    }
  }

  void on_upstream(Session* s, uint32_t e) {
    switch (s->state) {
      case State::Connecting: {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(s->ufd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err) upstream_refused(s, err);
        else connected(s);
        return;
      }
      case State::Forward:
        if ((e & EPOLLOUT) && !write_out(s, Direction::Frontend)) return;
        if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) pump(s, Direction::Backend);
        return;
      default:
        return;
    }
  }

  // Reads startup packets until a StartupMessage or CancelRequest; answers
  // SSLRequest and GSSENCRequest with 'N' itself.
  void startup_read(Session* s) {
    Buf& b = s->c2u;
    ssize_t n = ::recv(s->cfd, b.data + b.tail, b.cap - b.tail, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      close_session(s, EndReason::ClientAbort);
      return;
    }
    b.tail += static_cast<uint32_t>(n);
    stats.to_server += static_cast<uint64_t>(n);
    for (;;) {
      StartupPacket sp = classify_startup(b.data + b.head, b.tail - b.head, px.limits.max_startup);
      switch (sp.kind) {
        case StartupKind::Incomplete:
          if (b.tail == b.cap) {  // cannot happen while max_startup < cap; be safe
            protocol_error(s, "startup packet larger than the buffer");
          }
          return;
        case StartupKind::SslRequest:
        case StartupKind::GssEncRequest: {
          Nanos ts = now_ns();
          if (!s->dec.feed(Direction::Frontend, b.data + b.head, sp.length, ts)) {
            protocol_error(s, s->dec.error());
            return;
          }
          b.head += sp.length;
          static const uint8_t no = 'N';
          if (::send(s->cfd, &no, 1, MSG_NOSIGNAL) != 1) {
            close_session(s, EndReason::ClientAbort);
            return;
          }
          s->dec.feed(Direction::Backend, &no, 1, ts);
          if (b.head == b.tail) b.head = b.tail = 0;
          continue;
        }
        case StartupKind::Invalid:
        case StartupKind::Startup:
        case StartupKind::Cancel: {
          if (!s->dec.feed(Direction::Frontend, b.data + b.head, b.tail - b.head, now_ns())) {
            protocol_error(s, s->dec.error());
            return;
          }
          if (sp.kind == StartupKind::Invalid) {
            protocol_error(s, "invalid startup packet");
            return;
          }
          connect_upstream(s);
          return;
        }
      }
    }
  }

  void connect_upstream(Session* s) {
    const Addr& a = px.upstream;
    int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      upstream_refused(s, errno);
      return;
    }
    if (!a.is_unix) set_nodelay(fd);
    s->ufd = fd;
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len);
    if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN) {
      upstream_refused(s, errno);
      return;
    }
    add(fd, EPOLLOUT, tag(s, true));
    s->uev = EPOLLOUT;
    s->state = State::Connecting;
    update(s);
  }

  void connected(Session* s) {
    s->state = State::Forward;
    if (!write_out(s, Direction::Frontend)) return;
    update(s);
  }

  // Sends what the buffer of direction d holds to its destination.
  // Returns false if the session was closed.
  bool write_out(Session* s, Direction d) {
    const bool to_server = d == Direction::Frontend;
    Buf& b = to_server ? s->c2u : s->u2c;
    int fd = to_server ? s->ufd : s->cfd;
    while (b.head < b.tail) {
      ssize_t w = ::send(fd, b.data + b.head, b.tail - b.head, MSG_NOSIGNAL);
      if (w > 0) {
        b.head += static_cast<uint32_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // The destination is gone.
      if (to_server) upstream_gone(s);
      else close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
      return false;
    }
    if (b.head == b.tail) {
      b.head = b.tail = 0;
    } else if (b.tail == b.cap && b.head > 0) {
      std::memmove(b.data, b.data + b.head, b.tail - b.head);
      b.tail -= b.head;
      b.head = 0;
    }
    update(s);
    return true;
  }

  // Reads what the source of direction d has, records it, forwards it.
  void pump(Session* s, Direction d) {
    const bool from_client = d == Direction::Frontend;
    Buf& b = from_client ? s->c2u : s->u2c;
    int fd = from_client ? s->cfd : s->ufd;
    if (b.tail == b.cap) {
      if (b.head == 0) {
        update(s);
        return;
      }
      std::memmove(b.data, b.data + b.head, b.tail - b.head);
      b.tail -= b.head;
      b.head = 0;
    }
    ssize_t n = ::recv(fd, b.data + b.tail, b.cap - b.tail, 0);
    if (n > 0) {
      if (!s->dec.feed(d, b.data + b.tail, static_cast<size_t>(n), now_ns())) {
        protocol_error(s, s->dec.error(), from_client);
        return;
      }
      const bool was_pending = b.pending();
      b.tail += static_cast<uint32_t>(n);
      (from_client ? stats.to_server : stats.to_client) += static_cast<uint64_t>(n);
      if (!was_pending) write_out(s, d);  // otherwise EPOLLOUT is armed
      else update(s);
      return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (from_client) {
      // Let a Terminate already read reach the server, then close both.
      if (s->c2u.pending())
        (void)::send(s->ufd, b.data + b.head, b.tail - b.head, MSG_NOSIGNAL);
      close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
    } else {
      upstream_gone(s);
    }
  }

  // The upstream closed or failed: pass on what it sent, tell the client
  // (when its stream is at a message boundary), close.
  void upstream_gone(Session* s) {
    if (s->dec.terminated() || s->dec.cancel_request()) {
      close_session(s, EndReason::Clean);
      return;
    }
    Buf& b = s->u2c;
    while (b.head < b.tail) {
      ssize_t w = ::send(s->cfd, b.data + b.head, b.tail - b.head, MSG_NOSIGNAL);
      if (w <= 0) break;
      b.head += static_cast<uint32_t>(w);
    }
    if (b.head == b.tail && s->dec.at_boundary(Direction::Backend) && !s->dec.fatal_seen())
      send_error(s, "08006", "tierlab capture proxy: the upstream server closed the connection");
    close_session(s, EndReason::ServerClosed);
  }

  void upstream_refused(Session* s, int err) {
    ++stats.upstream_failures;
    if (!s->dec.cancel_request()) {
      char msg[300];
      std::snprintf(msg, sizeof msg, "tierlab capture proxy: could not connect to upstream server %s: %s",
                    px.upstream.text.c_str(), std::strerror(err));
      std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): %s\n",
                   static_cast<unsigned long long>(s->id), s->addr, msg + 23);
      send_error(s, "08001", msg);
    }
    close_session(s, EndReason::ServerClosed);
  }

  // Sends a FATAL ErrorResponse to the client and records it as the server's.
  void send_error(Session* s, const char* sqlstate, const char* message) {
    uint8_t buf[512];
    size_t n = make_error_response(buf, sizeof buf, "FATAL", sqlstate, message);
    if (n == 0) return;
    s->dec.feed(Direction::Backend, buf, n, now_ns());
    (void)::send(s->cfd, buf, n, MSG_NOSIGNAL);
  }

  // Closes a session whose stream broke the protocol. When the client sent
  // the bad message and the server's stream is at a message boundary, the
  // client is told why (FATAL 08P01) before the connection closes.
  void protocol_error(Session* s, const char* why, bool client_fault = false) {
    ++stats.protocol_errors;
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s) closed: %s\n",
                 static_cast<unsigned long long>(s->id), s->addr, why);
    if (client_fault && s->state == State::Forward && !s->u2c.pending() &&
        s->dec.at_boundary(Direction::Backend) && !s->dec.fatal_seen()) {
      char msg[300];
      std::snprintf(msg, sizeof msg, "tierlab capture proxy: %s", why);
      send_error(s, "08P01", msg);
    }
    close_session(s, EndReason::ProtocolError);
  }

  void close_session(Session* s, EndReason reason) {
    s->dec.end(reason, now_ns());
    if (s->dec.started()) ++stats.sessions;
    const SessionStats& st = s->dec.stats();
    stats.statements += st.statements;
    stats.transactions += st.transactions;
    stats.errors += st.errors;
    if (s->cfd >= 0) ::close(s->cfd);
    if (s->ufd >= 0) ::close(s->ufd);
    s->cfd = s->ufd = -1;
    s->state = State::Closed;
    if (s->prev) s->prev->next = s->next;
    else live = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = nullptr;
    closed.push_back(s);
  }
};

int listen_socket(const Addr& a, bool reuseport, const std::string& flag) {
  int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RuntimeError(errno_message("socket", errno));
  int one = 1;
  if (!a.is_unix) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(flag + " " + a.text + ": " + std::strerror(err));
  }
  if (::listen(fd, 4096) != 0) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(errno_message("listen " + a.text, err));
  }
  return fd;
}

std::string realtime_iso() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  tm g;
  gmtime_r(&t.tv_sec, &g);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", g.tm_year + 1900,
                g.tm_mon + 1, g.tm_mday, g.tm_hour, g.tm_min, g.tm_sec, t.tv_nsec / 1'000'000);
  return buf;
}

}  // namespace

struct Proxy::Impl : Shared {
  ~Impl() {
    for (int fd : tcp_fds)
      if (fd >= 0) ::close(fd);
    if (unix_fd >= 0) {
      ::close(unix_fd);
      ::unlink(unix_listen.text.c_str());
    }
    if (stop_fd >= 0) ::close(stop_fd);
  }
  std::vector<int> tcp_fds;  // until each loop takes its own
  int threads = 1;
  Addr listen_addr;
  bool has_tcp = false;
  Addr unix_listen;
  int stop_fd = -1;
  std::unique_ptr<detail::Recorder> recorder;
  std::vector<std::unique_ptr<Loop>> loops;
  bool started = false, stopped = false;
  Nanos t0 = 0, t1 = 0;
};

Proxy::Proxy(const ProxyOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& px = *impl_;
  px.opts = opts;
  px.limits.max_message = opts.max_message;
  if (opts.max_message < 1024) throw InputError("--max-message-size: at least 1kB");
  px.threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (px.threads > 256) throw InputError("--threads: at most 256");
  if (opts.out.empty()) throw InputError("--out: missing");
  if (opts.listen.empty() && opts.listen_unix.empty())
    throw InputError("--listen: give a TCP address, --listen-unix or both");
  if (opts.buffer_bytes < 16384 || opts.buffer_bytes > (1u << 30))
    throw InputError("forwarding buffer size out of range");
  px.upstream = parse_upstream(opts.upstream);
  // Two descriptors per session: allow as many as the hard limit does.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (!opts.listen.empty()) {
    px.listen_addr = resolve("--listen", opts.listen, true);
    px.has_tcp = true;
  }

  // Listeners first: a bad address must not leave an empty trace behind.
  if (px.has_tcp) {
    for (int i = 0; i < px.threads; ++i) {
      px.tcp_fds.push_back(listen_socket(px.listen_addr, true, "--listen"));
      if (px.listen_addr.port == 0) {
        // Port 0: every thread's socket shares the port the first one got.
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        getsockname(px.tcp_fds.back(), reinterpret_cast<sockaddr*>(&ss), &len);
        int port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        px.listen_addr.port = port;
        if (px.listen_addr.ss.ss_family == AF_INET6)
          reinterpret_cast<sockaddr_in6*>(&px.listen_addr.ss)->sin6_port = htons(static_cast<uint16_t>(port));
        else
          reinterpret_cast<sockaddr_in*>(&px.listen_addr.ss)->sin_port = htons(static_cast<uint16_t>(port));
        auto colon = px.listen_addr.text.rfind(':');
        px.listen_addr.text = px.listen_addr.text.substr(0, colon + 1) + std::to_string(port);
      }
    }
  }
  if (!opts.listen_unix.empty()) {
    px.unix_listen = unix_addr("--listen-unix", opts.listen_unix, px.has_tcp ? px.listen_addr.port : 5432);
    ::unlink(px.unix_listen.text.c_str());
    px.unix_fd = listen_socket(px.unix_listen, false, "--listen-unix");
    ::chmod(px.unix_listen.text.c_str(), 0777);
  }
  px.stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (px.stop_fd < 0) throw RuntimeError(errno_message("eventfd", errno));

  px.recorder = std::make_unique<detail::Recorder>(trace::open_writer(opts.out), px.threads,
                                                   opts.queue_bytes, opts.drop_on_overflow);
  for (int i = 0; i < px.threads; ++i) {
    px.loops.push_back(std::make_unique<Loop>(px, i, px.recorder->producer(static_cast<size_t>(i))));
    Loop& loop = *px.loops.back();
    if (px.has_tcp) {
      loop.tcp_fd = px.tcp_fds[static_cast<size_t>(i)];
      px.tcp_fds[static_cast<size_t>(i)] = -1;  // the loop owns it now
      loop.add(loop.tcp_fd, EPOLLIN, kTcpTag);
    }
    if (px.unix_fd >= 0) loop.add(px.unix_fd, EPOLLIN | EPOLLEXCLUSIVE, kUnixTag);
  }
  for (auto& loop : px.loops) loop->add(px.stop_fd, EPOLLIN, kStopTag);

  px.recorder->meta("capture", "proxy");
  if (px.has_tcp) px.recorder->meta("listen", px.listen_addr.text);
  if (px.unix_fd >= 0) px.recorder->meta("listen_unix", px.unix_listen.text);
  px.recorder->meta("upstream", px.upstream.text);
  px.recorder->meta("start_time", realtime_iso());
  px.recorder->meta("threads", std::to_string(px.threads));
}

Proxy::~Proxy() {
  try {
    stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlab: capture proxy: %s\n", e.what());
  }
}

std::string Proxy::listening() const {
  const Impl& px = *impl_;
  std::string s;
  if (px.has_tcp) s = px.listen_addr.text;
  if (px.unix_fd >= 0) s += (s.empty() ? "" : " and ") + px.unix_listen.text;
  return s;
}

int Proxy::port() const { return impl_->has_tcp ? impl_->listen_addr.port : 0; }

void Proxy::start() {
  Impl& px = *impl_;
  if (px.started) return;
  px.started = true;
  px.t0 = now_ns();
  px.recorder->start();
  for (auto& loop : px.loops) {
    Loop* l = loop.get();
    l->thread = std::thread([l] { l->run(); });
  }
}

void Proxy::stop() {
  Impl& px = *impl_;
  if (px.stopped) return;
  px.stopped = true;
  uint64_t one = 1;
  if (px.stop_fd >= 0) (void)::write(px.stop_fd, &one, sizeof one);
  for (auto& loop : px.loops)
    if (loop->thread.joinable()) loop->thread.join();
  px.t1 = now_ns();
  px.recorder->stop();
}

bool Proxy::failed() const { return impl_->recorder->failed(); }

ProxySummary Proxy::summary() const {
  const Impl& px = *impl_;
  ProxySummary s;
  for (const auto& l : px.loops) {
    s.connections += l->stats.connections;
    s.sessions += l->stats.sessions;
    s.statements += l->stats.statements;
    s.transactions += l->stats.transactions;
    s.errors += l->stats.errors;
    s.bytes_to_server += l->stats.to_server;
    s.bytes_to_client += l->stats.to_client;
    s.protocol_errors += l->stats.protocol_errors;
    s.upstream_failures += l->stats.upstream_failures;
  }
  auto rs = px.recorder->stats();
  s.records = rs.records_written;
  s.dropped = rs.dropped;
  s.queue_waits = rs.waits;
  s.duration_ns = (px.t1 ? px.t1 : now_ns()) - px.t0;
  return s;
}

}  // namespace tierlab::capture
