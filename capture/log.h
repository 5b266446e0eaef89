// Reading PostgreSQL server logs into a trace (`tierlab capture log`).
//
// A server that logs every statement (log_statement = all, or
// log_min_duration_statement = 0; log_connections and log_disconnections
// where present) writes, per session, what the client asked for: simple
// queries ("statement: SQL"), extended-protocol executions ("execute NAME:
// SQL" with "DETAIL: parameters: $1 = '...'"), their durations, errors and
// the connection's user, database, application and client. LogCapture turns
// that into the session records of a trace:
//   - SessionBegin at "connection authorized" (client address from
//     "connection received"); a session whose start is not in the log begins
//     at its first message, flagged kSessionUnknownStartup, with what the
//     line itself says of user and database;
//   - a simple query: Query; an execution: Parse (only when the session has
//     not parsed that name with that SQL yet; unnamed: every time, with no
//     parameter types, so that the server infers them as it did for the
//     client: the log does not show types), Bind (every parameter as text),
//     Execute, Sync;
//   - Error (SQLSTATE where the log carries it: csvlog, jsonlog, a stderr
//     prefix with %e) and then Ready, whose status follows the session's
//     transaction: BEGIN / START TRANSACTION open one, COMMIT, END, ROLLBACK,
//     ABORT and PREPARE TRANSACTION close it, an error inside one fails it;
//   - SessionEnd at "disconnection" (Clean), a FATAL (ServerClosed), or the
//     end of the input (CaptureEnd).
// The log has no row counts, result sizes or Describe messages, so the trace
// has no Result records; statement times are the log's (milliseconds for %m,
// csvlog and jsonlog). Meta records at the start say so (source=log).
//
// Streaming: input is read in blocks (1 MiB, more for a longer record), a
// record is parsed and forgotten; what is kept is one entry per session and
// the names it prepared, so memory grows with the sessions open at once, not
// with the log.
//
// Errors: input that cannot be read at all (a stderr log none of whose first
// lines match the prefix, a csvlog or jsonlog whose first record is not one)
// throws InputError "FILE:LINE: what"; any other line that cannot be used is
// counted in LogStats and skipped.
#pragma once

#include "trace/writer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace tierlab::capture {

// Pgreplay: pgreplay's replay file (`pgreplay -f` output), whose sessions,
// statements, prepares and executions become the same records as a log's.
enum class LogFormat { Auto, Stderr, Csv, Json, Pgreplay };

// "stderr", "csvlog", "jsonlog", "pgreplay" (and "auto"); throws InputError naming the
// value otherwise.
LogFormat parse_log_format(const std::string& s);

// log_line_prefix values recognised without --log-line-prefix, tried in this
// order on a stderr log's first lines.
inline constexpr const char* kDefaultPrefixes[] = {
    "%m [%p] ",            // PostgreSQL's default
    "%t:%r:%u@%d:[%p]:",   // Amazon RDS and Aurora
    "%m|%u|%d|%c|",        // pgreplay's documented prefix
};

struct LogOptions {
  // Auto: a pgreplay replay file by its content (binary), else by file name
  // (.csv, .json), else stderr.
  LogFormat format = LogFormat::Auto;
  std::string prefix;                  // stderr log_line_prefix; empty: kDefaultPrefixes
  // Only messages logged in [begin, end), wall-clock nanoseconds since the
  // epoch (parse_log_time()).
  std::optional<int64_t> begin, end;
  std::string database, user;  // only sessions of this database / user
};

struct LogStats {
  uint64_t files = 0;
  uint64_t lines = 0;
  uint64_t messages = 0;           // log entries (a message and its DETAIL etc.)
  uint64_t sessions = 0;           // SessionBegin records written
  uint64_t sessions_unknown_start = 0;  // of them, begun before the log
  uint64_t queries = 0;            // simple-protocol statements
  uint64_t executes = 0;           // extended-protocol executions
  uint64_t transactions = 0;       // units ending idle after statements ran
  uint64_t errors = 0;             // Error records
  uint64_t durations = 0;          // statements with a logged duration
  uint64_t unparsed = 0;           // lines that match no prefix or record format
  uint64_t truncated = 0;          // a last line or record cut off
  uint64_t filtered = 0;           // messages of sessions left out by database/user
  uint64_t outside_window = 0;     // messages before begin or at/after end
  uint64_t unlogged_statements = 0;  // errors whose statement was not logged before
  uint64_t other = 0;              // messages that are none of the above (checkpoints, ...)
  std::string prefix;              // the stderr prefix used
};

class LogCapture {
 public:
  // Called once, with the wall-clock time (ns since the epoch) of the first
  // message that makes a record: the trace's clock starts there (ts 0 is that
  // time), and the writer it returns gets every record. Called with the
  // current time by finish() when no message made one.
  using OpenWriter = std::function<trace::Writer&(int64_t realtime_start_ns)>;

  // Throws InputError when `opts` cannot work (a database or user filter on
  // a stderr prefix without %d or %u).
  LogCapture(const LogOptions& opts, OpenWriter open);
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Reads one log file (gzip'd or plain); files are read in the order given
  // and sessions carry over from one to the next (rotated logs).
  void read_file(const std::string& path);
  // Reads plain log text; `name` is used in messages.
  void read_text(const std::string& text, const std::string& name, LogFormat format);
  // Ends every open session (CaptureEnd) and returns the counts. The writer
  // is not closed.
  LogStats finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "2026-12-03 10:48:06[.190][ UTC|+03|-0530]" (or an integer or decimal
// number of seconds since the epoch) -> ns since the epoch. A zone name
// other than UTC, GMT or Z counts as UTC. nullopt if it is none of these.
std::optional<int64_t> parse_log_time(std::string_view s);

}  // namespace tierlab::capture
