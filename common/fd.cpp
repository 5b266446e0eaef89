#include "common/fd.h"

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace tierlab {

int write_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return 0;
}

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace tierlab
