// The capture proxy: a transparent PostgreSQL wire-protocol proxy that
// forwards every byte of the protocol unchanged (TLS, when used, ends at
// the proxy on each side; the one message it edits is a TLS server's offer
// of SCRAM mechanisms, see below) and records each session into a trace.
//
// Clients connect to the proxy (TCP and/or a unix socket directory); for
// each client the proxy opens a connection to the upstream server. Bytes are
// forwarded as they arrive, and the same buffers are fed to a
// SessionDecoder (capture/wire.h) whose records go through a bounded queue
// to one writer thread that owns the trace::Writer.
//
// TLS: the proxy terminates it on each side (common/tls.h, over the same
// event loop). A client's SSLRequest is answered 'S' (ProxyOptions::
// client_tls, the certificate from tls_cert/tls_key or a self-signed one made
// at start) and the handshake done by the proxy; GSSENCRequest is answered
// 'N'. Towards the upstream the proxy asks for TLS as libpq's sslmode says
// (upstream_sslmode; never on a unix socket, nor for a CancelRequest). The
// decoder sees the decrypted protocol, and each session's TLS version and
// cipher per side are recorded in a Meta record "session.ID.tls" (value
// "client=TLSv1.3/TLS_AES_256_GCM_SHA384 server=none"). SCRAM's channel
// binding cannot pass a hop that terminates TLS: the proxy removes
// SCRAM-SHA-256-PLUS from the mechanisms the server offers, and answers the
// server's channel-binding refusal with its own error naming why.
// CancelRequest is forwarded upstream on the new connection opened for it. When the upstream cannot be reached or goes
// away, the client receives a FATAL ErrorResponse (SQLSTATE 08001 or 08006)
// when the server's stream is at a message boundary, then the connection is
// closed; other sessions carry on. A malformed or oversized message from
// either side closes that session with one line on stderr.
//
// Threads: `threads` event loops (common/loop.h: io_uring, or epoll; see
// capture/proxy_loop.h), each with its own listeners
// (SO_REUSEPORT for TCP; the unix socket is shared) and sessions. The
// default is one loop per two cores: the proxy usually shares the machine
// with the server or the clients, and one loop forwards for many sessions.
// Session objects, receive buffers and decoders are allocated up front or
// pooled per loop and reused, so steady-state forwarding and recording
// allocate nothing.
#pragma once

#include "trace/record.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::capture {

struct BufferBudget;  // capture/wire.h

struct ProxyOptions {
  std::string listen = "127.0.0.1:6432";  // HOST:PORT; port 0 picks one; "" = none
  std::string listen_unix;                // socket directory; "" = none
  std::string upstream;                   // HOST:PORT or SOCKET_DIR[:PORT]
  std::string out;                        // trace file
  int threads = 0;                        // event-loop threads; 0 = half the cores, at least 1
  bool drop_on_overflow = false;          // drop records instead of waiting
  // Event loop: "io_uring", "epoll", or "auto" (io_uring where the kernel
  // has what it needs, else epoll: see Proxy::Proxy in capture/proxy.cpp
  // for why); `capture proxy --io` (or TIERLAB_PROXY_IO, which the app
  // reads: the proxy tests run once more with it set to epoll,
  // tests/CMakeLists.txt).
  std::string io = "auto";
  uint32_t max_message = 1u << 30;        // largest message accepted
  // What the decoders of every connection may hold together for messages
  // they reassemble (capture/wire.h BufferBudget): a larger message is
  // forwarded but recorded as a stream gap and counted.
  uint64_t decoder_memory = 1ull << 30;
  size_t queue_bytes = 8u << 20;          // record queue per thread
  // Bytes queued per direction (received, not yet sent on) at which the
  // proxy stops reading that direction's source until they drain.
  size_t buffer_bytes = 64u << 10;
  // zstd level of the trace; 0: uncompressed. Level 1, where sniff uses -3:
  // the proxy's CPU goes to forwarding, and its level made no measurable
  // difference to it, while level 1 keeps pgbench traces a sixth smaller.
  int compression_level = 1;
  // TLS with clients: "disable" (SSLRequest answered 'N'), "allow" (the
  // client chooses) or "require" (a StartupMessage outside TLS is refused
  // with a FATAL ErrorResponse; CancelRequest is still taken).
  std::string client_tls = "allow";
  // The proxy's certificate (chain) and key, PEM; both "": a self-signed
  // certificate made at start (tls_fingerprint()).
  std::string tls_cert, tls_key;
  // TLS to the upstream, libpq's sslmode: disable, allow, prefer, require,
  // verify-ca, verify-full.
  std::string upstream_sslmode = "prefer";
  std::string upstream_sslrootcert;                 // CA certificates for verify-ca/verify-full
  std::string upstream_sslcert, upstream_sslkey;    // a client certificate, or ""
  // Meta records written at the start after the proxy's own (the server's
  // settings, read by the caller).
  std::vector<std::pair<std::string, std::string>> meta;
};

struct ProxySummary {
  uint64_t sessions = 0;      // sessions with a StartupMessage
  uint64_t connections = 0;   // accepted client connections
  uint64_t statements = 0;
  uint64_t transactions = 0;
  uint64_t errors = 0;
  uint64_t bytes_to_server = 0;
  uint64_t bytes_to_client = 0;
  uint64_t records = 0;       // records written to the trace
  uint64_t dropped = 0;       // records dropped (--on-overflow drop)
  uint64_t protocol_errors = 0;
  uint64_t upstream_failures = 0;
  uint64_t queue_waits = 0;   // times an event loop waited for the writer
  // Messages not recorded because the decoders' memory (decoder_memory)
  // was full, and their bytes.
  uint64_t decoder_refused = 0;
  uint64_t decoder_refused_bytes = 0;
  trace::Nanos duration_ns = 0;
  // When the trace could not be written (a full disk): the error, how long
  // after start() it happened, and the records not in the trace (those of
  // the chunk that failed and every one after). records counts those in it.
  std::string recording_error;
  trace::Nanos recording_stopped_ns = 0;
  uint64_t lost_records = 0;
};

class Proxy {
 public:
  // Checks the addresses (InputError naming the flag), binds the listeners
  // and creates the trace. Nothing runs until start().
  explicit Proxy(const ProxyOptions& opts);
  ~Proxy();  // stops if running
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // "127.0.0.1:6432" (the real port when 0 was asked), plus the unix socket
  // path when there is one.
  std::string listening() const;
  int port() const;
  // The SHA-256 fingerprint of the self-signed certificate made at start,
  // "" when the certificate came from files or client TLS is disabled.
  std::string tls_fingerprint() const;

  // Starts the event-loop threads and the writer thread.
  void start();
  // Ends open sessions (SessionEnd{CaptureEnd}), joins the threads, closes
  // the trace. Idempotent. Throws if the writer thread failed.
  void stop();
  // True when the writer thread has failed; stop() rethrows its error.
  bool failed() const;
  // True once the trace could not be written (a full disk, an I/O error):
  // the proxy goes on forwarding every session and stops recording; the
  // trace keeps every chunk written before (readable, without its end
  // record) and summary() says what was lost. Safe from any thread.
  bool recording_stopped() const;

  ProxySummary summary() const;
  // The event loops' counts so far, for a status line: safe from any thread
  // while the proxy runs. Statements, transactions and errors count the
  // sessions that have ended; records, dropped and queue_waits are 0.
  ProxySummary progress() const;
  // The decoders' memory cap (ProxyOptions::decoder_memory).
  const BufferBudget& decoder_budget() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierlab::capture
