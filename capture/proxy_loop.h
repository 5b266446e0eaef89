// Private to capture/: what the capture proxy's event loops share.
//
// A loop owns its sessions (client connection, upstream connection, one
// SessionDecoder each) and runs on one thread. Its session policy
// (capture/proxy_session.h) is written once over common/loop.h, whose
// backend is chosen once (Proxy::Proxy says why "auto" picks io_uring):
//  - io_uring: multishot receives into a ring of provided buffers, sends
//    queued as submissions and handed to the kernel together with the wait,
//    in one io_uring_enter per round;
//  - epoll: recv/send/epoll_wait.
// Both forward every byte unchanged and feed the same bytes to the decoder;
// TLS (common/tls.h) sits above either backend, in the session policy.
#pragma once

#include "capture/proxy.h"
#include "capture/wire.h"
#include "common/clock.h"
#include "common/tls.h"
#include "trace/record.h"

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <thread>

namespace tierlab::capture::detail {

struct Addr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string text;
  std::string host;  // the host name or address given (TLS: SNI and verify-full)
  bool is_unix = false;
  int port = 0;
};

void set_nodelay(int fd);
std::string format_peer(const sockaddr_storage& ss);

// A counter written by one thread (its loop) and read by others (a status
// line): relaxed loads and stores, no read-modify-write, so counting costs
// what a plain integer does.
class LoopCounter {
 public:
  LoopCounter& operator+=(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    return *this;
  }
  LoopCounter& operator++() { return *this += 1; }
  operator uint64_t() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

struct LoopStats {
  LoopCounter connections, sessions, statements, transactions, errors;
  LoopCounter to_server, to_client, protocol_errors, upstream_failures;
};

// What every event loop reads.
struct Shared {
  ProxyOptions opts;
  WireLimits limits;
  Addr upstream;
  int unix_fd = -1;   // shared unix listener, or -1
  int stop_fd = -1;   // eventfd: readable once the loops must stop
  enum class ClientTls : uint8_t { Disable, Allow, Require } client_tls = ClientTls::Allow;
  std::unique_ptr<TlsContext> client_ctx;    // the proxy's server side, unless Disable
  SslMode upstream_mode = SslMode::Prefer;
  std::unique_ptr<TlsContext> upstream_ctx;  // unless Disable
  bool self_signed = false;
  std::atomic<uint64_t> next_id{1};
};

class EventLoop {
 public:
  virtual ~EventLoop() = default;
  // Runs until stop_fd becomes readable, then ends every open session
  // (SessionEnd{CaptureEnd}). Called once, on the loop's own thread.
  virtual void run() = 0;

  LoopStats stats;  // written by the loop thread; read by any (LoopCounter)
  std::thread thread;
};

// tcp_fd: this loop's own TCP listener (SO_REUSEPORT), -1 for none; the loop
// owns it. Records go to `sink`, used from the loop's thread only. The two
// differ only in the backend of their common/loop.h.
std::unique_ptr<EventLoop> make_epoll_loop(Shared& px, int tcp_fd, RecordSink& sink);
std::unique_ptr<EventLoop> make_uring_loop(Shared& px, int tcp_fd, RecordSink& sink);

// "" when io_uring loops can run here (the ring features they need are
// present and allowed), else what is missing, in one line.
std::string uring_unsupported();

// Startup packets a loop has collected from a client, at buf[head, len).
// An SSLRequest or GSSENCRequest is consumed and Answer returned with the
// byte the caller sends the client: 'S' for an SSLRequest when offer_tls
// (the request is not given to dec: the session's decoded stream starts
// inside TLS), else 'N' (the request and the 'N' go to dec, as the client
// goes on in plaintext). A StartupMessage or CancelRequest ends the startup:
// the rest of the bytes are fed to dec and go upstream.
enum class StartupStep : uint8_t {
  NeedMore,       // incomplete: read more
  Answer,         // send *answer, then call again
  Connect,        // a StartupMessage or CancelRequest: connect upstream, send buf[head, len)
  ProtocolError,  // *why says what
};
StartupStep startup_step(SessionDecoder& dec, uint8_t* buf, uint32_t& head, uint32_t& len, uint32_t max_startup,
                         bool offer_tls, char* answer, const char** why);

// A non-blocking socket for the upstream (TCP_NODELAY on TCP), or -1 with
// errno set.
int upstream_socket(const Addr& a);

// The FATAL ErrorResponse the proxy sends a client itself: written to out
// (cap bytes), recorded through dec as the server's answer. Returns its
// length, 0 if it does not fit.
size_t proxy_error(SessionDecoder& dec, uint8_t* out, size_t cap, const char* sqlstate,
                   const char* message);

}  // namespace tierlab::capture::detail
