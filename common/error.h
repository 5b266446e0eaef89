// Error types shared by every component.
//
// Setup and input problems are exceptions that carry their context in the
// message ("trace.tlt: chunk 12 at byte 40960: CRC mismatch"). The CLI prints
// the message as one line and exits 2 for InputError, 1 for anything else.
// Hot loops do not throw: they use error codes and counters, and convert at
// the component boundary.
#pragma once

#include <stdexcept>
#include <string>

namespace tierlab {

// The user gave something unusable: a bad flag value, a corrupt or truncated
// file, an unknown tier, a malformed message. Exit status 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Something failed at run time that the input did not cause: a system call,
// an unreachable database, a kernel feature that is missing. Exit status 1.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "what: strerror(errno)" for a failed system call.
std::string errno_message(const std::string& what, int err);

}  // namespace tierlab
