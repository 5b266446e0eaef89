// Sessions driven through non-blocking libpq (GSS-encrypted ones, and
// every session with Options::direct off), and the result bookkeeping the
// direct sessions share (replay/worker.h).
#include "replay/worker.h"

namespace tierlab::replay::detail {

bool Worker::send_execute(PGconn* c, const Tables& t, const Op& op) {
  return PQsendQueryPrepared(c, op.name, op.nparams, t.param_values.data() + op.params,
                             t.param_lengths.data() + op.params,
                             t.param_formats.data() + op.params, op.result_format) == 1;
}

void Worker::on_event(uint32_t slot, uint32_t ev) {
  Slot& s = slots_[slot];
  Nanos now = now_ns();
  if (s.state == State::Done || !s.conn) return;
  if ((ev & POLLOUT) && s.want_out) {
    if (s.state == State::CopyIn) {
      if (!push_copy(slot, now)) return;
    } else {
      int f = PQflush(s.conn);
      if (f < 0) return fail(slot, now);
      watch(slot, f == 1);
    }
  }
  if (ev & (POLLIN | POLLHUP | POLLERR)) {
    if (PQconsumeInput(s.conn) == 0) return fail(slot, now);
    if (s.state == State::Idle) {
      // Nothing is expected: notices, notifications, parameter changes.
      while (PGnotify* n = PQnotifies(s.conn)) PQfreemem(n);
      return;
    }
    if (s.state == State::Busy || s.state == State::CopyOut) drain(slot, now);
  }
}

void Worker::count_error(Slot& s, PGresult* res, char out[6]) {
  const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  if (!state || std::strlen(state) != 5) state = "XX000";
  std::memcpy(out, state, 5);
  out[5] = 0;
  const char* message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  count_error(s, out, message ? message : "");
}

void Worker::count_error(Slot& s, const char* state, std::string_view message) {
  stats_.error(state, message);
  live_.add(live_.errors, 1);
  if (!s.unit_state[0]) std::memcpy(s.unit_state, state, sizeof s.unit_state);
  s.txn_failed = true;
}

bool Worker::result_rows(PGresult* res, uint64_t* rows) {
  const char* t = PQcmdTuples(res);
  if (!t || !*t) return false;
  *rows = std::strtoull(t, nullptr, 10);
  return true;
}

void Worker::on_result(Slot& s, PGresult* res, ExecStatusType st) {
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
  const Op& op = s.tab->ops[u.first_op + s.op++];
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
  record(s.tab->stmts[op.stmt], out, now_ns() - s.sent_at);
}

}  // namespace tierlab::replay::detail
