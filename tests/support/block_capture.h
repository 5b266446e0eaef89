// A block capture running on its own thread, for tests that drive I/O on a
// device while capture::capture_block records it.
#pragma once

#include "capture/block.h"
#include "trace/writer.h"

#include <atomic>
#include <exception>
#include <future>
#include <thread>

namespace tierlab::test {

class BackgroundBlockCapture {
 public:
  // Returns once the capture records (events enabled), or rethrows why it
  // could not start.
  BackgroundBlockCapture(const capture::BlockCaptureOptions& o, trace::Writer& w) {
    std::promise<void> ready;
    std::future<void> started = ready.get_future();
    thread_ = std::thread([this, o, &w, ready = std::move(ready)]() mutable {
      bool announced = false;
      try {
        stats_ = capture::capture_block(o, w, &stop_, [&] {
          announced = true;
          ready.set_value();
        });
      } catch (...) {
        error_ = std::current_exception();
        if (!announced) ready.set_exception(error_);
      }
    });
    try {
      started.get();
    } catch (...) {
      thread_.join();
      throw;
    }
  }
  ~BackgroundBlockCapture() {
    if (thread_.joinable()) {
      stop_ = true;
      thread_.join();
    }
  }
  BackgroundBlockCapture(const BackgroundBlockCapture&) = delete;
  BackgroundBlockCapture& operator=(const BackgroundBlockCapture&) = delete;

  // Ends the capture (it drains what the kernel still holds) and returns its
  // counts; rethrows an error the capture stopped on.
  capture::BlockCaptureStats stop() {
    stop_ = true;
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    return stats_;
  }

 private:
  std::atomic<bool> stop_{false};
  capture::BlockCaptureStats stats_;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace tierlab::test
