// Private to replay/: a replay worker (replay/worker.cpp) and the state it
// shares with the other workers. One worker thread runs many sessions on one
// event loop (common/loop.h, io_uring or epoll): the rounds, the schedule,
// the session state machine and the statistics are in replay/worker.cpp,
// sessions driven directly (the plan's protocol messages out, the answers
// parsed as they come) in replay/direct.cpp, libpq sessions in
// replay/libpq_session.cpp. See replay/engine.cpp for the threads and
// the timing.
#pragma once

#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "common/loop.h"
#include "common/tls.h"
#include "replay/connector.h"
#include "replay/plan.h"
#include "replay/schedule.h"
#include "replay/session.h"
#include "replay/stats.h"
#include "replay/sync.h"
#include "replay/unit_log.h"
#include "replay/wire.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
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
// The tag of the loop's watch on the worker's inbox of opened connections
// (a libpq session's watch has its slot's number).
constexpr uint64_t kInboxTag = ~uint64_t{0};
// The tag of the watch on the worker's commit-order eventfd (Waiter::fd).
constexpr uint64_t kSyncTag = ~uint64_t{1};
// A directly driven session's receive buffer. Messages the engine only
// skips (rows, row descriptions, COPY data) may be any size; one it reads
// (CommandComplete, ErrorResponse, ReadyForQuery, COPY responses) is read
// from its first kInBuf bytes.
constexpr uint32_t kInBuf = 16384;
// A TLS session's requests are encrypted this many plaintext bytes at a
// time (a COPY's data need not be held encrypted all at once).
constexpr uint32_t kTlsPiece = 65536;
constexpr uint32_t kMaxMessage = 1u << 30;
// A streamed replay reads ahead at most this many batches of a session
// (Worker::next_unit): the window that bounds its memory.
constexpr uint32_t kQueueBatches = 16;
// Max speed under a CPU quota: how long a round waits for more answers
// once one has come (Shared::batch_window).
constexpr Nanos kBatchWindow = 100'000;
// How long a held batch may keep a starved session waiting before the
// read-ahead bound gives way (Worker::release_held).
constexpr Nanos kHeldPatience = 5'000'000;
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
  bool uring = false;                 // workers run the io_uring backend of the loop
  // Max speed under a CPU quota: a round waits for the answers of every
  // unit in flight, or this long with one (Loop::expect), so that a worker
  // wakes once per batch; 0: once per answer.
  Nanos batch_window = 0;
  int log_fd = -1;                    // Options::log_path, -1 none
  std::mutex log_lock;                // one worker writes to it at a time
  Nanos unix_offset = 0;              // CLOCK_REALTIME - CLOCK_MONOTONIC, for the log
  Connector* connector = nullptr;     // opens and closes the sessions' connections
  std::atomic<bool> stop{false};      // stop every session now (SIGINT, SIGTERM)
  // A streamed plan (Plan::streamed): each worker's reader of its sessions'
  // units, by worker index.
  std::vector<UnitStream*> streams;
  // --sync commit or all with commit points to keep: their order; nullptr else.
  CommitOrder* order = nullptr;
  bool sync_all = false;              // --sync all: every commit before, not the listed ones
  // Streamed with commit order: the sessions (by plan index) that ended
  // before their last unit; each worker's stream marks their commit points
  // done as it numbers them.
  std::unique_ptr<std::atomic<uint8_t>[]> ended_early;
  std::atomic<bool> any_ended_early{false};
  Nanos sync_timeout = 0;             // a wait longer than this goes on; 0: no limit
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
  uint32_t pw = kNone;               // libpq: the loop's watch on its socket
  uint32_t next = 0;                 // next unit, index within the session
  uint32_t unit = kNone;             // unit in flight (tab->units)
  const Tables* tab = nullptr;       // what the unit in flight refers to: the Plan, or a batch
  // Streamed (Shared::streams): the session's batches read and not yet
  // replayed, the head first (its `pos` is the next unit).
  UnitBatch* q_head = nullptr;
  UnitBatch* q_tail = nullptr;
  uint32_t queued = 0;
  bool starved = false;              // waits for the stream (Worker::next_unit)
  bool unbounded = false;            // its read-ahead let past kQueueBatches until it sends (Worker::release_held)
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
  // Driven directly (libpq only connected it): the loop's connection on a
  // duplicate of libpq's socket.
  bool direct = false;
  uint32_t lc = kNone;
  // A directly driven TLS connection: libpq's SSL object, taken over by the
  // stage for the session's life (given back before libpq closes it); the
  // ciphertext is received into `cipher` (kInBuf bytes) and decrypted into
  // `in`. Both made at the slot's first TLS connect and kept.
  bool tls_on = false;
  std::unique_ptr<TlsStage> tls;
  std::unique_ptr<uint8_t[]> cipher;
  bool aborted = false;              // an ErrorResponse in this unit
  char ready = 'I';                  // status of the last ReadyForQuery
  const char* out = nullptr;         // bytes still to hand to the loop (one piece at a time)
  uint32_t out_left = 0;
  bool done_after_send = false;      // ReadyForQuery came before `out` was sent
  uint32_t skip = 0;                 // bytes of a message still to discard
  uint32_t in_off = 0, in_len = 0;
  std::unique_ptr<char[]> in;        // kInBuf bytes, from connect; a receive into it is armed while connected
  // --sync: whether the slot is waiting for other sessions' commits, since
  // when, when it was let go (0: it did not wait since its last send), and
  // whether the next check lets it through (its wait timed out); the next
  // of its unit's listed commits to look at, and the one it watches
  // (kNone: none) at `watch_pos` in Worker::watching_.
  bool sync_waiting = false;
  Nanos sync_from = 0;
  Nanos sync_at = 0;
  bool sync_pass = false;
  uint32_t sync_cursor = 0;
  uint32_t sync_watch = kNone;
  uint32_t watch_pos = kNone;
};

class Worker {
 public:
  // Makes the worker's loop (an io_uring one is enabled by the first wait,
  // on the worker's thread). What the loop needs of the kernel was checked
  // before the workers started (uring_unsupported).
  Worker(Shared& sh, int index, std::vector<uint32_t> sessions, Live& live);
  ~Worker() {
    // Operations in flight point into the slots' buffers: end them first.
    loop_.reset();
    for (Slot& s : slots_) {
      if (s.tls) s.tls->reset();  // libpq's SSL object back to libpq first
      if (s.conn) PQfinish(s.conn);
    }
  }

  void run();

  Stats& stats() { return stats_; }
  Nanos last_end() const { return last_end_; }
  const UnitLog& log() const { return log_; }

 private:
  const Session& session_of(const Slot& s) const { return plan_.sessions[s.session]; }
  const Unit& unit_of(const Slot& s) const { return s.tab->units[s.unit]; }

  // The session's next unit (s.next < n_units), its tables in *tab and its
  // index there in *index. Streamed, read from the trace as needed: the
  // batches of other sessions read on the way queue on their slots, up to
  // kQueueBatches each; a batch for a full queue is held, and the reading
  // stops until that session sends (nullptr: the slot waits, starved_,
  // until stream_wake). The full queue's session may itself wait on the
  // server for a lock a starved session holds (at --max-speed sessions
  // drift from the captured interleaving): when the holder's unit in flight
  // has gone unanswered for kHeldPatience while a starved session is inside
  // a transaction (holder_stuck: it may hold the lock the holder's unit
  // waits for), the batch is queued anyway (release_held) and that
  // session reads ahead without bound until it finishes a batch. A holder
  // that goes on keeps the bound: the starved wait for it.
  const Unit* next_unit(uint32_t slot, const Tables** tab, uint32_t* index);
  void enqueue(Slot& s, UnitBatch* b);
  bool holder_stuck() const;
  void release_held();
  // Streamed: a held batch went to its queue; the starved slots look again.
  void stream_wake(Nanos now);
  // Streamed: the batches still queued for the slot go back to the stream
  // (with commit order, their commit points from each one's next unit on
  // are done: they cannot come).
  void drop_queue(uint32_t slot);
  void batch_done(const UnitBatch& b, uint32_t from);

  // Units in flight on the worker's sessions (Shared::batch_window).
  int in_flight() const;

  // One round's events: the inbox, libpq sockets ready, directly driven
  // sessions' answers and sends.
  void dispatch(const LoopEvent* evs, int n);

  void move(Slot& s, Event e);

  // Keeps the loop's watch on libpq's socket in step with our interest
  // (read always, write while libpq has unsent bytes).
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

  // --- commit order (--sync commit; replay/sync.h) ---------------------------

  // True when the first `need` commit points and the `n` listed at `deps`
  // have completed in the replay (or the slot's wait timed out), and the
  // slot's wait, if it waited, is counted; else the slot waits (parked_
  // for the prefix, or watching_ a listed commit, and a timer for
  // Shared::sync_timeout) and false.
  bool sync_ready(uint32_t slot, uint32_t need, const uint32_t* deps, uint32_t n, Nanos now);
  // The slot waits no more for the prefix or a listed commit.
  void unpark(uint32_t slot);
  bool parked(uint32_t slot) const { return parked_.armed(slot) || slots_[slot].sync_watch != kNone; }
  // Publishes the least need waiting (Waiter::need) and asks for a check
  // when it is already met.
  void publish_need();
  // Looks again at every waiting slot whose prefix or watched commit has
  // completed (it goes on, or waits for the next thing it needs).
  void sync_wake(Nanos now);
  // A wait timed out (--sync-timeout): the slot goes on, counted.
  void sync_timed_out(uint32_t slot, Nanos now);
  // Commit point c completed here: marks it and wakes who waits for it.
  void commit_done(uint32_t c);
  // Commit points done: the prefix moved to `prefix`; wakes who needs it.
  void sync_moved(uint64_t prefix);

  void send_unit(uint32_t slot, Nanos now);

  bool send_execute(PGconn* c, const Tables& t, const Op& op);

  void on_event(uint32_t slot, uint32_t ev);

  // --- directly driven sessions -------------------------------------------

  // Hands s.out to the loop once what it holds of the session has left.
  void send_direct(uint32_t slot);

  // True while bytes of the session's requests have not left.
  bool sending(const Slot& s) const {
    return s.out_left > 0 || loop_->queued(s.lc) > 0 || (s.tls_on && s.tls->queue().pending() > 0);
  }

  // TLS: hands the stage's next piece of ciphertext to the loop unless one
  // is in flight; true when one is (the Sent event goes on).
  bool flush_tls(uint32_t slot);

  // TLS: n bytes of ciphertext received: decrypts and acts on every
  // complete message, then receives again.
  void on_tls_data(uint32_t slot, uint32_t n, Nanos now);

  // A Sent event: the next piece goes, or, all of s.out gone, a unit whose
  // ReadyForQuery came first is done.
  void on_sent(uint32_t slot);

  // Arms the receive into the session's buffer, after what it holds.
  void arm_recv(uint32_t slot);

  // n bytes received: acts on every complete message, then receives again.
  void on_data(uint32_t slot, uint32_t n, Nanos now);

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
  UnitStream* stream_ = nullptr;     // streamed: this worker's sessions' units
  std::vector<uint32_t> slot_of_;    // streamed: plan session -> slot
  UnitBatch* held_batch_ = nullptr;  // read, for a session whose queue is full
  Nanos held_at_ = 0;                // when held_batch_ was held, or its session last finished a unit
  std::vector<uint32_t> starved_, waking_;  // slots waiting for the stream
  bool stream_moved_ = false;        // a held batch was queued: starved slots may go
  const int index_;                  // the worker's number, for the connection thread
  std::vector<Slot> slots_;
  TimerHeap timers_;
  // --sync commit: slots waiting for other sessions' commits, by the count
  // they need; sync_check_: the count may have moved (look before waiting).
  TimerHeap parked_;
  // Slots watching a listed commit (Slot::sync_watch); those of them found
  // completed in one look (sync_wake).
  std::vector<uint32_t> watching_, woken_;
  bool sync_check_ = false;
  Stats stats_;
  Live& live_;
  std::vector<uint32_t> gated_;
  std::vector<uint32_t> held_;       // max speed: connected, waiting for the start
  std::vector<Connector::Opened> opened_;  // taken from the inbox
  bool started_ = true;
  size_t gate_next_ = 0;
  size_t active_ = 0;
  // The loop (Options::io); destroyed before the slots, whose buffers its
  // receives fill.
  std::unique_ptr<Loop> loop_;
  Nanos last_end_ = 0;
  UnitLog log_;
  // Sends handed to the loop since its last round: their completions come
  // in the next round too (Shared::batch_window).
  int sends_ = 0;
};

}  // namespace tierlab::replay::detail
