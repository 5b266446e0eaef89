// The replay's connection thread: opens and closes every session's
// connection, so that the worker threads never run libpq's connect or
// close work.
//
// A connection costs the client 0.3-0.6 ms of CPU in libpq and the kernel
// (its TCP connect, the SSL and GSS negotiation, the authentication
// exchange) over several calls, and a close about a tenth of that; on a
// loaded machine a thread can lose its CPU in the middle of either for
// milliseconds. Made on a worker, that time is taken
// from every other session the worker runs: their sends go late and their
// answers wait unread. A workload that connects often (an application
// without a pooler) would then measure the replayer, not the target. Here a
// worker asks for a session's connection when it is due and goes on; the
// connection thread drives every pending connect over its own epoll wait
// and hands each one back, connected or failed, through the worker's inbox
// (an eventfd the worker waits on with its sessions' sockets).
//
// Nothing is allocated per connection on tierlab's side: the request queue,
// the table of connects in progress and the inboxes are sized for every
// session before the replay starts (libpq allocates its connection).
#pragma once

#include "common/clock.h"

#include <libpq-fe.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tierlab::replay {

// Who one session connects as; nullptr: from the conninfo and libpq's
// environment.
struct ConnParams {
  const char* user = nullptr;
  const char* database = nullptr;
  const char* application_name = nullptr;
};

// libpq's keyword/value arrays for a session's connection: the target's
// conninfo (expanded from "dbname"), then what the capture recorded for the
// session, which overrides it. Points into `conninfo` and `p`.
struct ConnKeywords {
  const char* kw[5];
  const char* val[5];
  ConnKeywords(const std::string& conninfo, const ConnParams& p);
};

// A setting `conninfo` names itself ("" when it does not): keyword=value
// pairs or a URI; a string that is neither is a database name, as libpq
// takes it.
std::string conninfo_value(const std::string& conninfo, const char* keyword);

// libpq's connect_timeout for `conninfo` (its value there, else
// PGCONNECT_TIMEOUT), in ns; 0: none. libpq applies it only in its blocking
// calls; the replay's non-blocking connects apply it themselves. As libpq,
// a timeout under 2 s is 2 s. InputError when it is not a number.
int64_t connect_timeout_ns(const std::string& conninfo);

class Connector {
 public:
  // A connection handed back to its worker: `conn` is connected
  // (PQstatus CONNECTION_OK), or failed with libpq's message in it, or
  // nullptr; `why` says why when libpq's message does not (else nullptr).
  struct Opened {
    uint32_t slot = 0;
    PGconn* conn = nullptr;
    const char* why = nullptr;
  };

  // `params` by session (kept by reference); `sessions_per_worker[w]`: how
  // many sessions worker w runs, each connecting at most once.
  Connector(const std::string& conninfo, const std::vector<ConnParams>& params,
            const std::vector<size_t>& sessions_per_worker);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Starts the thread (at the starting thread's scheduling policy).
  void start();
  // Closes what is left (queued closes, connects in progress, connections
  // no worker took) and joins the thread. Rethrows the thread's failure.
  void stop();

  // Readable while worker w's inbox may hold connections (level: until
  // take() reads it).
  int inbox_fd(int worker) const { return inboxes_[static_cast<size_t>(worker)].fd; }

  // From worker w: open session `session`'s connection for its slot.
  void open(int worker, uint32_t slot, uint32_t session);
  // From any worker: close a connection (nullptr is ignored).
  void close(PGconn* conn);
  // Wakes worker w's wait, with nothing in its inbox.
  void poke(int worker) { wake(inboxes_[static_cast<size_t>(worker)].fd); }
  // Worker w's connections handed back since its last call, into `out`
  // (cleared; reserve it for the worker's sessions: nothing is allocated).
  void take(int worker, std::vector<Opened>& out);

  // CPU time (user + system) of the connection thread in ns, after stop().
  int64_t cpu_ns() const { return cpu_ns_; }

 private:
  struct Request {
    PGconn* close = nullptr;  // a close, else an open:
    int worker = 0;
    uint32_t slot = 0;
    uint32_t session = 0;
  };
  struct Pending {
    PGconn* conn = nullptr;
    int64_t deadline = 0;  // CLOCK_MONOTONIC; with connect_timeout
    int worker = 0;
    uint32_t slot = 0;
    int fd = -1;        // registered with the epoll set, -1 none
    uint32_t events = 0;
  };
  struct Inbox {
    int fd = -1;  // eventfd
    std::mutex lock;
    std::vector<Opened> items;
  };

  void loop();
  bool handle_requests();  // false once stop() asked and nothing is left
  void begin(const Request& r);
  void step(uint32_t idx);
  // (Re)registers a pending connect's socket for `events`; false on failure.
  bool arm(uint32_t idx, uint32_t events);
  void unarm(Pending& p);
  void deliver(int worker, uint32_t slot, PGconn* conn, const char* why);
  // Fails the connects in progress whose connect_timeout passed; returns
  // how long until the next one would (epoll_wait's timeout, -1 none).
  int expire();
  static void wake(int fd);

  const std::string& conninfo_;
  const std::vector<ConnParams>& params_;
  std::vector<Inbox> inboxes_;
  int ep_ = -1;
  int wake_fd_ = -1;  // eventfd: requests are queued
  std::mutex lock_;   // guards requests_ and stopping_
  std::vector<Request> requests_;
  bool stopping_ = false;
  // The thread's own.
  std::vector<Request> work_;
  std::vector<Pending> pending_;  // by open request, in order of arrival
  // One timeout for all: deadlines come in order of arrival, so the first
  // connect still in progress from `oldest_` on is the next to expire.
  int64_t timeout_ns_ = 0;
  size_t oldest_ = 0;
  std::thread thread_;
  std::exception_ptr error_;
  std::string failure_;  // once the thread failed: why every open fails
  int64_t cpu_ns_ = 0;
};

}  // namespace tierlab::replay
