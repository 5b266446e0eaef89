// The epoll backend of common/loop.h: non-blocking sockets in one epoll set
// (level-triggered), recv into a free buffer of the loop's pool, sends made
// at once and, when the socket's buffer is full, again on EPOLLOUT. Events
// made outside epoll_wait (a send's completion, a connect that finished at
// once) are handed out by the next wait() before it waits, so a round
// costs no more system calls than the sends themselves and one epoll_wait.
//
// recv_into reads into the caller's memory when the socket is readable.
// poll_open() watches are in the same set (level-triggered). Timeouts are
// to the nanosecond: epoll_pwait2, or where the kernel lacks it (older
// kernels, a sandbox that filters it) a timerfd in the set set to the
// deadline.
#include "common/clock.h"
#include "common/error.h"
#include "common/loop_impl.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

namespace tierlab::loop_detail {
namespace {

constexpr int kMaxEvents = 256;
// epoll data: slot index << kKindBits | kind.
enum Kind : uint64_t { kConn = 0, kListen = 1, kWatch = 2, kPoll = 3, kTimer = 4 };
constexpr uint64_t kKindBits = 3;

class EpollLoop final : public LoopCommon {
 public:
  explicit EpollLoop(const LoopOptions& o) : LoopCommon(o) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) throw RuntimeError(errno_message("epoll_create1", errno));
    mem_.reset(new uint8_t[static_cast<size_t>(o.buffers) * o.buffer_size]);
    bufs_ = mem_.get();
    free_bufs_.reserve(o.buffers);
    for (uint32_t i = o.buffers; i-- > 0;) free_bufs_.push_back(static_cast<int32_t>(i));
    hup_.reserve(o.connections);
    dirty_.reserve(o.connections);
  }
  ~EpollLoop() override {
    for (Conn& k : conns_)
      if (k.fd >= 0 && !k.borrowed) ::close(k.fd);
    if (tfd_ >= 0) ::close(tfd_);
    ::close(ep_);
  }

  const char* backend() const override { return "epoll"; }

  void listen(int fd, uint64_t tag, bool shared) override {
    listeners_.push_back({fd, tag});
    add(fd, EPOLLIN | (shared ? EPOLLEXCLUSIVE : 0u), (listeners_.size() - 1) << kKindBits | kListen);
  }
  void watch(int fd, uint64_t tag) override {
    watches_.push_back({fd, tag});
    add(fd, EPOLLIN, (watches_.size() - 1) << kKindBits | kWatch);
  }

  uint32_t open(int fd) override {
    uint32_t c = take_slot(fd);
    add(fd, 0, uint64_t{c} << kKindBits | kConn);
    return c;
  }
  uint32_t open_borrowed(int fd) override {
    uint32_t c = open(fd);
    dirty_.reserve(conns_.capacity());  // each connection is in the list at most once
    conns_[c].borrowed = true;
    return c;
  }

  void recv_into(uint32_t c, uint8_t* p, uint32_t cap) override {
    Conn& k = conns_[c];
    k.into = p;
    k.into_cap = cap;
    update(c);
  }

  uint32_t poll_open(int fd, uint64_t tag) override {
    uint32_t w = take_watch(fd, tag);
    add(fd, 0, uint64_t{w} << kKindBits | kPoll);
    return w;
  }

  void poll(uint32_t w, uint32_t events) override {
    Watch& p = polls_[w];
    p.events = events;
    if (events == p.armed) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = uint64_t{w} << kKindBits | kPoll;
    epoll_ctl(ep_, EPOLL_CTL_MOD, p.fd, &ev);
    p.armed = events;
  }

  void poll_close(uint32_t w) override {
    Watch& p = polls_[w];
    assert(p.state == Slot::Open);
    epoll_ctl(ep_, EPOLL_CTL_DEL, p.fd, nullptr);
    forget_pending(w, true);
    free_watch(w);
  }

  void close(uint32_t c) override {
    Conn& k = conns_[c];
    assert(k.state == Slot::Open);
    // Out of the set while the number is still the socket's (the set holds
    // the socket, not the number: a borrowed descriptor closed by its owner
    // would leave it there while a duplicate lives).
    if (!k.hup) epoll_ctl(ep_, EPOLL_CTL_DEL, k.fd, nullptr);
    if (!k.borrowed) ::close(k.fd);
    k.fd = -1;  // (not closed again by the destructor: the number may be another's by then)
    drop_queue(k);
    k.state = Slot::Closing;
    k.user = 0;
    k.into = nullptr;
    forget_pending(c);
    // Events of this round may still name c: the slot is reused next round.
    closing_.push_back(c);
  }

  void recv(uint32_t c, bool on) override {
    conns_[c].want_recv = on;
    update(c);
  }

  void connect(uint32_t c, const sockaddr* addr, socklen_t len) override {
    Conn& k = conns_[c];
    int rc = ::connect(k.fd, addr, len);
    if (rc == 0) {
      post({LoopEv::Connected, 0, c});
      push(c);
      update(c);
      return;
    }
    if (errno != EINPROGRESS && errno != EAGAIN) {
      post({LoopEv::Connected, -errno, c});
      return;
    }
    k.connecting = true;
    update(c);
  }

  void release(int32_t buf) override {
    free_bufs_.push_back(buf);
    if (!starved_.empty()) {
      for (uint32_t c : starved_) {
        Conn& k = conns_[c];
        if (k.state != Slot::Open || !k.starved) continue;
        k.starved = false;
        update(c);
      }
      starved_.clear();
    }
  }

  int wait(LoopEvent* evs, int max, int64_t timeout_ns) override {
    return wait_ns(evs, max, timeout_ns, timeout_ns > 0 ? clock_ns(CLOCK_MONOTONIC) + timeout_ns : -1);
  }
  int wait_until(LoopEvent* evs, int max, int64_t deadline_ns) override {
    // A round can end with nothing for the caller before the deadline (an
    // event the loop handled itself): wait again for the time still left.
    for (;;) {
      const int n = wait_ns(
          evs, max, deadline_ns < 0 ? -1 : std::max<int64_t>(0, deadline_ns - clock_ns(CLOCK_MONOTONIC)),
          deadline_ns);
      if (n != 0 || deadline_ns < 0 || interrupted_ || clock_ns(CLOCK_MONOTONIC) >= deadline_ns) return n;
    }
  }

  int wait_ns(LoopEvent* evs, int max, int64_t timeout_ns, int64_t deadline_ns) {
    // Registrations left wider than needed by the last round (a recv_into
    // that delivered and was not asked again) narrow before the wait.
    if (!dirty_.empty()) {
      for (uint32_t c : dirty_) {
        conns_[c].dirty = false;
        update(c);
      }
      dirty_.clear();
    }
    int n = take_pending(evs, max);
    if (n > 0) return n;
    for (uint32_t c : closing_) free_slot(c);
    closing_.clear();
    // Hung-up sockets are out of the epoll set: read what they hold.
    if (!hup_.empty()) {
      for (uint32_t c : hup_) {
        Conn& k = conns_[c];
        if (k.state == Slot::Open && (k.want_recv || k.into) && !k.eof && !k.starved) read(c);
      }
      hup_.erase(std::remove_if(hup_.begin(), hup_.end(),
                                [&](uint32_t c) { return conns_[c].state != Slot::Open || conns_[c].eof; }),
                 hup_.end());
      n = take_pending(evs, max);
      if (n > 0) return n;
    }
    epoll_event ee[kMaxEvents];
    int got = epoll_in(ee, std::min(max, kMaxEvents), timeout_ns, deadline_ns);
    interrupted_ = got < 0 && errno == EINTR;
    if (got < 0) return interrupted_ ? 0 : -errno;
    for (int i = 0; i < got; ++i) {
      const uint64_t d = ee[i].data.u64;
      const uint32_t idx = static_cast<uint32_t>(d >> kKindBits);
      switch (static_cast<Kind>(d & ((1u << kKindBits) - 1))) {
        case kListen: accept_all(idx); break;
        case kWatch: post({LoopEv::Wake, 0, 0, -1, 0, nullptr, watches_[idx].tag}); break;
        case kConn: ready(idx, ee[i].events); break;
        case kPoll:
          if (polls_[idx].state == Slot::Open && polls_[idx].events)
            post({LoopEv::Ready, static_cast<int32_t>(ee[i].events), idx, -1, 0, nullptr, polls_[idx].tag});
          break;
        case kTimer: break;  // the deadline passed: the wait returns
      }
    }
    return take_pending(evs, max);
  }

  void finish(int64_t) override {
    for (uint32_t c : closing_) free_slot(c);
    closing_.clear();
  }

 private:
  struct Reg {
    int fd;
    uint64_t tag;
  };
  int ep_ = -1;
  std::unique_ptr<uint8_t[]> mem_;
  std::vector<int32_t> free_bufs_;
  std::vector<Reg> listeners_, watches_;
  std::vector<uint32_t> hup_;
  std::vector<uint32_t> dirty_;
  int tfd_ = -1;            // the deadline's timerfd, where epoll_pwait2 is missing
  bool tfd_armed_ = false;
  bool interrupted_ = false;  // the last wait ended on a signal

  // epoll_wait with a timeout to the nanosecond.
  int epoll_in(epoll_event* ee, int max, int64_t timeout_ns, int64_t deadline_ns) {
    if (timeout_ns == 0) return epoll_wait(ep_, ee, max, 0);
    if (tfd_ < 0) {
      if (timeout_ns < 0) return epoll_wait(ep_, ee, max, -1);
      timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
      int n = epoll_pwait2(ep_, ee, max, &ts, nullptr);
      if (n >= 0 || errno != ENOSYS) return n;
      tfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
      if (tfd_ < 0) return -1;
      add(tfd_, EPOLLIN, kTimer);
    }
    // Setting the timerfd (or, without a deadline, clearing it) also drops
    // an expiry not yet read, so it is readable only once this one passes.
    if (deadline_ns >= 0 || tfd_armed_) {
      itimerspec its{};
      if (deadline_ns >= 0) {
        its.it_value.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000);
        its.it_value.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000);
      }
      if (timerfd_settime(tfd_, TFD_TIMER_ABSTIME, &its, nullptr) != 0) return -1;
      tfd_armed_ = deadline_ns >= 0;
    }
    return epoll_wait(ep_, ee, max, -1);
  }

  void add(int fd, uint32_t events, uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0) throw RuntimeError(errno_message("epoll_ctl", errno));
  }

  // Makes c's registered events match what it waits for.
  void update(uint32_t c) {
    Conn& k = conns_[c];
    if (k.state != Slot::Open) return;
    const bool in = (k.want_recv || k.into) && !k.eof && !k.starved && !k.connecting;
    if (k.hup) {
      if (in && std::find(hup_.begin(), hup_.end(), c) == hup_.end()) hup_.push_back(c);  // read by the next wait()
      return;
    }
    uint32_t want = (in ? uint32_t{EPOLLIN} : 0u) | (k.connecting || k.blocked ? uint32_t{EPOLLOUT} : 0u);
    if (want == k.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = uint64_t{c} << kKindBits | kConn;
    epoll_ctl(ep_, EPOLL_CTL_MOD, k.fd, &ev);
    k.events = want;
  }

  void accept_all(uint32_t idx) {
    for (int i = 0; i < 64; ++i) {
      int fd = accept4(listeners_[idx].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) post({LoopEv::Accept, -errno, 0, -1, 0, nullptr, listeners_[idx].tag});
        return;
      }
      post({LoopEv::Accept, fd, 0, -1, 0, nullptr, listeners_[idx].tag});
    }
  }

  void ready(uint32_t c, uint32_t events) {
    Conn& k = conns_[c];
    if (k.state != Slot::Open) return;
    if (k.connecting) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      int err = 0;
      socklen_t len = sizeof err;
      if (getsockopt(k.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      k.connecting = false;
      post({LoopEv::Connected, -err, c});
      if (err == 0) push(c);
      update(c);
      return;
    }
    if ((events & EPOLLOUT) && k.blocked) {
      k.blocked = false;
      push(c);
      if (k.state != Slot::Open) return;
    }
    if (events & EPOLLIN) {
      read(c);
    } else if (events & (EPOLLHUP | EPOLLERR)) {
      // Not reading now (back-pressure or no buffer): level-triggered, the
      // hang-up would be reported on every wait. Take the socket out of the
      // set; it is read directly once the owner wants data again.
      k.hup = true;
      epoll_ctl(ep_, EPOLL_CTL_DEL, k.fd, nullptr);
      k.events = 0;
      if (k.blocked) {
        k.blocked = false;
        push(c);
      }
      update(c);
    }
  }

  void read(uint32_t c) {
    Conn& k = conns_[c];
    if (k.into) return read_into(c);
    if (!k.want_recv) return;
    if (free_bufs_.empty()) {
      k.starved = true;
      starved_.push_back(c);
      update(c);
      return;
    }
    int32_t id = free_bufs_.back();
    uint8_t* p = bufs_ + static_cast<size_t>(id) * opts_.buffer_size;
    ssize_t n = ::recv(k.fd, p, opts_.buffer_size, 0);
    if (n > 0) {
      free_bufs_.pop_back();
      post({LoopEv::Data, static_cast<int32_t>(n), c, id, static_cast<uint32_t>(n), p});
      return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    k.eof = true;
    post({LoopEv::Eof, n == 0 ? 0 : -errno, c});
    update(c);
  }

  void read_into(uint32_t c) {
    Conn& k = conns_[c];
    ssize_t n = ::recv(k.fd, k.into, k.into_cap, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    uint8_t* p = k.into;
    k.into = nullptr;
    if (n > 0) {
      post({LoopEv::Data, static_cast<int32_t>(n), c, -1, static_cast<uint32_t>(n), p});
      // EPOLLIN stays registered: the owner usually asks again in this
      // round; if not, the next wait() narrows it.
      if (!k.dirty) {
        k.dirty = true;
        dirty_.push_back(c);
      }
      return;
    }
    k.eof = true;
    post({LoopEv::Eof, n == 0 ? 0 : -errno, c});
    update(c);
  }

  // Sends what c's queue holds until it is empty or the socket is full.
  void push(uint32_t c) override {
    Conn& k = conns_[c];
    if (k.connecting || k.blocked || k.state != Slot::Open) return;
    uint32_t sent = 0;
    while (k.head != kNone) {
      ssize_t w = ::send(k.fd, piece_data(k, k.head) + k.off, piece_size(k, k.head) - k.off, MSG_NOSIGNAL);
      if (w > 0) {
        advance(k, static_cast<uint32_t>(w));
        sent += static_cast<uint32_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        k.blocked = true;
        break;
      }
      const int err = w < 0 ? errno : EPIPE;
      drop_queue(k);
      if (sent > 0) post({LoopEv::Sent, static_cast<int32_t>(sent), c});
      post({LoopEv::SendError, -err, c});
      return;
    }
    if (sent > 0) post({LoopEv::Sent, static_cast<int32_t>(sent), c});
    update(c);
  }
};

}  // namespace

std::unique_ptr<Loop> make_epoll_backend(const LoopOptions& o) { return std::make_unique<EpollLoop>(o); }

}  // namespace tierlab::loop_detail
