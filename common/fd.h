// Writing a whole buffer to a file descriptor; reading a small file whole.
#pragma once

#include <cstddef>
#include <string>

namespace tierlab {

// Writes all `len` bytes: a short write (a full disk, a pipe, a signal) is
// continued, EINTR retried. Returns 0, or the errno of the write that failed
// (ENOSPC when one wrote nothing).
int write_all(int fd, const void* data, size_t len);

// The whole text of a small file (a /proc, /sys, cgroup or tracefs entry),
// or "" when it cannot be opened: callers treat both as "not known".
std::string read_small_file(const std::string& path);

}  // namespace tierlab
