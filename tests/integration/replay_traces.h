// Synthetic traces for the replay tests: record sequences shaped the way the
// capture proxy records them (SessionBegin; per request Query or
// Parse/Bind/Describe/Execute/Sync; then Result or Error and Ready in
// server order; SessionEnd), written with trace::Writer.
#pragma once

#include "trace/writer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace replay_test {

using tierlab::trace::Nanos;
namespace trace = tierlab::trace;

constexpr Nanos kMs = 1000000;

// Synthetic traces start their clock at 0, so their records, like a
// capture's, come after the trace start (replay --begin and --end count
// from it).
inline std::unique_ptr<trace::Writer> open_at_zero(const std::string& path) {
  trace::WriterOptions o;
  o.start_mono_ns = 0;
  return trace::open_writer(path, o);
}

class TraceBuilder {
 public:
  explicit TraceBuilder(const std::string& path) : w_(open_at_zero(path)) {}

  void begin(Nanos ts, uint64_t s, const std::string& user, const std::string& db = "postgres") {
    w_->write(ts, s, trace::SessionBegin{user, db, "replay-test", "127.0.0.1:1", 0, 0});
    w_->write(ts, s, trace::Ready{'I'});
  }
  void end(Nanos ts, uint64_t s) { w_->write(ts, s, trace::SessionEnd{trace::EndReason::Clean}); }

  // A simple Query answered after `lat`.
  void query(Nanos ts, uint64_t s, const std::string& sql, const std::string& tag, bool has_rows,
             uint64_t rows, Nanos lat = kMs, char ready = 'I') {
    w_->write(ts, s, trace::Query{sql});
    w_->write(ts + lat, s, trace::Result{tag, has_rows, rows});
    w_->write(ts + lat, s, trace::Ready{ready});
  }
  void query_error(Nanos ts, uint64_t s, const std::string& sql, const std::string& sqlstate,
                   Nanos lat = kMs) {
    w_->write(ts, s, trace::Query{sql});
    w_->write(ts + lat, s, trace::Error{sqlstate, "ERROR", "captured failure"});
    w_->write(ts + lat, s, trace::Ready{'I'});
  }
  // Parse (+ Sync) of a named statement, as pgbench -M prepared does.
  void prepare(Nanos ts, uint64_t s, const std::string& name, const std::string& sql,
               const std::vector<uint32_t>& types, Nanos lat = kMs, char ready = 'I') {
    w_->write(ts, s, trace::Parse{name, sql, types});
    w_->write(ts, s, trace::Sync{});
    w_->write(ts + lat, s, trace::Ready{ready});
  }
  // Bind/Describe/Execute/Sync of a statement (unnamed: with its Parse first,
  // as pgbench -M extended does).
  void execute(Nanos ts, uint64_t s, const std::string& name, const std::string& sql_if_unnamed,
               const std::vector<uint32_t>& types, const std::vector<std::string>& params,
               const std::string& tag, bool has_rows, uint64_t rows, Nanos lat = kMs,
               char ready = 'I') {
    if (name.empty()) w_->write(ts, s, trace::Parse{"", sql_if_unnamed, types});
    std::vector<trace::Param> ps;
    for (const auto& p : params) ps.push_back(trace::Param{0, false, p});
    std::vector<int16_t> fmts;
    w_->write(ts, s, trace::Bind{"", name, ps, fmts});
    w_->write(ts, s, trace::Describe{'P', ""});
    w_->write(ts, s, trace::Execute{"", 0});
    w_->write(ts, s, trace::Sync{});
    w_->write(ts + lat, s, trace::Result{tag, has_rows, rows});
    w_->write(ts + lat, s, trace::Ready{ready});
  }
  void copy_in(Nanos ts, uint64_t s, const std::string& sql, const std::vector<std::string>& chunks,
               uint64_t rows, Nanos lat = kMs) {
    w_->write(ts, s, trace::Query{sql});
    for (const auto& c : chunks) w_->write(ts, s, trace::CopyData{trace::CopyDir::In, c});
    w_->write(ts, s, trace::CopyDone{trace::CopyDir::In});
    w_->write(ts + lat, s, trace::Result{"COPY", true, rows});
    w_->write(ts + lat, s, trace::Ready{'I'});
  }
  void close() { w_->close(); }

 private:
  std::unique_ptr<trace::Writer> w_;
};

// One session written message by message, a millisecond apart, for traces
// that need records TraceBuilder does not shape (portals, COPY out, ...).
class Script {
 public:
  Script(const std::string& path, uint64_t session) : w_(open_at_zero(path)), s_(session) {}
  Nanos at() { return t_ += kMs; }
  void send(const trace::Body& body) { w_->write(at(), s_, body); }
  // CommandComplete and ReadyForQuery at one time.
  void answer(const char* tag, bool has_rows, uint64_t rows, char ready = 'I') {
    Nanos ts = at();
    w_->write(ts, s_, trace::Result{tag, has_rows, rows});
    w_->write(ts, s_, trace::Ready{ready});
  }
  void error(const char* sqlstate, char ready = 'I') {
    Nanos ts = at();
    w_->write(ts, s_, trace::Error{sqlstate, "ERROR", "captured failure"});
    w_->write(ts, s_, trace::Ready{ready});
  }
  void close() { w_->close(); }

 private:
  std::unique_ptr<trace::Writer> w_;
  uint64_t s_;
  Nanos t_ = 0;
};

}  // namespace replay_test
