// -P SEC for the commands that print a status line while they run (capture
// proxy, sniff, run and block), as replay and iosim run do: "progress: T s,
// ..." on stderr every SEC seconds of the run.
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tierlab::app {

// Adds "-P,--progress SEC" to `cmd` into `progress_s` (left at -1 when not
// given: see progress_period()).
CLI::Option* add_progress_option(CLI::App& cmd, double& progress_s);

// The period a -P value asks for, in seconds: itself when given (0: no
// lines), else 1 s when stderr is a terminal and none otherwise.
double progress_period(double progress_s);

// A thread that prints "progress: T s, " + line(period_s) on stderr every
// period (T: seconds since construction); `line` keeps its own previous
// counts to give rates over the period. No thread with a period of 0.
class ProgressLine {
 public:
  ProgressLine(double period_s, std::function<std::string(double period_s)> line);
  ~ProgressLine() { stop(); }
  // No further line once it returns; idempotent. Call it before what
  // `line` reads goes away, and before the summary is printed.
  void stop();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// "1.2 MB/s" of `bytes` over `secs`.
std::string rate_mb(double bytes, double secs);

}  // namespace tierlab::app
