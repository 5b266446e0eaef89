// A replay worker: its wait (io_uring or epoll), the schedule, the session
// state machine and the statistics (replay/worker.h).
#include "replay/worker.h"

namespace tierlab::replay::detail {

void Worker::run() {
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

void Worker::start_ring() {
  try {
    ring_.emplace(ring_options());
  } catch (const RuntimeError& e) {
    throw RuntimeError(std::string("replay: io_uring: setting up a worker's ring: ") + e.what());
  }
  ring_on_ = true;
  arm_epoll();
}

int Worker::wait_events(epoll_event* evs, const timespec* timeout) {
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

void Worker::dispatch(const epoll_event* evs, int n) {
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = evs[i].data.u64;
    if (tag == kInboxTag) on_inbox();
    else if (tag != kTimerTag) on_event(static_cast<uint32_t>(tag), evs[i].events);
  }
}

io_uring_sqe* Worker::sqe() {
  io_uring_sqe* q = io_uring_get_sqe(ring());
  if (!q) {
    io_uring_submit(ring());
    q = io_uring_get_sqe(ring());
    if (!q) throw RuntimeError("io_uring: no submission queue entry free");
  }
  return q;
}

void Worker::arm_epoll() {
  io_uring_sqe* q = sqe();
  io_uring_prep_poll_add(q, ep_, POLLIN);
  io_uring_sqe_set_data64(q, kEpollTag);
}

void Worker::wait_ring(Nanos wait, epoll_event* evs) {
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

void Worker::to_ring(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.fd >= 0) epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
  s.fd = PQsocket(s.conn);
  s.events = 0;
  arm_recv(slot);
}

void Worker::arm_recv(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.in_off == s.in_len) s.in_off = s.in_len = 0;
  io_uring_sqe* q = sqe();
  io_uring_prep_recv(q, s.fd, s.in.get() + s.in_len, kInBuf - s.in_len, 0);
  io_uring_sqe_set_data64(q, uint64_t{slot} << 2 | kOpRecv);
  s.recv_armed = true;
}

void Worker::queue_send(uint32_t slot) {
  Slot& s = slots_[slot];
  io_uring_sqe* q = sqe();
  io_uring_prep_send(q, s.fd, s.out, s.out_left, MSG_NOSIGNAL);
  io_uring_sqe_set_data64(q, uint64_t{slot} << 2 | kOpSend);
  s.send_inflight = true;
}

void Worker::on_completion(uint32_t slot, uint64_t op, int res) {
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

void Worker::move(Slot& s, Event e) {
  State next = transition(s.state, e);
  // Invariant: the engine only takes transitions the state machine allows.
  assert(next != State::Invalid);
  s.state = next;
}

void Worker::watch(uint32_t slot, bool out) {
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

void Worker::finish_slot(uint32_t slot, Nanos now) {
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

void Worker::stop_all(Nanos now) {
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    Slot& s = slots_[slot];
    if (s.state == State::Done) continue;
    if (s.state != State::Pending) ++stats_.sessions_stopped;
    move(s, Event::Stopped);
    finish_slot(slot, now);
  }
}

void Worker::initial_settled(const Slot& s) {
  if (sh_.sched.max_speed && sh_.gate[s.session] == 0) sh_.initial_ready.fetch_add(1, std::memory_order_acq_rel);
}

void Worker::release(Nanos now) {
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

void Worker::fail(uint32_t slot, Nanos now, const char* why) {
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

void Worker::connect(uint32_t slot, Nanos) {
  Slot& s = slots_[slot];
  move(s, Event::Due);
  sh_.connector->open(index_, slot, s.session);
}

void Worker::on_inbox() {
  sh_.connector->take(index_, opened_);
  const Nanos now = now_ns();
  for (const Connector::Opened& o : opened_) {
    Slot& s = slots_[o.slot];
    s.conn = o.conn;
    if (o.why || !o.conn || PQstatus(o.conn) != CONNECTION_OK) fail(o.slot, now, o.why);
    else connected(o.slot, now);
  }
}

void Worker::connected(uint32_t slot, Nanos now) {
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

void Worker::schedule_next(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  const Session& ps = session_of(s);
  Nanos due = s.next < ps.n_units
                  ? sh_.sched.at(plan_.units[plan_.session_units[ps.first_unit + s.next]].ts)
                  : sh_.sched.at(ps.end);
  if (due <= now) on_timer(slot, now);
  else timers_.set(slot, due);
}

void Worker::on_timer(uint32_t slot, Nanos now) {
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

void Worker::send_unit(uint32_t slot, Nanos now) {
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

void Worker::fold(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows) {
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

void Worker::record(const Stmt& st, const Outcome& out, Nanos lat) {
  stats_.statement(st, out, lat);
  live_.add(live_.statements, 1);
  live_.add(live_.lat_sum_ns, static_cast<double>(lat));
  live_.add(live_.lat_sumsq_ns, static_cast<double>(lat) * static_cast<double>(lat));
}

void Worker::unit_done(uint32_t slot, Nanos now) {
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

}  // namespace tierlab::replay::detail
