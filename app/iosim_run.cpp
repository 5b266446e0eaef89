// tierlab iosim run: real I/O through io_uring, optionally shaped like a tier.
#include "app/command.h"
#include "app/stop_signals.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"
#include "iosim/engine.h"
#include "iosim/pattern.h"
#include "iosim/shaper.h"
#include "tiers/tiers.h"
#include "trace/reader.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

namespace tierlab::app {
namespace {

struct RunOptions {
  std::string target;
  std::string trace;
  std::string rw = "randread";
  std::string bs = "4k";
  uint32_t iodepth = 32;
  uint32_t iodepth_batch = 1;
  std::string size;       // "" = the target's size
  unsigned rwmixread = 50;
  bool direct = false;
  std::string tier;
  std::string tiers_file;
  std::string runtime;    // "" = until --size bytes (pattern) or the trace ends
  uint64_t ios = 0;
  bool verify = false;
  bool rt = false;
  bool no_pm_qos = false;
  uint64_t seed = 1;
  std::string json;       // path, "-" = stdout
  double progress_s = -1;  // -P: progress line period; 0 = none; < 0 = 1 s when stderr is a terminal
};

// Pattern requests for the engine (closed loop).
class PatternSource : public iosim::IoSource {
 public:
  explicit PatternSource(const iosim::PatternSpec& spec) : p_(spec) {}
  bool next(iosim::TimedIo& out) override {
    iosim::IoRequest r = p_.next();
    out = iosim::TimedIo{0, r.offset, r.length, r.op, 0};
    return true;
  }

 private:
  iosim::Pattern p_;
};

// The size of an existing target, for a pattern without --size; InputError
// saying why there is none (missing, not a file or device, unreadable, empty).
uint64_t existing_size(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) throw InputError(path + ": does not exist (give --size to create it)");
    throw InputError(errno_message(path, errno));
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    throw InputError(path + ": not a regular file or block device");
  uint64_t bytes = uint64_t(st.st_size);
  if (S_ISBLK(st.st_mode)) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(errno_message(path, errno));
    int rc = ioctl(fd, BLKGETSIZE64, &bytes);
    int err = errno;
    ::close(fd);
    if (rc != 0) throw RuntimeError(errno_message(path + ": BLKGETSIZE64", err));
  }
  if (bytes == 0) throw InputError(path + ": is empty (give --size)");
  return bytes;
}


// SIGINT and SIGTERM during a run, taken by a watcher thread through
// StopSignals: the first sets `signal` (the engine's stop flag: the run
// stops issuing, drains and reports); a second one ends the process at once,
// for a run whose drain does not finish. The same thread owns the progress
// output: with a period, a line on stderr every `progress_ns` of the run
// from `live`. Construct before any other thread starts; the destructor
// stops and joins the watcher.
class RunStopper {
 public:
  RunStopper(const iosim::EngineLive* live, int64_t progress_ns)
      : live_(live), progress_ns_(progress_ns), watcher_([this] { watch(); }) {}
  ~RunStopper() {
    done_.store(true);
    watcher_.join();
  }
  RunStopper(const RunStopper&) = delete;
  RunStopper& operator=(const RunStopper&) = delete;

  const std::atomic<int>& signal() const { return signal_; }

 private:
  void watch() {
    int64_t next_tick = 0;
    uint64_t p_ios = 0, p_bytes = 0;
    int64_t p_lat = 0;
    while (!done_.load()) {
      int sig = signals_.wait(50'000'000);
      if (sig && signal_.exchange(sig) != 0) {
        std::fprintf(stderr, "tierlab: iosim run: %s again: exiting without a summary\n", signal_name(sig));
        std::_Exit(128 + sig);
      }
      if (!live_ || progress_ns_ <= 0) continue;
      const int64_t start = live_->start_ns.load(std::memory_order_relaxed);
      if (!start) continue;  // laying out, or not started
      if (!next_tick) next_tick = start + progress_ns_;
      const int64_t now = now_ns();
      if (now < next_tick) continue;
      uint64_t ios = live_->ios.load(std::memory_order_relaxed);
      uint64_t bytes = live_->bytes.load(std::memory_order_relaxed);
      int64_t lat = live_->lat_sum_ns.load(std::memory_order_relaxed);
      const double secs = double(progress_ns_) / 1e9;
      const uint64_t n = ios - p_ios;
      std::fprintf(stderr, "progress: %.1f s, %.0f IOPS, %.1f MiB/s, lat %.3f ms\n", double(next_tick - start) / 1e9,
                   double(n) / secs, double(bytes - p_bytes) / secs / 1048576.0,
                   n ? double(lat - p_lat) / double(n) / 1e6 : 0.0);
      p_ios = ios;
      p_bytes = bytes;
      p_lat = lat;
      while (next_tick <= now) next_tick += progress_ns_;
    }
  }

  const iosim::EngineLive* live_;
  int64_t progress_ns_;
  StopSignals signals_;  // before the watcher starts: every thread inherits the mask
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

std::string human_count(double v) {
  char b[32];
  if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

std::string human_bw(double bytes_per_sec) {
  char b[64];
  double mib = bytes_per_sec / (1024.0 * 1024.0);
  std::snprintf(b, sizeof b, "%.1fMiB/s (%.1fMB/s)", mib, bytes_per_sec / 1e6);
  return b;
}

nlohmann::json lat_json(const Histogram& h) {
  return {{"p50", h.quantile(0.50)}, {"p90", h.quantile(0.90)}, {"p99", h.quantile(0.99)},
          {"p999", h.quantile(0.999)}, {"max", h.max()},         {"min", h.min()},
          {"mean", h.mean()}};
}

void print_lat(const char* what, const Histogram& h) {
  std::printf("    %s (usec): min=%.0f, max=%.0f, avg=%.2f, stdev=%.2f\n", what, h.min() / 1e3,
              h.max() / 1e3, h.mean() / 1e3, h.stddev() / 1e3);
  std::printf("     %s percentiles (usec): 50th=[%.0f], 90th=[%.0f], 99th=[%.0f], 99.9th=[%.0f]\n", what,
              h.quantile(0.5) / 1e3, h.quantile(0.9) / 1e3, h.quantile(0.99) / 1e3,
              h.quantile(0.999) / 1e3);
}

double duration_error(const iosim::EngineResult& r) {
  return r.schedule_ns > 0 ? double(r.elapsed_ns - r.schedule_ns) / double(r.schedule_ns) : 0;
}

const char* const kOpNames[] = {"read", "write", "flush", "discard"};

void print_summary(const RunOptions& o, const iosim::EngineOptions& eo, const iosim::EngineResult& r,
                   const std::string& what, const iosim::Shaper* shaper_ptr, double secs) {
  std::printf("iosim run: %s %s direct=%d tier=%s\n", o.target.c_str(), what.c_str(), o.direct ? 1 : 0,
              r.tier.empty() ? "none" : r.tier.c_str());
  for (int k = 0; k < 3; ++k) {
    const iosim::OpStats& st = r.op[k];
    if (!st.ios) continue;
    std::printf("  %s: IOPS=%s, BW=%s(%.1fMiB/%.0fmsec)\n", kOpNames[k], human_count(st.ios / secs).c_str(),
                human_bw(st.bytes / secs).c_str(), st.bytes / 1048576.0, r.elapsed_ns / 1e6);
    print_lat("lat", st.lat);
    if (eo.shaper) print_lat("device", st.device_lat);
  }
  if (eo.open_loop) {
    const double dur_err = duration_error(r);
    std::printf("  issue lag (usec): p50=%.1f, p99=%.1f, max=%.1f; %llu I/Os waited for a free slot\n",
                r.issue_lag.quantile(0.5) / 1e3, r.issue_lag.quantile(0.99) / 1e3, r.issue_lag.max() / 1e3,
                (unsigned long long)r.slot_waits);
    std::printf("  late issues (over %.0f usec): %llu, in %llu stalls\n",
                iosim::EngineResult::kLateIssueNs / 1e3, (unsigned long long)r.late_issues,
                (unsigned long long)r.issue_stalls);
    std::printf("  schedule: %.3f s, run: %.3f s (%+.2f%%)\n", r.schedule_ns / 1e9, r.elapsed_ns / 1e9,
                dur_err * 100);
  }
  if (eo.open_loop || eo.shaper)
    std::printf("  cpu wake-up latency: %s\n",
                r.cpu_latency_held ? "held at 0 us (/dev/cpu_dma_latency)"
                : o.no_pm_qos      ? "not held (--no-pm-qos)"
                                   : "not held (/dev/cpu_dma_latency needs root)");
  if (shaper_ptr) {
    const iosim::Shaper& shaper = *shaper_ptr;
    const auto& ss = shaper.stats();
    std::printf("  tier %s: %llu I/Os throttled (%.3f s waiting for tokens), %llu merged\n", r.tier.c_str(),
                (unsigned long long)ss.throttled_ios, ss.throttle_wait_ns / 1e9,
                (unsigned long long)ss.merged_ios);
    std::printf("  release lag (usec): p50=%.1f, p99=%.1f, max=%.1f (completions released after the tier's time)\n",
                r.release_lag.quantile(0.5) / 1e3, r.release_lag.quantile(0.99) / 1e3, r.release_lag.max() / 1e3);
    if (r.slower_than_tier)
      std::printf("  device slower than tier: %llu of %llu I/Os took longer on the device than the tier "
                  "allows; those ran at device speed\n",
                  (unsigned long long)r.slower_than_tier, (unsigned long long)r.ios);
  }
  std::printf("  retries: short=%llu (eof %llu) eagain=%llu eintr=%llu\n", (unsigned long long)r.short_ios,
              (unsigned long long)r.eof_short, (unsigned long long)r.eagain, (unsigned long long)r.eintr);
  if (r.wrapped)
    std::printf("  wrapped: %llu I/Os started beyond the end of the target (%s) and were moved into it "
                "(offset modulo its size)\n",
                (unsigned long long)r.wrapped, format_bytes(double(r.target_size)).c_str());
  if (r.skipped)
    std::printf("  skipped: %llu I/Os were not issued: trims (discards) and zero-length requests, which the "
                "engine does not drive\n",
                (unsigned long long)r.skipped);
  if (r.laid_out_bytes)
    std::printf("  laid out before the run: %s written (holes or unwritten extents)\n",
                format_bytes(double(r.laid_out_bytes)).c_str());
  if (o.verify)
    std::printf("  verify: %.1f MiB checked, no mismatch%s\n", r.verified_bytes / 1048576.0,
                r.stopped ? " (stopped: the written data was not read back)" : "");
}

void run_iosim(const RunOptions& o) {
  iosim::EngineOptions eo;
  eo.target = o.target;
  eo.direct = o.direct;
  eo.iodepth = o.iodepth;
  for_flag("--iodepth", [&] { iosim::check_iodepth(o.iodepth); });
  eo.submit_batch = o.iodepth_batch;
  eo.verify = o.verify;
  eo.realtime = o.rt;
  eo.hold_cpu_latency = !o.no_pm_qos;
  eo.seed = o.seed;
  eo.max_ios = o.ios;
  if (!o.size.empty()) {
    eo.size = parse_size("--size", o.size);
    if (eo.size == 0) throw InputError("--size: must be above 0 (leave it out to use the whole target)");
  }
  if (!o.runtime.empty()) eo.runtime_ns = parse_positive_duration("--runtime", o.runtime);
  const double progress_s = o.progress_s >= 0 ? o.progress_s : (::isatty(STDERR_FILENO) ? 1.0 : 0.0);
  // O_DIRECT needs offsets and lengths in multiples of the target's
  // alignment: checked here, not found out by the first I/O mid-run.
  const uint64_t align = o.direct ? iosim::direct_io_alignment(o.target) : 1;

  std::optional<tiers::Catalog> catalog;
  std::unique_ptr<iosim::Shaper> shaper;
  if (!o.tier.empty()) {
    catalog = tiers::load_catalog(o.tiers_file);
    shaper = std::make_unique<iosim::Shaper>(catalog->get(o.tier), o.seed);
    eo.shaper = shaper.get();
  } else if (!o.tiers_file.empty()) {
    throw InputError("--tiers-file is only used with --tier NAME");
  }

  std::unique_ptr<iosim::IoSource> source;
  std::string what;
  if (!o.trace.empty()) {
    auto reader = trace::open_reader(o.trace);
    auto sched = iosim::load_trace_schedule(*reader);
    if (sched.empty()) throw InputError(o.trace + ": has no block or file I/O records to replay");
    bool writes = false;
    for (const auto& q : sched) {
      eo.max_block = std::max(eo.max_block, q.length);
      writes |= q.op == trace::IoOp::Write || q.op == trace::IoOp::Discard;
      if ((q.op == trace::IoOp::Read || q.op == trace::IoOp::Write) && (q.offset % align || q.length % align))
        throw InputError("--direct: " + o.trace + " has a " + (q.op == trace::IoOp::Read ? "read" : "write") +
                         " of " + std::to_string(q.length) + " bytes at offset " + std::to_string(q.offset) +
                         ", not in multiples of " + std::to_string(align) + " bytes, the direct I/O alignment of " +
                         o.target + " (drop --direct)");
    }
    eo.open_loop = true;
    eo.verify_existing = !writes;
    eo.read_only = !writes;
    what = "trace=" + o.trace + " (" + std::to_string(sched.size()) + " I/Os, open loop)";
    source = std::make_unique<iosim::VectorSource>(std::move(sched));
  } else {
    iosim::PatternSpec spec;
    spec.rw = for_flag("--rw", [&] { return iosim::parse_rw(o.rw); });
    spec.bs = parse_size("--bs", o.bs);
    spec.rwmixread = o.rwmixread;
    spec.seed = o.seed;
    spec.size = eo.size ? eo.size : existing_size(o.target);
    for_flag("--bs", [&] { iosim::check_bs(spec.bs); });
    for_flag(eo.size ? "--size" : o.target + ":", [&] { iosim::check_region(spec.size, spec.bs); });
    for_flag("--rwmixread", [&] { iosim::check_rwmixread(spec.rwmixread); });
    if (spec.bs % align)
      throw InputError("--bs " + o.bs + ": not a multiple of " + std::to_string(align) +
                       " bytes, the direct I/O alignment of " + o.target + " (--direct)");
    eo.max_block = uint32_t(spec.bs);
    eo.verify_existing = spec.rw == iosim::Rw::RandRead || spec.rw == iosim::Rw::Read;
    eo.read_only = eo.verify_existing;
    // Like fio: without --runtime or --ios, transfer --size bytes once.
    if (!eo.runtime_ns && !eo.max_ios) eo.max_ios = spec.size / spec.bs;
    what = "rw=" + std::string(iosim::rw_name(spec.rw)) + " bs=" + o.bs +
           " iodepth=" + std::to_string(o.iodepth);
    source = std::make_unique<PatternSource>(spec);
  }

  OutputFile json(o.json, "--json");  // "-": stdout, at the end
  eo.on_layout = [](const std::string& target, uint64_t bytes) {
    std::fprintf(stderr, "tierlab: iosim run: laying out %s: %s (holes and unwritten extents, whose reads "
                 "would not reach the device)\n", target.c_str(), format_bytes(double(bytes)).c_str());
  };
  iosim::EngineLive live;
  eo.live = &live;
  iosim::EngineResult r;
  int stopped_by = 0;
  {
    check_rt(o.rt);
    RunStopper stopper(&live, int64_t(progress_s * 1e9));
    eo.stop = &stopper.signal();
    try {
      r = iosim::run_engine(eo, *source);
    } catch (const iosim::TargetError& e) {
      using Fix = iosim::TargetError::Fix;
      throw InputError(std::string(e.what()) + (e.fix == Fix::CreateWithSize ? " (give --size to create it)"
                                                : e.fix == Fix::GiveSize     ? " (give --size)"
                                                : e.fix == Fix::DropDirect   ? " (drop --direct)"
                                                                             : ""));
    }
    stopped_by = stopper.signal().load();
  }

  const bool text = o.json != "-";  // --json -: JSON alone on stdout, as iosim simulate
  double secs = r.elapsed_ns > 0 ? r.elapsed_ns / 1e9 : 1e-9;
  if (text) print_summary(o, eo, r, what, shaper.get(), secs);
  if (!o.json.empty()) {
    nlohmann::json j;
    j["target"] = o.target;
    j["tier"] = r.tier;
    j["ios"] = r.ios;
    j["bytes"] = r.bytes;
    j["runtime_ns"] = r.elapsed_ns;
    j["iops"] = r.ios / secs;
    j["bw_bytes"] = r.bytes / secs;
    j["lat_ns"] = lat_json(r.lat);
    for (int k = 0; k < 3; ++k) {
      if (!r.op[k].ios) continue;
      j[kOpNames[k]] = {{"ios", r.op[k].ios},
                        {"bytes", r.op[k].bytes},
                        {"iops", r.op[k].ios / secs},
                        {"bw_bytes", r.op[k].bytes / secs},
                        {"lat_ns", lat_json(r.op[k].lat)},
                        {"device_lat_ns", lat_json(r.op[k].device_lat)}};
    }
    j["open_loop"] = eo.open_loop;
    if (eo.open_loop) {
      j["issue_lag_ns"] = {{"p50", r.issue_lag.quantile(0.5)},
                           {"p99", r.issue_lag.quantile(0.99)},
                           {"max", r.issue_lag.max()}};
      j["schedule_ns"] = r.schedule_ns;
      j["duration_error"] = duration_error(r);
      j["slot_waits"] = r.slot_waits;
      j["late_issues"] = {{"threshold_ns", iosim::EngineResult::kLateIssueNs},
                          {"ios", r.late_issues},
                          {"stalls", r.issue_stalls}};
    }
    j["cpu_latency_held"] = r.cpu_latency_held;
    j["short_ios"] = r.short_ios;
    j["eof_short"] = r.eof_short;
    j["eagain"] = r.eagain;
    j["eintr"] = r.eintr;
    j["wrapped"] = r.wrapped;
    j["skipped"] = r.skipped;
    j["laid_out_bytes"] = r.laid_out_bytes;
    j["device_slower_than_tier"] = r.slower_than_tier;
    if (eo.shaper) {
      j["throttled_ios"] = shaper->stats().throttled_ios;
      j["throttle_wait_ns"] = shaper->stats().throttle_wait_ns;
      j["release_lag_ns"] = {{"p50", r.release_lag.quantile(0.5)},
                             {"p99", r.release_lag.quantile(0.99)},
                             {"max", r.release_lag.max()}};
    }
    if (o.verify) j["verified_bytes"] = r.verified_bytes;
    j["stopped"] = r.stopped ? signal_name(stopped_by) : "";
    json.write(j.dump(2) + "\n");
  }
  if (r.stopped) {
    // The results so far are out; the exit status says the run did not run
    // its course (128 + the signal, as for a command the signal ended).
    std::fflush(stdout);
    std::fprintf(stderr, "tierlab: iosim run: stopped by %s after %.3f s; the results cover the %llu I/Os that ran\n",
                 signal_name(stopped_by), r.elapsed_ns / 1e9, (unsigned long long)r.ios);
    set_exit_status(128 + stopped_by);
  }
}

}  // namespace

void setup_iosim_run(CLI::App& parent) {
  auto& io = group(parent, "iosim");
  auto* sub = io.add_subcommand("run", "real I/O through io_uring, closed loop (pattern) or open loop (--trace), "
                                       "optionally shaped like a tier");
  auto opt = std::make_shared<RunOptions>();
  sub->add_option("--target", opt->target, "file or block device to drive")->required();
  auto* trace = sub->add_option("--trace", opt->trace, "replay the block/file I/O of this trace at its recorded times");
  // The trace gives every I/O's op and size: a pattern's flags would be ignored.
  trace->excludes(sub->add_option("--rw", opt->rw, "randread|randwrite|read|write|randrw|readwrite")
                      ->capture_default_str());
  trace->excludes(sub->add_option("--bs", opt->bs, "block size (4k, 64k, ...)")->capture_default_str());
  sub->add_option("--iodepth", opt->iodepth, "I/Os in flight (open loop: at most)")->capture_default_str();
  sub->add_option("--iodepth-batch", opt->iodepth_batch,
                  "submit once this many I/Os are ready, like fio's iodepth_batch_submit "
                  "(0 = all that are ready at once)")
      ->capture_default_str();
  sub->add_option("--size", opt->size,
                  "bytes of the target to use, above 0; a regular file is created/extended to it. Holes and "
                  "unwritten extents of a regular file are written (laid out) before the run, as fio lays out "
                  "a new file, so that reads reach the device");
  trace->excludes(
      sub->add_option("--rwmixread", opt->rwmixread, "percent reads for randrw/readwrite")->capture_default_str());
  sub->add_flag("--direct", opt->direct,
                "O_DIRECT (bypass the page cache); --bs and a --trace's offsets and lengths must be multiples "
                "of the target's direct I/O alignment (statx, or its logical block size)");
  sub->add_option("--tier", opt->tier, "hold completions back like this tier (tierlab tiers list)");
  sub->add_option("--tiers-file", opt->tiers_file, "JSON file with more tiers");
  sub->add_option("--runtime", opt->runtime,
                  "run this long, above 0 (10s, 1m); pattern default: --size bytes once. Ctrl-C (SIGINT) "
                  "or SIGTERM stops a run early: the summary and --json cover what ran, exit 128 + signal");
  sub->add_option("--ios", opt->ios, "stop after this many I/Os");
  sub->add_flag("--verify", opt->verify, "write a known pattern and check it on read back");
  sub->add_flag("--rt", opt->rt, "run the I/O loop at real-time priority (SCHED_FIFO; root)");
  sub->add_flag("--no-pm-qos", opt->no_pm_qos,
                "open loop or --tier: let idle CPUs sleep deeply (by default /dev/cpu_dma_latency is held "
                "at 0 during the run, as cyclictest does)");
  sub->add_option("--seed", opt->seed, "seed of the pattern, latencies and verify data")->capture_default_str();
  sub->add_option("--json", opt->json, "write the results as JSON to this file (- : JSON on stdout only)");
  sub->add_option("-P,--progress", opt->progress_s,
                  "print a progress line on stderr every SEC seconds (0: none; default: every second when "
                  "stderr is a terminal)")
      ->check(CLI::Range(0.0, 1e6));
  sub->callback([opt] { run_iosim(*opt); });
}

}  // namespace tierlab::app
