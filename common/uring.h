// What tierlab's io_uring loops share (the capture proxy's, the replay's).
#pragma once

#include <liburing.h>

#include <initializer_list>
#include <string>
#include <utility>

namespace tierlab {

// The first of `ops` (opcode, name) that the kernel behind `ring` does not
// support, as "io_uring operation NAME not supported"; "" when it supports
// them all.
std::string uring_missing_op(io_uring& ring, std::initializer_list<std::pair<int, const char*>> ops);

}  // namespace tierlab
