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
#include <utility>

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

// An InputError about one setting of a library's options: `setting` is the
// name of the options member ("log_path"), the message names the value and
// what is wrong with it ("/no/dir/x.log: No such file or directory").
// Libraries name no command-line flag; the command that filled the member
// maps the setting to its flag (app::for_settings), and a SettingError no
// command maps reads as an InputError of its own.
class SettingError : public InputError {
 public:
  SettingError(std::string setting, const std::string& what) : InputError(what), setting_(std::move(setting)) {}
  const std::string& setting() const { return setting_; }

 private:
  std::string setting_;
};

// "what: strerror(errno)" for a failed system call.
std::string errno_message(const std::string& what, int err);

}  // namespace tierlab
