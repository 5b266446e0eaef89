#include "app/progress.h"

#include "app/command.h"
#include "common/clock.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace tierlab::app {

CLI::Option* add_progress_option(CLI::App& cmd, double& progress_s) {
  return cmd.add_option("-P,--progress", progress_s,
                        "print a progress line on stderr every SEC seconds (0: none; default: every second when "
                        "stderr is a terminal)")
      ->check(CLI::Range(0.0, 1e6));
}

double progress_period(double progress_s) {
  if (progress_s >= 0) return progress_s;
  return ::isatty(STDERR_FILENO) ? 1.0 : 0.0;
}

ProgressLine::ProgressLine(double period_s, std::function<std::string(double)> line) {
  if (period_s <= 0) return;
  const int64_t period_ns = static_cast<int64_t>(period_s * 1e9);
  thread_ = std::thread([this, period_ns, period_s, line = std::move(line)] {
    const int64_t start = now_ns();
    // Invariant: next is the end of the period the next line covers, on
    // the absolute schedule start + k * period.
    int64_t next = start + period_ns;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      const int64_t now = now_ns();
      if (now < next) {
        if (cv_.wait_for(l, std::chrono::nanoseconds(next - now), [&] { return done_; })) return;
        continue;
      }
      std::fprintf(stderr, "progress: %.1f s, %s\n", static_cast<double>(next - start) / 1e9,
                   line(period_s).c_str());
      std::fflush(stderr);
      while (next <= now) next += period_ns;
    }
  });
}

void ProgressLine::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string rate_mb(double bytes, double secs) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MB/s", secs > 0 ? bytes / secs / 1e6 : 0.0);
  return s;
}

}  // namespace tierlab::app
