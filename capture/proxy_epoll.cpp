// The capture proxy's epoll event loop: recv/send on non-blocking sockets,
// one epoll per thread. The default event loop (see capture/proxy_loop.h).
#include "capture/proxy_loop.h"

#include "common/error.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tierlab::capture::detail {
namespace {

using trace::EndReason;
using trace::Nanos;

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

struct Loop final : EventLoop {
  Loop(Shared& px, RecordSink& sink) : px(px), sink(sink) {
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
  RecordSink& sink;
  int ep = -1;
  int tcp_fd = -1;
  std::vector<std::unique_ptr<Session>> pool;
  Session* free_list = nullptr;
  Session* live = nullptr;
  std::vector<Session*> closed;

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

  void run() override {
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
    const char* why = "";
    switch (startup_step(s->dec, s->cfd, b.data, b.head, b.tail, px.limits.max_startup, &why)) {
      case StartupStep::NeedMore:
        if (b.tail == b.cap) protocol_error(s, "startup packet larger than the buffer");  // max_startup < cap
        return;
      case StartupStep::Connect: connect_upstream(s); return;
      case StartupStep::ProtocolError: protocol_error(s, why); return;
      case StartupStep::ClientGone: close_session(s, EndReason::ClientAbort); return;
    }
  }

  void connect_upstream(Session* s) {
    const Addr& a = px.upstream;
    int fd = upstream_socket(a);
    if (fd < 0) {
      upstream_refused(s, errno);
      return;
    }
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
    size_t n = proxy_error(s->dec, buf, sizeof buf, sqlstate, message);
    if (n == 0) return;
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

}  // namespace

std::unique_ptr<EventLoop> make_epoll_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  auto loop = std::make_unique<Loop>(px, sink);
  loop->tcp_fd = tcp_fd;
  if (tcp_fd >= 0) loop->add(tcp_fd, EPOLLIN, kTcpTag);
  if (px.unix_fd >= 0) loop->add(px.unix_fd, EPOLLIN | EPOLLEXCLUSIVE, kUnixTag);
  loop->add(px.stop_fd, EPOLLIN, kStopTag);
  return loop;
}

}  // namespace tierlab::capture::detail
