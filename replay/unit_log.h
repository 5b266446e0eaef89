// The replay's round-trip log (tierlab replay --log FILE): one line per
// round trip (a Query, an extended-protocol group up to its Sync, a COPY with
// its data) as it completes, in the columns of pgbench's per-transaction log
// (pgbench -l with -R) and three more:
//
//   session unit latency_us 0 end_epoch_s end_us lag_us own_lag_us captured_us result
//
//   session      the trace's session id (s= in `tierlab trace dump`)
//   unit         the round trip's number within its session, from 0
//   latency_us   its send to the target's ReadyForQuery, microseconds
//   0            pgbench's script number (one script)
//   end_epoch_s, end_us  when the answer completed, Unix time
//   lag_us       its send minus its scheduled send (0 with --max-speed)
//   own_lag_us   the part of that lag spent in tierlab: from the later of
//                the scheduled send and the session's previous answer
//   captured_us  the same round trip's latency at capture; - when unknown
//   result       ok, or the SQLSTATE of the first error the target
//                returned for it (a Parse's too)
//
// Each worker thread fills its own buffer and appends it to the file whole
// (one writer at a time, so a pipe gets whole lines too), so the file is in
// completion order per worker, not overall: `sort -n -k5,5 -k6,6` orders it
// by time. Nothing is allocated per line.
#pragma once

#include "trace/record.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace tierlab::replay {

using trace::Nanos;

struct UnitLogLine {
  uint64_t session = 0;
  uint32_t unit = 0;
  Nanos latency = 0;
  Nanos end_unix = 0;        // nanoseconds since the Unix epoch
  Nanos lag = 0;
  Nanos own_lag = 0;
  Nanos captured = -1;       // < 0: unknown
  bool failed = false;
  char sqlstate[6] = {0};    // when failed; "" if the server sent none
};

// The longest line format_unit_log_line() writes, newline included.
inline constexpr size_t kUnitLogLineMax = 256;

// Writes the line (with its newline) to `out`, which has room for
// kUnitLogLineMax bytes; returns its length.
size_t format_unit_log_line(char* out, const UnitLogLine& l);

// Opens `path` for the log (created or truncated). Throws InputError naming
// it when it cannot be.
int open_unit_log(const std::string& path);

// One worker's buffer in front of the shared log descriptor.
class UnitLog {
 public:
  // fd < 0: logging off (add() does nothing). The workers sharing `fd`
  // share `write_lock`.
  UnitLog(int fd, std::mutex* write_lock);
  ~UnitLog();
  UnitLog(const UnitLog&) = delete;
  UnitLog& operator=(const UnitLog&) = delete;

  bool on() const { return fd_ >= 0; }
  void add(const UnitLogLine& l);
  // Appends what is buffered. After a failed write the log is off for this
  // worker; error() says why.
  void flush();
  uint64_t lines() const { return lines_; }
  const std::string& error() const { return error_; }

 private:
  int fd_;
  std::mutex* write_lock_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0;
  uint64_t pending_ = 0;     // lines in buf_
  uint64_t lines_ = 0;       // lines written
  std::string error_;
};

}  // namespace tierlab::replay
