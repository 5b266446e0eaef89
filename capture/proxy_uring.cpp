// The capture proxy's io_uring event loop (see capture/proxy_loop.h).
//
// Per loop: one ring (single issuer, task work deferred to io_uring_enter)
// and one ring of provided receive buffers. Every socket has a multishot
// receive armed; each completion brings a provided buffer, which is fed to
// the session's decoder and then sent to the other side straight from that
// buffer; the buffer goes back to the kernel when its send has completed.
// Sends of one direction go out one at a time, in order; what arrives
// meanwhile queues behind (a list of buffers per direction, linked through
// per-buffer arrays: no allocation). A direction with kHighWater bytes or
// more queued stops receiving from its source (its multishot receive is
// cancelled) until the queue drains, so a slow reader pushes back on the
// writer through TCP, and no session can take all the buffers.
//
// One round: give buffers back, submit every queued send and receive and wait
// for a completion in the same io_uring_enter, handle every completion.
//
// A closed session is shut down and its operations cancelled; the object is
// kept until every operation it had in flight has completed, then its
// descriptors are closed and it is reused.
#include "capture/proxy_loop.h"

#include "common/error.h"
#include "common/uring.h"

#include <liburing.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tierlab::capture::detail {
namespace {

using trace::EndReason;
using trace::Nanos;

constexpr unsigned kRingEntries = 4096;
constexpr unsigned kCqEntries = 16384;
constexpr uint32_t kBufSize = 16 * 1024;   // one provided receive buffer
constexpr uint32_t kBufCount = 1024;       // per loop, a power of two
constexpr uint32_t kHighWater = 64 * 1024; // queued bytes that stop a direction's source
constexpr uint16_t kGroup = 0;             // provided buffer group id
constexpr long kSendWaitNs = 1'000'000;    // see Loop::run

// user_data: a session pointer (16-aligned) with the operation in the low
// bits, or one of the small constants below.
constexpr uint64_t kIgnore = 0;  // cancellations
constexpr uint64_t kStop = 1;
constexpr uint64_t kAcceptTcp = 2;
constexpr uint64_t kAcceptUnix = 3;
constexpr uint64_t kOpMask = 15;
enum Op : uint64_t {
  kRecvClient = 1,    // flow 0's source
  kRecvUpstream = 2,  // flow 1's source
  kSendUpstream = 3,  // flow 0's sends
  kSendClient = 4,    // flow 1's sends
  kConnect = 5,
};

// Queue entries: provided buffer ids, or the session's startup buffer.
constexpr int32_t kNone = -1;
constexpr int32_t kAux = -2;

enum class State : uint8_t { Free, Startup, Connecting, Forward, Draining, Closed };
enum class Recv : uint8_t { Off, Armed, Cancelling };

// One direction: flow 0 is client to server (source: the client socket),
// flow 1 server to client.
struct Flow {
  int32_t head = kNone, tail = kNone;  // queued pieces, oldest first
  uint32_t off = 0;                    // bytes of the head piece already sent
  uint32_t bytes = 0;                  // bytes queued and not yet sent
  bool sending = false;                // a send of the head piece is in flight
  Recv recv = Recv::Off;               // the source's multishot receive
  bool eof = false;                    // the source has closed
  bool starved = false;                // receive stopped for want of buffers
};

struct alignas(16) Session {
  Session(RecordSink& sink, const WireLimits& limits, uint32_t aux_bytes)
      : dec(sink, limits), aux(new uint8_t[aux_bytes]), aux_cap(aux_bytes) {}
  SessionDecoder dec;
  // Startup packets are collected here, then sent upstream from here.
  std::unique_ptr<uint8_t[]> aux;
  uint32_t aux_cap;
  uint32_t aux_head = 0, aux_len = 0;
  int32_t aux_next = kNone;
  Flow flow[2];
  int fd[2] = {-1, -1};  // client, upstream
  uint32_t inflight = 0; // operations submitted and not completed
  State state = State::Free;
  int8_t drain = -1;     // Draining: the flow whose end closes the session
  uint64_t id = 0;
  Session* prev = nullptr;  // live list
  Session* next = nullptr;  // live list or free list
  char addr[64] = {};
};

Direction dir_of(int f) { return f == 0 ? Direction::Frontend : Direction::Backend; }

RingOptions ring_options(bool disabled) {
  RingOptions o;
  o.entries = kRingEntries;
  o.cq_entries = kCqEntries;
  o.single_task = true;
  o.disabled = disabled;
  return o;
}

class Loop final : public EventLoop {
 public:
  Loop(Shared& px, int tcp_fd, RecordSink& sink)
      : px_(px), sink_(sink), tcp_fd_(tcp_fd),
        aux_bytes_(std::max<uint32_t>(16 * 1024, px.limits.max_startup + 1024)) {
    try {
      ring_.emplace(ring_options(true));
      br_.emplace(*ring_, kGroup, kBufCount, kBufSize);
    } catch (const RuntimeError& e) {
      if (tcp_fd_ >= 0) ::close(tcp_fd_);
      throw RuntimeError(std::string("capture proxy: ") + e.what());
    }
    piece_len_.assign(kBufCount, 0);
    piece_next_.assign(kBufCount, kNone);
    closing_.reserve(256);
    starved_.reserve(256);
    for (int i = 0; i < 16; ++i) grow();
  }

  ~Loop() override {
    br_.reset();
    ring_.reset();
    for (auto& s : pool_)
      for (int& fd : s->fd)
        if (fd >= 0) ::close(fd);
    if (tcp_fd_ >= 0) ::close(tcp_fd_);
  }

  void run() override {
    int rc = ring_->enable();
    if (rc < 0) {
      std::fprintf(stderr, "tierlab: capture proxy: enabling the io_uring: %s\n", std::strerror(-rc));
      return;
    }
    if (tcp_fd_ >= 0) arm_accept(tcp_fd_, kAcceptTcp);
    if (px_.unix_fd >= 0) arm_accept(px_.unix_fd, kAcceptUnix);
    io_uring_sqe* e = sqe();
    io_uring_prep_poll_add(e, px_.stop_fd, POLLIN);
    io_uring_sqe_set_data64(e, kStop);

    while (!stopping_) {
      give_back_now();
      if (sends_ == 0) {
        rc = io_uring_submit_and_wait(ring_->get(), 1);
      } else {
        // Sends to a socket with room complete during the submission and
        // post their completions at once: wait for those plus one event, so
        // that a round costs one io_uring_enter rather than two. A send that
        // has to wait for room would hold the round back: the timeout bounds
        // that (it only happens under back-pressure).
        __kernel_timespec ts{0, kSendWaitNs};
        io_uring_cqe* cqe = nullptr;
        rc = io_uring_submit_and_wait_timeout(ring_->get(), &cqe, 1 + sends_, &ts, nullptr);
      }
      sends_ = 0;
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
        std::fprintf(stderr, "tierlab: capture proxy: io_uring_enter: %s\n", std::strerror(-rc));
        break;
      }
      reap();
      end_round();
    }
    // Take what already arrived (a Terminate, a last reply) before ending
    // the sessions still open.
    give_back_now();
    io_uring_submit_and_get_events(ring_->get());
    reap();
    end_round();
    while (live_) close_session(live_, EndReason::CaptureEnd);
    // Wait (briefly) for the cancelled operations, so descriptors close
    // after the kernel is done with them.
    for (int i = 0; i < 100 && !closing_.empty(); ++i) {
      give_back_now();
      __kernel_timespec ts{0, 10'000'000};
      io_uring_cqe* cqe = nullptr;
      io_uring_submit_and_wait_timeout(ring_->get(), &cqe, 1, &ts, nullptr);
      reap();
      end_round();
    }
  }

 private:
  Shared& px_;
  RecordSink& sink_;
  int tcp_fd_;
  const uint32_t aux_bytes_;
  std::optional<Ring> ring_;
  std::optional<BufRing> br_;
  std::vector<uint32_t> piece_len_;   // per provided buffer: bytes it holds
  std::vector<int32_t> piece_next_;   // per provided buffer: next in its queue
  bool stopping_ = false;
  unsigned sends_ = 0;  // sends queued in this round
  std::vector<std::unique_ptr<Session>> pool_;
  Session* free_ = nullptr;
  Session* live_ = nullptr;
  std::vector<Session*> closing_;  // closed, waiting for their operations
  std::vector<Session*> starved_;  // a receive is waiting for buffers

  void grow() {
    pool_.push_back(std::make_unique<Session>(sink_, px_.limits, aux_bytes_));
    Session* s = pool_.back().get();
    s->next = free_;
    free_ = s;
  }

  static uint64_t tag(Session* s, Op op) { return reinterpret_cast<uint64_t>(s) | op; }

  io_uring_sqe* sqe() { return ring_->sqe(); }

  // --- provided buffers -------------------------------------------------------

  uint8_t* buf(int32_t id) { return br_->data(static_cast<uint32_t>(id)); }

  void give_back(int32_t id) {
    assert(id >= 0 && br_->held() > 0);
    br_->give_back(static_cast<uint32_t>(id));
  }

  void give_back_now() {
    if (!br_->returns()) return;
    br_->publish();
    // Receives that stopped for want of buffers start again.
    if (!starved_.empty()) {
      for (Session* s : starved_)
        for (int f = 0; f < 2; ++f)
          if (s->flow[f].starved) {
            s->flow[f].starved = false;
            maybe_arm(s, f);
          }
      starved_.clear();
    }
  }

  // --- queues -------------------------------------------------------------------

  uint8_t* piece_data(Session* s, int32_t id) {
    return id == kAux ? s->aux.get() + s->aux_head : buf(id);
  }
  uint32_t piece_size(Session* s, int32_t id) {
    return id == kAux ? s->aux_len - s->aux_head : piece_len_[static_cast<size_t>(id)];
  }
  int32_t& piece_next(Session* s, int32_t id) {
    return id == kAux ? s->aux_next : piece_next_[static_cast<size_t>(id)];
  }

  void enqueue(Session* s, int f, int32_t id, uint32_t len) {
    Flow& fl = s->flow[f];
    if (id >= 0) piece_len_[static_cast<size_t>(id)] = len;
    piece_next(s, id) = kNone;
    if (fl.tail == kNone) fl.head = id;
    else piece_next(s, fl.tail) = id;
    fl.tail = id;
    fl.bytes += len;
  }

  static bool idle(const Flow& fl) { return fl.head == kNone && !fl.sending; }

  // Starts the send of flow f's oldest piece, unless one is in flight.
  void kick(Session* s, int f) {
    Flow& fl = s->flow[f];
    if (fl.sending || fl.head == kNone) return;
    if (s->state != State::Forward && s->state != State::Draining) return;
    io_uring_sqe* e = sqe();
    io_uring_prep_send(e, s->fd[1 - f], piece_data(s, fl.head) + fl.off,
                       piece_size(s, fl.head) - fl.off, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(e, tag(s, f == 0 ? kSendUpstream : kSendClient));
    fl.sending = true;
    ++s->inflight;
    ++sends_;
  }

  void arm_recv(Session* s, int f) {
    io_uring_sqe* e = sqe();
    io_uring_prep_recv_multishot(e, s->fd[f], nullptr, 0, 0);
    e->flags |= IOSQE_BUFFER_SELECT;
    e->buf_group = kGroup;
    io_uring_sqe_set_data64(e, tag(s, f == 0 ? kRecvClient : kRecvUpstream));
    s->flow[f].recv = Recv::Armed;
    ++s->inflight;
  }

  // Re-arms flow f's source when it is stopped and may read again.
  void maybe_arm(Session* s, int f) {
    Flow& fl = s->flow[f];
    if (fl.recv != Recv::Off || fl.eof || fl.starved) return;
    switch (s->state) {
      case State::Startup:
      case State::Connecting:
        if (f != 0) return;
        break;
      case State::Forward:
        break;
      default:
        return;
    }
    if (fl.bytes >= kHighWater) return;  // the send completion re-arms it
    if (br_->held() >= kBufCount && !br_->returns()) {
      fl.starved = true;
      starved_.push_back(s);
      return;
    }
    arm_recv(s, f);
  }

  void arm_accept(int fd, uint64_t t) {
    io_uring_sqe* e = sqe();
    io_uring_prep_multishot_accept(e, fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data64(e, t);
  }

  // --- completions --------------------------------------------------------------

  void reap() {
    unsigned head;
    unsigned n = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring_->get(), head, cqe) {
      ++n;
      dispatch(cqe->user_data, cqe->res, cqe->flags);
    }
    io_uring_cq_advance(ring_->get(), n);
  }

  void dispatch(uint64_t ud, int res, unsigned flags) {
    if (ud <= kOpMask) {
      switch (ud) {
        case kStop:
          stopping_ = true;
          return;
        case kAcceptTcp:
        case kAcceptUnix:
          on_accept(ud, res, flags);
          return;
        default:
          return;  // cancellations
      }
    }
    Session* s = reinterpret_cast<Session*>(ud & ~kOpMask);
    switch (static_cast<Op>(ud & kOpMask)) {
      case kRecvClient: on_recv(s, 0, res, flags); return;
      case kRecvUpstream: on_recv(s, 1, res, flags); return;
      case kSendUpstream: on_send(s, 0, res); return;
      case kSendClient: on_send(s, 1, res); return;
      case kConnect: on_connect(s, res); return;
    }
  }

  void end_round() {
    // Closed sessions whose operations have all completed are reused.
    size_t keep = 0;
    for (Session* s : closing_) {
      if (s->inflight > 0) {
        closing_[keep++] = s;
        continue;
      }
      for (int f = 0; f < 2; ++f) {
        Flow& fl = s->flow[f];
        for (int32_t id = fl.head; id != kNone;) {
          int32_t next = piece_next(s, id);
          if (id >= 0) give_back(id);
          id = next;
        }
        fl = Flow{};
      }
      for (int& fd : s->fd)
        if (fd >= 0) {
          ::close(fd);
          fd = -1;
        }
      s->state = State::Free;
      s->next = free_;
      free_ = s;
    }
    closing_.resize(keep);
  }

  void on_accept(uint64_t t, int res, unsigned flags) {
    const bool is_unix = t == kAcceptUnix;
    if (!(flags & IORING_CQE_F_MORE) && !stopping_) arm_accept(is_unix ? px_.unix_fd : tcp_fd_, t);
    if (res < 0) {
      if (res != -ECANCELED && res != -EAGAIN && res != -EINTR && res != -ECONNABORTED)
        std::fprintf(stderr, "tierlab: capture proxy: accept: %s\n", std::strerror(-res));
      return;
    }
    if (stopping_) {
      ::close(res);
      return;
    }
    if (!free_) grow();
    Session* s = free_;
    free_ = s->next;
    s->prev = nullptr;
    s->next = live_;
    if (live_) live_->prev = s;
    live_ = s;
    s->fd[0] = res;
    s->fd[1] = -1;
    s->inflight = 0;
    s->drain = -1;
    s->aux_head = s->aux_len = 0;
    s->flow[0] = s->flow[1] = Flow{};
    s->id = px_.next_id.fetch_add(1, std::memory_order_relaxed);
    uint32_t session_flags = 0;
    if (is_unix) {
      session_flags |= trace::kSessionUnixSocket;
      std::snprintf(s->addr, sizeof s->addr, "unix");
    } else {
      set_nodelay(res);
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      getpeername(res, reinterpret_cast<sockaddr*>(&ss), &len);
      std::string peer = format_peer(ss);
      std::snprintf(s->addr, sizeof s->addr, "%s", peer.c_str());
    }
    s->state = State::Startup;
    s->dec.begin(s->id, s->addr, session_flags, now_ns());
    ++stats.connections;
    arm_recv(s, 0);
  }

  void on_recv(Session* s, int f, int res, unsigned flags) {
    Flow& fl = s->flow[f];
    int32_t id = kNone;
    if (flags & IORING_CQE_F_BUFFER) {
      id = static_cast<int32_t>(flags >> IORING_CQE_BUFFER_SHIFT);
      br_->taken();
    }
    if (!(flags & IORING_CQE_F_MORE)) {
      --s->inflight;
      fl.recv = Recv::Off;
    }
    if (s->state == State::Closed || s->state == State::Draining) {
      if (id >= 0) give_back(id);
      return;
    }
    if (res > 0 && id >= 0) {
      data(s, f, id, static_cast<uint32_t>(res));
    } else if (res == -ENOBUFS) {
      if (!fl.starved) {
        fl.starved = true;
        starved_.push_back(s);
      }
      return;
    } else if (res != -ECANCELED && res != -EINTR && res != -EAGAIN) {
      // End of stream (0) or a socket error: the source is gone.
      if (id >= 0) give_back(id);
      fl.eof = true;
      source_gone(s, f);
      return;
    }
    if (fl.recv == Recv::Off && s->state != State::Closed) maybe_arm(s, f);
  }

  // Bytes from flow f's source, in provided buffer id.
  void data(Session* s, int f, int32_t id, uint32_t n) {
    Flow& fl = s->flow[f];
    if (s->state == State::Startup) {
      startup_data(s, buf(id), n);
      give_back(id);
      return;
    }
    if (!s->dec.feed(dir_of(f), buf(id), n, now_ns())) {
      give_back(id);
      protocol_error(s, s->dec.error(), f == 0);
      return;
    }
    (f == 0 ? stats.to_server : stats.to_client) += n;
    enqueue(s, f, id, n);
    kick(s, f);
    if (fl.bytes >= kHighWater && fl.recv == Recv::Armed) {
      // Back-pressure: stop reading this source until the queue drains.
      io_uring_sqe* e = sqe();
      io_uring_prep_cancel64(e, tag(s, f == 0 ? kRecvClient : kRecvUpstream), 0);
      io_uring_sqe_set_data64(e, kIgnore);
      e->flags |= IOSQE_CQE_SKIP_SUCCESS;
      fl.recv = Recv::Cancelling;
    }
  }

  void on_send(Session* s, int f, int res) {
    Flow& fl = s->flow[f];
    --s->inflight;
    fl.sending = false;
    if (s->state == State::Closed) return;
    if (res < 0 && res != -EINTR && res != -EAGAIN) {
      dest_gone(s, f);
      return;
    }
    if (res > 0) {
      fl.off += static_cast<uint32_t>(res);
      fl.bytes -= static_cast<uint32_t>(res);
      while (fl.head != kNone && fl.off == piece_size(s, fl.head)) {
        int32_t id = fl.head;
        fl.head = piece_next(s, id);
        fl.off = 0;
        if (id >= 0) give_back(id);
      }
      if (fl.head == kNone) fl.tail = kNone;
    }
    kick(s, f);
    if (s->state == State::Draining && s->drain == f && idle(fl)) {
      drained(s);
      return;
    }
    maybe_arm(s, f);
  }

  void on_connect(Session* s, int res) {
    --s->inflight;
    if (s->state != State::Connecting) return;
    if (res < 0) {
      upstream_refused(s, -res);
      return;
    }
    s->state = State::Forward;
    kick(s, 0);
    arm_recv(s, 1);
    maybe_arm(s, 0);
  }

  // --- sessions -----------------------------------------------------------------

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
    switch (startup_step(s->dec, s->fd[0], s->aux.get(), s->aux_head, s->aux_len, px_.limits.max_startup, &why)) {
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
    s->fd[1] = fd;
    s->state = State::Connecting;
    // The startup bytes go first, once connected.
    enqueue(s, 0, kAux, s->aux_len - s->aux_head);
    io_uring_sqe* e = sqe();
    io_uring_prep_connect(e, fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len);
    io_uring_sqe_set_data64(e, tag(s, kConnect));
    ++s->inflight;
  }

  // Flow f's source closed or failed.
  void source_gone(Session* s, int f) {
    if (f == 1) {
      upstream_gone(s);
      return;
    }
    if (s->state != State::Forward) {
      close_session(s, EndReason::ClientAbort);
      return;
    }
    // Let what the client sent last (a Terminate) reach the server first.
    if (idle(s->flow[0])) {
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
    if (!idle(s->flow[1])) {
      s->state = State::Draining;
      s->drain = 1;
      return;
    }
    s->drain = 1;
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

  // Sends a FATAL ErrorResponse to the client (nothing else is in flight to
  // it) and records it in the session.
  void send_error(Session* s, const char* sqlstate, const char* message) {
    assert(idle(s->flow[1]));
    uint8_t b[512];
    size_t n = proxy_error(s->dec, b, sizeof b, sqlstate, message);
    if (n == 0) return;
    (void)::send(s->fd[0], b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Closes a session whose stream broke the protocol. When the client sent
  // the bad message and the server's stream is at a message boundary, the
  // client is told why (FATAL 08P01) before the connection closes.
  void protocol_error(Session* s, const char* why, bool client_fault = false) {
    ++stats.protocol_errors;
    std::fprintf(stderr, "tierlab: capture proxy: session %llu (%s) closed: %s\n",
                 static_cast<unsigned long long>(s->id), s->addr, why);
    if (client_fault && s->state == State::Forward && idle(s->flow[1]) &&
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
    s->state = State::Closed;
    for (int fd : s->fd) {
      if (fd < 0) continue;
      ::shutdown(fd, SHUT_RDWR);
      if (s->inflight > 0) {
        io_uring_sqe* e = sqe();
        io_uring_prep_cancel_fd(e, fd, IORING_ASYNC_CANCEL_ALL);
        io_uring_sqe_set_data64(e, kIgnore);
        e->flags |= IOSQE_CQE_SKIP_SUCCESS;
      }
    }
    if (s->prev) s->prev->next = s->next;
    else live_ = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = nullptr;
    closing_.push_back(s);
  }
};

}  // namespace

std::string uring_unsupported() {
  return uring_missing({.ext_arg = false,
                        .buf_ring = true,
                        .ops = {{IORING_OP_RECV, "recv"},
                                {IORING_OP_SEND, "send"},
                                {IORING_OP_ACCEPT, "accept"},
                                {IORING_OP_CONNECT, "connect"},
                                {IORING_OP_ASYNC_CANCEL, "async cancel"},
                                {IORING_OP_POLL_ADD, "poll"}}});
}

std::unique_ptr<EventLoop> make_uring_loop(Shared& px, int tcp_fd, RecordSink& sink) {
  return std::make_unique<Loop>(px, tcp_fd, sink);
}

}  // namespace tierlab::capture::detail
