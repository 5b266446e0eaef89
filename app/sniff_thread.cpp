#include "app/sniff_thread.h"

#include "app/progress.h"

#include <chrono>
#include <cstdio>

namespace tierlab::app {

int LineBuf::overflow(int c) {
  if (c == traits_type::eof()) return traits_type::not_eof(c);
  if (c == '\n') {
    on_line_(line_);
    line_.clear();
  } else {
    line_.push_back(static_cast<char>(c));
  }
  return c;
}

SniffThread::SniffThread(capture::SniffOptions opts, bool show_start)
    : opts_(std::move(opts)),
      show_start_(show_start),
      buf_([this](const std::string& line) { on_log(line); }),
      log_(&buf_) {
  opts_.live_packets = &packets_;
  opts_.live_bytes = &bytes_;
}

SniffThread::~SniffThread() {
  try {
    stop();
  } catch (...) {
  }
}

void SniffThread::start() {
  thread_ = std::thread([this] {
    std::exception_ptr e;
    capture::SniffSummary s;
    try {
      s = capture::run_sniff(opts_, log_);
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> l(mu_);
    summary_ = s;
    error_ = e;
    done_ = true;
    cv_.notify_all();
  });
}

bool SniffThread::wait_live() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return live_ || done_; });
  if (live_) return true;
  l.unlock();
  stop();  // rethrows the recorder's error
  return false;
}

bool SniffThread::done() const {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

void SniffThread::stop() {
  if (!thread_.joinable()) return;
  {
    // A stop_sniff() that comes before run_sniff() is listening is
    // forgotten: repeat it until the recorder has ended.
    std::unique_lock<std::mutex> l(mu_);
    while (!done_) {
      capture::stop_sniff();
      cv_.wait_for(l, std::chrono::milliseconds(100));
    }
  }
  thread_.join();
  if (error_) std::rethrow_exception(error_);
}

std::string SniffThread::progress(double secs) {
  const uint64_t p = packets_.load(std::memory_order_relaxed), b = bytes_.load(std::memory_order_relaxed);
  char line[96];
  std::snprintf(line, sizeof line, "%.0f packets/s, %s", double(p - prev_packets_) / secs,
                rate_mb(double(b - prev_bytes_), secs).c_str());
  prev_packets_ = p;
  prev_bytes_ = b;
  return line;
}

void SniffThread::on_log(const std::string& line) {
  if (line.rfind("capturing on", 0) == 0) {
    std::lock_guard<std::mutex> l(mu_);
    live_ = true;
    cv_.notify_all();
    if (!show_start_) return;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace tierlab::app
