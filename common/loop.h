// One event loop for tierlab's network code, with two backends chosen once
// (make_loop): io_uring where the kernel has what it needs, epoll elsewhere
// or on request (the caller says which). What a session does with the bytes (the capture
// proxy's policy: capture/proxy_session.h) is written once above it.
//
// A Loop runs on one thread and owns its connections: a connection is a
// slot index (also the io_uring user_data, with the operation in the low
// bits), never a pointer. Its operations:
//  - receive: recv(c, true) delivers what arrives as Data events, each one
//    buffer of a pool the loop owns (on io_uring: a ring of provided buffers,
//    multishot receives; on epoll: recv into a free buffer). recv(c, false)
//    stops it (back-pressure). A receive that finds no free buffer waits,
//    inside the loop, until one is released.
//  - send: send(c, buf) queues a received buffer on another connection
//    (forwarding without a copy; the buffer is released once sent);
//    send_ext(c, p, n) queues bytes the caller owns (one such piece per
//    connection, valid until its Sent event). Sends of one connection go
//    out in order; each completion is a Sent event.
//  - connect(c, addr): a Connected event, res 0 or -errno.
//  - receive into the caller's memory: recv_into(c, p, cap) is one receive
//    into p (a Data event with buf -1, or Eof), for a parser that keeps its
//    own buffer; the caller asks again for more.
//  - readiness: poll_open(fd, tag) watches a descriptor the loop does not
//    own (a library's socket, an eventfd); poll(w, POLLIN | POLLOUT) says
//    what for. Level-triggered: a Ready event in every round in which the
//    descriptor is ready for what is asked.
//  - timer: wait() returns when an event is ready or its timeout has passed;
//    wait_until() when its deadline (CLOCK_MONOTONIC, nanoseconds) has.
// One round of wait() hands every queued send and receive to the kernel and
// waits in the same call (one io_uring_enter, or one epoll_wait after the
// sends). The hot path allocates nothing: buffers, slots and the event array
// are sized at start and grow only when more connections are open than ever
// before.
//
// A TLS stage fits between the loop and a session (see Stage below): it
// takes the Data events' ciphertext and gives the session plaintext, and
// turns the session's plaintext into ciphertext that the owner queues with
// send_ext, so TLS is written once for both backends.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

namespace tierlab {

enum class LoopEv : uint8_t {
  Accept,     // tag: the listener's; res: the new socket (non-blocking), or -errno
  Data,       // conn, buf, data, len: bytes received; the buffer is the caller's until sent or released
  Eof,        // conn: the peer closed (res 0) or the socket failed (-errno); no more Data
  Sent,       // conn: the oldest queued piece, or part of it, went out; queued() is what is left
  SendError,  // conn: a send failed (res -errno); the queue is dropped
  Connected,  // conn: res 0, or -errno
  Wake,       // tag: a watched descriptor became readable (once per watch())
  Ready,      // conn: a poll_open() watch, tag its tag; res: its poll bits (POLLIN, POLLOUT, POLLERR, POLLHUP)
};

struct LoopEvent {
  LoopEv kind;
  int32_t res = 0;
  uint32_t conn = 0;
  int32_t buf = -1;
  uint32_t len = 0;
  uint8_t* data = nullptr;
  uint64_t tag = 0;
};

struct LoopOptions {
  uint32_t buffers = 1024;      // receive buffers per loop, a power of two
  uint32_t buffer_size = 16384; // bytes each
  uint32_t connections = 32;    // slots made at start; more are made when needed
  // io_uring: with sends queued, a round waits for their completions and
  // one event (at most 1 ms longer), so that it costs one io_uring_enter
  // (the proxy's forwarding). false: it returns at the first completion,
  // as a round without sends does (the replay's workers: a wait with that
  // bound cost them more CPU per transaction than the second
  // io_uring_enter it saves, where answers take longer than the bound).
  bool wait_sends = true;
};

class Loop {
 public:
  virtual ~Loop() = default;

  // Registrations, made before the first wait(): a listener (non-blocking)
  // whose accepted
  // sockets come as Accept events, and a descriptor whose readability comes
  // as one Wake event. `tag` is any value above 0.
  // `shared`: other loops listen on fd too (epoll wakes one of them).
  virtual void listen(int fd, uint64_t tag, bool shared) = 0;
  virtual void watch(int fd, uint64_t tag) = 0;

  // A connection slot for socket fd (non-blocking), which the loop now owns.
  virtual uint32_t open(int fd) = 0;
  // A connection slot for socket fd (non-blocking), which another owner
  // keeps (libpq's): the loop borrows the descriptor and never closes it or
  // shuts the socket down, so that the other owner ends the connection its
  // own way. No descriptor is made for it. fd must stay open until
  // close(c); the owner may close it as soon as close(c) returns, and the
  // number may then be another socket's.
  virtual uint32_t open_borrowed(int fd) = 0;
  // Shuts the socket down, stops its operations and drops its queue; the
  // slot and the descriptor are reused once the kernel is done with them.
  // A borrowed connection (open_borrowed) is not shut down and its
  // descriptor stays open: what the loop had queued or in flight on it is
  // cancelled before close returns (io_uring: submitted with the
  // cancellation at once, while the number is still the socket's; epoll:
  // taken out of the set).
  // No event for c is returned after close(c).
  virtual void close(uint32_t c) = 0;
  virtual int fd(uint32_t c) const = 0;
  // A word the owner keeps per connection (0 when opened).
  virtual uint64_t& user(uint32_t c) = 0;

  virtual void recv(uint32_t c, bool on) = 0;
  // One receive into p (up to cap bytes, valid until its event or
  // close(c)): a Data event with buf -1, data p and the length, or Eof.
  // A connection uses either this or recv(c, true), not both.
  virtual void recv_into(uint32_t c, uint8_t* p, uint32_t cap) = 0;
  virtual void send(uint32_t c, int32_t buf, uint32_t len) = 0;
  virtual void send_ext(uint32_t c, const uint8_t* p, uint32_t len) = 0;
  virtual void connect(uint32_t c, const sockaddr* addr, socklen_t len) = 0;
  // Bytes queued on c and not yet sent.
  virtual uint32_t queued(uint32_t c) const = 0;
  // Gives back a Data event's buffer that is not sent on.
  virtual void release(int32_t buf) = 0;

  // Submits what is queued and waits up to timeout_ns (-1: no limit, 0:
  // only what is ready) for events; fills up to `max` of them. Returns their
  // number (0 on timeout or interruption), or -errno when the loop cannot go
  // on.
  virtual int wait(LoopEvent* evs, int max, int64_t timeout_ns) = 0;

  // The same, waiting at most until `deadline_ns` on CLOCK_MONOTONIC (-1:
  // no limit): the caller's schedule in absolute times, to the nanosecond.
  virtual int wait_until(LoopEvent* evs, int max, int64_t deadline_ns) = 0;

  // The same as wait_until, but a round that finds fewer than `n` events
  // ready waits on for more: it returns once n are ready, or once
  // `window_ns` has passed with at least one, or at the deadline. The
  // io_uring backend waits in the kernel (io_uring_enter's min-wait,
  // Linux 6.12 and later): a thread held to a CPU quota wakes once per
  // batch of completions rather than once per completion. Where the kernel
  // has no min-wait, and on epoll, it is wait_until.
  virtual int expect(LoopEvent* evs, int max, int64_t deadline_ns, int n, int64_t window_ns) {
    (void)n;
    (void)window_ns;
    return wait_until(evs, max, deadline_ns);
  }

  // A readiness watch on fd, which the loop does not own; `tag` comes with
  // its Ready events. Starts with nothing asked for.
  virtual uint32_t poll_open(int fd, uint64_t tag) = 0;
  // What watch w waits for: POLLIN, POLLOUT or both; 0 stops it.
  virtual void poll(uint32_t w, uint32_t events) = 0;
  // Ends watch w: no Ready event for it is returned after; the owner may
  // close the descriptor at once.
  virtual void poll_close(uint32_t w) = 0;

  // After the last wait(): lets the kernel finish with closed connections
  // (up to `timeout_ns`) before their descriptors close.
  virtual void finish(int64_t timeout_ns) = 0;

  // "io_uring" or "epoll".
  virtual const char* backend() const = 0;
};

// A loop for the calling thread. `uring`: the io_uring backend, which needs
// loop_uring_missing() to be "" (the caller checked it); else epoll. An
// io_uring loop is created disabled and enabled by its first wait(), so it
// may be made on one thread and run on another. Throws RuntimeError.
std::unique_ptr<Loop> make_loop(bool uring, const LoopOptions& o);

// "" when io_uring loops can run here, else what is missing, in one line
// (probed once per process).
std::string loop_uring_missing();

// The seam for a TLS stage between a connection's buffers and its session
// (common/tls.h: TlsStage, used by the capture proxy). One stage per connection, the same code on every backend
// (OpenSSL with memory BIOs, buffers sized at session start):
//  - a Data event's ciphertext goes to decrypt(), and the buffer is released;
//    the plaintext it completes goes to the session as if it had come from
//    the socket (into a buffer of the session's, or of the loop's);
//  - the session's plaintext goes to encrypt() instead of send();
//  - output() is the ciphertext waiting to leave (handshake records, alerts,
//    encrypted data): the owner queues it with send_ext after each call
//    above, and reports what the Sent event says went out with sent().
class Stage {
 public:
  virtual ~Stage() = default;
  // Takes n bytes received; writes up to cap bytes of plaintext to out and
  // returns their number; -1 when the peer broke the protocol.
  virtual int64_t decrypt(const uint8_t* p, uint32_t n, uint8_t* out, uint32_t cap) = 0;
  // Encrypts n bytes of the session's into output(); false on failure.
  virtual bool encrypt(const uint8_t* p, uint32_t n) = 0;
  // Ciphertext not yet queued: its bytes and length (0: none). Valid until
  // the next call on the stage.
  virtual const uint8_t* output(uint32_t* len) = 0;
  // n bytes of output() went out.
  virtual void sent(uint32_t n) = 0;
};

}  // namespace tierlab
