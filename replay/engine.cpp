// The replay engine: worker threads, each running many sessions over one
// event loop (common/loop.h; its io_uring or epoll backend, Options::io,
// chosen once for all workers). This file starts and joins them
// (run); the worker is replay/worker.h: its loop, schedule, session state
// machine and statistics in replay/worker.cpp, directly driven sessions in
// replay/direct.cpp, libpq sessions in replay/libpq_session.cpp.
//
// libpq opens every connection (authentication, TLS, GSS), on the
// connection thread (replay/connector.h), which hands each one to its
// worker through the worker's inbox, an eventfd the worker's loop watches;
// the same thread closes them. A session on a plaintext or TLS connection is then driven
// directly: each unit's request is
// the plan's protocol messages (a Query, or the extended-protocol messages
// up to a Sync), written to the socket as they are, and the answers are
// read into the session's buffer and acted on as they arrive (statement
// outcomes from CommandComplete and ErrorResponse, the transaction status
// from ReadyForQuery; rows are skipped unread). Over TLS the session's
// TlsStage (common/tls.h) takes over libpq's OpenSSL session, with memory
// buffers for the socket, and gives it back before libpq closes the
// connection. A GSS-encrypted session, or every session with
// Options::direct off, stays on libpq.
//
// A directly driven session is a connection of the loop, on a duplicate of
// libpq's socket: a receive into its buffer is always armed (recv_into),
// and its requests are queued as they are in the plan (send_ext). On
// io_uring every send and receive queued in a round reaches the kernel
// with the wait for the next completion, in one io_uring_enter, where
// epoll takes a system call per send, per receive and per wait. libpq's
// sockets and the inbox are the loop's readiness watches (level-triggered:
// libpq reads only part of what a socket holds). The next unit's due time
// is the round's absolute deadline (wait_until, to the nanosecond). Lag
// and latency count from when a unit's send is queued; on io_uring it
// leaves in that round's io_uring_enter.
//
// Steady state (a connected session sending units and reaping results)
// allocates nothing on tierlab's side: session slots and their receive
// buffers, the timer heap, the event array, the loop's slots and lists,
// statistics and parameter
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
#include "replay/cpu_budget.h"
#include "replay/worker.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "common/loop.h"
#include "common/uring.h"
#include "replay/connector.h"
#include "replay/plan.h"
#include "replay/schedule.h"
#include "replay/session.h"
#include "replay/start_at.h"
#include "replay/stats.h"
#include "replay/unit_log.h"
#include "replay/wire.h"

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

namespace tierlab::replay {
namespace {

using detail::Shared;
using detail::Worker;
using detail::kNone;
using detail::kWorkerSliceNs;


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

// Why the io_uring loop cannot run here ("" when it can): the loop's needs,
// and a wait that takes a timeout (the schedule's deadlines, without a
// timeout operation per round).
std::string uring_unsupported() {
  std::string m = loop_uring_missing();
  if (m.empty()) m = uring_missing({.ext_arg = true, .buf_ring = false, .ops = {}});
  return m;
}

void check_speed(const Workload& w, double speed) {
  char msg[160];
  if (!(speed > 0)) {
    std::snprintf(msg, sizeof msg, "%g: must be greater than 0", speed);
    throw InputError(msg);
  }
  // The schedule must fit the clock: 2^62 ns is 146 years.
  const Plan& plan = w.plan();
  Nanos last = plan.t0;
  for (const Session& s : plan.sessions) last = std::max(last, s.end);
  if (static_cast<double>(last - plan.t0) / speed >= 0x1p62) {
    std::snprintf(msg, sizeof msg, "%g: the captured %.3f s would take more than 146 years", speed,
                  static_cast<double>(last - plan.t0) / 1e9);
    throw InputError(msg);
  }
}

Report run(const Workload& w, const Options& opts, std::ostream* progress) {
  const Plan& plan = w.plan();
  if (plan.streamed && opts.sync && !plan.sync)
    throw InputError("commit order needs a workload planned with it (load(), or stream() with sync)");
  if (plan.streamed && opts.sync && !plan.sync_unplanned.empty())
    throw InputError("commit order cannot be planned as the trace is read (" + plan.sync_unplanned + "): load() it");
  if (!opts.max_speed) {
    try {
      check_speed(w, opts.speed);
    } catch (const InputError& e) {
      throw InputError(std::string("speed ") + e.what());
    }
  }
  Shared sh;
  sh.plan = &plan;
  sh.opts = &opts;
  sh.sched.t0 = plan.t0;
  sh.sched.speed = opts.speed;
  sh.sched.max_speed = opts.max_speed;
  // auto: io_uring only for directly driven sessions (libpq's gain nothing
  // from it: libpq makes its own system calls).
  sh.uring = use_uring(opts.io, "replay", opts.direct, &uring_unsupported);

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
  sh.gate = max_speed_gates(plan);
  if (opts.max_speed) sh.initial = static_cast<uint64_t>(std::count(sh.gate.begin(), sh.gate.end(), 0));

  // By default one worker per CPU the replay may use: its affinity, capped
  // by its cgroup's CPU quota (replay/cpu_budget.h).
  int threads = opts.threads > 0 ? opts.threads : default_cpus();
  // At max speed under a CPU quota a worker waits for a batch of answers
  // (Loop::expect): each wake-up costs quota the sends need.
  if (opts.max_speed && cgroup_quota_cpus() > 0) sh.batch_window = detail::kBatchWindow;
  threads = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, plan.sessions.size())));

  // One descriptor a session open at once: libpq's socket, which a
  // directly driven session's loop connection borrows.
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
  // Streamed: each worker reads the trace again for its sessions' units.
  std::vector<std::unique_ptr<UnitStream>> streams;
  if (plan.streamed) {
    for (int t = 0; t < threads; ++t) {
      streams.push_back(std::make_unique<UnitStream>(trace::open_reader(w.path()), plan, w.window(), w.shard(), per[t]));
      sh.streams.push_back(streams.back().get());
    }
  }
  Connector connector(opts.conninfo, sh.params, per_size);
  sh.connector = &connector;
  connector.start();
  // --sync commit: the commit order, when there is one to keep.
  std::optional<detail::CommitOrder> commit_order;
  if (opts.sync && plan.commits > 0) {
    commit_order.emplace(plan.commits, threads);
    sh.order = &*commit_order;
    sh.sync_timeout = opts.sync_timeout_ns;
    sh.sync_all = opts.sync_all;
    if (plan.streamed) {
      sh.ended_early = std::make_unique<std::atomic<uint8_t>[]>(plan.sessions.size());
      for (size_t i = 0; i < plan.sessions.size(); ++i) sh.ended_early[i].store(0, std::memory_order_relaxed);
    }
  }
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < threads; ++t) workers.push_back(std::make_unique<Worker>(sh, t, per[t], live[t]));

  std::atomic<int> running{threads};
  std::vector<std::exception_ptr> errors(threads);
  std::vector<Nanos> cpu_ns(threads, 0);
  std::vector<uint64_t> slice_ns(threads, 0);
  // Timed replays keep deadlines: hold the CPUs' wake-up latency down.
  CpuLatencyHold cpu_latency(opts.hold_cpu_latency && !opts.max_speed);
  sh.sched.epoch = now_ns() + 1000000;  // 1 ms for the threads to start
  if (opts.start_at_ns) {  // --start-at: the shared epoch of the shards
    const char* why = nullptr;
    sh.sched.epoch = wait_for_start(opts.start_at_ns, opts.wait_stop, &why);
    if (why) throw RuntimeError(std::string("replay: stopped by ") + why + " while waiting for the start time; nothing was replayed");
  }
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
        // The others stop too: their sessions may wait for this one's.
        sh.stop.store(true);
        for (int o = 0; o < threads; ++o) connector.poke(o);
      }
      cpu_ns[t] = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      running.fetch_sub(1);
    });
  }
  rt.reset();  // the progress loop below runs at normal priority
  const int64_t start_offset_ns = opts.start_at_ns ? start_offset(opts.start_at_ns, sh.sched.epoch) : 0;

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
  r.sync = opts.sync;
  r.sync_all = opts.sync && opts.sync_all;
  r.sync_timeout_s = static_cast<double>(opts.sync_timeout_ns) / 1e9;
  r.threads = threads;
  r.cpu_latency_held = cpu_latency.held();
  r.realtime = opts.realtime;
  r.slice_ms = static_cast<double>(*std::min_element(slice_ns.begin(), slice_ns.end())) / 1e6;
  r.io = sh.uring ? "io_uring" : "epoll";
  r.start_at_ns = opts.start_at_ns;
  r.start_offset_ns = r.start_offset_max_ns = start_offset_ns;
  if (opts.start_at_ns) r.clock = realtime_clock_source();
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
