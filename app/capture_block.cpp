// tierlab capture block: kernel block I/O (tracefs) -> trace.
#include "app/command.h"
#include "app/progress.h"
#include "common/units.h"
#include "capture/block.h"
#include "common/error.h"
#include "trace/writer.h"

#include <csignal>
#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct BlockOptions {
  std::string device;
  std::vector<int32_t> pids;
  std::string out;
  std::string duration;  // "30s", "500ms", "2m"; empty = until interrupted
  uint32_t buffer_kb = 8192;
  double progress_s = -1;  // -P: see progress_period()
};

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop.store(true); }

void run_block(const BlockOptions& o) {
  capture::BlockCaptureOptions co;
  co.device = o.device;
  co.pids = o.pids;
  co.buffer_kb = o.buffer_kb;
  if (!o.duration.empty()) co.duration_ns = parse_positive_duration("--duration", o.duration);
  // Every flag before --out is created.
  for_flag("--pid", [&] {
    for (int32_t pid : co.pids) capture::check_pid(pid);
  });
  for_flag("--buffer-kb", [&] { capture::check_buffer_kb(co.buffer_kb); });
  capture::BlockDevice dev = for_flag("--device", [&] { return capture::resolve_block_device(o.device); });
  capture::require_block_tracing("");  // root and tracefs: before creating --out
  if (dev.from_partition)
    std::cerr << "capture block: block requests are issued to the whole disk; recording " << dev.name << "\n";
  auto writer = trace::open_writer(o.out);
  g_stop.store(false);
  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  capture::BlockCaptureStats st;
  // The status line: the I/Os recorded over the last period.
  std::atomic<uint64_t> ios{0};
  co.live_ios = &ios;
  uint64_t prev = 0;
  ProgressLine progress(progress_period(o.progress_s), [&](double secs) {
    const uint64_t n = ios.load(std::memory_order_relaxed);
    char line[64];
    std::snprintf(line, sizeof line, "%.0f I/Os per second recorded", double(n - prev) / secs);
    prev = n;
    return std::string(line);
  });
  try {
    st = capture::capture_block(co, *writer, &g_stop, [&] {
      std::cerr << "capture block: recording " << dev.name << " (" << (dev.dev >> 20) << ":"
                << (dev.dev & 0xfffff) << ")" << (o.duration.empty() ? ", Ctrl-C to stop" : "")
                << "\n";
    });
  } catch (...) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    throw;
  }
  progress.stop();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  writer->close();
  std::cout << "capture block: " << dev.name << " -> " << o.out << ": "
            << capture::describe(st, !o.pids.empty()) << "\n";
}

}  // namespace

void setup_capture_block(CLI::App& parent) {
  auto& cap = group(parent, "capture");
  auto* sub = cap.add_subcommand("block", "record block I/O requests of a device from kernel tracepoints (root)");
  auto opt = std::make_shared<BlockOptions>();
  sub->add_option("--device,-d", opt->device, "vda, /dev/vda, 254:0, or a path on the device")->required();
  sub->add_option("--pid,-p", opt->pids, "record only I/Os issued by these pids (repeatable)");
  sub->add_option("--out,-o", opt->out, "trace file to write")->required();
  sub->add_option("--duration", opt->duration, "stop after this long (30s, 2m); default: until Ctrl-C");
  sub->add_option("--buffer-kb", opt->buffer_kb, "per-CPU kernel ring buffer size")->capture_default_str();
  add_progress_option(*sub, opt->progress_s);
  sub->callback([opt] { run_block(*opt); });
}

}  // namespace tierlab::app
