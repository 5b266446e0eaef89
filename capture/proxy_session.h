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
//
// This header is private to the proxy: ProxyLoop's declaration, shared by
// capture/proxy_session.cpp (the event loop, forwarding, back-pressure,
// errors and closing) and capture/proxy_startup.cpp (startup packets, the
// connection upstream, TLS negotiation on either side, SCRAM-SHA-256-PLUS).
#pragma once

#include "capture/proxy_loop.h"

#include "common/loop.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace tierlab::capture::detail {

using trace::EndReason;

inline constexpr int kMaxEvents = 256;
inline constexpr uint32_t kNoConn = UINT32_MAX;
inline constexpr uint64_t kTagTcp = 1, kTagUnix = 2, kTagStop = 3;

enum class State : uint8_t { Free, Startup, Connecting, Forward, Draining };

// The upstream's TLS negotiation, while Connecting.
enum class Up : uint8_t {
  None,       // no negotiation (plaintext, or done)
  SslAnswer,  // SSLRequest sent: waiting for 'S' or 'N'
  Handshake,  // 'S': the TLS handshake is under way
};

inline constexpr uint32_t kScratch = 32 * 1024;

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

inline Direction dir_of(int f) { return f == 0 ? Direction::Frontend : Direction::Backend; }

class ProxyLoop final : public EventLoop {
 public:
  ProxyLoop(Shared& px, int tcp_fd, RecordSink& sink, bool uring);

  ~ProxyLoop() override;
  void run() override;

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

  void grow();

  // A connection's user word: its session's index << 1 | flow, plus one.
  void own(Session* s, int f) { loop_->user(s->conn[f]) = (uint64_t{s->index} << 1 | static_cast<uint64_t>(f)) + 1; }

  void handle(const LoopEvent& ev);

  // --- sends ------------------------------------------------------------------

  // Where connection c's outgoing bytes wait in a copying session.
  SendQueue& outq(Session* s, int c) { return s->tls[c].active() ? s->tls[c].queue() : s->q[c]; }

  // Bytes waiting to go out on connection c.
  uint32_t backlog(Session* s, int c);

  // Hands connection c's next piece to the loop, unless one is in flight.
  void flush(Session* s, int c);

  // Plaintext for connection c (encrypted when c has TLS). False when its
  // TLS failed (the caller closes the session).
  bool put(Session* s, int c, const uint8_t* p, uint32_t n);

  bool idle(Session* s, int f) { return backlog(s, 1 - f) == 0; }

  // Back-pressure: stop reading flow f's source while its destination's
  // backlog is at the high-water mark.
  void pressure(Session* s, int f);

  // --- events -----------------------------------------------------------------

  void on_accept(int fd, bool is_unix);

  // Bytes from flow f's source, in the loop's buffer `buf`.
  void on_data(Session* s, int f, int32_t buf, const uint8_t* p, uint32_t n);

  // Ciphertext from connection f (or the upstream's answer to SSLRequest).
  void tls_data(Session* s, int f, const uint8_t* p, uint32_t n);

  // Plaintext from flow f's source in a copying session. False when the
  // session was closed.
  bool plain(Session* s, int f, const uint8_t* p, uint32_t n);

  // Some of flow f's queue went out.
  void on_sent(Session* s, int f);

  // --- startup and the upstream's TLS (capture/proxy_startup.cpp) -----------

  void on_connect(Session* s, int res);

  // Startup packets, until a StartupMessage or CancelRequest; SSLRequest is
  // answered 'S' (TLS with the client) or 'N', GSSENCRequest 'N'. False
  // when the session was closed.
  bool startup_data(Session* s, const uint8_t* p, uint32_t n);

  // Sends the client the answer to its SSLRequest/GSSENCRequest; 'S' starts
  // the proxy's TLS with it.
  bool answer_client(Session* s, char answer);

  // --client-tls require: a StartupMessage outside TLS.
  void refuse_plaintext(Session* s);

  void connect_upstream(Session* s);

  // The startup bytes (and what the client sent since) go first, once
  // connected; in a plain session what the client sends meanwhile queues
  // behind them.
  void send_startup(Session* s);

  // sslmode allow: the server refused the plaintext attempt; connect again
  // with TLS.
  void retry_with_tls(Session* s);

  // The upstream's one-byte answer to the proxy's SSLRequest.
  void upstream_ssl_answer(Session* s, const uint8_t* p, uint32_t n);

  // The upstream's TLS handshake ended: the startup goes through it. False
  // when the session was closed.
  bool upstream_ready(Session* s);

  // The TLS version and cipher of each side, once the proxy has both
  // connections: one Meta record "session.ID.tls" (Meta records carry no
  // session of their own), "client=VERSION/CIPHER server=VERSION/CIPHER",
  // "none" for a side without TLS.
  void write_tls_meta(Session* s);

  // The upstream's messages while it authenticates the client (its TLS
  // side only: a server offers SCRAM-SHA-256-PLUS only over TLS). Whole
  // messages are passed on; SCRAM-SHA-256-PLUS is taken out of an
  // AuthenticationSASL, and the server's refusal of channel binding is
  // replaced by the proxy's error saying why. After AuthenticationOk (or any
  // other message) the rest passes through as it comes.
  bool auth_data(Session* s, const uint8_t* p, uint32_t n);

  // An AuthenticationSASL (m, whole bytes) without SCRAM-SHA-256-PLUS.
  bool forward_sasl(Session* s, const uint8_t* m, uint32_t whole);

  // Copies the AuthenticationSASL m (whole bytes) to out without
  // SCRAM-SHA-256-PLUS; returns the new length.
  uint32_t strip_plus(Session* s, const uint8_t* m, uint32_t whole, uint8_t* out);

  // Flow f's source closed or failed.
  void source_gone(Session* s, int f);

  // Sending on flow f failed: its destination is gone.
  void dest_gone(Session* s, int f);

  // The upstream closed or failed: pass on what it sent, tell the client
  // (when its stream is at a message boundary), close.
  void upstream_gone(Session* s);

  // The flow a draining session waited for is empty: end the session.
  void drained(Session* s);

  void upstream_refused(Session* s, int err);

  // The upstream's TLS could not be set up as --upstream-sslmode asks: one
  // line on stderr, the client told why.
  void upstream_tls_refused(Session* s, const char* why);

  // TLS on connection c failed (the handshake, a broken record, a refused
  // certificate).
  void tls_failed(Session* s, int c);

  // Sends a FATAL ErrorResponse to the client (nothing else is queued to
  // it) and records it in the session.
  void send_error(Session* s, const char* sqlstate, const char* message);

  // Closes a session whose stream broke the protocol. When the client sent
  // the bad message and the server's stream is at a message boundary, the
  // client is told why (FATAL 08P01) before the connection closes.
  void protocol_error(Session* s, const char* why, bool client_fault = false);

  void close_session(Session* s, EndReason reason);
};

}  // namespace tierlab::capture::detail
