#include "replay/unit_log.h"

#include "common/error.h"
#include "common/fd.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fcntl.h>

namespace tierlab::replay {

namespace {

constexpr size_t kLogBuffer = 64 << 10;

char* put(char* p, uint64_t v) { return std::to_chars(p, p + 20, v).ptr; }

char* put_us(char* p, Nanos ns) { return put(p, static_cast<uint64_t>(ns > 0 ? ns / 1000 : 0)); }

}  // namespace

size_t format_unit_log_line(char* out, const UnitLogLine& l) {
  char* p = out;
  p = put(p, l.session);
  *p++ = ' ';
  p = put(p, l.unit);
  *p++ = ' ';
  p = put_us(p, l.latency);
  *p++ = ' ';
  *p++ = '0';
  *p++ = ' ';
  Nanos end = l.end_unix > 0 ? l.end_unix : 0;
  p = put(p, static_cast<uint64_t>(end / 1000000000));
  *p++ = ' ';
  p = put(p, static_cast<uint64_t>(end % 1000000000 / 1000));
  *p++ = ' ';
  p = put_us(p, l.lag);
  *p++ = ' ';
  p = put_us(p, l.own_lag);
  *p++ = ' ';
  if (l.captured < 0) *p++ = '-';
  else p = put_us(p, l.captured);
  *p++ = ' ';
  if (!l.failed) {
    std::memcpy(p, "ok", 2);
    p += 2;
  } else if (l.sqlstate[0]) {
    size_t n = strnlen(l.sqlstate, 5);
    std::memcpy(p, l.sqlstate, n);
    p += n;
  } else {
    std::memcpy(p, "error", 5);
    p += 5;
  }
  *p++ = '\n';
  return static_cast<size_t>(p - out);
}

int open_unit_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw SettingError("log_path", errno_message(path, errno));
  return fd;
}

UnitLog::UnitLog(int fd, std::mutex* write_lock) : fd_(fd), write_lock_(write_lock) {
  if (fd_ >= 0) buf_ = std::make_unique_for_overwrite<char[]>(kLogBuffer);
}

UnitLog::~UnitLog() { flush(); }

void UnitLog::add(const UnitLogLine& l) {
  if (fd_ < 0) return;
  if (len_ + kUnitLogLineMax > kLogBuffer) flush();
  if (fd_ < 0) return;
  len_ += format_unit_log_line(buf_.get() + len_, l);
  ++pending_;
}

void UnitLog::flush() {
  if (fd_ < 0 || len_ == 0) return;
  // Whole buffers, one worker at a time: lines stay whole in a file or a
  // pipe.
  std::lock_guard<std::mutex> hold(*write_lock_);
  if (int err = write_all(fd_, buf_.get(), len_)) {
    error_ = errno_message("write", err);
    fd_ = -1;
  } else {
    lines_ += pending_;
  }
  pending_ = 0;
  len_ = 0;
}

}  // namespace tierlab::replay
