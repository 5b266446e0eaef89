// The capture proxy's session policy (capture/proxy_session.h): the event
// loop, forwarding and recording, back-pressure, errors, draining and
// closing. Startup and TLS negotiation are in capture/proxy_startup.cpp.
#include "capture/proxy_session.h"

#include "common/error.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tierlab::capture::detail {

ProxyLoop::ProxyLoop(Shared& px, int tcp_fd, RecordSink& sink, bool uring)
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

ProxyLoop::~ProxyLoop() {
  loop_.reset();
  if (tcp_fd_ >= 0) ::close(tcp_fd_);
}

void ProxyLoop::run() {
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

void ProxyLoop::grow() {
  pool_.push_back(std::make_unique<Session>(sink_, px_.limits, aux_bytes_));
  Session* s = pool_.back().get();
  s->index = static_cast<uint32_t>(pool_.size() - 1);
  s->next = free_;
  free_ = s;
}

void ProxyLoop::handle(const LoopEvent& ev) {
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

uint32_t ProxyLoop::backlog(Session* s, int c) {
  if (s->conn[c] == kNoConn) return 0;
  return s->copy ? outq(s, c).pending() : loop_->queued(s->conn[c]);
}

void ProxyLoop::flush(Session* s, int c) {
  uint32_t len = 0;
  if (const uint8_t* p = outq(s, c).take(&len)) loop_->send_ext(s->conn[c], p, len);
}

bool ProxyLoop::put(Session* s, int c, const uint8_t* p, uint32_t n) {
  if (s->tls[c].active()) {
    if (!s->tls[c].encrypt(p, n)) return false;
  } else {
    s->q[c].append(p, n);
  }
  flush(s, c);
  return true;
}

void ProxyLoop::pressure(Session* s, int f) {
  if (!s->paused[f] && backlog(s, 1 - f) >= high_water_) {
    s->paused[f] = true;
    loop_->recv(s->conn[f], false);
  }
}

void ProxyLoop::on_accept(int fd, bool is_unix) {
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

void ProxyLoop::on_data(Session* s, int f, int32_t buf, const uint8_t* p, uint32_t n) {
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

void ProxyLoop::tls_data(Session* s, int f, const uint8_t* p, uint32_t n) {
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

bool ProxyLoop::plain(Session* s, int f, const uint8_t* p, uint32_t n) {
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

void ProxyLoop::on_sent(Session* s, int f) {
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

void ProxyLoop::source_gone(Session* s, int f) {
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

void ProxyLoop::dest_gone(Session* s, int f) {
  if (s->state == State::Draining) {
    close_session(s, s->drain == 1 ? EndReason::ServerClosed
                     : s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
    return;
  }
  if (f == 0) upstream_gone(s);
  else close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
}

void ProxyLoop::upstream_gone(Session* s) {
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

void ProxyLoop::drained(Session* s) {
  if (s->drain == 1) {
    if (s->dec.at_boundary(Direction::Backend) && !s->dec.fatal_seen())
      send_error(s, "08006", "tierlab capture proxy: the upstream server closed the connection");
    close_session(s, EndReason::ServerClosed);
  } else {
    close_session(s, s->dec.terminated() ? EndReason::Clean : EndReason::ClientAbort);
  }
}

void ProxyLoop::upstream_refused(Session* s, int err) {
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

void ProxyLoop::tls_failed(Session* s, int c) {
  if (c == 1 && s->state == State::Connecting) {
    upstream_tls_refused(s, s->tls[1].error());
    return;
  }
  ++stats.protocol_errors;
  std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s) closed: %s %s\n",
               static_cast<unsigned long long>(s->id), s->addr, c == 0 ? "client" : "upstream", s->tls[c].error());
  close_session(s, c == 0 ? EndReason::ClientAbort : EndReason::ServerClosed);
}

void ProxyLoop::send_error(Session* s, const char* sqlstate, const char* message) {
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

void ProxyLoop::protocol_error(Session* s, const char* why, bool client_fault) {
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

void ProxyLoop::close_session(Session* s, EndReason reason) {
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

std::string uring_unsupported() { return loop_uring_missing(); }

std::unique_ptr<EventLoop> make_uring_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  return std::make_unique<ProxyLoop>(px, tcp_fd, sink, true);
}

std::unique_ptr<EventLoop> make_epoll_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  return std::make_unique<ProxyLoop>(px, tcp_fd, sink, false);
}

}  // namespace tierlab::capture::detail
