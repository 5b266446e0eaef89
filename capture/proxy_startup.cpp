// The capture proxy session's startup (capture/proxy_session.h): startup
// packets and the answers to SSLRequest and GSSENCRequest, the connection
// upstream and its TLS negotiation (as --upstream-sslmode asks, with
// sslmode allow's retry), the TLS Meta record, and the upstream's
// authentication messages, from which SCRAM-SHA-256-PLUS is taken out
// (channel binding cannot pass a proxy that terminates TLS).
#include "capture/proxy_session.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace tierlab::capture::detail {
namespace {

constexpr uint8_t kSslRequest[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
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

}  // namespace

void ProxyLoop::on_connect(Session* s, int res) {
  if (s->state != State::Connecting) return;
  if (res < 0) {
    upstream_refused(s, -res);
    return;
  }
  if (s->up == Up::None) s->state = State::Forward;
  loop_->recv(s->conn[1], true);
}

bool ProxyLoop::startup_data(Session* s, const uint8_t* p, uint32_t n) {
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

bool ProxyLoop::answer_client(Session* s, char answer) {
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

void ProxyLoop::refuse_plaintext(Session* s) {
  std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): refused a client without TLS (TLS required of clients)\n",
               static_cast<unsigned long long>(s->id), s->addr);
  send_error(s, "28000",
             "tierlab capture proxy: this proxy requires TLS of its clients: connect with sslmode=require");
  close_session(s, EndReason::ServerClosed);
}

void ProxyLoop::connect_upstream(Session* s) {
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

void ProxyLoop::send_startup(Session* s) {
  if (s->copy) {
    s->q[1].append(s->aux.get() + s->aux_head, s->aux_len - s->aux_head);
    flush(s, 1);
  } else {
    loop_->send_ext(s->conn[1], s->aux.get() + s->aux_head, s->aux_len - s->aux_head);
  }
}

void ProxyLoop::retry_with_tls(Session* s) {
  loop_->close(s->conn[1]);
  s->conn[1] = kNoConn;
  s->q[1].clear();
  s->retried = true;
  connect_upstream(s);
}

void ProxyLoop::upstream_ssl_answer(Session* s, const uint8_t* p, uint32_t n) {
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
      std::snprintf(msg, sizeof msg, "the server does not accept TLS (upstream sslmode %s)",
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

bool ProxyLoop::upstream_ready(Session* s) {
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

void ProxyLoop::write_tls_meta(Session* s) {
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

bool ProxyLoop::auth_data(Session* s, const uint8_t* p, uint32_t n) {
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

bool ProxyLoop::forward_sasl(Session* s, const uint8_t* m, uint32_t whole) {
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

uint32_t ProxyLoop::strip_plus(Session* s, const uint8_t* m, uint32_t whole, uint8_t* out) {
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

void ProxyLoop::upstream_tls_refused(Session* s, const char* why) {
  ++stats.upstream_failures;
  char msg[400];
  std::snprintf(msg, sizeof msg, "tierlab capture proxy: upstream server %s: %s", px_.upstream.text.c_str(), why);
  std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s): %s\n", static_cast<unsigned long long>(s->id),
               s->addr, msg + 23);
  if (idle(s, 1)) send_error(s, "08001", msg);
  close_session(s, EndReason::ServerClosed);
}

}  // namespace tierlab::capture::detail
