// Writing a whole buffer to a file descriptor.
#pragma once

#include <cstddef>

namespace tierlab {

// Writes all `len` bytes: a short write (a full disk, a pipe, a signal) is
// continued, EINTR retried. Returns 0, or the errno of the write that failed
// (ENOSPC when one wrote nothing).
int write_all(int fd, const void* data, size_t len);

}  // namespace tierlab
