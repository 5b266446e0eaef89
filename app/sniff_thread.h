// capture sniff's recorder (capture/sniff.h: run_sniff) on a thread of its
// own, so that the command's thread waits for SIGINT/SIGTERM
// (StopSignals::until_stop) as the other capture commands do.
#pragma once

#include "app/command.h"
#include "capture/sniff.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <ostream>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

namespace tierlab::app {

// The capture::SniffOptions members that capture sniff and capture run set
// from flags, with those flags (for_settings).
inline const std::vector<SettingFlag> kSniffFlags = {
    {"interface", "--interface"},     {"port", "--port"},
    {"host", "--host"},               {"duration_s", "--duration"},
    {"snaplen", "--snaplen"},         {"buffer_bytes", "--buffer-size"},
    {"max_connections", "--max-connections"}, {"reassembly_bytes", "--reassembly-buffer"},
};

// Hands each complete line written to it to a function.
class LineBuf : public std::streambuf {
 public:
  explicit LineBuf(std::function<void(const std::string&)> on_line) : on_line_(std::move(on_line)) {}

 protected:
  int overflow(int c) override;

 private:
  std::function<void(const std::string&)> on_line_;
  std::string line_;
};

// run_sniff() on its own thread. Its log goes to stderr line by line, but
// for the "capturing on ..." line when `show_start` is false (capture run
// says where it records in a line of its own). Construct it after the
// StopSignals of the command, so that its thread leaves the signals to it.
class SniffThread {
 public:
  SniffThread(capture::SniffOptions opts, bool show_start);
  // Stops the recorder if it still runs; its error is lost then.
  ~SniffThread();
  SniffThread(const SniffThread&) = delete;
  SniffThread& operator=(const SniffThread&) = delete;

  // Starts run_sniff().
  void start();
  // Waits until packets flow ("capturing on ...": true) or the recorder
  // ended before (false; its error, if any, is thrown).
  bool wait_live();
  // True once run_sniff() has returned (the file ended, its --duration
  // passed, or it failed).
  bool done() const;
  // Asks run_sniff() to stop, waits for it and rethrows its error;
  // idempotent.
  void stop();
  // What run_sniff() returned; valid after stop().
  const capture::SniffSummary& summary() const { return summary_; }
  const capture::SniffOptions& options() const { return opts_; }
  // The status line's part: packets and bytes per second over the last
  // `secs`; called from the status line's thread.
  std::string progress(double secs);

 private:
  void on_log(const std::string& line);

  capture::SniffOptions opts_;
  bool show_start_;
  LineBuf buf_;
  std::ostream log_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool live_ = false, done_ = false;
  capture::SniffSummary summary_;
  std::exception_ptr error_;
  std::atomic<uint64_t> packets_{0}, bytes_{0};
  uint64_t prev_packets_ = 0, prev_bytes_ = 0;
};

}  // namespace tierlab::app
