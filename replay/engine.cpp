// The replay engine: worker threads, each running many sessions over one
// wait: an io_uring (Options::io) or epoll.
//
// libpq opens every connection (authentication, TLS, GSS), on the
// connection thread (replay/connector.h), which hands each one to its
// worker through the worker's inbox, an eventfd in its epoll set; the same
// thread closes them. A session on a plaintext connection is then driven
// directly: each unit's request is
// the plan's protocol messages (a Query, or the extended-protocol messages
// up to a Sync), written to the socket as they are, and the answers are
// read into the session's buffer and acted on as they arrive (statement
// outcomes from CommandComplete and ErrorResponse, the transaction status
// from ReadyForQuery; rows are skipped unread). A TLS or GSS-encrypted
// session, or every session with Options::direct off, stays on libpq.
//
// On the io_uring loop a directly driven session's socket leaves the epoll
// set once connected: a receive into its buffer is always armed, and its
// requests go out as send submissions; every submission queued in a round
// reaches the kernel with the wait for the next completion, in one
// io_uring_enter, where epoll takes a system call per send, per receive
// and per wait. libpq's sessions and the inbox stay on the epoll set, and
// the ring polls the epoll descriptor. Lag and latency count from when a
// unit's send is queued; it leaves in that round's io_uring_enter.
//
// Steady state (a connected session sending units and reaping results)
// allocates nothing on tierlab's side: session slots and their receive
// buffers, the timer heap, the epoll event array, the ring and its
// completion array, statistics and parameter
// arrays are sized before the workers start or at connect; units are sent
// straight from the Plan's tables. On libpq, libpq allocates its PGresults
// (freed with PQclear at once) and grows its own buffers; connecting and
// failing sessions allocate (libpq's connection, the first error message).
//
// On libpq, extended-protocol units are sent in pipeline mode, so the
// captured messages (Parse, Bind, Describe, Execute, ..., Sync) leave in one
// write as the client sent them; a Simple or COPY unit leaves pipeline mode
// first (libpq allows simple Query only outside it). So does a unit that is
// one Execute of a prepared statement, the commonest by far: outside
// pipeline mode PQsendQueryPrepared sends the same Bind, Describe, Execute
// and Sync in one write, and leaves one result fewer to reap (no
// PIPELINE_SYNC).
#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "common/uring.h"
#include "replay/connector.h"
#include "replay/plan.h"
#include "replay/schedule.h"
#include "replay/session.h"
#include "replay/stats.h"
#include "replay/unit_log.h"
#include "replay/wire.h"

#include <libpq-fe.h>
#include <liburing.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

namespace tierlab::replay {
namespace {

static_assert(sizeof(Oid) == sizeof(uint32_t));

constexpr uint32_t kNone = UINT32_MAX;
constexpr int kMaxEvents = 256;
// Timed replays ask the scheduler for this time slice for each worker
// thread (request_short_slice; the kernel's shortest, Linux 6.12 and later):
// a worker waking for a scheduled send or an answer then preempts a target
// backend busy on its CPU instead of waiting out the backend's slice, at
// the same fair share of the CPUs. Not with Options::realtime (SCHED_FIFO
// preempts anyway; the call leaves such a thread alone) nor at max speed
// (no deadlines; there the preemptions cost throughput).
constexpr uint64_t kWorkerSliceNs = kShortestSliceNs;
// epoll data of the timeout's timerfd and of the worker's inbox of opened
// connections (slots are numbered from 0).
constexpr uint64_t kTimerTag = ~uint64_t{0};
constexpr uint64_t kInboxTag = ~uint64_t{0} - 1;
// io_uring user_data: a slot's operation (slot << 2 | kOpRecv or kOpSend),
// or one of the tags below (their low bits are 3).
constexpr uint64_t kOpRecv = 0, kOpSend = 1;
constexpr uint64_t kEpollTag = ~uint64_t{0};      // the poll on the epoll fd
constexpr uint64_t kIgnoreTag = ~uint64_t{0} - 4;  // cancellations
constexpr unsigned kRingEntries = 1024;
// One thread submits and reaps; completions are posted when it waits. The
// completion queue holds a receive's answer for 8192 sessions at once
// (beyond, the kernel keeps them until there is room).
RingOptions ring_options() {
  RingOptions o;
  o.entries = kRingEntries;
  o.cq_entries = 8192;
  o.single_task = true;
  o.submit_all = true;
  return o;
}
// A directly driven session's receive buffer. Messages the engine only
// skips (rows, row descriptions, COPY data) may be any size; one it reads
// (CommandComplete, ErrorResponse, ReadyForQuery, COPY responses) is read
// from its first kInBuf bytes.
constexpr uint32_t kInBuf = 16384;
constexpr uint32_t kMaxMessage = 1u << 30;
// CopyDone, for a COPY FROM STDIN the capture holds no data for (it began
// before the capture); after a COPY started by Execute, a Sync follows (the
// server ignored the unit's Sync while it waited for the data), as libpq's
// PQputCopyEnd sends it.
constexpr char kCopyDone[10] = {'c', 0, 0, 0, 4, 'S', 0, 0, 0, 4};

Nanos now_ns() { return clock_ns(CLOCK_MONOTONIC); }

// State shared by all workers.
struct Shared {
  const Plan* plan = nullptr;
  const Options* opts = nullptr;
  Schedule sched;
  std::vector<ConnParams> params;     // by plan session
  std::vector<uint64_t> gate;         // max speed: sessions that must end first
  std::atomic<uint64_t> ended{0};     // sessions done (any worker)
  // Max speed starts as pgbench does: the sessions that start at once (gate
  // 0) connect first, and none sends until all of them are connected (or
  // failed). The clock starts then, so tps is "without initial connection
  // time", comparable with pgbench's.
  uint64_t initial = 0;               // sessions with gate 0
  std::atomic<uint64_t> initial_ready{0};
  std::atomic<Nanos> start{0};        // when the last of them connected
  bool uring = false;                 // workers run the io_uring loop
  int log_fd = -1;                    // Options::log_path, -1 none
  std::mutex log_lock;                // one worker writes to it at a time
  Nanos unix_offset = 0;              // CLOCK_REALTIME - CLOCK_MONOTONIC, for the log
  Connector* connector = nullptr;     // opens and closes the sessions' connections
  std::atomic<bool> stop{false};      // stop every session now (SIGINT, SIGTERM)
};

// One session slot of a worker.
struct Slot {
  uint32_t session = 0;
  State state = State::Pending;
  bool pipeline = false;
  bool copy_end_sent = false;
  bool want_out = false;
  uint8_t nulls = 0;                 // consecutive NULL results (pipeline)
  PGconn* conn = nullptr;
  int fd = -1;                       // fd registered with epoll, -1 none
  uint32_t events = 0;               // registered interest
  uint32_t next = 0;                 // next unit, index within the session
  uint32_t unit = kNone;             // unit in flight (Plan::units)
  uint32_t op = 0;                   // Extended: next op to get its result
  uint32_t copy = 0;                 // Copy: next chunk to queue
  Outcome agg;                       // Simple/Copy: answers folded
  bool pending_error = false;        // Extended: error of a non-Execute op
  char pending_state[6] = {0};
  Nanos sent_at = 0;
  Nanos lag = 0, own_lag = 0;        // of the unit in flight (timed replays)
  char unit_state[6] = {0};          // first error of the unit in flight; "" none
  Nanos free_at = 0;                 // when the session last became Idle
  uint64_t stmts_since_idle = 0;
  bool txn_failed = false;           // an error since the session was last idle
  // Driven directly (a plaintext connection, libpq only connected it).
  bool direct = false;
  bool aborted = false;              // an ErrorResponse in this unit
  char ready = 'I';                  // status of the last ReadyForQuery
  const char* out = nullptr;         // bytes still to send
  uint32_t out_left = 0;
  bool done_after_send = false;      // ReadyForQuery came before `out` was sent
  uint32_t skip = 0;                 // bytes of a message still to discard
  uint32_t in_off = 0, in_len = 0;
  std::unique_ptr<char[]> in;        // kInBuf bytes, from connect
  // On the worker's io_uring (every directly driven session of a worker
  // that runs one: on_ring()), its socket is out of the epoll set; a
  // receive is armed while it is connected, and at most one send is in
  // flight.
  bool recv_armed = false;
  bool send_inflight = false;
};

class Worker {
 public:
  Worker(Shared& sh, int index, std::vector<uint32_t> sessions, Live& live)
      : sh_(sh), plan_(*sh.plan), index_(index), slots_(sessions.size()),
        timers_(static_cast<uint32_t>(sessions.size())), stats_(sh.plan->fingerprints.size()),
        live_(live), log_(sh.log_fd, &sh.log_lock) {
    for (size_t i = 0; i < sessions.size(); ++i) slots_[i].session = sessions[i];
    held_.reserve(sessions.size());
    opened_.reserve(sessions.size());
    started_ = !sh.sched.max_speed || sh.initial == 0;
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) throw RuntimeError(errno_message("epoll_create1", errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kInboxTag;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, sh.connector->inbox_fd(index), &ev) != 0) {
      int e = errno;
      close(ep_);
      throw RuntimeError(errno_message("epoll_ctl (inbox)", e));
    }
  }
  ~Worker() {
    // Operations in flight point into the slots' buffers: end them first.
    for (Slot& s : slots_)
      if (s.conn) PQfinish(s.conn);
    if (ep_ >= 0) close(ep_);
    if (tfd_ >= 0) close(tfd_);
  }

  void run() {
    if (sh_.uring) start_ring();
    Nanos now = now_ns();
    active_ = slots_.size();
    // Timed: each session's connect is a timer. Max speed: sessions start
    // when enough earlier sessions have ended (order of their gates).
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (sh_.sched.max_speed) gated_.push_back(i);
      else timers_.set(i, sh_.sched.at(plan_.sessions[slots_[i].session].begin));
    }
    std::sort(gated_.begin(), gated_.end(), [&](uint32_t a, uint32_t b) {
      return sh_.gate[slots_[a].session] < sh_.gate[slots_[b].session];
    });
    epoll_event evs[kMaxEvents];
    while (active_ > 0) {
      now = now_ns();
      if (sh_.stop.load(std::memory_order_relaxed)) {
        stop_all(now);
        break;
      }
      if (!started_) release(now);
      while (gate_next_ < gated_.size() &&
             sh_.gate[slots_[gated_[gate_next_]].session] <= sh_.ended.load(std::memory_order_acquire)) {
        connect(gated_[gate_next_++], now);
      }
      while (!timers_.empty() && timers_.top_due() <= now) on_timer(timers_.pop(), now);
      if (active_ == 0) break;
      timespec ts, *tsp = nullptr;
      Nanos wait = -1;
      if (!timers_.empty()) wait = std::max<Nanos>(0, timers_.top_due() - now_ns());
      if (gate_next_ < gated_.size()) wait = wait < 0 ? 1000000 : std::min<Nanos>(wait, 1000000);
      // Connected sessions held for the start: look again soon (the other
      // workers' sessions may be the last to connect).
      if (!started_ && !held_.empty()) wait = wait < 0 ? 20000 : std::min<Nanos>(wait, 20000);
      if (wait >= 0) {
        ts.tv_sec = wait / 1000000000;
        ts.tv_nsec = wait % 1000000000;
        tsp = &ts;
      }
      if (ring_on_) {
        wait_ring(wait, evs);
        continue;
      }
      int n = wait_events(evs, tsp);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw RuntimeError(errno_message("epoll wait", errno));
      }
      dispatch(evs, n);
    }
    log_.flush();
  }

  // Sets up the worker's io_uring (on the thread that runs it: the ring is
  // single-issuer). What the loop needs of the kernel was checked before
  // the workers started (uring_unsupported).
  void start_ring() {
    try {
      ring_.emplace(ring_options());
    } catch (const RuntimeError& e) {
      throw RuntimeError(std::string("replay: io_uring: setting up a worker's ring: ") + e.what());
    }
    ring_on_ = true;
    arm_epoll();
  }

  Stats& stats() { return stats_; }
  Nanos last_end() const { return last_end_; }
  const UnitLog& log() const { return log_; }

 private:
  const Session& session_of(const Slot& s) const { return plan_.sessions[s.session]; }
  const Unit& unit_of(const Slot& s) const { return plan_.units[s.unit]; }

  // Waits for events until `timeout` has passed (nullptr: no limit).
  // epoll_pwait2 (Linux 5.11) takes a nanosecond timeout; where the kernel
  // lacks it (older kernels, a container on an older host, a sandbox that
  // filters it) a timerfd in the epoll set carries the timeout instead, so a
  // timed replay keeps its sub-millisecond wake-ups either way.
  int wait_events(epoll_event* evs, const timespec* timeout) {
    if (tfd_ < 0) {
      int n = epoll_pwait2(ep_, evs, kMaxEvents, timeout, nullptr);
      if (n >= 0 || errno != ENOSYS) return n;
      tfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
      if (tfd_ < 0) throw RuntimeError(errno_message("timerfd_create", errno));
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kTimerTag;
      if (epoll_ctl(ep_, EPOLL_CTL_ADD, tfd_, &ev) != 0)
        throw RuntimeError(errno_message("epoll_ctl (timerfd)", errno));
    }
    if (timeout && timeout->tv_sec == 0 && timeout->tv_nsec == 0) return epoll_wait(ep_, evs, kMaxEvents, 0);
    // Arming (or, without a timeout, disarming) also clears an expiry not
    // yet read, so the timerfd is readable only once this timeout passes.
    itimerspec its{};
    if (timeout) its.it_value = *timeout;
    if (timerfd_settime(tfd_, 0, &its, nullptr) != 0)
      throw RuntimeError(errno_message("timerfd_settime", errno));
    return epoll_wait(ep_, evs, kMaxEvents, -1);
  }

  void dispatch(const epoll_event* evs, int n) {
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = evs[i].data.u64;
      if (tag == kInboxTag) on_inbox();
      else if (tag != kTimerTag) on_event(static_cast<uint32_t>(tag), evs[i].events);
    }
  }

  // --- the io_uring loop --------------------------------------------------
  // Directly driven sessions send and receive through the ring; the epoll
  // set (libpq sessions, the inbox) is one poll on it. One
  // io_uring_enter per round submits every queued send and receive and
  // waits for the first completion or the timeout.

  io_uring_sqe* sqe() {
    io_uring_sqe* q = io_uring_get_sqe(ring());
    if (!q) {
      io_uring_submit(ring());
      q = io_uring_get_sqe(ring());
      if (!q) throw RuntimeError("io_uring: no submission queue entry free");
    }
    return q;
  }

  // A one-shot poll: re-armed after each drain of the epoll set, so what
  // stays ready (level-triggered) completes it again at once.
  void arm_epoll() {
    io_uring_sqe* q = sqe();
    io_uring_prep_poll_add(q, ep_, POLLIN);
    io_uring_sqe_set_data64(q, kEpollTag);
  }

  void wait_ring(Nanos wait, epoll_event* evs) {
    int rc;
    if (wait == 0) {
      rc = io_uring_submit_and_get_events(ring());
    } else {
      __kernel_timespec ts{};
      ts.tv_sec = wait / 1000000000;
      ts.tv_nsec = wait % 1000000000;
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_submit_and_wait_timeout(ring(), &cqe, 1, wait > 0 ? &ts : nullptr, nullptr);
    }
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN)
      throw RuntimeError(errno_message("io_uring wait", -rc));
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    bool epoll_ready = false;
    // Completions are handled after the CQ is advanced past them: a handler
    // may submit (a cancel, a full SQ), which must not see them again.
    io_uring_for_each_cqe(ring(), head, cqe) {
      if (seen == kMaxCqes) break;
      cqes_[seen].user_data = cqe->user_data;
      cqes_[seen].res = cqe->res;
      ++seen;
    }
    io_uring_cq_advance(ring(), seen);
    for (unsigned i = 0; i < seen; ++i) {
      uint64_t ud = cqes_[i].user_data;
      if (ud == kEpollTag) epoll_ready = true;
      else if (ud == kIgnoreTag) continue;
      else on_completion(static_cast<uint32_t>(ud >> 2), ud & 3, cqes_[i].res);
    }
    if (epoll_ready) {
      int n;
      do {
        n = epoll_wait(ep_, evs, kMaxEvents, 0);
        if (n < 0 && errno != EINTR) throw RuntimeError(errno_message("epoll wait", errno));
        if (n > 0) dispatch(evs, n);
      } while (n == kMaxEvents);
      arm_epoll();
    }
  }

  // A directly driven session's I/O goes through the ring once connected
  // (`direct` is set then).
  bool on_ring(const Slot& s) const { return ring_on_ && s.direct; }

  // Moves a connected direct session from the epoll set to the ring.
  void to_ring(uint32_t slot) {
    Slot& s = slots_[slot];
    if (s.fd >= 0) epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
    s.fd = PQsocket(s.conn);
    s.events = 0;
    arm_recv(slot);
  }

  void arm_recv(uint32_t slot) {
    Slot& s = slots_[slot];
    if (s.in_off == s.in_len) s.in_off = s.in_len = 0;
    io_uring_sqe* q = sqe();
    io_uring_prep_recv(q, s.fd, s.in.get() + s.in_len, kInBuf - s.in_len, 0);
    io_uring_sqe_set_data64(q, uint64_t{slot} << 2 | kOpRecv);
    s.recv_armed = true;
  }

  void queue_send(uint32_t slot) {
    Slot& s = slots_[slot];
    io_uring_sqe* q = sqe();
    io_uring_prep_send(q, s.fd, s.out, s.out_left, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(q, uint64_t{slot} << 2 | kOpSend);
    s.send_inflight = true;
  }

  void on_completion(uint32_t slot, uint64_t op, int res) {
    Slot& s = slots_[slot];
    if (op == kOpRecv) s.recv_armed = false;
    else s.send_inflight = false;
    if (s.state == State::Done || !s.conn) return;  // finished: a cancellation
    Nanos now = now_ns();
    PGconn* c = s.conn;
    if (op == kOpSend) {
      if (res < 0 && (res == -EINTR || res == -EAGAIN)) return queue_send(slot);
      if (res <= 0) return fail(slot, now, res < 0 ? std::strerror(-res) : "could not send to the server");
      s.out += res;
      s.out_left -= static_cast<uint32_t>(res);
      if (s.out_left > 0) return queue_send(slot);
      return sent(slot);
    }
    if (res == 0) return fail(slot, now, "the server closed the connection unexpectedly");
    if (res < 0) {
      if (res == -EINTR || res == -EAGAIN || res == -ENOBUFS) return arm_recv(slot);
      return fail(slot, now, std::strerror(-res));
    }
    s.in_len += static_cast<uint32_t>(res);
    if (!parse_direct(slot, now) || s.conn != c || s.state == State::Done) return;
    arm_recv(slot);
  }

  void move(Slot& s, Event e) {
    State next = transition(s.state, e);
    // Invariant: the engine only takes transitions the state machine allows.
    assert(next != State::Invalid);
    s.state = next;
  }

  // Keeps the epoll registration in step with libpq's socket and our
  // interest (read always, write while libpq has unsent bytes).
  void watch(uint32_t slot, bool out) {
    Slot& s = slots_[slot];
    int fd = PQsocket(s.conn);
    uint32_t want = EPOLLIN | (out ? EPOLLOUT : 0u);
    s.want_out = out;
    if (fd != s.fd) {
      if (s.fd >= 0) epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
      s.fd = -1;
      if (fd < 0) return;
      epoll_event ev{};
      ev.events = want;
      ev.data.u64 = slot;
      if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) == 0) {
        s.fd = fd;
        s.events = want;
      }
      return;
    }
    if (want != s.events && s.fd >= 0) {
      epoll_event ev{};
      ev.events = want;
      ev.data.u64 = slot;
      epoll_ctl(ep_, EPOLL_CTL_MOD, s.fd, &ev);
      s.events = want;
    }
  }

  void finish_slot(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    if (on_ring(s)) {
      // Its operations end as cancelled (their buffers outlive them: slots
      // last as long as the worker's ring).
      for (uint64_t op : {kOpRecv, kOpSend}) {
        if (!(op == kOpRecv ? s.recv_armed : s.send_inflight)) continue;
        io_uring_sqe* q = sqe();
        io_uring_prep_cancel64(q, uint64_t{slot} << 2 | op, 0);
        io_uring_sqe_set_data64(q, kIgnoreTag);
      }
      // The connection thread closes the socket, and may open another
      // with its number at once: a receive or send still queued here
      // names the socket by number, so it goes to the kernel first.
      if (s.recv_armed || s.send_inflight) io_uring_submit(ring());
    } else if (s.fd >= 0) {
      epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
    }
    s.fd = -1;
    sh_.connector->close(s.conn);
    s.conn = nullptr;
    timers_.cancel(slot);
    --active_;
    last_end_ = std::max(last_end_, now);
    sh_.ended.fetch_add(1, std::memory_order_release);
  }

  // The replay is stopping: every session ends where it is. A unit in
  // flight is not counted (no answer); a connection still being opened is
  // closed by the connection thread when it stops.
  void stop_all(Nanos now) {
    for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
      Slot& s = slots_[slot];
      if (s.state == State::Done) continue;
      if (s.state != State::Pending) ++stats_.sessions_stopped;
      move(s, Event::Stopped);
      finish_slot(slot, now);
    }
  }

  // Max speed: counts a session with gate 0 that connected or failed to.
  void initial_settled(const Slot& s) {
    if (sh_.sched.max_speed && sh_.gate[s.session] == 0) sh_.initial_ready.fetch_add(1, std::memory_order_acq_rel);
  }

  // Max speed: once every session with gate 0 has settled, the clock starts
  // (the first worker to see it sets it) and the held sessions go.
  void release(Nanos now) {
    if (sh_.initial_ready.load(std::memory_order_acquire) < sh_.initial) return;
    Nanos none = 0;
    sh_.start.compare_exchange_strong(none, now, std::memory_order_acq_rel);
    started_ = true;
    for (uint32_t slot : held_) {
      if (slots_[slot].state != State::Idle) continue;  // failed meanwhile
      slots_[slot].free_at = now;
      schedule_next(slot, now);
    }
    held_.clear();
  }

  // The session is lost: `why`, else libpq's message.
  void fail(uint32_t slot, Nanos now, const char* why = nullptr) {
    Slot& s = slots_[slot];
    if (s.state == State::Pending || s.state == State::Connecting) initial_settled(s);
    ++stats_.sessions_failed;
    if (stats_.first_session_error.empty()) {
      const char* msg = why ? why : s.conn ? PQerrorMessage(s.conn) : "out of memory";
      std::string m = msg;
      std::replace(m.begin(), m.end(), '\n', ' ');
      while (!m.empty() && m.back() == ' ') m.pop_back();
      stats_.first_session_error = m;
    }
    move(s, Event::Failed);
    finish_slot(slot, now);
  }

  // The connection thread opens it and hands it back (on_inbox).
  void connect(uint32_t slot, Nanos) {
    Slot& s = slots_[slot];
    move(s, Event::Due);
    sh_.connector->open(index_, slot, s.session);
  }

  void on_inbox() {
    sh_.connector->take(index_, opened_);
    const Nanos now = now_ns();
    for (const Connector::Opened& o : opened_) {
      Slot& s = slots_[o.slot];
      s.conn = o.conn;
      if (o.why || !o.conn || PQstatus(o.conn) != CONNECTION_OK) fail(o.slot, now, o.why);
      else connected(o.slot, now);
    }
  }

  void connected(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    if (PQsetnonblocking(s.conn, 1) != 0) return fail(slot, now);
    s.direct = sh_.opts->direct && !PQsslInUse(s.conn) && !PQgssEncInUse(s.conn);
    if (s.direct && !s.in) s.in = std::make_unique_for_overwrite<char[]>(kInBuf);  // pages touched as used
    if (s.direct) ++stats_.sessions_direct;
    move(s, Event::Connected);
    s.free_at = now;
    if (s.direct && ring_on_) to_ring(slot);
    else watch(slot, false);
    if (!started_) {
      initial_settled(s);
      held_.push_back(slot);
      return release(now);
    }
    schedule_next(slot, now);
  }

  // From Idle: arm the timer for the next unit or for the session's end
  // (or act at once when that time has passed).
  void schedule_next(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    const Session& ps = session_of(s);
    Nanos due = s.next < ps.n_units
                    ? sh_.sched.at(plan_.units[plan_.session_units[ps.first_unit + s.next]].ts)
                    : sh_.sched.at(ps.end);
    if (due <= now) on_timer(slot, now);
    else timers_.set(slot, due);
  }

  void on_timer(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    if (s.state == State::Pending) return connect(slot, now);
    if (s.state != State::Idle) return;  // still busy: sends when done
    const Session& ps = session_of(s);
    if (s.next >= ps.n_units) {
      move(s, Event::Ended);
      return finish_slot(slot, now);
    }
    s.unit = plan_.session_units[ps.first_unit + s.next];
    send_unit(slot, now);
  }

  void send_unit(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    const Unit& u = unit_of(s);
    PGconn* c = s.conn;
    // Lag and latency count from the send (on the io_uring loop: from when
    // it is queued), not from when this pass of the loop started.
    now = now_ns();
    s.lag = s.own_lag = 0;
    s.unit_state[0] = 0;
    if (!sh_.sched.max_speed) {
      Nanos due = sh_.sched.at(u.ts);
      s.lag = std::max<Nanos>(0, now - due);
      stats_.lag.record(s.lag);
      // The part of it spent in tierlab: from the later of the due time and
      // the previous answer (the target's share) to the send.
      s.own_lag = std::max<Nanos>(0, now - std::max(due, s.free_at));
      stats_.own_lag.record(s.own_lag);
      live_.add(live_.lag_sum_ns, static_cast<double>(s.lag));
      live_.add(live_.lag_n, 1);
    }
    s.op = 0;
    s.copy = 0;
    s.copy_end_sent = false;
    s.nulls = 0;
    s.pending_error = false;
    s.agg = Outcome{};
    s.sent_at = now;
    if (!s.direct) stats_.unsupported += u.libpq_unsupported;
    if (s.direct) {
      s.aborted = false;
      s.out = u.wire;
      s.out_left = u.wire_len;
      move(s, Event::UnitSent);
      send_direct(slot, now);
      return;
    }
    const bool one_execute = u.kind == UnitKind::Extended && u.n_ops == 1 &&
                             plan_.ops[u.first_op].kind == OpKind::Execute;
    const bool pipelined = u.kind == UnitKind::Extended && !one_execute;
    bool ok = true;
    if (s.pipeline != pipelined) {
      ok = (pipelined ? PQenterPipelineMode(c) : PQexitPipelineMode(c)) == 1;
      if (ok) s.pipeline = pipelined;
    }
    if (!pipelined) {
      ok = ok && (one_execute ? send_execute(c, plan_.ops[u.first_op]) : PQsendQuery(c, u.sql) == 1);
    } else {
      for (uint32_t i = 0; ok && i < u.n_ops; ++i) {
        const Op& op = plan_.ops[u.first_op + i];
        switch (op.kind) {
          case OpKind::Prepare:
            ok = PQsendPrepare(c, op.name, op.sql, op.nparams,
                               op.nparams ? reinterpret_cast<const Oid*>(plan_.types.data() + op.types)
                                          : nullptr) == 1;
            break;
          case OpKind::Execute:
            ok = send_execute(c, op);
            break;
          case OpKind::DescribeStmt:
            ok = PQsendDescribePrepared(c, op.name) == 1;
            break;
          case OpKind::DescribePortal:
            ok = PQsendDescribePortal(c, op.name) == 1;
            break;
          case OpKind::Deallocate:
            ok = PQsendQueryParams(c, op.sql, 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
            break;
        }
      }
      ok = ok && PQpipelineSync(c) == 1;
    }
    if (!ok) return fail(slot, now);
    move(s, Event::UnitSent);
    int f = PQflush(c);
    if (f < 0) return fail(slot, now);
    watch(slot, f == 1);
  }

  bool send_execute(PGconn* c, const Op& op) {
    return PQsendQueryPrepared(c, op.name, op.nparams, plan_.param_values.data() + op.params,
                               plan_.param_lengths.data() + op.params,
                               plan_.param_formats.data() + op.params, op.result_format) == 1;
  }

  void on_event(uint32_t slot, uint32_t ev) {
    Slot& s = slots_[slot];
    PGconn* const c = s.conn;
    Nanos now = now_ns();
    if (s.state == State::Done || !s.conn) return;
    if (s.direct) {
      // Answers first: one may end the unit before its request has left
      // (a COPY failing on its first rows).
      if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        receive_direct(slot, now);
        if (s.conn != c || s.state == State::Done) return;
      }
      if ((ev & EPOLLOUT) && s.want_out) send_direct(slot, now);
      return;
    }
    if ((ev & EPOLLOUT) && s.want_out) {
      if (s.state == State::CopyIn) {
        if (!push_copy(slot, now)) return;
      } else {
        int f = PQflush(s.conn);
        if (f < 0) return fail(slot, now);
        watch(slot, f == 1);
      }
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      if (PQconsumeInput(s.conn) == 0) return fail(slot, now);
      if (s.state == State::Idle) {
        // Nothing is expected: notices, notifications, parameter changes.
        while (PGnotify* n = PQnotifies(s.conn)) PQfreemem(n);
        return;
      }
      if (s.state == State::Busy || s.state == State::CopyOut) drain(slot, now);
    }
  }

  // --- directly driven sessions -------------------------------------------

  // Sends what is left of s.out; false when the session failed.
  bool send_direct(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    if (on_ring(s)) {
      // Leaves with the next io_uring_enter; its completion goes on.
      if (s.out_left > 0 && !s.send_inflight) queue_send(slot);
      else if (s.out_left == 0) sent(slot);
      return true;
    }
    while (s.out_left > 0) {
      ssize_t n = ::send(s.fd, s.out, s.out_left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        s.out += n;
        s.out_left -= static_cast<uint32_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        watch(slot, true);
        return true;
      }
      fail(slot, now, n < 0 ? std::strerror(errno) : "could not send to the server");
      return false;
    }
    if (s.want_out) watch(slot, false);
    sent(slot);
    return true;
  }

  // All of s.out has left: a unit whose ReadyForQuery came first is done.
  void sent(uint32_t slot) {
    Slot& s = slots_[slot];
    if (!s.done_after_send) return;
    s.done_after_send = false;
    unit_done(slot, now_ns());
  }

  // Reads what the server sent and acts on every complete message.
  void receive_direct(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    PGconn* c = s.conn;
    for (;;) {
      if (s.in_off == s.in_len) s.in_off = s.in_len = 0;
      uint32_t room = kInBuf - s.in_len;
      ssize_t n = ::recv(s.fd, s.in.get() + s.in_len, room, 0);
      if (n == 0) return fail(slot, now, "the server closed the connection unexpectedly");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return fail(slot, now, std::strerror(errno));
      }
      s.in_len += static_cast<uint32_t>(n);
      if (!parse_direct(slot, now) || s.conn != c || s.state == State::Done) return;
      // Level-triggered: a short read took all there was; epoll reports more.
      if (static_cast<uint32_t>(n) < room) return;
    }
  }

  // Acts on the complete messages in the buffer; false when the session
  // ended or failed.
  bool parse_direct(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    PGconn* c = s.conn;
    for (;;) {
      if (s.skip) {
        uint32_t k = std::min(s.skip, s.in_len - s.in_off);
        s.in_off += k;
        s.skip -= k;
        if (s.skip) return true;
      }
      uint32_t avail = s.in_len - s.in_off;
      const char* m = s.in.get() + s.in_off;
      if (avail >= 5) {
        uint32_t len = wire::get32(m + 1);
        if (len < 4 || len > kMaxMessage) {
          fail(slot, now, "invalid message length from the server (protocol out of step)");
          return false;
        }
        const char type = m[0];
        const bool read = type == 'C' || type == 'E' || type == 'Z' || type == 'G' || type == 'H' ||
                          type == 'W';
        const uint32_t whole = std::min<uint32_t>(len + 1, kInBuf);
        if (!read || avail >= whole) {
          const uint32_t used = read ? whole : 5;
          s.in_off += used;
          s.skip = len + 1 - used;
          if (!on_message(slot, type, m + 5, used - 5, now)) return false;
          if (s.conn != c || s.state == State::Done) return false;
          continue;
        }
      }
      // An incomplete message: move it to the front for the next read.
      if (s.in_off > 0) {
        std::memmove(s.in.get(), m, avail);
        s.in_off = 0;
        s.in_len = avail;
      }
      return true;
    }
  }

  // One message from the server (`body`: its first `len` bytes, for the
  // types parse_direct reads); false when the session failed.
  bool on_message(uint32_t slot, char type, const char* body, uint32_t len, Nanos now) {
    Slot& s = slots_[slot];
    const bool busy = s.unit != kNone && s.state != State::Idle;
    switch (type) {
      case 'C': {
        if (!busy) return true;
        const void* nul = std::memchr(body, 0, len);
        size_t tag_len = nul ? static_cast<size_t>(static_cast<const char*>(nul) - body) : len;
        // Read as the capture read it, so that row counts compare like for like.
        trace::Result r = trace::split_command_tag(std::string_view(body, tag_len));
        answer(s, false, nullptr, r.has_rows, r.rows);
        return true;
      }
      case 'I':  // EmptyQueryResponse
      case 's':  // PortalSuspended
        if (busy) answer(s, false, nullptr, false, 0);
        return true;
      case 'E': {
        if (!busy) return true;  // a FATAL while idle: the close follows
        char state[6];
        wire::error_sqlstate(body, len, state);
        count_error(s, state);
        answer(s, true, state, false, 0);
        return true;
      }
      case 'Z':
        if (!busy || len < 1) return true;
        s.ready = body[0];
        finish_direct(slot);
        return true;
      case 'G': {  // CopyInResponse: the captured data, or none
        if (!busy) return true;
        const Unit& u = unit_of(s);
        move(s, Event::CopyInStarted);
        if (u.copy_wire) {
          s.out = u.copy_wire;
          s.out_left = u.copy_wire_len;
        } else {
          s.out = kCopyDone;
          s.out_left = u.kind == UnitKind::Extended ? sizeof kCopyDone : 5;
        }
        move(s, Event::CopyFinished);
        return send_direct(slot, now);
      }
      case 'H':  // CopyOutResponse: its data is skipped
        if (busy) move(s, Event::CopyOutStarted);
        return true;
      case 'c':  // CopyDone
        if (s.state == State::CopyOut) move(s, Event::CopyFinished);
        return true;
      case 'W':
        fail(slot, now, "the server started COPY BOTH (replication), which a replay does not drive");
        return false;
      case 'D': case 'T': case 't': case 'd': case 'n': case '1': case '2': case '3':
      case 'N': case 'A': case 'S': case 'K': case 'v':
        return true;
      default: {
        char why[96];
        std::snprintf(why, sizeof why, "unexpected message type 0x%02x from the server (protocol out of step)",
                      static_cast<unsigned char>(type));
        fail(slot, now, why);
        return false;
      }
    }
  }

  // An Execute's (Extended) or a statement's (Simple, Copy) answer. In an
  // Extended unit answers arrive one per Execute in order; an error (from
  // the Execute or from a Parse, Bind or Describe before it) is the next
  // Execute's answer, as the capture attributes it, and the server skips
  // the rest up to the Sync.
  void answer(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows) {
    const Unit& u = unit_of(s);
    if (u.kind != UnitKind::Extended) return fold(s, error, state, has_rows, rows);
    if (s.aborted || s.op >= u.n_stmts) return;
    Outcome out;
    out.status = error ? Status::Error : Status::Ok;
    if (error) std::memcpy(out.sqlstate, state, 6);
    out.has_rows = has_rows;
    out.rows = rows;
    s.aborted = error;
    record(plan_.stmts[u.first_stmt + s.op++], out, now_ns() - s.sent_at);
  }

  // ReadyForQuery of a directly driven unit: Executes left unanswered were
  // skipped after an error.
  void finish_direct(uint32_t slot) {
    Slot& s = slots_[slot];
    const Unit& u = unit_of(s);
    Nanos now = now_ns();
    if (u.kind == UnitKind::Extended) {
      Outcome skipped;
      skipped.status = Status::Skipped;
      while (s.op < u.n_stmts) record(plan_.stmts[u.first_stmt + s.op++], skipped, now - s.sent_at);
    }
    if (s.state == State::CopyOut) move(s, Event::CopyFinished);  // no CopyDone came
    // A COPY that failed while its data was still going out: the server
    // ignores the rest, but it must leave whole before the next request.
    if (s.out_left > 0) {
      s.done_after_send = true;
      return;
    }
    unit_done(slot, now);
  }

  // Queues captured COPY data; false when the session failed. Leaves the
  // session in CopyIn while libpq's buffer is full.
  bool push_copy(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    const Unit& u = unit_of(s);
    while (s.copy < u.n_copy) {
      const CopyChunk& ch = plan_.copy_chunks[u.first_copy + s.copy];
      int r = PQputCopyData(s.conn, ch.data, static_cast<int>(ch.len));
      if (r < 0) return fail(slot, now), false;
      if (r == 0) {
        watch(slot, true);
        return true;
      }
      ++s.copy;
    }
    if (!s.copy_end_sent) {
      int r = PQputCopyEnd(s.conn, u.copy_fail ? kCopyFailMessage : nullptr);
      if (r < 0) return fail(slot, now), false;
      if (r == 0) {
        watch(slot, true);
        return true;
      }
      s.copy_end_sent = true;
    }
    int f = PQflush(s.conn);
    if (f < 0) return fail(slot, now), false;
    move(s, Event::CopyFinished);
    watch(slot, f == 1);
    drain(slot, now);
    return s.state != State::Done;
  }

  // Reads every result libpq has complete, without blocking.
  void drain(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    PGconn* c = s.conn;
    for (;;) {
      if (s.state == State::CopyOut) {
        char* buf = nullptr;
        int r;
        while ((r = PQgetCopyData(c, &buf, 1)) > 0) PQfreemem(buf);
        if (r == 0) return;  // more to come
        if (r == -2) return fail(slot, now);
        move(s, Event::CopyFinished);
      }
      if (PQisBusy(c)) return;
      PGresult* res = PQgetResult(c);
      if (!res) {
        // Outside pipeline mode (Simple, COPY, one Execute) the unit is done.
        if (!s.pipeline) return unit_done(slot, now_ns());
        // Pipeline: end of one command's results. Two in a row means libpq
        // has nothing queued yet; wait for input.
        if (++s.nulls >= 2) return;
        continue;
      }
      s.nulls = 0;
      ExecStatusType st = PQresultStatus(res);
      if (st == PGRES_PIPELINE_SYNC) {
        PQclear(res);
        return unit_done(slot, now_ns());
      }
      if (st == PGRES_COPY_IN) {
        PQclear(res);
        move(s, Event::CopyInStarted);
        push_copy(slot, now);
        return;
      }
      if (st == PGRES_COPY_OUT) {
        PQclear(res);
        move(s, Event::CopyOutStarted);
        continue;
      }
      on_result(s, res, st);
      PQclear(res);
    }
  }

  void count_error(Slot& s, PGresult* res, char out[6]) {
    const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (!state || std::strlen(state) != 5) state = "XX000";
    std::memcpy(out, state, 5);
    out[5] = 0;
    count_error(s, out);
  }
  // Every error the target answers, of any message of the unit in flight
  // (a Parse's too); the first one's SQLSTATE goes to the round-trip log.
  void count_error(Slot& s, const char* state) {
    stats_.errors.add(state);
    live_.add(live_.errors, 1);
    if (!s.unit_state[0]) std::memcpy(s.unit_state, state, sizeof s.unit_state);
    s.txn_failed = true;
  }

  // Simple and Copy units: the answers of their statements folded into one.
  void fold(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows) {
    if (error) {
      if (s.agg.status != Status::Error) {
        s.agg.status = Status::Error;
        std::memcpy(s.agg.sqlstate, state, 6);
      }
    } else if (has_rows) {
      s.agg.has_rows = true;
      s.agg.rows += rows;
    }
  }

  void record(const Stmt& st, const Outcome& out, Nanos lat) {
    stats_.statement(st, out, lat);
    live_.add(live_.statements, 1);
    live_.add(live_.lat_sum_ns, static_cast<double>(lat));
    live_.add(live_.lat_sumsq_ns, static_cast<double>(lat) * static_cast<double>(lat));
  }

  // A CommandComplete's row count, as PQcmdTuples gives it.
  static bool result_rows(PGresult* res, uint64_t* rows) {
    const char* t = PQcmdTuples(res);
    if (!t || !*t) return false;
    *rows = std::strtoull(t, nullptr, 10);
    return true;
  }

  void on_result(Slot& s, PGresult* res, ExecStatusType st) {
    const Unit& u = unit_of(s);
    bool error = st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR;
    if (u.kind != UnitKind::Extended) {
      char state[6] = {};
      uint64_t rows = 0;
      bool has_rows = false;
      if (error) count_error(s, res, state);
      else has_rows = result_rows(res, &rows);
      return fold(s, error, state, has_rows, rows);
    }
    if (s.op >= u.n_ops) return;  // more results than commands: ignore
    const Op& op = plan_.ops[u.first_op + s.op++];
    if (op.kind != OpKind::Execute) {
      if (error) {
        char state[6];
        count_error(s, res, state);
        if (!s.pending_error) {
          s.pending_error = true;
          std::memcpy(s.pending_state, state, 6);
        }
      }
      return;
    }
    Outcome out;
    if (error) {
      out.status = Status::Error;
      count_error(s, res, out.sqlstate);
    } else if (st == PGRES_PIPELINE_ABORTED) {
      if (s.pending_error) {
        // The earlier error (Parse, Describe) is this statement's answer,
        // as the capture attributes it.
        out.status = Status::Error;
        std::memcpy(out.sqlstate, s.pending_state, 6);
        s.pending_error = false;
      } else {
        out.status = Status::Skipped;
      }
    } else {
      out.status = Status::Ok;
      out.has_rows = result_rows(res, &out.rows);
    }
    record(plan_.stmts[op.stmt], out, now_ns() - s.sent_at);
  }

  void unit_done(uint32_t slot, Nanos now) {
    Slot& s = slots_[slot];
    const Unit& u = unit_of(s);
    if (u.kind != UnitKind::Extended && u.n_stmts) {
      if (s.agg.status != Status::Error) s.agg.status = Status::Ok;
      record(plan_.stmts[u.first_stmt], s.agg, now - s.sent_at);
    }
    s.stmts_since_idle += u.n_stmts;
    if (s.direct ? s.ready == 'I' : PQtransactionStatus(s.conn) == PQTRANS_IDLE) {
      // A transaction that met an error (rolled back, or a failed
      // statement of its own in autocommit) is a failed one, as pgbench
      // counts them: not processed, not in tps.
      if (s.stmts_since_idle > 0 && s.txn_failed) {
        ++stats_.failed_transactions;
      } else if (s.stmts_since_idle > 0) {
        ++stats_.transactions;
        live_.add(live_.transactions, 1);
      }
      s.stmts_since_idle = 0;
      s.txn_failed = false;
    }
    if (log_.on()) {
      UnitLogLine l;
      l.session = session_of(s).id;
      l.unit = s.next;
      l.latency = now - s.sent_at;
      l.end_unix = now + sh_.unix_offset;
      l.lag = s.lag;
      l.own_lag = s.own_lag;
      l.captured = u.ready_ts > 0 ? u.ready_ts - u.ts : -1;
      l.failed = s.unit_state[0] != 0;
      std::memcpy(l.sqlstate, s.unit_state, sizeof l.sqlstate);
      log_.add(l);
    }
    move(s, Event::UnitDone);
    s.free_at = now;
    ++s.next;
    s.unit = kNone;
    schedule_next(slot, now);
  }

  Shared& sh_;
  const Plan& plan_;
  const int index_;                  // the worker's number, for the connection thread
  std::vector<Slot> slots_;
  TimerHeap timers_;
  Stats stats_;
  Live& live_;
  std::vector<uint32_t> gated_;
  std::vector<uint32_t> held_;       // max speed: connected, waiting for the start
  std::vector<Connector::Opened> opened_;  // taken from the inbox
  bool started_ = true;
  size_t gate_next_ = 0;
  size_t active_ = 0;
  int ep_ = -1;
  int tfd_ = -1;  // the timeout's timerfd, where epoll_pwait2 is missing
  // The io_uring loop (Options::io), set up by run() on the worker's thread.
  static constexpr unsigned kMaxCqes = 256;
  std::optional<Ring> ring_;
  bool ring_on_ = false;
  io_uring* ring() { return ring_->get(); }
  struct Cqe {
    uint64_t user_data;
    int res;
  };
  Cqe cqes_[kMaxCqes];
  Nanos last_end_ = 0;
  UnitLog log_;
};

// Raises RLIMIT_NOFILE so `need` descriptors fit.
void ensure_fd_limit(uint64_t need) {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) throw RuntimeError(errno_message("getrlimit(RLIMIT_NOFILE)", errno));
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need) return;
  rlimit want = rl;
  want.rlim_cur = need;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) want.rlim_max = need;
  if (setrlimit(RLIMIT_NOFILE, &want) == 0) return;
  int err = errno;
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) {
    throw RuntimeError(errno_message("replay needs " + std::to_string(need) +
                                         " open files; setrlimit(RLIMIT_NOFILE) to that failed",
                                     err));
  }
  throw RuntimeError("replay needs " + std::to_string(need) + " open files for its sessions but the hard "
                     "limit is " + std::to_string(rl.rlim_max) +
                     " and cannot be raised (run as root or raise `ulimit -Hn`)");
}

std::string one_line(const char* msg) {
  std::string m = msg ? msg : "";
  std::replace(m.begin(), m.end(), '\n', ' ');
  while (!m.empty() && m.back() == ' ') m.pop_back();
  return m;
}

// The conninfo as shown in messages: its settings without the password.
std::string describe_target(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (!opts) {
    if (err) PQfreemem(err);
    return "the target";
  }
  std::string out;
  for (PQconninfoOption* o = opts; o->keyword; ++o) {
    if (!o->val || !*o->val || std::strcmp(o->keyword, "password") == 0) continue;
    if (!out.empty()) out += ' ';
    out += std::string(o->keyword) + "=" + o->val;
  }
  PQconninfoFree(opts);
  return out.empty() ? "the default target (libpq environment)" : out;
}

// The first session's connection, made before anything starts: an
// unreachable target or a rejected user fails the replay at once with
// libpq's message. A target that does not answer is given up on after
// connect_timeout (libpq's, by default none), or with a stop
// (Options::wait_stop).
void preflight(const Options& opts, const ConnParams& p) {
  const Nanos timeout = connect_timeout_ns(opts.conninfo);
  const Nanos deadline = timeout ? now_ns() + timeout : 0;
  ConnKeywords k(opts.conninfo, p);
  PGconn* c = PQconnectStartParams(k.kw, k.val, 1);
  if (!c) throw RuntimeError("replay: cannot connect to the target: out of memory");
  struct Finish {
    PGconn* c;
    ~Finish() { PQfinish(c); }
  } finish{c};
  PostgresPollingStatusType st = PQstatus(c) == CONNECTION_BAD ? PGRES_POLLING_FAILED : PGRES_POLLING_WRITING;
  while (st == PGRES_POLLING_READING || st == PGRES_POLLING_WRITING) {
    pollfd pf{PQsocket(c), static_cast<short>(st == PGRES_POLLING_READING ? POLLIN : POLLOUT), 0};
    int n = ::poll(&pf, 1, opts.wait_stop || deadline ? 50 : -1);
    if (n < 0 && errno != EINTR) throw RuntimeError(errno_message("replay: poll (connecting)", errno));
    if (n > 0) {
      st = PQconnectPoll(c);
      continue;
    }
    if (deadline && now_ns() >= deadline)
      throw RuntimeError("replay: cannot connect to " + describe_target(opts.conninfo) +
                         ": timeout expired (connect_timeout)");
    if (opts.wait_stop) {
      if (const char* why = opts.wait_stop(0))
        throw RuntimeError(std::string("replay: stopped by ") + why + " while connecting to " +
                           describe_target(opts.conninfo) + "; nothing was replayed");
    }
  }
  if (st != PGRES_POLLING_OK)
    throw RuntimeError("replay: cannot connect to " + describe_target(opts.conninfo) + ": " +
                       one_line(PQerrorMessage(c)));
}

}  // namespace

// Why the io_uring loop cannot run here ("" when it can): a ring as the
// workers set one up, and the operations they use.
std::string uring_unsupported() {
  return uring_missing({.ext_arg = true,
                        .buf_ring = false,
                        .ops = {{IORING_OP_RECV, "recv"},
                                {IORING_OP_SEND, "send"},
                                {IORING_OP_POLL_ADD, "poll"},
                                {IORING_OP_ASYNC_CANCEL, "async cancel"}}});
}

Report run(const Workload& w, const Options& opts, std::ostream* progress) {
  const Plan& plan = w.plan();
  if (!opts.max_speed && !(opts.speed > 0))
    throw InputError("--speed must be greater than 0");
  if (!opts.max_speed) {
    // The schedule must fit the clock: 2^62 ns is 146 years.
    Nanos last = plan.t0;
    for (const Session& s : plan.sessions) last = std::max(last, s.end);
    if (static_cast<double>(last - plan.t0) / opts.speed >= 0x1p62) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "--speed %g: the captured %.3f s would take more than 146 years", opts.speed,
                    static_cast<double>(last - plan.t0) / 1e9);
      throw InputError(msg);
    }
  }
  Shared sh;
  sh.plan = &plan;
  sh.opts = &opts;
  sh.sched.t0 = plan.t0;
  sh.sched.speed = opts.speed;
  sh.sched.max_speed = opts.max_speed;
  // auto: only directly driven sessions use the ring.
  sh.uring = use_uring(opts.io, "TIERLAB_REPLAY_IO", "replay", opts.direct, &uring_unsupported);

  // Who connects where: --user / --database, --user-map, else the captured
  // ones. A user or database the conninfo names is the default only for a
  // session that has none captured; when sessions go elsewhere, say so.
  const std::string conn_user = conninfo_value(opts.conninfo, "user");
  const std::string conn_database = conninfo_value(opts.conninfo, "dbname");
  std::vector<std::string> other_users, other_databases;  // a few, for the note
  auto note_other = [](std::vector<std::string>& v, const char* name) {
    if (v.size() < 3 && std::find(v.begin(), v.end(), name) == v.end()) v.emplace_back(name);
  };
  sh.params.resize(plan.sessions.size());
  for (size_t i = 0; i < plan.sessions.size(); ++i) {
    const Session& s = plan.sessions[i];
    ConnParams& p = sh.params[i];
    if (!opts.user.empty()) {
      p.user = opts.user.c_str();
    } else if (const std::string* m = opts.user_map.find(s.user)) {
      p.user = m->c_str();
    } else if (*s.user) {
      p.user = s.user;
      if (!conn_user.empty() && conn_user != s.user) note_other(other_users, s.user);
    }
    if (!opts.database.empty()) {
      p.database = opts.database.c_str();
    } else if (*s.database) {
      p.database = s.database;
      if (!conn_database.empty() && conn_database != s.database) note_other(other_databases, s.database);
    }
    if (*s.application_name) p.application_name = s.application_name;
  }
  if (progress) {
    auto note = [&](const char* key, const std::string& value, const std::vector<std::string>& others,
                    const char* what, const char* flag) {
      if (others.empty()) return;
      std::string list;
      for (const std::string& o : others) list += (list.empty() ? "" : ", ") + o;
      *progress << "tierlab: replay: --db names " << key << "=" << value << ", but sessions connect " << what
                << " (" << list << (others.size() == 3 ? ", ..." : "") << "); " << flag << " " << value
                << " sends every session there\n";
    };
    note("user", conn_user, other_users, "as their captured users", "--user");
    note("dbname", conn_database, other_databases, "to their captured databases", "--database");
    if (uint64_t n = plan.summary.joined_in_transaction)
      *progress << "tierlab: replay: sessions the capture joined inside a transaction: " << n
                << "; each replays from its next idle point\n";
  }

  // Max speed: a session waits for as many sessions to end as had ended in
  // the capture when it started, which keeps the captured concurrency.
  std::vector<uint32_t> order(plan.sessions.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return plan.sessions[a].begin < plan.sessions[b].begin; });
  sh.gate.assign(plan.sessions.size(), 0);
  {
    std::vector<Nanos> ends;
    ends.reserve(plan.sessions.size());
    for (const Session& s : plan.sessions) ends.push_back(s.end);
    std::sort(ends.begin(), ends.end());
    for (size_t i = 0; i < plan.sessions.size(); ++i)
      sh.gate[i] = static_cast<uint64_t>(
          std::upper_bound(ends.begin(), ends.end(), plan.sessions[i].begin) - ends.begin());
    if (opts.max_speed) sh.initial = static_cast<uint64_t>(std::count(sh.gate.begin(), sh.gate.end(), 0));
  }

  int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, plan.sessions.size())));

  uint64_t conc = plan.summary.max_concurrency;
  uint64_t need = std::min<uint64_t>(plan.sessions.size(), std::max<uint64_t>(2 * conc, conc + 1000)) +
                  64 + 4 * static_cast<uint64_t>(threads);
  ensure_fd_limit(need);

  if (!plan.sessions.empty()) preflight(opts, sh.params[order.front()]);

  // --log: opened before any session connects (a bad path fails the
  // replay at once), closed however the replay ends.
  struct LogFd {
    int fd = -1;
    ~LogFd() {
      if (fd >= 0) ::close(fd);
    }
  } log_fd;
  if (!opts.log_path.empty()) {
    log_fd.fd = sh.log_fd = open_unit_log(opts.log_path);
    sh.unix_offset = clock_ns(CLOCK_REALTIME) - now_ns();
  }

  // Sessions dealt round-robin in start order, so each worker gets its
  // share of every period of the capture.
  std::vector<std::vector<uint32_t>> per(threads);
  for (size_t i = 0; i < order.size(); ++i) per[i % threads].push_back(order[i]);
  std::vector<Live> live(threads);
  std::vector<size_t> per_size(threads);
  for (int t = 0; t < threads; ++t) per_size[t] = per[t].size();
  // Started before the workers, at the normal priority (not --rt's): its
  // work is not on the schedule.
  Connector connector(opts.conninfo, sh.params, per_size);
  sh.connector = &connector;
  connector.start();
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < threads; ++t) workers.push_back(std::make_unique<Worker>(sh, t, per[t], live[t]));

  std::atomic<int> running{threads};
  std::vector<std::exception_ptr> errors(threads);
  std::vector<Nanos> cpu_ns(threads, 0);
  std::vector<uint64_t> slice_ns(threads, 0);
  // Timed replays keep deadlines: hold the CPUs' wake-up latency down.
  CpuLatencyHold cpu_latency(opts.hold_cpu_latency && !opts.max_speed);
  sh.sched.epoch = now_ns() + 1000000;  // 1 ms for the threads to start
  std::vector<std::thread> pool;
  std::optional<RealTimeScope> rt(std::in_place, opts.realtime);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        tight_timer_slack();
        if (!opts.max_speed) slice_ns[t] = request_short_slice(kWorkerSliceNs);
        workers[t]->run();
      } catch (...) {
        errors[t] = std::current_exception();
      }
      cpu_ns[t] = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      running.fetch_sub(1);
    });
  }
  rt.reset();  // the progress loop below runs at normal priority

  // This thread owns the progress output.
  Nanos period = static_cast<Nanos>(opts.progress_s * 1e9);
  Nanos next_tick = sh.sched.epoch + period;
  uint64_t p_txn = 0, p_stmt = 0, p_err = 0, p_lag_n = 0;
  double p_lat = 0, p_latsq = 0, p_lag = 0;
  // Without progress lines or a stop to wait for it just waits for the
  // workers (no wake-ups taking CPU time from a target on the same machine).
  const bool ticking = progress && period > 0;
  const char* stopped = nullptr;
  while ((ticking || opts.wait_stop) && running.load() > 0) {
    const long step = ticking ? 5'000'000 : 50'000'000;
    if (!opts.wait_stop) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(step));
    } else if ((stopped = opts.wait_stop(step))) {
      sh.stop.store(true);
      for (int t = 0; t < threads; ++t) connector.poke(t);
      break;
    }
    if (!ticking || now_ns() < next_tick) continue;
    uint64_t txn = 0, stmt = 0, err = 0, lag_n = 0;
    double lat = 0, latsq = 0, lag = 0;
    for (const Live& l : live) {
      txn += l.transactions.load(std::memory_order_relaxed);
      stmt += l.statements.load(std::memory_order_relaxed);
      err += l.errors.load(std::memory_order_relaxed);
      lag_n += l.lag_n.load(std::memory_order_relaxed);
      lat += l.lat_sum_ns.load(std::memory_order_relaxed);
      latsq += l.lat_sumsq_ns.load(std::memory_order_relaxed);
      lag += l.lag_sum_ns.load(std::memory_order_relaxed);
    }
    double secs = static_cast<double>(period) / 1e9;
    double n = static_cast<double>(stmt - p_stmt);
    double mean = n > 0 ? (lat - p_lat) / n : 0;
    double var = n > 0 ? (latsq - p_latsq) / n - mean * mean : 0;
    double lag_mean = lag_n > p_lag_n ? (lag - p_lag) / static_cast<double>(lag_n - p_lag_n) : 0;
    char line[256];
    std::snprintf(line, sizeof line,
                  "progress: %.1f s, %.1f tps, lat %.3f ms stddev %.3f, lag %.3f ms, %llu errors\n",
                  static_cast<double>(next_tick - sh.sched.epoch) / 1e9,
                  static_cast<double>(txn - p_txn) / secs, mean / 1e6,
                  var > 0 ? std::sqrt(var) / 1e6 : 0.0, lag_mean / 1e6,
                  static_cast<unsigned long long>(err - p_err));
    *progress << line << std::flush;
    p_txn = txn, p_stmt = stmt, p_err = err, p_lag_n = lag_n, p_lat = lat, p_latsq = latsq, p_lag = lag;
    next_tick += period;
  }
  for (auto& th : pool) th.join();
  connector.stop();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  Stats total(plan.fingerprints.size());
  Nanos end = sh.sched.epoch;
  Report r;
  for (auto& wk : workers) {
    total.merge(wk->stats());
    end = std::max(end, wk->last_end());
    r.log_lines += wk->log().lines();
    if (r.log_error.empty()) r.log_error = wk->log().error();
  }
  r.log_path = opts.log_path;
  if (stopped) r.stopped = stopped;
  r.speed = opts.speed;
  r.max_speed = opts.max_speed;
  r.threads = threads;
  r.cpu_latency_held = cpu_latency.held();
  r.realtime = opts.realtime;
  r.slice_ms = static_cast<double>(*std::min_element(slice_ns.begin(), slice_ns.end())) / 1e6;
  r.io = sh.uring ? "io_uring" : "epoll";
  for (Nanos c : cpu_ns) r.cpu_s += static_cast<double>(c) / 1e9;
  r.cpu_s += static_cast<double>(connector.cpu_ns()) / 1e9;
  // Max speed counts from the start (every initial session connected), as
  // pgbench's tps "without initial connection time"; timed replays from
  // the schedule's epoch.
  Nanos start = sh.sched.epoch;
  if (opts.max_speed && sh.start.load() > 0) start = sh.start.load();
  r.connect_s = static_cast<double>(start - sh.sched.epoch) / 1e9;
  fill_report(r, total, plan, std::max<Nanos>(0, end - start));
  return r;
}

}  // namespace tierlab::replay
