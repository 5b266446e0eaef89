// The subcommands of the tierlab CLI.
//
// Each app/<name>.cpp holds one subcommand (or one group of them): an options
// struct with defaults for every member, a setup function that declares the
// flags on a CLI::App, and a run function. The setup functions are declared
// below and called in one list, setup_all() (app/command.cpp), in the order
// --help shows them. setup() must attach a callback (CLI::App::callback)
// that runs the command; the options struct is kept alive by a shared_ptr
// captured in that callback. run functions throw InputError /
// RuntimeError; run_cli() turns them into one line and an exit code.
#pragma once

#include "common/error.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>

#include <string>
#include <utility>
#include <vector>

namespace tierlab::app {

// The subcommands' setup functions, one per app/<name>.cpp. A command of
// a group ("capture run") adds itself to the group (see group() below).
void setup_capture_run(CLI::App& parent);
void setup_capture_proxy(CLI::App& parent);
void setup_capture_sniff(CLI::App& parent);
void setup_capture_block(CLI::App& parent);
void setup_capture_import(CLI::App& parent);
void setup_capture_log(CLI::App& parent);
void setup_replay(CLI::App& parent);
void setup_report(CLI::App& parent);
void setup_iosim_simulate(CLI::App& parent);
void setup_iosim_run(CLI::App& parent);
void setup_iosim_emulate(CLI::App& parent);
void setup_trace(CLI::App& parent);
void setup_profile(CLI::App& parent);
void setup_profile_synth(CLI::App& parent);  // "profile synth": after setup_profile
void setup_tiers(CLI::App& parent);
void setup_project(CLI::App& parent);
void setup_sandbox(CLI::App& parent);

// Builds the whole CLI on `app`: every subcommand, in the order --help
// lists them.
void setup_all(CLI::App& app);

// Parses and runs `args` (without argv[0]) as the tierlab binary would.
// Returns the exit status; messages go to stdout/stderr. Tests use this.
int run_cli(const std::vector<std::string>& args);

// Exit status set by a command's callback when it completes without throwing
// but wants a non-zero status (e.g. 128 + the signal that stopped a replay or
// an iosim run, or the status of the command sandbox ran).
void set_exit_status(int status);

}  // namespace tierlab::app

namespace tierlab::app {

// The subcommand group `name` ("capture", "iosim" or "trace") of `parent`,
// created with its description if it does not exist yet: the groups are
// shared by several files this way, and their descriptions stand in one place.
CLI::App& group(CLI::App& parent, const std::string& name);

// Runs `check`, a library's parse or check of one flag's value: its
// InputError, which starts with the value and says what is wrong with it,
// comes out with the flag in front ("--rw sideways: unknown pattern ...").
// Libraries speak of values; only the app knows the flags.
template <class F>
decltype(auto) for_flag(const std::string& flag, F&& check) {
  try {
    return check();
  } catch (const InputError& e) {
    throw InputError(flag + " " + e.what());
  }
}

// A library option member and the flag that sets it: {"log_path", "--log"}.
struct SettingFlag {
  const char* setting;
  const char* flag;
};

// Runs `call`, a library call that checks several settings of its options
// at once: a SettingError of a setting in `flags` comes out with that flag
// in front ("--log /no/dir/x.log: No such file or directory"); any other
// error passes unchanged.
// With `who` (the subcommand), the line starts with it: "capture sniff:
// --port 0: must be 1-65535".
template <class F>
decltype(auto) for_settings(const std::string& who, const std::vector<SettingFlag>& flags, F&& call) {
  try {
    return call();
  } catch (const SettingError& e) {
    for (const SettingFlag& f : flags)
      if (e.setting() == f.setting)
        throw InputError((who.empty() ? "" : who + ": ") + f.flag + " " + e.what());
    throw;
  }
}
template <class F>
decltype(auto) for_settings(const std::vector<SettingFlag>& flags, F&& call) {
  return for_settings(std::string(), flags, std::forward<F>(call));
}

// The event loop a command runs (its --io value, `asked`), or the value of
// the environment variable `env` (TIERLAB_PROXY_IO, TIERLAB_REPLAY_IO) when
// it is set and not empty: the tests run the proxy and the replay once
// more on epoll with it. InputError "ENV VALUE: expected auto, io_uring or
// epoll" for another value in `env`. Libraries take the choice as a value
// (ProxyOptions::io, replay::Options::io) and read no environment.
std::string io_choice(const std::string& asked, const char* env);

// --rt: that the calling thread can have real-time priority (common/
// realtime.h: RealTimeScope), checked before a run starts; RuntimeError
// "--rt: ..." when it cannot.
void check_rt(bool rt);

// Checks of a number option: finite and above 0, or at least 0. (CLI11's
// PositiveNumber lets "nan" through and names its range up to DBL_MAX.)
CLI::Validator positive_number();
CLI::Validator non_negative_number();

// Declares --compress-level (the trace's zstd level) on a capture command.
CLI::Option* add_compress_level(CLI::App& cmd, int& level);

// A proxy capture's summary line for the times its event loops waited for
// the trace writer (back-pressure); nothing when there were none.
void print_writer_waits(uint64_t waits);

// The line a capture prints when capture::server_meta() could not connect.
void say_settings_skipped(const char* cmd, const std::string& why);

// Where a command writes an output file until it is complete. A regular
// file (new, or one that exists; through a symbolic link, the file it
// names) is written as a temporary file beside it, which commit() renames
// over it: a command that fails before leaves an existing file as it was
// and no new one (the destructor removes the temporary file; so does
// SIGINT, SIGTERM or SIGHUP ending a command that does not take them
// itself, before the signal ends the process as usual). Anything else
// that exists (a FIFO, /dev/stdout, a device) is written in place. The
// constructor fails in one line naming `option` and `path` (InputError) when
// the file cannot be written there.
class PendingFile {
 public:
  PendingFile(const std::string& path, const std::string& option);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  // The file to write.
  const std::string& path() const { return path_; }
  // The output is complete and closed: it becomes `path`. RuntimeError
  // naming it when the rename fails.
  void commit();

 private:
  std::string option_, final_, path_;
  bool temp_ = false;
};

// A file a command writes when its work is done (--json): checked when the
// command starts, so that a path that cannot be written fails at once, in
// one line naming `option` and the path (InputError), not after a long
// replay or I/O run. A file (new, or one that exists) is written as a
// temporary file beside it, renamed over it by write(): a command that fails
// before leaves an existing file as it was and no new one. Anything else
// (a FIFO, /dev/stdout, a device) is opened at the start and written as it
// is. "-" is standard output; "" means none.
class OutputFile {
 public:
  OutputFile(const std::string& path, const char* option);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  // Writes `text` and closes the file; RuntimeError if that fails.
  void write(const std::string& text);

 private:
  std::FILE* f_ = nullptr;
  std::string option_, shown_;        // shown_: the path as given
  std::optional<PendingFile> file_;  // none for "-"
};

}  // namespace tierlab::app
