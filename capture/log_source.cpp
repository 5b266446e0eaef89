// The input of `tierlab capture log`: a gzip'd or plain file, or a string.
#include "capture/log_internal.h"

#include "common/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tierlab::capture::logimpl {

namespace {
// The buffer's first size, and the most read into it at a time: small
// enough that the bytes a read copies are still in the CPU's cache when
// they are parsed (a 1 MiB read left the first of them out of it), large
// enough for the system calls not to count. zlib reads an uncompressed
// file straight into it (a read of at least twice its own buffer).
constexpr size_t kBlock = 1 << 20;
constexpr size_t kRead = 128 * 1024;
}  // namespace

LogSource::LogSource(const std::string& path) : name_(path) {
  gz_ = gzopen(path.c_str(), "rb");
  if (!gz_) throw InputError(errno_message(path, errno ? errno : ENOMEM));
  gzbuffer(gz_, kRead / 2);
  buf_.resize(kBlock);
  data_ = buf_.data();
}

LogSource::LogSource(std::string_view text, const std::string& name)
    : name_(name), data_(text.data()), len_(text.size()) {}

LogSource::~LogSource() {
  if (gz_) gzclose(gz_);
}

bool LogSource::more() {
  if (!gz_) return false;
  // Invariant: the window [pos_, len_) is kept, moved to the front.
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
  }
  if (len_ == buf_.size()) buf_.resize(buf_.size() * 2);
  data_ = buf_.data();
  const size_t want = std::min(buf_.size() - len_, kRead);
  int n = gzread(gz_, buf_.data() + len_, static_cast<unsigned>(want));
  if (n < 0) {
    int err = 0;
    const char* msg = gzerror(gz_, &err);
    throw InputError(name_ + ": line " + std::to_string(lineno_ + 1) + ": " +
                     (err == Z_ERRNO ? std::strerror(errno) : msg));
  }
  len_ += static_cast<size_t>(n);
  return n > 0;
}

bool LogSource::next(std::string_view& line, bool& complete) {
  size_t scanned = 0;  // of the window, bytes known to hold no '\n'
  for (;;) {
    std::string_view w = window();
    if (const void* nl = std::memchr(w.data() + scanned, '\n', w.size() - scanned)) {
      const size_t n = static_cast<size_t>(static_cast<const char*>(nl) - w.data());
      line = w.substr(0, n);
      consume(n + 1);
      complete = true;
      ++lineno_;
      return true;
    }
    scanned = w.size();
    if (!more()) break;
  }
  std::string_view w = window();
  if (w.empty()) return false;
  line = w;
  consume(w.size());
  complete = false;
  ++lineno_;
  return true;
}

bool LogSource::read_bytes(void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    if (pos_ >= len_ && !more()) return false;
    size_t k = std::min(n, len_ - pos_);
    std::memcpy(p, data_ + pos_, k);
    pos_ += k, p += k, n -= k, offset_ += k;
  }
  return true;
}

bool LogSource::at_end() { return pos_ >= len_ && !more(); }

bool LogSource::looks_binary() {
  while (len_ - pos_ < 64 && more()) {
  }
  return std::memchr(data_ + pos_, 0, std::min<size_t>(64, len_ - pos_)) != nullptr;
}

}  // namespace tierlab::capture::logimpl
