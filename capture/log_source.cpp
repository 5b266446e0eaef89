// The input of `tierlab capture log`: a gzip'd or plain file, or a string.
#include "capture/log_internal.h"

#include "common/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace tierlab::capture::logimpl {

namespace {
// The buffer's first size, and the most read into it at a time: small
// enough that the bytes a read copies are still in the CPU's cache when
// they are parsed, large enough for the system calls not to count.
constexpr size_t kBlock = 1 << 20;
constexpr size_t kRead = 128 * 1024;
}  // namespace

LogSource::LogSource(const std::string& path) : name_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(errno_message(path, errno));
  // A plain file is read as it is, not through zlib (which copies what it
  // reads once more); a gzip'd one, or one that cannot be read twice (a
  // pipe), through zlib, which passes plain text on.
  unsigned char magic[2] = {0, 0};
  if (::pread(fd_, magic, 2, 0) != 2 || (magic[0] == 0x1f && magic[1] == 0x8b)) {
    gz_ = gzdopen(fd_, "rb");
    if (!gz_) {
      const int err = errno ? errno : ENOMEM;
      ::close(fd_);
      fd_ = -1;
      throw InputError(errno_message(path, err));
    }
    fd_ = -1;  // gzclose() closes it
    gzbuffer(gz_, kRead / 2);
  }
  buf_.resize(kBlock);
  data_ = buf_.data();
}

LogSource::LogSource(std::string_view text, const std::string& name)
    : name_(name), data_(text.data()), len_(text.size()) {}

LogSource::~LogSource() {
  if (gz_) gzclose(gz_);
  if (fd_ >= 0) ::close(fd_);
}

bool LogSource::more() {
  if (!gz_ && fd_ < 0) return false;
  // Invariant: the window [pos_, len_) is kept, moved to the front.
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
  }
  if (len_ == buf_.size()) buf_.resize(buf_.size() * 2);
  data_ = buf_.data();
  const size_t want = std::min(buf_.size() - len_, kRead);
  if (fd_ >= 0) {
    ssize_t n;
    do {
      n = ::read(fd_, buf_.data() + len_, want);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
      throw InputError(name_ + ": line " + std::to_string(lineno_ + 1) + ": " + std::strerror(errno));
    len_ += static_cast<size_t>(n);
    return n > 0;
  }
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
