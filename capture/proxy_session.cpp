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
// TLS (common/tls.h) on either connection makes the session a copying one:
// received ciphertext is decrypted into the loop's scratch buffer, fed to the
// decoder, and the plaintext encrypted for (or copied to) the other
// connection's SendQueue, which goes out with send_ext, one piece in flight;
// back-pressure counts the queue's bytes. Sessions without TLS forward the
// loop's buffers without a copy, as before.
//
// Flow 0 is client to server (source: the client connection), flow 1
// server to client; connection 0 is the client's, 1 the upstream's.
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
#include <string_view>
#include <vector>

namespace tierlab::capture::detail {
namespace {

using trace::EndReason;

constexpr int kMaxEvents = 256;
constexpr uint32_t kNoConn = UINT32_MAX;
constexpr uint64_t kTagTcp = 1, kTagUnix = 2, kTagStop = 3;

enum class State : uint8_t { Free, Startup, Connecting, Forward, Draining };

// The upstream's TLS negotiation, while Connecting.
enum class Up : uint8_t {
  None,       // no negotiation (plaintext, or done)
  SslAnswer,  // SSLRequest sent: waiting for 'S' or 'N'
  Handshake,  // 'S': the TLS handshake is under way
};

constexpr uint8_t kSslRequest[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
constexpr uint32_t kScratch = 32 * 1024;
constexpr const char* kPlus = "SCRAM-SHA-256-PLUS";

uint32_t rd32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}
void wr32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// An ErrorResponse (whole message at m, n bytes) whose message field speaks
// of SCRAM channel binding: the server's refusal of a client that supports
// channel binding but was not offered it (libpq's "y" flag) while the
// server's own connection is TLS.
bool channel_binding_refusal(const uint8_t* m, uint32_t n) {
  for (uint32_t i = 5; i < n;) {
    const uint8_t field = m[i++];
    if (field == 0) break;
    const char* v = reinterpret_cast<const char*>(m + i);
    const size_t len = strnlen(v, n - i);
    if (field == 'M' && std::string_view(v, len).find("channel binding") != std::string_view::npos) return true;
    i += static_cast<uint32_t>(len) + 1;
  }
  return false;
}

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
  // TLS per connection (active() when in use), and the plaintext waiting
  // for a connection without TLS in a copying session.
  TlsStage tls[2];
  SendQueue q[2];
  bool copy = false;         // TLS on some side: every send goes through q/tls with send_ext
  Up up = Up::None;
  bool allow_retry = false;  // sslmode allow: a refused plaintext attempt is retried with TLS
  bool retried = false;      // this is the retry
  // The upstream's authentication messages, reassembled (TLS upstream) so
  // that SCRAM-SHA-256-PLUS can be taken out of its offer.
  bool auth = false;
  std::vector<uint8_t> auth_buf;
  bool plus_dropped = false;
  uint64_t frontend_at_drop = 0;  // the client's messages when it was offered the list without -PLUS
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
  // Plaintext decrypted from a TLS connection, before it is fed and passed on.
  std::unique_ptr<uint8_t[]> scratch_{new uint8_t[kScratch]};

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

  // --- sends ------------------------------------------------------------------

  // Where connection c's outgoing bytes wait in a copying session.
  SendQueue& outq(Session* s, int c) { return s->tls[c].active() ? s->tls[c].queue() : s->q[c]; }

  // Bytes waiting to go out on connection c.
  uint32_t backlog(Session* s, int c) {
    if (s->conn[c] == kNoConn) return 0;
    return s->copy ? outq(s, c).pending() : loop_->queued(s->conn[c]);
  }

  // Hands connection c's next piece to the loop, unless one is in flight.
  void flush(Session* s, int c) {
    uint32_t len = 0;
    if (const uint8_t* p = outq(s, c).take(&len)) loop_->send_ext(s->conn[c], p, len);
  }

  // Plaintext for connection c (encrypted when c has TLS). False when its
  // TLS failed (the caller closes the session).
  bool put(Session* s, int c, const uint8_t* p, uint32_t n) {
    if (s->tls[c].active()) {
      if (!s->tls[c].encrypt(p, n)) return false;
    } else {
      s->q[c].append(p, n);
    }
    flush(s, c);
    return true;
  }

  bool idle(Session* s, int f) { return backlog(s, 1 - f) == 0; }

  // Back-pressure: stop reading flow f's source while its destination's
  // backlog is at the high-water mark.
  void pressure(Session* s, int f) {
    if (!s->paused[f] && backlog(s, 1 - f) >= high_water_) {
      s->paused[f] = true;
      loop_->recv(s->conn[f], false);
    }
  }

  // --- events -----------------------------------------------------------------

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
    s->copy = false;
    s->up = Up::None;
    s->allow_retry = s->retried = false;
    s->auth = s->plus_dropped = false;
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
    if (s->tls[f].active() || (f == 1 && s->up == Up::SslAnswer)) {
      tls_data(s, f, p, n);
      loop_->release(buf);
      return;
    }
    if (s->state == State::Startup) {
      startup_data(s, p, n);
      loop_->release(buf);
      return;
    }
    if (f == 1 && s->allow_retry) {
      // sslmode allow: the plaintext attempt's first answer. An
      // ErrorResponse (the server wants TLS) is not passed on: the proxy
      // tries again with TLS.
      s->allow_retry = false;
      if (p[0] == 'E') {
        loop_->release(buf);
        retry_with_tls(s);
        return;
      }
      if (s->tls[0].active()) write_tls_meta(s);
    }
    if (s->copy) {
      plain(s, f, p, n);
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
    pressure(s, f);
  }

  // Ciphertext from connection f (or the upstream's answer to SSLRequest).
  void tls_data(Session* s, int f, const uint8_t* p, uint32_t n) {
    if (f == 1 && s->up == Up::SslAnswer) {
      upstream_ssl_answer(s, p, n);
      return;
    }
    TlsStage& t = s->tls[f];
    const bool was = t.established();
    int64_t k = t.decrypt(p, n, scratch_.get(), kScratch);
    flush(s, f);  // handshake records, tickets, alerts
    if (k < 0) {
      tls_failed(s, f);
      return;
    }
    if (f == 1 && !was && t.established() && !upstream_ready(s)) return;
    while (k > 0) {
      if (!plain(s, f, scratch_.get(), static_cast<uint32_t>(k))) return;
      k = t.decrypt(nullptr, 0, scratch_.get(), kScratch);
      flush(s, f);
      if (k < 0) {
        tls_failed(s, f);
        return;
      }
    }
  }

  // Plaintext from flow f's source in a copying session. False when the
  // session was closed.
  bool plain(Session* s, int f, const uint8_t* p, uint32_t n) {
    if (s->state == State::Startup) return startup_data(s, p, n);
    if (!s->dec.feed(dir_of(f), p, n, now_ns())) {
      protocol_error(s, s->dec.error(), f == 0);
      return false;
    }
    (f == 0 ? stats.to_server : stats.to_client) += n;
    if (f == 0 && s->state == State::Connecting && s->up != Up::None) {
      // The upstream's TLS is not up yet: hold it behind the startup bytes.
      if (n > s->aux_cap - s->aux_len) {
        protocol_error(s, "client sent more than the proxy holds before the server's TLS is up");
        return false;
      }
      std::memcpy(s->aux.get() + s->aux_len, p, n);
      s->aux_len += n;
      return true;
    }
    if (f == 1 && s->auth) return auth_data(s, p, n);
    if (!put(s, 1 - f, p, n)) {
      tls_failed(s, 1 - f);
      return false;
    }
    pressure(s, f);
    return true;
  }

  // Some of flow f's queue went out.
  void on_sent(Session* s, int f) {
    const int c = 1 - f;  // the connection that sent
    if (s->copy && s->conn[c] != kNoConn) {
      outq(s, c).done(loop_->queued(s->conn[c]));
      flush(s, c);
    }
    if (s->state == State::Draining) {
      if (s->drain == f && idle(s, f)) drained(s);
      return;
    }
    if (s->paused[f] && backlog(s, c) < high_water_) {
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
    if (s->up == Up::None) s->state = State::Forward;
    loop_->recv(s->conn[1], true);
  }

  // Startup packets, until a StartupMessage or CancelRequest; SSLRequest is
  // answered 'S' (TLS with the client) or 'N', GSSENCRequest 'N'. False
  // when the session was closed.
  bool startup_data(Session* s, const uint8_t* p, uint32_t n) {
    stats.to_server += n;
    if (n > s->aux_cap - s->aux_len) {
      protocol_error(s, "startup packet larger than the buffer");
      return false;
    }
    std::memcpy(s->aux.get() + s->aux_len, p, n);
    s->aux_len += n;
    for (;;) {
      const char* why = "";
      char answer = 'N';
      const bool offer = px_.client_ctx && !s->tls[0].active();
      switch (startup_step(s->dec, s->aux.get(), s->aux_head, s->aux_len, px_.limits.max_startup, offer, &answer,
                           &why)) {
        case StartupStep::NeedMore: return true;
        case StartupStep::Answer:
          if (!answer_client(s, answer)) return false;
          continue;
        case StartupStep::Connect:
          if (px_.client_tls == Shared::ClientTls::Require && !s->tls[0].active() && !s->dec.cancel_request()) {
            refuse_plaintext(s);
            return false;
          }
          connect_upstream(s);
          return s->state != State::Free;
        case StartupStep::ProtocolError: protocol_error(s, why); return false;
      }
    }
  }

  // Sends the client the answer to its SSLRequest/GSSENCRequest; 'S' starts
  // the proxy's TLS with it.
  bool answer_client(Session* s, char answer) {
    if (s->tls[0].active()) {  // asked again inside TLS
      const uint8_t b = static_cast<uint8_t>(answer);
      if (!put(s, 0, &b, 1)) {
        tls_failed(s, 0);
        return false;
      }
      return true;
    }
    if (::send(loop_->fd(s->conn[0]), &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
      close_session(s, EndReason::ClientAbort);
      return false;
    }
    if (answer != 'S') return true;
    if (s->aux_len != 0) {
      // What follows the request must be the TLS handshake, not data the
      // proxy would take as having come through it.
      protocol_error(s, "data after SSLRequest before the TLS handshake");
      return false;
    }
    if (!s->tls[0].start(*px_.client_ctx)) {
      tls_failed(s, 0);
      return false;
    }
    s->copy = true;
    return true;
  }

  // --client-tls require: a StartupMessage outside TLS.
  void refuse_plaintext(Session* s) {
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): refused a client without TLS (--client-tls require)\n",
                 static_cast<unsigned long long>(s->id), s->addr);
    send_error(s, "28000",
               "tierlab capture proxy: this proxy requires TLS of its clients (--client-tls require): connect with "
               "sslmode=require");
    close_session(s, EndReason::ServerClosed);
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
    const SslMode m = px_.upstream_mode;
    // TLS is never asked for on a unix socket (as libpq), nor for a
    // CancelRequest (the server takes it in plaintext).
    const bool can = !a.is_unix && !s->dec.cancel_request() && px_.upstream_ctx;
    if (can && (s->retried || (m != SslMode::Disable && m != SslMode::Allow))) {
      s->copy = true;
      s->up = Up::SslAnswer;
      s->q[1].append(kSslRequest, sizeof kSslRequest);
      flush(s, 1);
      return;
    }
    s->allow_retry = can && m == SslMode::Allow && !s->retried;
    // The upstream stays in plaintext (unless sslmode allow retries).
    if (s->tls[0].active() && !s->allow_retry) write_tls_meta(s);
    send_startup(s);
  }

  // The startup bytes (and what the client sent since) go first, once
  // connected; in a plain session what the client sends meanwhile queues
  // behind them.
  void send_startup(Session* s) {
    if (s->copy) {
      s->q[1].append(s->aux.get() + s->aux_head, s->aux_len - s->aux_head);
      flush(s, 1);
    } else {
      loop_->send_ext(s->conn[1], s->aux.get() + s->aux_head, s->aux_len - s->aux_head);
    }
  }

  // sslmode allow: the server refused the plaintext attempt; connect again
  // with TLS.
  void retry_with_tls(Session* s) {
    loop_->close(s->conn[1]);
    s->conn[1] = kNoConn;
    s->q[1].clear();
    s->retried = true;
    connect_upstream(s);
  }

  // The upstream's one-byte answer to the proxy's SSLRequest.
  void upstream_ssl_answer(Session* s, const uint8_t* p, uint32_t n) {
    s->q[1].done(loop_->queued(s->conn[1]));
    const char c = static_cast<char>(p[0]);
    if (c == 'S' && n == 1) {
      if (s->q[1].pending() != 0) {
        upstream_tls_refused(s, "TLS: the SSLRequest was answered before it was sent");
        return;
      }
      if (!s->tls[1].start(*px_.upstream_ctx, px_.upstream.host)) {
        upstream_tls_refused(s, s->tls[1].error());
        return;
      }
      s->up = Up::Handshake;
      flush(s, 1);
      return;
    }
    if (c == 'S') {
      upstream_tls_refused(s, "TLS: the server sent data after accepting TLS, before the handshake");
      return;
    }
    if (c == 'N' && n == 1) {
      if (px_.upstream_mode != SslMode::Prefer && !s->retried) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "the server does not accept TLS (--upstream-sslmode %s)",
                      sslmode_name(px_.upstream_mode));
        upstream_tls_refused(s, msg);
        return;
      }
      if (s->retried) {
        upstream_tls_refused(s, "the server refused the plaintext attempt and does not accept TLS either");
        return;
      }
      // prefer: go on in plaintext.
      s->up = Up::None;
      if (!s->tls[0].active() && s->q[1].pending() == 0) s->copy = false;
      if (s->tls[0].active()) write_tls_meta(s);
      send_startup(s);
      s->state = State::Forward;
      return;
    }
    upstream_tls_refused(s, "the server answered the proxy's SSLRequest with an error");
  }

  // The upstream's TLS handshake ended: the startup goes through it. False
  // when the session was closed.
  bool upstream_ready(Session* s) {
    s->up = Up::None;
    s->state = State::Forward;
    write_tls_meta(s);
    s->auth = true;
    s->auth_buf.clear();
    if (!put(s, 1, s->aux.get() + s->aux_head, s->aux_len - s->aux_head)) {
      tls_failed(s, 1);
      return false;
    }
    return true;
  }

  // The TLS version and cipher of each side, once the proxy has both
  // connections: one Meta record "session.ID.tls" (Meta records carry no
  // session of their own), "client=VERSION/CIPHER server=VERSION/CIPHER",
  // "none" for a side without TLS.
  void write_tls_meta(Session* s) {
    char key[48], value[256], side[2][112];
    for (int c = 0; c < 2; ++c) {
      if (s->tls[c].active() && s->tls[c].established())
        std::snprintf(side[c], sizeof side[c], "%s/%s", s->tls[c].version(), s->tls[c].cipher());
      else
        std::snprintf(side[c], sizeof side[c], "none");
    }
    std::snprintf(key, sizeof key, "session.%llu.tls", static_cast<unsigned long long>(s->id));
    std::snprintf(value, sizeof value, "client=%s server=%s", side[0], side[1]);
    sink_.record(trace::Record{now_ns(), 0, trace::Meta{key, value}});
  }

  // The upstream's messages while it authenticates the client (its TLS
  // side only: a server offers SCRAM-SHA-256-PLUS only over TLS). Whole
  // messages are passed on; SCRAM-SHA-256-PLUS is taken out of an
  // AuthenticationSASL, and the server's refusal of channel binding is
  // replaced by the proxy's error saying why. After AuthenticationOk (or any
  // other message) the rest passes through as it comes.
  bool auth_data(Session* s, const uint8_t* p, uint32_t n) {
    std::vector<uint8_t>& b = s->auth_buf;
    b.insert(b.end(), p, p + n);
    size_t off = 0;
    while (s->auth && b.size() - off >= 5) {
      uint8_t* m = b.data() + off;
      const uint32_t len = rd32(m + 1);
      if (len < 4 || len > 16384) {  // not an authentication message: pass everything on
        s->auth = false;
        break;
      }
      if (b.size() - off < 1 + size_t{len}) break;
      const uint32_t whole = 1 + len;
      off += whole;
      if (m[0] == 'R' && len >= 8 && rd32(m + 5) == 10) {
        if (!forward_sasl(s, m, whole)) return false;
        continue;
      }
      if (m[0] == 'E' && channel_binding_refusal(m, whole)) {
        std::fprintf(stderr,
                     "tierlab: capture proxy: session %llu (%s): the server refused SCRAM: the client supports "
                     "channel binding, which cannot pass the proxy (it terminates TLS); connect to the proxy "
                     "with channel_binding=disable\n",
                     static_cast<unsigned long long>(s->id), s->addr);
        uint8_t e[512];
        size_t k = make_error_response(
            e, sizeof e, "FATAL", "08P01",
            "tierlab capture proxy: SCRAM channel binding cannot pass this proxy, which terminates TLS: connect "
            "to it with channel_binding=disable");
        s->auth = false;
        if (!put(s, 0, e, static_cast<uint32_t>(k))) {
          tls_failed(s, 0);
          return false;
        }
        continue;
      }
      if (!(m[0] == 'R' && len >= 8 && rd32(m + 5) != 0)) s->auth = false;  // AuthenticationOk, or not auth
      if (!put(s, 0, m, whole)) {
        tls_failed(s, 0);
        return false;
      }
    }
    if (!s->auth && off < b.size()) {
      if (!put(s, 0, b.data() + off, static_cast<uint32_t>(b.size() - off))) {
        tls_failed(s, 0);
        return false;
      }
      off = b.size();
    }
    b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(off));
    pressure(s, 1);
    return true;
  }

  // An AuthenticationSASL (m, whole bytes) without SCRAM-SHA-256-PLUS.
  bool forward_sasl(Session* s, const uint8_t* m, uint32_t whole) {
    uint8_t out[1024];
    const uint8_t* send = out;
    uint32_t len = 0;
    if (whole > sizeof out) {  // no list of known mechanisms is this long: pass it on as it is
      send = m;
      len = whole;
    } else {
      len = strip_plus(s, m, whole, out);
    }
    if (!put(s, 0, send, len)) {
      tls_failed(s, 0);
      return false;
    }
    return true;
  }

  // Copies the AuthenticationSASL m (whole bytes) to out without
  // SCRAM-SHA-256-PLUS; returns the new length.
  uint32_t strip_plus(Session* s, const uint8_t* m, uint32_t whole, uint8_t* out) {
    std::memcpy(out, m, 9);
    uint32_t o = 9;
    for (uint32_t i = 9; i < whole;) {
      const char* name = reinterpret_cast<const char*>(m + i);
      const size_t len = strnlen(name, whole - i);
      if (len == 0 || i + len >= whole) break;  // the list's end (or a name without its NUL)
      if (std::string_view(name, len) == kPlus) s->plus_dropped = true;
      else {
        std::memcpy(out + o, name, len + 1);
        o += static_cast<uint32_t>(len) + 1;
      }
      i += static_cast<uint32_t>(len) + 1;
    }
    out[o++] = 0;
    wr32(out + 1, o - 1);
    if (s->plus_dropped) s->frontend_at_drop = s->dec.stats().messages[0];
    return o;
  }

  // Flow f's source closed or failed.
  void source_gone(Session* s, int f) {
    if (f == 1) {
      upstream_gone(s);
      return;
    }
    if (s->state == State::Draining) return;
    if (s->plus_dropped && s->auth && s->dec.stats().messages[0] == s->frontend_at_drop)
      std::fprintf(stderr,
                   "tierlab: capture proxy: session %llu (%s): the client left when offered SCRAM-SHA-256 without "
                   "channel binding: the proxy terminates TLS, so SCRAM-SHA-256-PLUS cannot pass it (a client "
                   "with channel_binding=require refuses; connect to the proxy with channel_binding=disable)\n",
                   static_cast<unsigned long long>(s->id), s->addr);
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
    if (s->state == State::Connecting && s->up != Up::None) {
      upstream_tls_refused(s, s->up == Up::SslAnswer ? "the server closed the connection instead of answering "
                                                       "the proxy's SSLRequest"
                                                     : "the server closed the connection during the TLS handshake");
      return;
    }
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

  // The upstream's TLS could not be set up as --upstream-sslmode asks: one
  // line on stderr, the client told why.
  void upstream_tls_refused(Session* s, const char* why) {
    ++stats.upstream_failures;
    char msg[400];
    std::snprintf(msg, sizeof msg, "tierlab capture proxy: upstream server %s: %s", px_.upstream.text.c_str(), why);
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): %s\n", static_cast<unsigned long long>(s->id),
                 s->addr, msg + 23);
    if (idle(s, 1)) send_error(s, "08001", msg);
    close_session(s, EndReason::ServerClosed);
  }

  // TLS on connection c failed (the handshake, a broken record, a refused
  // certificate).
  void tls_failed(Session* s, int c) {
    if (c == 1 && s->state == State::Connecting) {
      upstream_tls_refused(s, s->tls[1].error());
      return;
    }
    ++stats.protocol_errors;
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s) closed: %s %s\n",
                 static_cast<unsigned long long>(s->id), s->addr, c == 0 ? "client" : "upstream", s->tls[c].error());
    close_session(s, c == 0 ? EndReason::ClientAbort : EndReason::ServerClosed);
  }

  // Sends a FATAL ErrorResponse to the client (nothing else is queued to
  // it) and records it in the session.
  void send_error(Session* s, const char* sqlstate, const char* message) {
    assert(idle(s, 1));
    uint8_t b[512];
    size_t n = proxy_error(s->dec, b, sizeof b, sqlstate, message);
    if (n == 0) return;
    const int fd = loop_->fd(s->conn[0]);
    TlsStage& t = s->tls[0];
    if (!t.active()) {
      (void)::send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      return;
    }
    // Through the client's TLS, when nothing else is on its way (the
    // session closes next, so the bytes go out here, not with the loop).
    if (!t.established() || t.queue().in_flight() || !t.encrypt(b, static_cast<uint32_t>(n))) return;
    uint32_t len = 0;
    if (const uint8_t* p = t.queue().take(&len)) (void)::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
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
    for (int c = 0; c < 2; ++c) {
      s->tls[c].reset();
      s->q[c].clear();
    }
    s->auth_buf.clear();
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
