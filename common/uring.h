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

// An --io choice: `asked` ("auto", "io_uring" or "epoll"), or the value of
// the environment variable `env` when it is set (tests run either loop with
// it). True for io_uring: asked for by name, or "auto" when `auto_uring`
// and `missing()` (why io_uring cannot run here, "" when it can) is empty.
// InputError for another name; RuntimeError "WHO: io_uring: WHY" when
// io_uring is asked for by name and missing.
bool use_uring(const std::string& asked, const char* env, const char* who, bool auto_uring,
               std::string (*missing)());

}  // namespace tierlab
