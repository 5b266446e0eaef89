// A replay worker: its rounds on the event loop (common/loop.h), the
// schedule, the session state machine and the statistics (replay/worker.h).
#include "replay/worker.h"

namespace tierlab::replay::detail {

Worker::Worker(Shared& sh, int index, std::vector<uint32_t> sessions, Live& live)
    : sh_(sh), plan_(*sh.plan), index_(index), slots_(sessions.size()),
      timers_(static_cast<uint32_t>(sessions.size())), parked_(static_cast<uint32_t>(sessions.size())),
      stats_(sh.plan->fingerprints.size()),
      live_(live), log_(sh.log_fd, &sh.log_lock) {
  for (size_t i = 0; i < sessions.size(); ++i) slots_[i].session = sessions[i];
  if (plan_.streamed) {
    stream_ = sh.streams.at(index);
    slot_of_.assign(plan_.sessions.size(), kNone);
    starved_.reserve(sessions.size());
    waking_.reserve(sessions.size());
    for (size_t i = 0; i < sessions.size(); ++i) slot_of_[sessions[i]] = static_cast<uint32_t>(i);
    if (sh.order)
      stream_->on_commit(
          [](void* w, uint32_t session, uint32_t c) {
            Worker& me = *static_cast<Worker*>(w);
            if (me.sh_.ended_early[session].load(std::memory_order_acquire)) me.commit_done(c);
          },
          this);
  }
  held_.reserve(sessions.size());
  watching_.reserve(sessions.size());
  woken_.reserve(sessions.size());
  opened_.reserve(sessions.size());
  started_ = !sh.sched.max_speed || sh.initial == 0;
  // The sessions' own buffers take the answers (recv_into); the loop's
  // pool is unused, so it is the smallest there is.
  LoopOptions lo;
  lo.buffers = 2;
  lo.buffer_size = 4096;
  lo.connections = static_cast<uint32_t>(sessions.size() + 2);  // and the inbox's and commit order's watches
  lo.wait_sends = false;
  try {
    loop_ = make_loop(sh.uring, lo);
  } catch (const RuntimeError& e) {
    throw RuntimeError(std::string("replay: ") + (sh.uring ? "io_uring" : "epoll") +
                       ": setting up a worker's loop: " + e.what());
  }
  loop_->poll(loop_->poll_open(sh.connector->inbox_fd(index), kInboxTag), POLLIN);
  if (sh.order) loop_->poll(loop_->poll_open(sh.order->waiter(index).fd, kSyncTag), POLLIN);
}

void Worker::run() {
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
  LoopEvent evs[kMaxEvents];
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
    if (sync_check_) sync_wake(now);
    if (held_batch_ && !starved_.empty() && now - held_at_ >= kHeldPatience && holder_stuck()) release_held();
    if (stream_moved_) stream_wake(now);
    while (!timers_.empty() && timers_.top_due() <= now) on_timer(timers_.pop(), now);
    if (active_ == 0) break;
    // The next unit's due time, absolute: the loop wakes at it to the
    // nanosecond.
    Nanos deadline = timers_.empty() ? -1 : timers_.top_due();
    auto sooner = [&](Nanos at) { deadline = deadline < 0 ? at : std::min(deadline, at); };
    if (gate_next_ < gated_.size()) sooner(now + 1000000);
    // Connected sessions held for the start: look again soon (the other
    // workers' sessions may be the last to connect).
    if (!started_ && !held_.empty()) sooner(now + 20000);
    if (sync_check_ || stream_moved_) sooner(now);  // waiting slots may go: look without sleeping
    if (held_batch_ && !starved_.empty()) sooner(held_at_ + kHeldPatience);
    const int want = sh_.batch_window > 0 && started_ ? in_flight() + sends_ : 0;
    sends_ = 0;
    int n = want > 1 ? loop_->expect(evs, kMaxEvents, deadline, want, sh_.batch_window)
                     : loop_->wait_until(evs, kMaxEvents, deadline);
    if (n < 0) throw RuntimeError(errno_message(std::string("replay: ") + loop_->backend() + " wait", -n));
    dispatch(evs, n);
  }
  // Streamed with commit order: a session that ended early may have commit
  // points this stream has not numbered yet, which other workers' sessions
  // may wait for; the stream reads on to the end, marking them done.
  if (stream_ && sh_.order && sh_.any_ended_early.load(std::memory_order_acquire) && !sh_.stop.load())
    while (UnitBatch* b = stream_->next()) stream_->recycle(b);
  // The loop closes its duplicates of the sessions' sockets once the
  // kernel is done with them.
  loop_->finish(1'000'000'000);
  log_.flush();
}

int Worker::in_flight() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.unit != kNone && s.state != State::Done;
  return n;
}

void Worker::dispatch(const LoopEvent* evs, int n) {
  for (int i = 0; i < n; ++i) {
    const LoopEvent& e = evs[i];
    if (e.kind == LoopEv::Ready) {
      if (e.tag == kInboxTag) {
        on_inbox();
        continue;
      }
      if (e.tag == kSyncTag) {
        // Read before clearing `signalled`, then look (sync_wake): a
        // signal after this read writes again.
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(sh_.order->waiter(index_).fd, &v, sizeof v);
        sh_.order->waiter(index_).signalled.store(false, std::memory_order_seq_cst);
        sync_check_ = true;
        continue;
      }
      // A libpq session's socket (not one ended earlier in this round).
      const uint32_t slot = static_cast<uint32_t>(e.tag);
      if (slots_[slot].pw == e.conn) on_event(slot, static_cast<uint32_t>(e.res));
      continue;
    }
    // A directly driven session's connection; 0: closed earlier in this round.
    const uint64_t u = loop_->user(e.conn);
    if (u == 0) continue;
    const uint32_t slot = static_cast<uint32_t>(u - 1);
    Slot& s = slots_[slot];
    if (s.state == State::Done || !s.conn) continue;
    switch (e.kind) {
      case LoopEv::Data: on_data(slot, e.len, now_ns()); break;
      case LoopEv::Sent: on_sent(slot); break;
      case LoopEv::Eof:
        fail(slot, now_ns(), e.res < 0 ? std::strerror(-e.res) : "the server closed the connection unexpectedly");
        break;
      case LoopEv::SendError:
        fail(slot, now_ns(), e.res < 0 ? std::strerror(-e.res) : "could not send to the server");
        break;
      default: break;
    }
  }
}

void Worker::move(Slot& s, Event e) {
  State next = transition(s.state, e);
  // Invariant: the engine only takes transitions the state machine allows.
  assert(next != State::Invalid);
  s.state = next;
}

void Worker::watch(uint32_t slot, bool out) {
  Slot& s = slots_[slot];
  s.want_out = out;
  if (s.pw == kNone) {
    const int fd = PQsocket(s.conn);
    if (fd < 0) return;
    s.pw = loop_->poll_open(fd, slot);
  }
  loop_->poll(s.pw, POLLIN | (out ? POLLOUT : 0u));
}

void Worker::finish_slot(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  // The loop stops what it has in flight for the session (a receive into
  // its buffer ends as cancelled: the buffer outlives the loop) and gives
  // the socket back; libpq closes it on the connection thread.
  if (s.lc != kNone) {
    loop_->close(s.lc);
    s.lc = kNone;
  }
  if (s.tls_on) {
    // libpq's SSL object goes back to its socket, for libpq's Terminate
    // and close_notify.
    s.tls->reset();
    s.tls_on = false;
  }
  if (s.pw != kNone) {
    loop_->poll_close(s.pw);
    s.pw = kNone;
  }
  s.out_left = 0;
  sh_.connector->close(s.conn);
  s.conn = nullptr;
  timers_.cancel(slot);
  if (stream_) drop_queue(slot);
  if (sh_.order) {
    // The session's commit points still to come never will: done now, so
    // that no one waits for them.
    unpark(slot);
    s.sync_waiting = false;
    const Session& ps = session_of(s);
    if (!stream_) {
      for (uint32_t k = s.next; k < ps.n_units; ++k) {
        const uint32_t c = plan_.units[plan_.session_units[ps.first_unit + k]].commit;
        if (c != kNoCommit) commit_done(c);
      }
    } else if (s.next < ps.n_units) {
      // Those not read yet: marked done as the streams number them.
      sh_.ended_early[s.session].store(1, std::memory_order_release);
      sh_.any_ended_early.store(true, std::memory_order_release);
    }
    publish_need();
  }
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

void Worker::connect(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  // A session starts once the commits before its captured start have
  // completed; but at max speed those that start at once (gate 0) connect
  // together, before anything is sent, and their first units wait instead.
  const bool initial = sh_.sched.max_speed && sh_.gate[s.session] == 0;
  if (!initial && sh_.sync_all && !sync_ready(slot, session_of(s).sync_all, nullptr, 0, now)) return;
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
  // TLS as libpq negotiated it (sslmode, the root certificate, the host
  // name, a client certificate, channel binding): its SSL object goes on
  // in the session's stage. GSS encryption, and TLS of a libpq built on
  // another library, stay on libpq.
  SSL* ssl = PQsslInUse(s.conn) ? static_cast<SSL*>(PQsslStruct(s.conn, "OpenSSL")) : nullptr;
  s.direct = sh_.opts->direct && !PQgssEncInUse(s.conn) && (ssl || !PQsslInUse(s.conn));
  if (s.direct && !s.in) s.in = std::make_unique_for_overwrite<char[]>(kInBuf);  // pages touched as used
  if (s.direct && ssl) {
    if (!s.tls) {
      s.tls = std::make_unique<TlsStage>();
      s.cipher = std::make_unique_for_overwrite<uint8_t[]>(kInBuf);
    }
    if (!s.tls->adopt(ssl)) return fail(slot, now, s.tls->error());
    s.tls_on = true;
  }
  if (s.direct) ++stats_.sessions_direct;
  move(s, Event::Connected);
  s.free_at = now;
  if (s.direct) {
    // The loop borrows libpq's socket (libpq ends the connection with it,
    // on the connection thread, after finish_slot's close): one descriptor
    // a session.
    s.lc = loop_->open_borrowed(PQsocket(s.conn));
    loop_->user(s.lc) = uint64_t{slot} + 1;
    arm_recv(slot);
  } else {
    watch(slot, false);
  }
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
  Nanos due;
  if (s.next < ps.n_units) {
    const Tables* tab;
    uint32_t index;
    const Unit* u = next_unit(slot, &tab, &index);
    if (!u) return;  // streamed: read when another session's batch goes (stream_wake)
    due = sh_.sched.at(u->ts);
  } else {
    due = sh_.sched.at(ps.end);
  }
  if (due <= now) on_timer(slot, now);
  else timers_.set(slot, due);
}

void Worker::on_timer(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  if (parked(slot)) return sync_timed_out(slot, now);  // --sync-timeout
  if (s.state == State::Pending) return connect(slot, now);
  if (s.state != State::Idle) return;  // still busy: sends when done
  const Session& ps = session_of(s);
  if (s.next >= ps.n_units) {
    move(s, Event::Ended);
    return finish_slot(slot, now);
  }
  const Tables* tab;
  uint32_t unit;
  const Unit* next = next_unit(slot, &tab, &unit);
  if (!next) return;
  const Unit& u = *next;
  const bool go = sh_.sync_all ? sync_ready(slot, u.sync_all, nullptr, 0, now)
                               : sync_ready(slot, u.sync_need, tab->sync_deps.data() + u.sync_dep, u.n_sync_deps, now);
  if (!go) return;
  s.unit = unit;
  s.tab = tab;
  send_unit(slot, now);
}

const Unit* Worker::next_unit(uint32_t slot, const Tables** tab, uint32_t* index) {
  Slot& s = slots_[slot];
  if (!stream_) {
    *tab = &plan_;
    *index = plan_.session_units[session_of(s).first_unit + s.next];
    return &plan_.units[*index];
  }
  for (;;) {
    if (UnitBatch* h = s.q_head) {
      if (h->pos < h->order.size()) {
        *tab = h;
        *index = h->order[h->pos];
        return &h->units[*index];
      }
      s.q_head = h->next;
      if (!s.q_head) s.q_tail = nullptr;
      --s.queued;
      s.unbounded = false;  // it sends again: its read-ahead is bounded again
      stream_->recycle(h);
      if (held_batch_ && slot_of_[held_batch_->session] == slot) {
        enqueue(s, held_batch_);
        held_batch_ = nullptr;
        stream_moved_ = true;
      }
      continue;
    }
    // Invariant: a held batch's session has kQueueBatches queued, so this
    // one (with none) is not its session; it waits for that one to send.
    if (held_batch_) {
      assert(slot_of_[held_batch_->session] != slot);
      if (!s.starved) {
        s.starved = true;
        starved_.push_back(slot);
      }
      return nullptr;
    }
    UnitBatch* b = stream_->next();
    if (!b)
      throw RuntimeError("replay: the trace ended before session " + std::to_string(session_of(s).id) +
                         "'s unit " + std::to_string(s.next) + " (did it change while it was replayed?)");
    Slot& to = slots_[slot_of_.at(b->session)];
    if (to.state == State::Done) {  // failed or stopped: nothing more of it is sent
      if (sh_.order) batch_done(*b, 0);
      stream_->recycle(b);
      continue;
    }
    if (to.queued >= kQueueBatches && !to.unbounded) {
      held_batch_ = b;
      held_at_ = now_ns();
    } else {
      enqueue(to, b);
    }
  }
}

void Worker::enqueue(Slot& s, UnitBatch* b) {
  if (s.q_tail) s.q_tail->next = b;
  else s.q_head = b;
  s.q_tail = b;
  ++s.queued;
}

bool Worker::holder_stuck() const {
  const Slot& h = slots_[slot_of_[held_batch_->session]];
  if (h.unit == kNone) return false;  // no unit in flight: it waits for its time, not the server
  // Only a session inside a transaction holds locks the holder's unit may
  // wait for.
  for (uint32_t slot : starved_) {
    const Slot& s = slots_[slot];
    if (s.state == State::Done) continue;
    if (s.direct ? s.ready != 'I' : (s.conn && PQtransactionStatus(s.conn) != PQTRANS_IDLE)) return true;
  }
  return false;
}

void Worker::release_held() {
  Slot& s = slots_[slot_of_[held_batch_->session]];
  s.unbounded = true;
  enqueue(s, held_batch_);
  held_batch_ = nullptr;
  stream_moved_ = true;
}

void Worker::stream_wake(Nanos now) {
  stream_moved_ = false;
  std::swap(starved_, waking_);
  for (uint32_t slot : waking_) {
    Slot& s = slots_[slot];
    s.starved = false;
    if (s.state == State::Idle && !timers_.armed(slot) && (started_ || !sh_.sched.max_speed)) schedule_next(slot, now);
  }
  waking_.clear();
}

void Worker::batch_done(const UnitBatch& b, uint32_t from) {
  for (uint32_t k = from; k < b.order.size(); ++k)
    if (const uint32_t c = b.units[b.order[k]].commit; c != kNoCommit) commit_done(c);
}

void Worker::drop_queue(uint32_t slot) {
  Slot& s = slots_[slot];
  while (UnitBatch* h = s.q_head) {
    s.q_head = h->next;
    if (sh_.order) batch_done(*h, h->pos);
    stream_->recycle(h);
  }
  s.q_tail = nullptr;
  s.queued = 0;
  if (held_batch_ && slot_of_[held_batch_->session] == slot) {
    if (sh_.order) batch_done(*held_batch_, 0);
    stream_->recycle(held_batch_);
    held_batch_ = nullptr;
    stream_moved_ = true;
  }
}

bool Worker::sync_ready(uint32_t slot, uint32_t need, const uint32_t* deps, uint32_t n, Nanos now) {
  Slot& s = slots_[slot];
  if (s.sync_pass) {
    s.sync_pass = false;
    return true;
  }
  if (!sh_.order) return true;
  bool go = true;
  if (need > sh_.order->done()) {
    parked_.set(slot, need);
    go = false;
  } else {
    // Invariant (replay/sync.h): watched, then read; a completion after
    // the read signals this worker.
    for (; s.sync_cursor < n; ++s.sync_cursor) {
      const uint32_t c = deps[s.sync_cursor];
      if (sh_.order->is_done(c) || sh_.order->watch(c, index_)) continue;
      s.sync_watch = c;
      s.watch_pos = static_cast<uint32_t>(watching_.size());
      watching_.push_back(slot);
      go = false;
      break;
    }
  }
  if (go) {
    s.sync_cursor = 0;
    if (s.sync_waiting) {
      s.sync_waiting = false;
      timers_.cancel(slot);
      stats_.sync_wait.record(now - s.sync_from);
      s.sync_at = now;
    }
    return true;
  }
  if (!s.sync_waiting) {
    s.sync_waiting = true;
    s.sync_from = now;
    if (sh_.sync_timeout > 0) timers_.set(slot, now + sh_.sync_timeout);
  }
  publish_need();
  return false;
}

void Worker::unpark(uint32_t slot) {
  Slot& s = slots_[slot];
  parked_.cancel(slot);
  if (s.sync_watch == kNone) return;
  const uint32_t last = watching_.back();
  watching_[s.watch_pos] = last;
  slots_[last].watch_pos = s.watch_pos;
  watching_.pop_back();
  s.sync_watch = kNone;
  s.watch_pos = kNone;
}

void Worker::publish_need() {
  const uint64_t least = parked_.empty() ? UINT64_MAX : static_cast<uint64_t>(parked_.top_due());
  sh_.order->waiter(index_).need.store(least, std::memory_order_seq_cst);
  // Invariant (replay/sync.h): published, then read; a commit that moved
  // the prefix before this read is seen here, one after it signals us.
  if (least <= sh_.order->done()) sync_check_ = true;
}

void Worker::sync_wake(Nanos now) {
  sync_check_ = false;
  const uint64_t done = sh_.order->done();
  woken_.clear();
  while (!parked_.empty() && static_cast<uint64_t>(parked_.top_due()) <= done) {
    woken_.push_back(parked_.top());
    parked_.cancel(parked_.top());
  }
  for (size_t i = 0; i < watching_.size();) {
    const uint32_t slot = watching_[i];
    // Watched again (a slot of watchers serves several commit points, and
    // another's completion took this worker's bit), then read.
    if (!sh_.order->watch(slots_[slot].sync_watch, index_)) {
      ++i;
      continue;
    }
    woken_.push_back(slot);
    unpark(slot);  // moves the last one to i
  }
  // Each looks again: goes on, or waits for what it needs next.
  for (uint32_t slot : woken_)
    if (slots_[slot].sync_waiting) on_timer(slot, now);
  publish_need();
}

void Worker::sync_timed_out(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  unpark(slot);
  stats_.sync_wait.record(now - s.sync_from);
  ++stats_.sync_timeouts;
  s.sync_waiting = false;
  s.sync_cursor = 0;
  s.sync_pass = true;
  s.sync_at = now;
  on_timer(slot, now);
  s.sync_pass = false;  // used, or the slot ended meanwhile
  publish_need();
}

void Worker::commit_done(uint32_t c) {
  const uint64_t prefix = sh_.order->complete(c);
  const uint64_t watchers = sh_.order->take_watchers(c);
  sh_.order->signal(watchers, index_);
  if (watchers >> (index_ % 64) & 1) sync_check_ = true;
  sync_moved(prefix);
}

void Worker::sync_moved(uint64_t prefix) {
  sh_.order->wake(prefix, index_);
  if (!parked_.empty() && static_cast<uint64_t>(parked_.top_due()) <= prefix) sync_check_ = true;
}

void Worker::send_unit(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  const Unit& u = unit_of(s);
  PGconn* c = s.conn;
  // Lag and latency count from the send (a directly driven session's: from
  // when it is queued on the loop), not from when this pass of the loop
  // started.
  now = now_ns();
  s.lag = s.own_lag = 0;
  s.unit_state[0] = 0;
  if (!sh_.sched.max_speed) {
    Nanos due = sh_.sched.at(u.ts);
    s.lag = std::max<Nanos>(0, now - due);
    stats_.lag.record(s.lag);
    // The part of it spent in tierlab: from the later of the due time and
    // the previous answer (the target's share) to the send.
    // A wait for other sessions' commits (--sync commit) is not tierlab's.
    s.own_lag = std::max<Nanos>(0, now - std::max({due, s.free_at, s.sync_at}));
    stats_.own_lag.record(s.own_lag);
    live_.add(live_.lag_sum_ns, static_cast<double>(s.lag));
    live_.add(live_.lag_n, 1);
  }
  s.sync_at = 0;
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
    send_direct(slot);
    return;
  }
  const Tables& tab = *s.tab;
  const bool one_execute = u.kind == UnitKind::Extended && u.n_ops == 1 &&
                           tab.ops[u.first_op].kind == OpKind::Execute;
  const bool pipelined = u.kind == UnitKind::Extended && !one_execute;
  bool ok = true;
  if (s.pipeline != pipelined) {
    ok = (pipelined ? PQenterPipelineMode(c) : PQexitPipelineMode(c)) == 1;
    if (ok) s.pipeline = pipelined;
  }
  if (!pipelined) {
    ok = ok && (one_execute ? send_execute(c, tab, tab.ops[u.first_op]) : PQsendQuery(c, u.sql) == 1);
  } else {
    for (uint32_t i = 0; ok && i < u.n_ops; ++i) {
      const Op& op = tab.ops[u.first_op + i];
      switch (op.kind) {
        case OpKind::Prepare:
          ok = PQsendPrepare(c, op.name, op.sql, op.nparams,
                             op.nparams ? reinterpret_cast<const Oid*>(tab.types.data() + op.types)
                                        : nullptr) == 1;
          break;
        case OpKind::Execute:
          ok = send_execute(c, tab, op);
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
    record(s.tab->stmts[u.first_stmt], s.agg, now - s.sent_at);
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
  if (sh_.order && u.commit != kNoCommit) commit_done(u.commit);
  move(s, Event::UnitDone);
  s.free_at = now;
  ++s.next;
  s.unit = kNone;
  // The holder of a held batch goes on: a starved session waits for it
  // (release_held is for a holder that does not).
  if (held_batch_ && slot_of_[held_batch_->session] == slot) held_at_ = now;
  s.tab = nullptr;
  if (stream_) ++s.q_head->pos;  // the unit sent was the head's (next_unit)
  schedule_next(slot, now);
}

}  // namespace tierlab::replay::detail
