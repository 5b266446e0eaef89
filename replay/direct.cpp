// Sessions driven directly: the plan's protocol messages out, the answers
// read and parsed without libpq (replay/worker.h). On a TLS connection the
// same, through the session's TlsStage (common/tls.h) holding libpq's SSL
// object: requests are encrypted into the stage's queue, which goes out a
// piece at a time, and the ciphertext received is decrypted into the
// session's buffer before the parser reads it.
#include "replay/worker.h"

namespace tierlab::replay::detail {

void Worker::send_direct(uint32_t slot) {
  Slot& s = slots_[slot];
  if (loop_->queued(s.lc) > 0) return;  // its Sent event goes on
  if (s.out_left == 0) return on_sent(slot);
  if (s.tls_on) {
    const uint32_t n = std::min(s.out_left, kTlsPiece);
    if (!s.tls->encrypt(reinterpret_cast<const uint8_t*>(s.out), n)) return fail(slot, now_ns(), s.tls->error());
    s.out += n;
    s.out_left -= n;
    flush_tls(slot);
    return;
  }
  // Leaves with the loop's next round (on io_uring in the submission that
  // also waits; on epoll at once); the plan's bytes stay put until sent.
  loop_->send_ext(s.lc, reinterpret_cast<const uint8_t*>(s.out), s.out_left);
  ++sends_;
  s.out += s.out_left;
  s.out_left = 0;
}

bool Worker::flush_tls(uint32_t slot) {
  Slot& s = slots_[slot];
  SendQueue& q = s.tls->queue();
  if (q.in_flight()) return true;
  uint32_t len = 0;
  const uint8_t* p = q.take(&len);
  if (!p) return false;
  loop_->send_ext(s.lc, p, len);
  return true;
}

void Worker::on_sent(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.tls_on) s.tls->queue().done(loop_->queued(s.lc));
  if (loop_->queued(s.lc) > 0) return;
  if (s.tls_on && flush_tls(slot)) return;  // ciphertext encrypted behind the piece that went
  if (s.out_left > 0) return send_direct(slot);
  if (!s.done_after_send) return;
  s.done_after_send = false;
  unit_done(slot, now_ns());
}

void Worker::arm_recv(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.tls_on) return loop_->recv_into(s.lc, s.cipher.get(), kInBuf);
  if (s.in_off == s.in_len) s.in_off = s.in_len = 0;
  loop_->recv_into(s.lc, reinterpret_cast<uint8_t*>(s.in.get()) + s.in_len, kInBuf - s.in_len);
}

void Worker::on_data(uint32_t slot, uint32_t n, Nanos now) {
  Slot& s = slots_[slot];
  if (s.tls_on) return on_tls_data(slot, n, now);
  PGconn* c = s.conn;
  s.in_len += n;
  if (!parse_direct(slot, now) || s.conn != c || s.state == State::Done) return;
  arm_recv(slot);
}

void Worker::on_tls_data(uint32_t slot, uint32_t n, Nanos now) {
  Slot& s = slots_[slot];
  PGconn* c = s.conn;
  const uint8_t* p = s.cipher.get();
  // Invariant: after parse_direct the buffer has room (a message it waits
  // for is shorter than kInBuf, or is read from its first kInBuf bytes).
  for (;;) {
    if (s.in_off == s.in_len) s.in_off = s.in_len = 0;
    assert(s.in_len < kInBuf);
    const int64_t got =
        s.tls->decrypt(p, n, reinterpret_cast<uint8_t*>(s.in.get()) + s.in_len, kInBuf - s.in_len);
    p = nullptr;
    n = 0;
    flush_tls(slot);  // what TLS answers by itself (a key update, an alert)
    if (got < 0) return fail(slot, now, s.tls->error());
    if (got == 0) break;  // one record at a time: none left
    s.in_len += static_cast<uint32_t>(got);
    if (!parse_direct(slot, now) || s.conn != c || s.state == State::Done) return;
  }
  if (s.tls->peer_closed()) return fail(slot, now, "the server closed the connection unexpectedly");
  arm_recv(slot);
}

bool Worker::parse_direct(uint32_t slot, Nanos now) {
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

bool Worker::on_message(uint32_t slot, char type, const char* body, uint32_t len, Nanos now) {
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
      count_error(s, state, wire::error_message(body, len));
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
      send_direct(slot);
      return true;
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

void Worker::answer(Slot& s, bool error, const char* state, bool has_rows, uint64_t rows) {
  const Unit& u = unit_of(s);
  if (u.kind != UnitKind::Extended) return fold(s, error, state, has_rows, rows);
  if (s.aborted || s.op >= u.n_stmts) return;
  Outcome out;
  out.status = error ? Status::Error : Status::Ok;
  if (error) std::memcpy(out.sqlstate, state, 6);
  out.has_rows = has_rows;
  out.rows = rows;
  s.aborted = error;
  record(s.tab->stmts[u.first_stmt + s.op++], out, now_ns() - s.sent_at);
}

void Worker::finish_direct(uint32_t slot) {
  Slot& s = slots_[slot];
  const Unit& u = unit_of(s);
  Nanos now = now_ns();
  if (u.kind == UnitKind::Extended) {
    Outcome skipped;
    skipped.status = Status::Skipped;
    while (s.op < u.n_stmts) record(s.tab->stmts[u.first_stmt + s.op++], skipped, now - s.sent_at);
  }
  if (s.state == State::CopyOut) move(s, Event::CopyFinished);  // no CopyDone came
  // A COPY that failed while its data was still going out: the server
  // ignores the rest, but it must leave whole before the next request.
  if (sending(s)) {
    s.done_after_send = true;
    return;
  }
  unit_done(slot, now);
}

bool Worker::push_copy(uint32_t slot, Nanos now) {
  Slot& s = slots_[slot];
  const Unit& u = unit_of(s);
  while (s.copy < u.n_copy) {
    const CopyChunk& ch = s.tab->copy_chunks[u.first_copy + s.copy];
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

void Worker::drain(uint32_t slot, Nanos now) {
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

}  // namespace tierlab::replay::detail
