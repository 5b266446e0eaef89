// The capture proxy's session policy, written once over common/loop.h (its
// io_uring and epoll backends): accept, startup, connect upstream, forward
// and record, back-pressure, errors and draining.
//
// Each received buffer is fed to the session's decoder, then queued on the
// other connection straight from that buffer; the loop releases it once
// sent. A direction with ProxyOptions::buffer_bytes or more queued stops receiving
// from its source until the queue drains below it, so a slow reader pushes
// back on the writer through TCP, and no session can take all the buffers.
//
// Flow 0 is client to server (source: the client connection), flow 1
// server to client.
#include "capture/proxy_loop.h"

#include "common/error.h"
#include "common/loop.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tierlab::capture::detail {
namespace {

using trace::EndReason;

constexpr int kMaxEvents = 256;
constexpr uint32_t kNoConn = UINT32_MAX;
constexpr uint64_t kTagTcp = 1, kTagUnix = 2, kTagStop = 3;

enum class State : uint8_t { Free, Startup, Connecting, Forward, Draining };

struct Session {
  Session(RecordSink& sink, const WireLimits& limits, uint32_t aux_bytes)
      : dec(sink, limits), aux(new uint8_t[aux_bytes]), aux_cap(aux_bytes) {}
  SessionDecoder dec;
  // Startup packets are collected here, then sent upstream from here.
  std::unique_ptr<uint8_t[]> aux;
  uint32_t aux_cap;
  uint32_t aux_head = 0, aux_len = 0;
  uint32_t conn[2] = {kNoConn, kNoConn};  // client, upstream
  bool paused[2] = {false, false};        // flow f's source stopped by back-pressure
  State state = State::Free;
  int8_t drain = -1;  // Draining: the flow whose end closes the session
  uint64_t id = 0;
  uint32_t index = 0;
  Session* prev = nullptr;  // live list
  Session* next = nullptr;  // live list or free list
  char addr[64] = {};
};

Direction dir_of(int f) { return f == 0 ? Direction::Frontend : Direction::Backend; }

class ProxyLoop final : public EventLoop {
 public:
  ProxyLoop(Shared& px, int tcp_fd, RecordSink& sink, bool uring)
      : px_(px), sink_(sink), tcp_fd_(tcp_fd),
        aux_bytes_(std::max<uint32_t>(16 * 1024, px.limits.max_startup + 1024)) {
    try {
      loop_ = make_loop(uring, LoopOptions{});
    } catch (const RuntimeError& e) {
      if (tcp_fd_ >= 0) ::close(tcp_fd_);
      throw RuntimeError(std::string("capture proxy: ") + e.what());
    }
    if (tcp_fd_ >= 0) loop_->listen(tcp_fd_, kTagTcp, false);
    if (px_.unix_fd >= 0) loop_->listen(px_.unix_fd, kTagUnix, true);
    loop_->watch(px_.stop_fd, kTagStop);
    high_water_ = static_cast<uint32_t>(px.opts.buffer_bytes);
    for (int i = 0; i < 16; ++i) grow();
  }

  ~ProxyLoop() override {
    loop_.reset();
    if (tcp_fd_ >= 0) ::close(tcp_fd_);
  }

  void run() override {
    LoopEvent evs[kMaxEvents];
    while (!stopping_) {
      int n = loop_->wait(evs, kMaxEvents, -1);
      if (n < 0) {
        std::fprintf(stderr, "tierlab: capture proxy: %s loop: %s\n", loop_->backend(), std::strerror(-n));
        break;
      }
      for (int i = 0; i < n; ++i) handle(evs[i]);
    }
    // Take what already arrived (a Terminate, a last reply) before ending
    // the sessions still open.
    for (int round = 0; round < 2; ++round) {
      int n = loop_->wait(evs, kMaxEvents, 0);
      for (int i = 0; i < n; ++i) handle(evs[i]);
    }
    while (live_) close_session(live_, EndReason::CaptureEnd);
    // Wait (briefly) for the cancelled operations, so descriptors close
    // after the kernel is done with them.
    loop_->finish(1'000'000'000);
  }

 private:
  Shared& px_;
  RecordSink& sink_;
  int tcp_fd_;
  const uint32_t aux_bytes_;
  uint32_t high_water_;  // queued bytes that stop a direction's source
  std::unique_ptr<Loop> loop_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Session>> pool_;
  Session* free_ = nullptr;
  Session* live_ = nullptr;

  void grow() {
    pool_.push_back(std::make_unique<Session>(sink_, px_.limits, aux_bytes_));
    Session* s = pool_.back().get();
    s->index = static_cast<uint32_t>(pool_.size() - 1);
    s->next = free_;
    free_ = s;
  }

  // A connection's user word: its session's index << 1 | flow, plus one.
  void own(Session* s, int f) { loop_->user(s->conn[f]) = (uint64_t{s->index} << 1 | static_cast<uint64_t>(f)) + 1; }

  void handle(const LoopEvent& ev) {
    switch (ev.kind) {
      case LoopEv::Wake:
        stopping_ = true;
        return;
      case LoopEv::Accept:
        on_accept(ev.res, ev.tag == kTagUnix);
        return;
      default:
        break;
    }
    const uint64_t u = loop_->user(ev.conn);
    if (u == 0) {  // closed earlier in this round
      if (ev.buf >= 0) loop_->release(ev.buf);
      return;
    }
    Session* s = pool_[(u - 1) >> 1].get();
    const int f = static_cast<int>((u - 1) & 1);
    switch (ev.kind) {
      case LoopEv::Data: on_data(s, f, ev.buf, ev.data, ev.len); return;
      case LoopEv::Eof: source_gone(s, f); return;
      case LoopEv::Sent: on_sent(s, 1 - f); return;      // conn f is flow (1 - f)'s destination
      case LoopEv::SendError: dest_gone(s, 1 - f); return;
      case LoopEv::Connected: on_connect(s, ev.res); return;
      default: return;
    }
  }

  bool idle(Session* s, int f) const { return s->conn[1 - f] == kNoConn || loop_->queued(s->conn[1 - f]) == 0; }

  void on_accept(int fd, bool is_unix) {
    if (fd < 0) {
      std::fprintf(stderr, "tierlab: capture proxy: accept: %s\n", std::strerror(-fd));
      return;
    }
    if (stopping_) {
      ::close(fd);
      return;
    }
    if (!free_) grow();
    Session* s = free_;
    free_ = s->next;
    s->prev = nullptr;
    s->next = live_;
    if (live_) live_->prev = s;
    live_ = s;
    s->conn[0] = loop_->open(fd);
    s->conn[1] = kNoConn;
    own(s, 0);
    s->paused[0] = s->paused[1] = false;
    s->drain = -1;
    s->aux_head = s->aux_len = 0;
    s->id = px_.next_id.fetch_add(1, std::memory_order_relaxed);
    uint32_t session_flags = 0;
    if (is_unix) {
      session_flags |= trace::kSessionUnixSocket;
      std::snprintf(s->addr, sizeof s->addr, "unix");
    } else {
      set_nodelay(fd);
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      std::string peer = format_peer(ss);
      std::snprintf(s->addr, sizeof s->addr, "%s", peer.c_str());
    }
    s->state = State::Startup;
    s->dec.begin(s->id, s->addr, session_flags, now_ns());
    ++stats.connections;
    loop_->recv(s->conn[0], true);
  }

  // Bytes from flow f's source, in the loop's buffer `buf`.
  void on_data(Session* s, int f, int32_t buf, const uint8_t* p, uint32_t n) {
    if (s->state == State::Draining) {
      loop_->release(buf);
      return;
    }
    if (s->state == State::Startup) {
      startup_data(s, p, n);
      loop_->release(buf);
      return;
    }
    if (!s->dec.feed(dir_of(f), p, n, now_ns())) {
      loop_->release(buf);
      protocol_error(s, s->dec.error(), f == 0);
      return;
    }
    (f == 0 ? stats.to_server : stats.to_client) += n;
    const uint32_t dest = s->conn[1 - f];
    loop_->send(dest, buf, n);
    if (!s->paused[f] && loop_->queued(dest) >= high_water_) {
      // Back-pressure: stop reading this source until the queue drains.
      s->paused[f] = true;
      loop_->recv(s->conn[f], false);
    }
  }

  // Some of flow f's queue went out.
  void on_sent(Session* s, int f) {
    if (s->state == State::Draining) {
      if (s->drain == f && idle(s, f)) drained(s);
      return;
    }
    if (s->paused[f] && loop_->queued(s->conn[1 - f]) < high_water_) {
      s->paused[f] = false;
      loop_->recv(s->conn[f], true);
    }
  }

  void on_connect(Session* s, int res) {
    if (s->state != State::Connecting) return;
    if (res < 0) {
      upstream_refused(s, -res);
      return;
    }
    s->state = State::Forward;
    loop_->recv(s->conn[1], true);
  }

  // Startup packets, until a StartupMessage or CancelRequest; SSLRequest and
  // GSSENCRequest are answered 'N' by the proxy itself.
  void startup_data(Session* s, const uint8_t* p, uint32_t n) {
    stats.to_server += n;
    if (n > s->aux_cap - s->aux_len) {
      protocol_error(s, "startup packet larger than the buffer");
      return;
    }
    std::memcpy(s->aux.get() + s->aux_len, p, n);
    s->aux_len += n;
    const char* why = "";
    switch (startup_step(s->dec, loop_->fd(s->conn[0]), s->aux.get(), s->aux_head, s->aux_len,
                         px_.limits.max_startup, &why)) {
      case StartupStep::NeedMore: return;
      case StartupStep::Connect: connect_upstream(s); return;
      case StartupStep::ProtocolError: protocol_error(s, why); return;
      case StartupStep::ClientGone: close_session(s, EndReason::ClientAbort); return;
    }
  }

  void connect_upstream(Session* s) {
    const Addr& a = px_.upstream;
    int fd = upstream_socket(a);
    if (fd < 0) {
      upstream_refused(s, errno);
      return;
    }
    s->conn[1] = loop_->open(fd);
    own(s, 1);
    s->state = State::Connecting;
    loop_->connect(s->conn[1], reinterpret_cast<const sockaddr*>(&a.ss), a.len);
    // The startup bytes go first, once connected; what the client sends
    // meanwhile queues behind them.
    loop_->send_ext(s->conn[1], s->aux.get() + s->aux_head, s->aux_len - s->aux_head);
  }

  // Flow f's source closed or failed.
  void source_gone(Session* s, int f) {
    if (f == 1) {
      upstream_gone(s);
      return;
    }
    if (s->state == State::Draining) return;
    if (s->state != State::Forward) {
      close_session(s, EndReason::ClientAbort);
      return;
    }
    // Let what the client sent last (a Terminate) reach the server first.
    if (idle(s, 0)) {
      close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
      return;
    }
    s->state = State::Draining;
    s->drain = 0;
  }

  // Sending on flow f failed: its destination is gone.
  void dest_gone(Session* s, int f) {
    if (s->state == State::Draining) {
      close_session(s, s->drain == 1 ? EndReason::ServerClosed
                       : s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
      return;
    }
    if (f == 0) upstream_gone(s);
    else close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
  }

  // The upstream closed or failed: pass on what it sent, tell the client
  // (when its stream is at a message boundary), close.
  void upstream_gone(Session* s) {
    if (s->state == State::Draining) return;
    if (s->dec.terminated() || s->dec.cancel_request()) {
      close_session(s, EndReason::Clean);
      return;
    }
    s->drain = 1;
    if (!idle(s, 1)) {
      s->state = State::Draining;
      return;
    }
    drained(s);
  }

  // The flow a draining session waited for is empty: end the session.
  void drained(Session* s) {
    if (s->drain == 1) {
      if (s->dec.at_boundary(Direction::Backend) && !s->dec.fatal_seen())
        send_error(s, "08006", "tierlab capture proxy: the upstream server closed the connection");
      close_session(s, EndReason::ServerClosed);
    } else {
      close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
    }
  }

  void upstream_refused(Session* s, int err) {
    ++stats.upstream_failures;
    if (!s->dec.cancel_request()) {
      char msg[300];
      std::snprintf(msg, sizeof msg, "tierlab capture proxy: could not connect to upstream server %s: %s",
                    px_.upstream.text.c_str(), std::strerror(err));
      std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): %s\n",
                   static_cast<unsigned long long>(s->id), s->addr, msg + 23);
      send_error(s, "08001", msg);
    }
    close_session(s, EndReason::ServerClosed);
  }

  // Sends a FATAL ErrorResponse to the client (nothing else is queued to
  // it) and records it in the session.
  void send_error(Session* s, const char* sqlstate, const char* message) {
    assert(idle(s, 1));
    uint8_t b[512];
    size_t n = proxy_error(s->dec, b, sizeof b, sqlstate, message);
    if (n == 0) return;
    (void)::send(loop_->fd(s->conn[0]), b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Closes a session whose stream broke the protocol. When the client sent
  // the bad message and the server's stream is at a message boundary, the
  // client is told why (FATAL 08P01) before the connection closes.
  void protocol_error(Session* s, const char* why, bool client_fault = false) {
    ++stats.protocol_errors;
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s) closed: %s\n",
                 static_cast<unsigned long long>(s->id), s->addr, why);
    if (client_fault && s->state == State::Forward && idle(s, 1) && s->dec.at_boundary(Direction::Backend) &&
        !s->dec.fatal_seen()) {
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
    for (uint32_t& c : s->conn)
      if (c != kNoConn) {
        loop_->close(c);
        c = kNoConn;
      }
    s->state = State::Free;
    if (s->prev) s->prev->next = s->next;
    else live_ = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = nullptr;
    s->next = free_;
    free_ = s;
  }
};

}  // namespace

std::string uring_unsupported() { return loop_uring_missing(); }

std::unique_ptr<EventLoop> make_uring_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  return std::make_unique<ProxyLoop>(px, tcp_fd, sink, true);
}

std::unique_ptr<EventLoop> make_epoll_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  return std::make_unique<ProxyLoop>(px, tcp_fd, sink, false);
}

}  // namespace tierlab::capture::detail
