// The io_uring backend of common/loop.h.
//
// One ring (single issuer, task work deferred to io_uring_enter) and one
// ring of provided receive buffers. A connection that wants data has a
// multishot receive armed; each completion brings a provided buffer. Sends
// of a connection go out one at a time, in order, straight from the queued
// buffers. recv(c, false) cancels the multishot receive. A receive that
// found no buffer (ENOBUFS) is armed again when buffers are given back.
//
// One round (wait): give buffers back, submit every queued operation and
// wait in the same io_uring_enter, turn the completions into events.
//
// recv_into is a one-shot receive into the caller's memory. A poll_open()
// watch is a one-shot poll, armed again at the start of each round while
// something is asked for (the kernel checks readiness when it takes the
// poll: level-triggered, as libpq needs, which reads only part of what a
// socket holds); poll() with another mask takes an armed poll out, and its
// completion arms it again.
// wait_until() passes the time left to its deadline to io_uring_enter
// (nanoseconds, no timeout operation to submit and cancel per round).
//
// user_data: slot index << 3 | operation; listeners and watches are
// numbered apart from connections.
#include "common/clock.h"
#include "common/error.h"
#include "common/loop_impl.h"
#include "common/uring.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

namespace tierlab::loop_detail {
namespace {

constexpr unsigned kRingEntries = 4096;
constexpr unsigned kCqEntries = 16384;
constexpr uint16_t kGroup = 0;
// With sends in flight, a round waits for their completions plus one event,
// at most this long (see wait()).
constexpr long kSendWaitNs = 1'000'000;
// io_uring_enter takes a min-wait (io_uring_getevents_arg.min_wait_usec;
// Linux 6.12), which liburing 2.3's headers do not name.
constexpr unsigned kFeatMinTimeout = 1u << 15;

enum Op : uint64_t { kIgnore = 0, kRecv = 1, kSend = 2, kConnect = 3, kAccept = 4, kWatch = 5, kRecvInto = 6, kPoll = 7 };
constexpr uint64_t kOpBits = 3;

class UringLoop final : public LoopCommon {
 public:
  explicit UringLoop(const LoopOptions& o) : LoopCommon(o) {
    RingOptions ro;
    ro.entries = kRingEntries;
    ro.cq_entries = kCqEntries;
    ro.single_task = true;
    ro.disabled = true;
    ring_.emplace(ro);
    br_.emplace(*ring_, kGroup, o.buffers, o.buffer_size);
    bufs_ = br_->data(0);
    rearm_.reserve(o.connections);
  }
  ~UringLoop() override {
    br_.reset();
    ring_.reset();
    for (Conn& k : conns_)
      if (k.fd >= 0 && !k.borrowed) ::close(k.fd);
  }

  const char* backend() const override { return "io_uring"; }

  void listen(int fd, uint64_t tag, bool) override {
    listeners_.push_back({fd, tag});
  }
  void watch(int fd, uint64_t tag) override { watches_.push_back({fd, tag}); }

  uint32_t open(int fd) override { return take_slot(fd); }
  uint32_t open_borrowed(int fd) override {
    uint32_t c = take_slot(fd);
    conns_[c].borrowed = true;
    return c;
  }

  void close(uint32_t c) override {
    Conn& k = conns_[c];
    assert(k.state == Slot::Open);
    k.state = Slot::Closing;
    k.user = 0;
    k.into = nullptr;
    if (!k.borrowed) ::shutdown(k.fd, SHUT_RDWR);
    if (k.inflight > 0) {
      io_uring_sqe* e = ring_->sqe();
      io_uring_prep_cancel_fd(e, k.fd, IORING_ASYNC_CANCEL_ALL);
      io_uring_sqe_set_data64(e, kIgnore);
      e->flags |= IOSQE_CQE_SKIP_SUCCESS;
      // A borrowed descriptor may be closed, and its number given to
      // another socket, once close() returns: c's queued operations and
      // their cancellation go to the kernel now, which resolves the number
      // to the socket while it still is that (an operation holds the socket,
      // not the number, from then on until it completes).
      if (k.borrowed) submit_now();
    }
    if (k.starved) k.starved = false;  // (left in starved_, skipped there)
    forget_pending(c);
    closing_.push_back(c);
  }

  void recv(uint32_t c, bool on) override {
    Conn& k = conns_[c];
    k.want_recv = on;
    if (on) {
      maybe_arm(c);
    } else if (k.armed && !k.cancelling) {
      // Back-pressure: stop reading until the owner asks again.
      io_uring_sqe* e = ring_->sqe();
      io_uring_prep_cancel64(e, ud(c, kRecv), 0);
      io_uring_sqe_set_data64(e, kIgnore);
      e->flags |= IOSQE_CQE_SKIP_SUCCESS;
      k.cancelling = true;
    }
  }

  void recv_into(uint32_t c, uint8_t* p, uint32_t cap) override {
    Conn& k = conns_[c];
    assert(!k.armed && !k.into);
    k.into = p;
    k.into_cap = cap;
    if (k.eof || k.connecting || k.state != Slot::Open) return;
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_recv(e, k.fd, p, cap, 0);
    io_uring_sqe_set_data64(e, ud(c, kRecvInto));
    k.armed = true;
    ++k.inflight;
  }

  uint32_t poll_open(int fd, uint64_t tag) override {
    uint32_t w = take_watch(fd, tag);
    rearm_.reserve(polls_.capacity());  // each watch is in the list at most once
    return w;
  }

  void poll(uint32_t w, uint32_t events) override {
    Watch& p = polls_[w];
    p.events = events;
    if (p.armed) {
      // Armed with another mask: taken out (its completion, ECANCELED or
      // what was ready, arms it again with the new mask), unless that is
      // under way already.
      if (events == p.armed || p.removing) return;
      io_uring_sqe* e = ring_->sqe();
      io_uring_prep_poll_remove(e, ud(w, kPoll));
      io_uring_sqe_set_data64(e, kIgnore);
      e->flags |= IOSQE_CQE_SKIP_SUCCESS;
      p.removing = true;
      return;
    }
    if (events && !p.queued) {
      p.queued = true;
      rearm_.push_back(w);
    }
  }

  void poll_close(uint32_t w) override {
    Watch& p = polls_[w];
    assert(p.state == Slot::Open);
    forget_pending(w, true);
    if (!p.armed) {
      // (If queued, the list skips it: the slot is not open.)
      if (!p.queued) free_watch(w);
      else p.state = Slot::Closing;
      return;
    }
    p.state = Slot::Closing;
    if (p.removing) return;
    p.removing = true;
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_poll_remove(e, ud(w, kPoll));
    io_uring_sqe_set_data64(e, kIgnore);
    e->flags |= IOSQE_CQE_SKIP_SUCCESS;
  }

  void connect(uint32_t c, const sockaddr* addr, socklen_t len) override {
    Conn& k = conns_[c];
    k.connecting = true;
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_connect(e, k.fd, addr, len);
    io_uring_sqe_set_data64(e, ud(c, kConnect));
    ++k.inflight;
  }

  void release(int32_t buf) override {
    assert(buf >= 0 && br_->held() > 0);
    br_->give_back(static_cast<uint32_t>(buf));
  }

  int wait_until(LoopEvent* evs, int max, int64_t deadline_ns) override {
    // A round can end with nothing for the caller before the deadline (the
    // completions of sends, which the loop reaps itself): wait again for the
    // time still left.
    for (;;) {
      const int n =
          wait(evs, max, deadline_ns < 0 ? -1 : std::max<int64_t>(0, deadline_ns - clock_ns(CLOCK_MONOTONIC)));
      if (n != 0 || deadline_ns < 0 || interrupted_ || clock_ns(CLOCK_MONOTONIC) >= deadline_ns) return n;
    }
  }

  int wait(LoopEvent* evs, int max, int64_t timeout_ns) override {
    if (!enabled_ && !enable()) return -errno_;
    int n = take_pending(evs, max);
    if (n > 0) return n;
    reuse_closed();
    give_back_now();
    arm_polls();
    int rc;
    if (timeout_ns == 0 || io_uring_cq_ready(ring_->get()) > 0) {
      rc = io_uring_submit_and_get_events(ring_->get());
    } else if ((sends_ == 0 || !opts_.wait_sends) && timeout_ns < 0) {
      rc = io_uring_submit_and_wait(ring_->get(), 1);
    } else {
      // Sends to a socket with room complete during the submission and
      // post their completions at once: wait for those plus one event, so
      // that a round costs one io_uring_enter rather than two. A send that
      // has to wait for room would hold the round back: the timeout bounds
      // that (it only happens under back-pressure).
      const unsigned sends = opts_.wait_sends ? sends_ : 0;
      int64_t t = timeout_ns;
      if (sends > 0 && (t < 0 || t > kSendWaitNs)) t = kSendWaitNs;
      __kernel_timespec ts = to_kts(t);
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_submit_and_wait_timeout(ring_->get(), &cqe, 1 + sends, &ts, nullptr);
    }
    sends_ = 0;
    interrupted_ = rc == -EINTR;
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) return rc;
    return reap(evs, max);
  }

  int expect(LoopEvent* evs, int max, int64_t deadline_ns, int n, int64_t window_ns) override {
    if (n <= 1 || window_ns <= 0 || !(ring_->features() & kFeatMinTimeout)) return wait_until(evs, max, deadline_ns);
    if (!enabled_ && !enable()) return -errno_;
    if (int k = take_pending(evs, max); k > 0) return k;
    reuse_closed();
    give_back_now();
    arm_polls();
    int rc;
    const int64_t left = deadline_ns < 0 ? -1 : std::max<int64_t>(0, deadline_ns - clock_ns(CLOCK_MONOTONIC));
    if (left == 0 || io_uring_cq_ready(ring_->get()) >= static_cast<unsigned>(n)) {
      rc = io_uring_submit_and_get_events(ring_->get());
    } else {
      rc = enter_min_wait(static_cast<unsigned>(n), window_ns, left);
    }
    sends_ = 0;
    interrupted_ = rc == -EINTR;
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) return rc;
    return reap(evs, max);
  }

  void finish(int64_t timeout_ns) override {
    for (int64_t waited = 0; waited < timeout_ns; waited += 10'000'000) {
      reuse_closed();
      if (closing_.empty()) return;
      give_back_now();
      __kernel_timespec ts = to_kts(10'000'000);
      io_uring_cqe* cqe = nullptr;
      io_uring_submit_and_wait_timeout(ring_->get(), &cqe, 1, &ts, nullptr);
      LoopEvent sink[64];
      while (reap(sink, 64) > 0) {
      }
    }
  }

 private:
  struct Reg {
    int fd;
    uint64_t tag;
  };
  std::optional<Ring> ring_;
  std::optional<BufRing> br_;
  std::vector<Reg> listeners_, watches_;
  std::vector<uint32_t> rearm_;  // poll_open() watches to arm this round
  bool enabled_ = false;
  int errno_ = 0;
  unsigned sends_ = 0;  // sends queued in this round
  bool interrupted_ = false;  // the last wait ended on a signal

  static uint64_t ud(uint64_t index, Op op) { return index << kOpBits | op; }

  // One io_uring_enter that submits what is queued and waits for `n`
  // completions, or `window_ns` with at least one, or `timeout_ns` (-1:
  // none). liburing 2.3 does not wrap the min-wait: the submission queue's
  // tail is published here as liburing's submit does (no SQPOLL ring).
  int enter_min_wait(unsigned n, int64_t window_ns, int64_t timeout_ns) {
    io_uring* r = ring_->get();
    const unsigned tail = r->sq.sqe_tail;
    if (r->sq.sqe_head != tail) {
      r->sq.sqe_head = tail;
      io_uring_smp_store_release(r->sq.ktail, tail);
    }
    const unsigned submit = tail - io_uring_smp_load_acquire(r->sq.khead);
    __kernel_timespec ts = to_kts(timeout_ns < 0 ? 0 : timeout_ns);
    io_uring_getevents_arg arg{};
    arg.pad = static_cast<uint32_t>(std::max<int64_t>(1, window_ns / 1000));  // min_wait_usec
    arg.ts = timeout_ns < 0 ? 0 : reinterpret_cast<uint64_t>(&ts);
    const long rc = ::syscall(__NR_io_uring_enter, r->ring_fd, submit, n,
                              IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof arg);
    return rc < 0 ? -errno : static_cast<int>(rc);
  }

  // Hands every queued submission to the kernel, outside a round. A full
  // completion queue (-EBUSY) is made room in: what is reaped is handed out
  // by the next wait().
  void submit_now() {
    if (!enabled_ && !enable()) return;  // nothing ever goes to the kernel: the next wait() fails
    for (int tries = 0; io_uring_sq_ready(ring_->get()) > 0 && tries < 1000; ++tries) {
      const int rc = io_uring_submit(ring_->get());
      if (rc >= 0 || rc == -EINTR) continue;
      if (rc != -EBUSY && rc != -EAGAIN) return;  // the ring cannot go on: the next wait() says so
      LoopEvent evs[64];
      const int n = reap(evs, 64);
      for (int i = 0; i < n; ++i) post(evs[i]);
    }
  }

  bool enable() {
    if (int rc = ring_->enable(); rc < 0) {
      errno_ = -rc;
      return false;
    }
    enabled_ = true;
    for (size_t i = 0; i < listeners_.size(); ++i) arm_accept(i);
    for (size_t i = 0; i < watches_.size(); ++i) {
      io_uring_sqe* e = ring_->sqe();
      io_uring_prep_poll_add(e, watches_[i].fd, POLLIN);
      io_uring_sqe_set_data64(e, ud(i, kWatch));
    }
    return true;
  }

  void arm_polls() {
    for (uint32_t w : rearm_) {
      Watch& p = polls_[w];
      p.queued = false;
      if (p.state == Slot::Closing) {
        free_watch(w);
        continue;
      }
      if (p.state != Slot::Open || p.armed || !p.events) continue;
      io_uring_sqe* e = ring_->sqe();
      io_uring_prep_poll_add(e, p.fd, p.events);
      io_uring_sqe_set_data64(e, ud(w, kPoll));
      p.armed = p.events;
    }
    rearm_.clear();
  }

  bool on_poll(uint32_t w, int res, LoopEvent& ev) {
    Watch& p = polls_[w];
    p.armed = 0;
    p.removing = false;
    if (p.state != Slot::Open) {
      free_watch(w);
      return false;
    }
    if (p.events && !p.queued) {
      p.queued = true;
      rearm_.push_back(w);
    }
    if (res == -ECANCELED || res == -EINTR || res == -EAGAIN) return false;
    // A poll that failed (the descriptor went bad) says so as an error.
    const int32_t bits = res < 0 ? POLLERR : res;
    ev = LoopEvent{LoopEv::Ready, bits, w, -1, 0, nullptr, p.tag};
    return true;
  }

  void arm_accept(size_t i) {
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_multishot_accept(e, listeners_[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data64(e, ud(i, kAccept));
  }

  // Starts the send of c's oldest piece, unless one is in flight.
  void push(uint32_t c) override {
    Conn& k = conns_[c];
    if (k.sending || k.head == kNone || k.connecting || k.state != Slot::Open) return;
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_send(e, k.fd, piece_data(k, k.head) + k.off, piece_size(k, k.head) - k.off, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(e, ud(c, kSend));
    k.sending = true;
    ++k.inflight;
    ++sends_;
  }

  void maybe_arm(uint32_t c) {
    Conn& k = conns_[c];
    if (!k.want_recv || k.armed || k.eof || k.starved || k.connecting || k.state != Slot::Open) return;
    if (br_->held() >= br_->count() && !br_->returns()) {
      k.starved = true;
      starved_.push_back(c);
      return;
    }
    io_uring_sqe* e = ring_->sqe();
    io_uring_prep_recv_multishot(e, k.fd, nullptr, 0, 0);
    e->flags |= IOSQE_BUFFER_SELECT;
    e->buf_group = kGroup;
    io_uring_sqe_set_data64(e, ud(c, kRecv));
    k.armed = true;
    ++k.inflight;
  }

  void give_back_now() {
    if (!br_->returns()) return;
    br_->publish();
    // Receives that stopped for want of buffers start again.
    if (!starved_.empty()) {
      for (uint32_t c : starved_) {
        Conn& k = conns_[c];
        if (k.state != Slot::Open || !k.starved) continue;
        k.starved = false;
        maybe_arm(c);
      }
      starved_.clear();
    }
  }

  // Closed connections whose operations have all completed are reused.
  void reuse_closed() {
    size_t keep = 0;
    for (uint32_t c : closing_) {
      Conn& k = conns_[c];
      if (k.inflight > 0) {
        closing_[keep++] = c;
        continue;
      }
      drop_queue(k);
      if (!k.borrowed) ::close(k.fd);
      free_slot(c);
    }
    closing_.resize(keep);
  }

  int reap(LoopEvent* evs, int max) {
    unsigned head;
    unsigned seen = 0;
    int n = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring_->get(), head, cqe) {
      if (n == max) break;
      ++seen;
      if (complete(cqe->user_data, cqe->res, cqe->flags, evs[n])) ++n;
    }
    io_uring_cq_advance(ring_->get(), seen);
    return n;
  }

  // Turns one completion into an event in ev; false when it makes none.
  bool complete(uint64_t u, int res, unsigned flags, LoopEvent& ev) {
    const Op op = static_cast<Op>(u & ((1u << kOpBits) - 1));
    const uint32_t c = static_cast<uint32_t>(u >> kOpBits);
    switch (op) {
      case kIgnore:
        return false;
      case kAccept: {
        if (!(flags & IORING_CQE_F_MORE)) arm_accept(c);
        if (res == -ECANCELED || res == -EAGAIN || res == -EINTR || res == -ECONNABORTED) return false;
        ev = LoopEvent{LoopEv::Accept, res, 0, -1, 0, nullptr, listeners_[c].tag};
        return true;
      }
      case kWatch:
        ev = LoopEvent{LoopEv::Wake, res, 0, -1, 0, nullptr, watches_[c].tag};
        return true;
      case kRecv: return on_recv(c, res, flags, ev);
      case kRecvInto: return on_recv_into(c, res, ev);
      case kPoll: return on_poll(c, res, ev);
      case kSend: return on_send(c, res, ev);
      case kConnect: {
        Conn& k = conns_[c];
        --k.inflight;
        if (k.state != Slot::Open) return false;
        k.connecting = false;
        ev = LoopEvent{LoopEv::Connected, res, c};
        if (res == 0) {
          push(c);
          maybe_arm(c);
          if (k.into && !k.armed) {
            uint8_t* p = k.into;
            k.into = nullptr;
            recv_into(c, p, k.into_cap);
          }
        }
        return true;
      }
    }
    return false;
  }

  bool on_recv(uint32_t c, int res, unsigned flags, LoopEvent& ev) {
    Conn& k = conns_[c];
    int32_t id = kNone;
    if (flags & IORING_CQE_F_BUFFER) {
      id = static_cast<int32_t>(flags >> IORING_CQE_BUFFER_SHIFT);
      br_->taken();
    }
    if (!(flags & IORING_CQE_F_MORE)) {
      --k.inflight;
      k.armed = false;
      k.cancelling = false;
    }
    if (k.state != Slot::Open) {
      if (id >= 0) release(id);
      return false;
    }
    if (res > 0 && id >= 0) {
      ev = LoopEvent{LoopEv::Data, res, c, id, static_cast<uint32_t>(res), br_->data(static_cast<uint32_t>(id))};
      if (!k.armed) maybe_arm(c);
      return true;
    }
    if (id >= 0) release(id);
    if (res == -ENOBUFS) {
      if (!k.starved) {
        k.starved = true;
        starved_.push_back(c);
      }
      return false;
    }
    if (res == -ECANCELED || res == -EINTR || res == -EAGAIN) {
      if (!k.armed) maybe_arm(c);
      return false;
    }
    // End of stream (0) or a socket error: the source is gone.
    k.eof = true;
    ev = LoopEvent{LoopEv::Eof, res, c};
    return true;
  }

  bool on_recv_into(uint32_t c, int res, LoopEvent& ev) {
    Conn& k = conns_[c];
    --k.inflight;
    k.armed = false;
    if (k.state != Slot::Open) return false;
    uint8_t* p = k.into;
    if (res == -EINTR || res == -EAGAIN || res == -ECANCELED) {
      k.into = nullptr;
      recv_into(c, p, k.into_cap);
      return false;
    }
    k.into = nullptr;
    if (res > 0) {
      ev = LoopEvent{LoopEv::Data, res, c, -1, static_cast<uint32_t>(res), p};
      return true;
    }
    k.eof = true;
    ev = LoopEvent{LoopEv::Eof, res, c};
    return true;
  }

  bool on_send(uint32_t c, int res, LoopEvent& ev) {
    Conn& k = conns_[c];
    --k.inflight;
    k.sending = false;
    if (k.state != Slot::Open) return false;
    if (res < 0 && res != -EINTR && res != -EAGAIN) {
      drop_queue(k);
      ev = LoopEvent{LoopEv::SendError, res, c};
      return true;
    }
    if (res > 0) advance(k, static_cast<uint32_t>(res));
    push(c);
    ev = LoopEvent{LoopEv::Sent, res, c};
    return true;
  }
};

}  // namespace

std::unique_ptr<Loop> make_uring_backend(const LoopOptions& o) { return std::make_unique<UringLoop>(o); }

}  // namespace tierlab::loop_detail
