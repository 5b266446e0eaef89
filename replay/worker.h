// Private to replay/: a replay worker (replay/worker.cpp) and the state it
// shares with the other workers. One worker thread runs many sessions on one
// wait: the schedule, the session state machine and the statistics are in
// replay/worker.cpp, sessions driven directly (the plan's protocol messages
// out, the answers parsed as they come) in replay/direct.cpp, libpq sessions
// in replay/libpq_session.cpp. See replay/engine.cpp for the threads, the
// event loop and the timing.
#pragma once

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

namespace tierlab::replay::detail {


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
inline RingOptions ring_options() {
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

  void run();

  // Sets up the worker's io_uring (on the thread that runs it: the ring is
  // single-issuer). What the loop needs of the kernel was checked before
  // the workers started (uring_unsupported).
  void start_ring();

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
  int wait_events(epoll_event* evs, const timespec* timeout);

  void dispatch(const epoll_event* evs, int n);

  // --- the io_uring loop --------------------------------------------------
  // Directly driven sessions send and receive through the ring; the epoll
  // set (libpq sessions, the inbox) is one poll on it. One
  // io_uring_enter per round submits every queued send and receive and
  // waits for the first completion or the timeout.

  io_uring_sqe* sqe();

  // A one-shot poll: re-armed after each drain of the epoll set, so what
  // stays ready (level-triggered) completes it again at once.
  void arm_epoll();

  void wait_ring(Nanos wait, epoll_event* evs);

  // A directly driven session's I/O goes through the ring once connected
  // (`direct` is set then).
  bool on_ring(const Slot& s) const { return ring_on_ && s.direct; }

  // Moves a connected direct session from the epoll set to the ring.
  void to_ring(uint32_t slot);

  void arm_recv(uint32_t slot);

  void queue_send(uint32_t slot);

  void on_completion(uint32_t slot, uint64_t op, int res);

  void move(Slot& s, Event e);

  // Keeps the epoll registration in step with libpq's socket and our
  // interest (read always, write while libpq has unsent bytes).
  void watch(uint32_t slot, bool out);

  void finish_slot(uint32_t slot, Nanos now);

  // The replay is stopping: every session ends where it is. A unit in
  // flight is not counted (no answer); a connection still being opened is
  // closed by the connection thread when it stops.
  void stop_all(Nanos now);

  // Max speed: counts a session with gate 0 that connected or failed to.
  void initial_settled(const Slot& s);

  // Max speed: once every session with gate 0 has settled, the clock starts
  // (the first worker to see it sets it) and the held sessions go.
  void release(Nanos now);

  // The session is lost: `why`, else libpq's message.
  void fail(uint32_t slot, Nanos now, const char* why = nullptr);

  // The connection thread opens it and hands it back (on_inbox).
  void connect(uint32_t slot, Nanos);

  void on_inbox();

  void connected(uint32_t slot, Nanos now);

  // From Idle: arm the timer for the next unit or for the session's end
  // (or act at once when that time has passed).
  void schedule_next(uint32_t slot, Nanos now);

  void on_timer(uint32_t slot, Nanos now);

  void send_unit(uint32_t slot, Nanos now);

  bool send_execute(PGconn* c, const Op& op);

  void on_event(uint32_t slot, uint32_t ev);

  // --- directly driven sessions -------------------------------------------

  // Sends what is left of s.out; false when the session failed.
  bool send_direct(uint32_t slot, Nanos now);

  // All of s.out has left: a unit whose ReadyForQuery came first is done.
  void sent(uint32_t slot);

  // Reads what the server sent and acts on every complete message.
  void receive_direct(uint32_t slot, Nanos now);

  // Acts on the complete messages in the buffer; false when the session
  // ended or failed.
  bool parse_direct(uint32_t slot, Nanos now);

  // One message from the server (`body`: its first `len` bytes, for the
  // types parse_direct reads); false when the session failed.
  bool on_message(uint32_t slot, char type, const char* body, uint32_t len, Nanos now);

  // An Execute's (Extended) or a statement's (Simple, Copy) answer. In an
  // Extended unit answers arrive one per Execute in order; an error (from
  // the Execute or from a Parse, Bind or Describe before it) is the next
  // Execute's answer, as the capture attributes it, and the server skips
  // the rest up to the Sync.
  void answer(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows);

  // ReadyForQuery of a directly driven unit: Executes left unanswered were
  // skipped after an error.
  void finish_direct(uint32_t slot);

  // Queues captured COPY data; false when the session failed. Leaves the
  // session in CopyIn while libpq's buffer is full.
  bool push_copy(uint32_t slot, Nanos now);

  // Reads every result libpq has complete, without blocking.
  void drain(uint32_t slot, Nanos now);

  void count_error(Slot& s, PGresult* res, char out[6]);
  // Every error the target answers, of any message of the unit in flight
  // (a Parse's too); the first one's SQLSTATE goes to the round-trip log.
  void count_error(Slot& s, const char* state, std::string_view message);

  // Simple and Copy units: the answers of their statements folded into one.
  void fold(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows);

  void record(const Stmt& st, const Outcome& out, Nanos lat);

  // A CommandComplete's row count, as PQcmdTuples gives it.
  static bool result_rows(PGresult* res, uint64_t* rows);

  void on_result(Slot& s, PGresult* res, ExecStatusType st);

  void unit_done(uint32_t slot, Nanos now);

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

}  // namespace tierlab::replay::detail
