// tierlab capture run: the transaction capture (through the proxy, or
// passively from packets), the block and file I/O recorders and periodic
// samples of the server (CPU time of its process tree, PostgreSQL's
// counters) together, on one clock, into one trace.
#include "app/command.h"
#include "app/progress.h"
#include "app/sniff_thread.h"
#include "app/stop_signals.h"
#include "capture/server.h"
#include "common/units.h"
#include "capture/activity.h"
#include "capture/block.h"
#include "capture/file_io.h"
#include "capture/proxy.h"
#include "app/proxy_tls.h"
#include "capture/run.h"
#include "capture/local_clients.h"
#include "capture/sniff.h"
#include "common/error.h"
#include "trace/writer.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <streambuf>
#include <string>
#include <thread>
#include <unordered_set>

namespace tierlab::app {
namespace {

struct CaptureRunOptions {
  // Proxy mode.
  std::string listen = "127.0.0.1:6432";
  std::string upstream;
  int threads = 0;
  std::string io = "auto";
  ProxyTlsFlags tls;
  // Passive mode.
  std::string interface;
  uint16_t port = 0;
  std::string host;
  std::string buffer_size;
  // Which mode's flags were given (the modes exclude each other).
  bool proxy_flags = false, passive_flags = false;
  std::string device;
  std::string out;
  std::string duration;
  std::string sample_interval = "1s";
  int pid = 0;
  std::string conninfo;
  bool all_processes = false;  // block I/O of every process, not only the server's
  bool no_file_io = false;
  double progress_s = -1;  // -P: see progress_period()
  bool hostless = false;   // sample the server over SQL only, wherever it runs
};

// An exception's message.
std::string what(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

void say(const std::string& line) {
  std::fprintf(stderr, "tierlab capture run: %s\n", line.c_str());
  std::fflush(stderr);
}

// The transaction side of a capture run: the proxy or the packet sniffer,
// each writing its own part file.
class TxCapture {
 public:
  virtual ~TxCapture() = default;
  // Returns once transactions are being recorded; throws if they cannot be.
  virtual void start() = 0;
  // "listening on ..." or "capturing on ...", for the start line.
  virtual std::string where() const = 0;
  // True when the capture ended on its own (stop() then throws its error).
  virtual bool failed() const = 0;
  // True once its part file could take no more records (a full disk): the
  // capture goes on (the proxy forwards), only recording stopped.
  // `error` says why.
  virtual bool recording_stopped(std::string& error) const = 0;
  // Stops, flushes and closes the part file; idempotent. Throws its error.
  virtual void stop() = 0;
  // The summary lines about transactions and what could not be seen.
  virtual void print_summary(const char* why) const = 0;
  // The status line's part about the traffic over the last `secs`; called
  // from the status line's thread while the capture runs.
  virtual std::string progress(double secs) = 0;
};

void print_counts(uint64_t sessions, uint64_t statements, uint64_t transactions, uint64_t errors) {
  std::printf("sessions: %llu, statements: %llu, transactions: %llu, errors: %llu\n",
              static_cast<unsigned long long>(sessions), static_cast<unsigned long long>(statements),
              static_cast<unsigned long long>(transactions), static_cast<unsigned long long>(errors));
}

// A tracefs recorder (block or file I/O) on its own thread, writing its
// part file, until the capture's stop flag is set.
class RecorderThread {
 public:
  explicit RecorderThread(std::atomic<bool>& stop) : stop_(stop) {}
  // Starts `record(writer, ready)` and returns once it called ready() (it
  // records), or rethrows why it could not start.
  template <class F>
  void start(const std::string& part, F record) {
    thread_ = std::thread([this, part, record] {
      try {
        auto w = trace::open_writer(part);
        record(*w, [this] {
          std::lock_guard<std::mutex> l(mu_);
          ready_ = true;
          cv_.notify_all();
        });
        w->close();
      } catch (...) {
        error_ = std::current_exception();
        failed_.store(true, std::memory_order_release);
      }
      std::lock_guard<std::mutex> l(mu_);
      ready_ = true;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return ready_; });
    if (error_) {
      l.unlock();
      thread_.join();
      std::rethrow_exception(error_);
    }
  }
  // True once the recorder ended on an error (its part file failing: a full
  // disk); error() is then set.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::exception_ptr error() const { return failed() ? error_ : nullptr; }
  // Waits for the end (after the stop flag is set); the error it ended on.
  std::exception_ptr join() {
    if (thread_.joinable()) thread_.join();
    return error_;
  }
  ~RecorderThread() {
    stop_ = true;  // an early exit of the capture ends the recorder too
    join();
  }

 private:
  std::atomic<bool>& stop_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

class ProxyCapture : public TxCapture {
 public:
  ProxyCapture(const CaptureRunOptions& o, const std::string& part) : upstream_(o.upstream) {
    capture::ProxyOptions po;
    po.listen = o.listen;
    po.upstream = o.upstream;
    po.out = part;
    po.threads = o.threads;
    po.io = io_choice(o.io, "TIERLAB_PROXY_IO");
    apply_proxy_tls_flags(o.tls, po);
    proxy_ = for_settings(kProxyFlags, [&] { return std::make_unique<capture::Proxy>(po); });
  }
  void start() override {
    proxy_->start();
    say_tls_fingerprint("capture run", *proxy_);
  }
  std::string where() const override { return "listening on " + proxy_->listening() + ", upstream " + upstream_; }
  bool failed() const override { return proxy_->failed(); }
  bool recording_stopped(std::string& error) const override {
    if (!proxy_->recording_stopped()) return false;
    error = proxy_->summary().recording_error;
    return true;
  }
  void stop() override { proxy_->stop(); }
  std::string progress(double secs) override {
    capture::ProxySummary now = proxy_->progress();
    std::string line = std::to_string(now.connections) + " connections, " +
                       rate_mb(double(now.bytes_to_server - prev_.bytes_to_server), secs) + " to the server, " +
                       rate_mb(double(now.bytes_to_client - prev_.bytes_to_client), secs) + " to clients";
    prev_ = now;
    return line;
  }
  void print_summary(const char* why) const override {
    auto s = proxy_->summary();
    std::printf("capture run: %s after %.1f s\n", why, static_cast<double>(s.duration_ns) / 1e9);
    print_counts(s.sessions, s.statements, s.transactions, s.errors);
    if (s.dropped) std::printf("dropped records: %llu\n", static_cast<unsigned long long>(s.dropped));
    print_writer_waits(s.queue_waits);
    if (!s.recording_error.empty())
      std::printf("transactions not recorded: %llu records (the chunk being written and every one after)\n",
                  static_cast<unsigned long long>(s.lost_records));
  }

 private:
  std::string upstream_;
  std::unique_ptr<capture::Proxy> proxy_;
  capture::ProxySummary prev_;
};

// capture sniff's recorder on its own thread (app/sniff_thread.h); its
// "capturing on ..." line is the start signal here, the start line says
// where it records.
class SniffCapture : public TxCapture {
 public:
  explicit SniffCapture(capture::SniffOptions so) : sniff_(std::move(so), false) {}
  std::string progress(double secs) override { return sniff_.progress(secs); }
  void start() override {
    sniff_.start();
    if (!sniff_.wait_live())
      throw RuntimeError("capture run: packet capture on " + sniff_.options().interface + " ended before it started");
  }
  std::string where() const override {
    const auto& o = sniff_.options();
    return "capturing on " + o.interface + ", port " + std::to_string(o.port) +
           (o.host.empty() ? std::string() : ", host " + o.host);
  }
  bool failed() const override { return sniff_.done(); }
  // The sniffer says so itself (its RECORDING STOPPED line) and goes on
  // decoding; its summary, once it ended, says why.
  bool recording_stopped(std::string& error) const override {
    if (!sniff_.done()) return false;
    error = sniff_.summary().recording_error;
    return !error.empty();
  }
  void stop() override { sniff_.stop(); }
  void print_summary(const char* why) const override {
    const auto& s = sniff_.summary();
    std::printf("capture run: %s after %.1f s\n", why, s.seconds);
    print_counts(s.sessions, s.statements, s.transactions, s.errors);
    std::printf("packets: %llu (%.1f MB), kernel drops: %llu, interface drops: %llu, stream gaps: %llu (%llu bytes)\n",
                static_cast<unsigned long long>(s.packets), static_cast<double>(s.bytes) / 1e6,
                static_cast<unsigned long long>(s.kernel_drops), static_cast<unsigned long long>(s.if_drops),
                static_cast<unsigned long long>(s.gaps), static_cast<unsigned long long>(s.gap_bytes));
    std::fputs(capture::drop_advice(s).c_str(), stdout);
    if (s.joined) std::printf("sessions joined mid-stream: %llu\n", static_cast<unsigned long long>(s.joined));
    if (s.tls_sessions)
      std::printf("sessions encrypted (TLS/GSS), not decodable: %llu\n",
                  static_cast<unsigned long long>(s.tls_sessions));
    if (s.decode_failures)
      std::printf("sessions that stopped decoding (malformed stream): %llu\n",
                  static_cast<unsigned long long>(s.decode_failures));
    if (!s.recording_error.empty())
      std::printf("transactions not recorded: %llu records (after %.1f s: %s)\n",
                  static_cast<unsigned long long>(s.lost_records), s.recording_stopped_s, s.recording_error.c_str());
  }

 private:
  SniffThread sniff_;
};

void run_capture_run(const CaptureRunOptions& o) {
  const bool passive = !o.interface.empty();
  if (o.proxy_flags && o.passive_flags)
    throw InputError(
        "capture run: give either --listen/--upstream (through the proxy) or --interface/--port (passive "
        "capture), not both");
  if (!passive && o.upstream.empty())
    throw InputError(
        "capture run: give --upstream (and --listen) to capture through the proxy, or --interface and --port to "
        "capture passively");
  if (passive && o.port == 0) throw InputError("capture run: --interface needs --port, the server's TCP port");
  int64_t duration = o.duration.empty() ? 0 : parse_positive_duration("--duration", o.duration);
  int64_t interval = parse_positive_duration("--sample-interval", o.sample_interval);
  if (o.threads < 0) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 0");
  for_flag("--pid", [&] { capture::check_pid(o.pid); });
  if (o.hostless && (!o.device.empty() || o.pid != 0))
    throw InputError("capture run: --hostless samples the server over SQL only: no --device or --pid with it");
  if (!o.device.empty())  // a bad name: exit 2 now
    for_flag("--device", [&] { capture::resolve_block_device(o.device); });
  capture::SniffOptions so;
  if (passive) {
    so.interface = o.interface;
    so.port = o.port;
    so.host = o.host;
    if (!o.buffer_size.empty()) so.buffer_bytes = parse_size("--buffer-size", o.buffer_size);
  }

  const std::string part_tx = o.out + (passive ? ".sniff.part" : ".proxy.part"),
                    part_block = o.out + ".block.part", part_samples = o.out + ".samples.part",
                    part_file_io = o.out + ".fileio.part";
  if (passive) {
    so.out = part_tx;
    // Before the server checks print their warnings.
    for_settings("capture run", kSniffFlags, [&] { capture::check_sniff_options(so, "capture run"); });
  }
  std::vector<std::string> parts{part_tx, part_samples};
  // The part files go when the run fails before they are merged.
  struct PartsGuard {
    const std::vector<std::string>* parts;
    bool keep = false;
    ~PartsGuard() {
      if (!keep)
        for (const auto& p : *parts) ::unlink(p.c_str());
    }
  } parts_guard{&parts};

  // The proxy binds --listen and checks --upstream, --io and --threads now,
  // before anything else starts; its loops start with the capture.
  std::unique_ptr<TxCapture> tx;
  if (!passive) tx = std::make_unique<ProxyCapture>(o, part_tx);

  // What the server is: version, shared_buffers, postmaster pid, memory.
  std::string server = o.upstream;
  if (passive) server = (o.host.empty() ? std::string("localhost") : o.host) + ":" + std::to_string(o.port);
  capture::PgSampler pg(o.conninfo.empty() ? capture::conninfo_for(server) : o.conninfo);
  if (passive) {
    capture::SniffOptions::Client self;
    if (pg.tcp_client(self.addr, self.port)) so.ignore_clients.push_back(self);
  }
  int32_t postmaster = o.pid;
  std::string datadir;
  std::vector<std::pair<std::string, std::string>> meta;
  // A server elsewhere (a managed one: RDS, Aurora, Cloud SQL) is sampled
  // over SQL only: its processes and devices are not this machine's.
  std::string peer;
  const bool hostless = o.hostless || (pg.ok() && o.pid == 0 && !pg.server_on_this_machine(&peer));
  if (o.hostless) peer = server;
  if (hostless) {
    meta.push_back({"capture.hostless", peer});
    say("host-less capture of " + peer + (o.hostless ? "" : " (not on this machine)") +
        ": no CPU samples of the server's processes; its own counters every " + o.sample_interval);
  }
  if (pg.ok()) {
    meta.push_back({"server_version", pg.value("SHOW server_version")});
    for (auto& kv : capture::durability_settings(pg)) meta.push_back(std::move(kv));
    for (auto& kv : capture::projection_settings(pg)) meta.push_back(std::move(kv));
    datadir = pg.value("SHOW data_directory");  // "" without pg_read_all_settings
    if (!datadir.empty()) meta.push_back({"data_directory", datadir});
    if (postmaster == 0 && !datadir.empty() && !hostless) {
      try {
        postmaster = capture::postmaster_pid_from_datadir(datadir);
      } catch (const InputError& e) {
        say(std::string("CPU samples skipped: ") + e.what() + " (give --pid)");
      }
    }
  } else {
    say("PostgreSQL counters and durability settings skipped: " + pg.error() + " (give --conninfo)");
  }
  if (postmaster > 0) {
    try {
      capture::process_tree_cpu(postmaster);
      meta.push_back({"postmaster_pid", std::to_string(postmaster)});
      meta.push_back({"memory.bytes", std::to_string(static_cast<uint64_t>(capture::memory_limit_bytes(postmaster)))});
      meta.push_back({"cpu.count", std::to_string(capture::cpu_count(postmaster))});
    } catch (const RuntimeError& e) {
      say(std::string("CPU samples skipped: ") + e.what());
      postmaster = 0;
    }
  } else if (!pg.ok()) {
    say("CPU samples skipped: postmaster pid unknown (give --pid)");
  }
  bool block = !o.device.empty();
  if (block && geteuid() != 0) {
    say("block I/O skipped: recording " + o.device + " needs root");
    block = false;
  }
  if (!block && o.device.empty()) say("block I/O not recorded (no --device)");
  // Block I/O of the server's processes (and the kernel's threads, which
  // write its data back and commit its journal); others' are counted.
  int32_t block_tree = 0;
  if (block && !o.all_processes) {
    if (postmaster > 0)
      block_tree = postmaster;
    else
      say("block I/O of every process recorded: the postmaster's pid is unknown (give --pid)");
  }
  if (block) parts.push_back(part_block);
  // File I/O of the server's process tree: the page references below
  // shared_buffers that project --memory needs.
  bool file_io = !o.no_file_io && !hostless;  // a server elsewhere: its files are not here
  if (file_io) {
    try {
      capture::require_file_io_tracing("");
      if (postmaster <= 0) {
        say("file I/O not recorded: the postmaster's pid is unknown (give --pid)");
        file_io = false;
      }
    } catch (const RuntimeError& e) {
      say(std::string("file I/O not recorded: ") + e.what());
      file_io = false;
    }
  }
  if (file_io) parts.push_back(part_file_io);

  StopSignals signals;

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr sample_error;
  std::atomic<bool> samples_failed{false};
  capture::BlockCaptureStats block_stats;
  capture::FileIoCaptureStats file_io_stats;
  std::atomic<uint64_t> live_block_ios{0}, live_file_ios{0};  // for the status line
  std::atomic<uint64_t> samples{0};  // counter values written
  std::atomic<uint64_t> rounds{0};   // sampling moments (one per --sample-interval)

  // The recorders first: the I/O of the first transactions must be seen.
  RecorderThread block_thread(stop), file_io_thread(stop);
  if (block)
    block_thread.start(part_block, [&](trace::Writer& w, const std::function<void()>& ready) {
      capture::BlockCaptureOptions bo;
      bo.device = o.device;
      bo.process_tree = block_tree;
      bo.live_ios = &live_block_ios;
      block_stats = capture::capture_block(bo, w, &stop, ready);
    });
  if (file_io) {
    try {
      file_io_thread.start(part_file_io, [&](trace::Writer& w, const std::function<void()>& ready) {
        capture::FileIoCaptureOptions fo;
        fo.process_tree = postmaster;
        fo.data_dir = datadir;
        fo.live_calls = &live_file_ios;
        file_io_stats = capture::capture_file_io(fo, w, &stop, ready);
      });
    } catch (...) {
      stop = true;
      block_thread.join();
      throw;
    }
  }

  // Samples: CPU of the postmaster's tree and PostgreSQL's counters.
  auto sample_writer = trace::open_writer(part_samples);
  for (const auto& [k, v] : meta) sample_writer->write(now_ns(), 0, trace::Meta{k, v});
  std::unique_ptr<capture::CounterSampler> counters;
  if (pg.ok()) counters = std::make_unique<capture::CounterSampler>(pg, [](const std::string& line) { say(line); });
  // What the backends in a transaction wait on, every round: the profile's
  // split of a transaction's time by wait.
  std::unique_ptr<capture::ActivitySampler> activity;
  if (pg.ok())
    activity = std::make_unique<capture::ActivitySampler>(
        [&pg](const char* sql, std::vector<std::vector<std::string>>& rows, std::string& err) {
          return pg.rows(sql, rows, err);
        },
        [](const std::string& line) { say(line); });
  // Clients on the server's machine (pgbench beside it) use the same cores:
  // their CPU, found by the client ends of connections to where they
  // connect (the server's port when passive, the proxy's when not).
  std::unique_ptr<capture::LocalClients> local_clients;
  if (postmaster > 0) {
    try {
      if (passive) {
        local_clients = std::make_unique<capture::LocalClients>(o.host, o.port);
      } else if (auto colon = o.listen.rfind(':'); colon != std::string::npos && o.listen[0] != '/') {
        std::string h = o.listen.substr(0, colon);
        if (h.size() > 1 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
        int port = std::atoi(o.listen.c_str() + colon + 1);
        if (port > 0) local_clients = std::make_unique<capture::LocalClients>(h, static_cast<uint16_t>(port));
      }
    } catch (const InputError& e) {
      say(std::string("CPU of clients on this machine not sampled: ") + e.what());
    }
  }
  std::thread sample_thread([&] {
    try {
      std::vector<std::pair<std::string, double>> c;
      std::vector<std::pair<std::string, std::string>> texts;
      std::unordered_set<int32_t> known_pids;
      bool pg_on = pg.ok();
      for (;;) {
        trace::Nanos now = now_ns();
        if (postmaster > 0) {
          try {
            auto cpu = capture::process_tree_cpu(postmaster);
            // Which processes are the server's, so that the profile can tell
            // their I/O from the kernel's own (writeback, journal).
            for (int32_t pid : cpu.pids)
              if (known_pids.insert(pid).second)
                sample_writer->write(now, 0, trace::Meta{"server.pid", std::to_string(pid)});
            sample_writer->write(now, 0, trace::Sample{"cpu.user_ns", static_cast<double>(cpu.user_ns)});
            sample_writer->write(now, 0, trace::Sample{"cpu.system_ns", static_cast<double>(cpu.system_ns)});
            samples += 2;
            if (local_clients) {
              int64_t ns = local_clients->cpu_ns(known_pids);
              if (local_clients->processes() > 0) {
                sample_writer->write(now, 0, trace::Sample{"clients.cpu_ns", static_cast<double>(ns)});
                ++samples;
              }
            }
            // The capture's own CPU: on the server's machine it takes cores
            // the server would otherwise have (the profile and projection
            // take it out).
            rusage self{};
            if (::getrusage(RUSAGE_SELF, &self) == 0) {
              auto ns = [](const timeval& t) { return double(t.tv_sec) * 1e9 + double(t.tv_usec) * 1e3; };
              sample_writer->write(now, 0, trace::Sample{"capture.cpu_ns", ns(self.ru_utime) + ns(self.ru_stime)});
              ++samples;
            }
          } catch (const RuntimeError&) {
            postmaster = 0;  // the server went away; keep the rest going
          }
        }
        if (pg_on) {
          if (counters->sample(c, texts)) {
            for (const auto& [k, v] : texts) sample_writer->write(now, 0, trace::Meta{k, v});
            for (const auto& [name, v] : c) sample_writer->write(now, 0, trace::Sample{name, v});
            samples += c.size();
            c.clear();
            if (activity->sample(c)) {
              for (const auto& [name, v] : c) sample_writer->write(now, 0, trace::Sample{name, v});
              samples += c.size();
            }
          } else {
            pg_on = false;
          }
        }
        ++rounds;
        std::unique_lock<std::mutex> l(mu);
        if (cv.wait_for(l, std::chrono::nanoseconds(interval), [&] { return stop.load(); })) break;
      }
      sample_writer->close();
    } catch (...) {
      sample_error = std::current_exception();
      samples_failed.store(true, std::memory_order_release);
    }
  });

  try {
    if (passive) tx = std::make_unique<SniffCapture>(so);
    tx->start();
  } catch (...) {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    sample_thread.join();
    block_thread.join();
    file_io_thread.join();
    tx.reset();
    for (const auto& p : parts) ::unlink(p.c_str());
    throw;
  }
  say(tx->where() + ", recording to " + o.out + (block ? ", block I/O of " + o.device : std::string()) +
      (file_io ? ", the server's file I/O" : "") +
      (duration > 0 ? "" : "; Ctrl-C to stop"));

  // The status line: traffic, then the I/O recorded, over the last period.
  uint64_t prev_block = 0, prev_file = 0;
  ProgressLine progress(progress_period(o.progress_s), [&](double secs) {
    std::string line = tx->progress(secs);
    char part[96];
    if (block) {
      const uint64_t n = live_block_ios.load(std::memory_order_relaxed);
      std::snprintf(part, sizeof part, ", %.0f block I/Os/s", double(n - prev_block) / secs);
      line += part;
      prev_block = n;
    }
    if (file_io) {
      const uint64_t n = live_file_ios.load(std::memory_order_relaxed);
      std::snprintf(part, sizeof part, ", %.0f file I/Os/s", double(n - prev_file) / secs);
      line += part;
      prev_file = n;
    }
    return line;
  });

  // A part file that can take no more (the disk of --out full) stops
  // recording, said once; the transactions go on being served (through the
  // proxy) and what was recorded is kept.
  bool stopped_said = false;
  auto say_recording_stopped = [&](const std::string& error) {
    stopped_said = true;
    say("RECORDING STOPPED: " + error + ": --out " + o.out +
        "'s disk cannot take more; still forwarding, nothing more is recorded (what was recorded is kept)");
  };
  const char* why = signals.until_stop(
      duration,
      [&] {
        std::string error;
        if (!stopped_said) {
          if (tx->recording_stopped(error)) {
            say_recording_stopped(error);
          } else if (samples_failed.load(std::memory_order_acquire)) {
            say_recording_stopped(what(sample_error));
          } else {
            for (auto* t : {&block_thread, &file_io_thread})
              if (t->failed()) {
                say_recording_stopped(what(t->error()));
                break;
              }
          }
        }
        return tx->failed();
      },
      "transaction capture failed");
  progress.stop();
  std::exception_ptr tx_error;
  try {
    tx->stop();
  } catch (...) {
    tx_error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  sample_thread.join();
  std::exception_ptr block_error = block_thread.join(), file_io_error = file_io_thread.join();
  // Why the trace is incomplete, if it is: the first error of a part.
  std::string incomplete;
  if (std::string e; tx->recording_stopped(e)) incomplete = e;
  for (auto* e : {&tx_error, &block_error, &file_io_error, &sample_error})
    if (*e && incomplete.empty()) incomplete = what(*e);

  // What was recorded is merged even after an error: each part ends at its
  // last whole chunk. If the merge itself fails (no room for the trace
  // beside its parts), the parts stay and say how to join them later.
  parts_guard.keep = true;
  uint64_t records = 0;
  try {
    records = capture::merge_traces(parts, o.out);
  } catch (const std::exception& e) {
    ::unlink(o.out.c_str());
    std::string list;
    for (const auto& p : parts) list += " " + p;
    say("the trace could not be merged (" + std::string(e.what()) + "); its parts are kept, nothing recorded is lost:" +
        list + "; with room for the trace, `tierlab trace merge" + list + " --out " + o.out + "` joins them");
    for (auto* err : {&tx_error, &block_error, &file_io_error, &sample_error})
      if (*err) std::rethrow_exception(*err);
    throw RuntimeError("capture run: the trace " + o.out + " was not written: " + e.what());
  }
  for (const auto& p : parts) ::unlink(p.c_str());
  tx->print_summary(why);
  if (block)
    std::printf("block I/O: %s\n", capture::describe(block_stats, false).c_str());
  if (file_io) std::printf("file I/O: %s\n", capture::describe(file_io_stats).c_str());
  std::printf("samples: %llu sampling rounds (every %s), %llu counter values in all\n",
              static_cast<unsigned long long>(rounds.load()), o.sample_interval.c_str(),
              static_cast<unsigned long long>(samples.load()));
  std::printf("trace: %s (%llu records)\n", o.out.c_str(), static_cast<unsigned long long>(records));
  std::fflush(stdout);
  if (!incomplete.empty()) {
    if (tx_error) std::rethrow_exception(tx_error);
    throw RuntimeError("capture run: the trace " + o.out + " is incomplete: " + incomplete);
  }
}

}  // namespace

void setup_capture_run(CLI::App& parent) {
  auto& capture = group(parent, "capture");
  auto opt = std::make_shared<CaptureRunOptions>();
  auto* cmd = capture.add_subcommand(
      "run",
      "record everything a projection needs in one trace: the transactions (through the proxy:\n"
      "point clients at --listen; or passively from packets on --interface, no hop in the path,\n"
      "needs root), the block I/O of --device (needs root), the server's file I/O (its reads,\n"
      "writes and syncs from the kernel's syscall tracepoints; needs root, --no-file-io to leave it\n"
      "out), and every --sample-interval the CPU time of the server's process tree and PostgreSQL's\n"
      "counters (pg_stat_database, pg_stat_bgwriter, pg_stat_checkpointer, pg_stat_wal, pg_stat_io,\n"
      "pg_stat_statements, WAL position, as the server version has them) and what the backends in a\n"
      "transaction wait on (pg_stat_activity; the role needs pg_monitor). A server not on this\n"
      "machine (RDS, Aurora) is captured host-less: transactions through the proxy and its counters\n"
      "over SQL only.");
  auto* listen = cmd->add_option("--listen", opt->listen,
                                 "proxy: HOST:PORT to accept clients on (port 0: any free port)")
                     ->capture_default_str();
  auto* upstream = cmd->add_option("--upstream", opt->upstream, "proxy: the server, HOST:PORT or SOCKET_DIR[:PORT]");
  auto* threads =
      cmd->add_option("--threads", opt->threads, "proxy: event-loop threads (0: half the cores, at least one)")->capture_default_str();
  auto* io = cmd->add_option("--io", opt->io,
                             "proxy: event loop: io_uring, epoll, or auto (io_uring where the kernel has it, else epoll)")
                 ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
                 ->capture_default_str();
  auto tls_flags = std::make_shared<std::vector<CLI::Option*>>();
  add_proxy_tls_flags(*cmd, opt->tls, "proxy: ", tls_flags.get());
  auto* iface = cmd->add_option("--interface,-i", opt->interface,
                                "passive: capture packets on this interface (lo, eth0, any); needs root");
  auto* port = cmd->add_option("--port,-p", opt->port, "passive: the server's TCP port");
  auto* host = cmd->add_option("--host", opt->host, "passive: the server's IP address (default: any)");
  auto* buffer = cmd->add_option("--buffer-size,-B", opt->buffer_size,
                                 "passive: kernel capture buffer, 64K to 1G (default 8M; larger means fewer drops)");
  cmd->add_option("--device", opt->device,
                  "block device holding the data directory (vda, /dev/vda, 254:0 or a path on it); needs root");
  cmd->add_option("--out,-o", opt->out, "trace file to write (.tlt)")->required();
  cmd->add_option("--duration", opt->duration, "stop after this long (60s, 5m); default: until SIGINT/SIGTERM");
  cmd->add_option("--sample-interval", opt->sample_interval, "how often to sample CPU and counters")
      ->capture_default_str();
  cmd->add_option("--pid", opt->pid, "postmaster pid (default: from the server's postmaster.pid)");
  cmd->add_option("--conninfo", opt->conninfo,
                  "libpq connection string for the counters and settings (default: the server's host and port, "
                  "dbname=postgres)");
  cmd->add_flag("--all-processes", opt->all_processes,
                "record the block I/O of every process on --device (default: the server's process tree, "
                "new backends included, and kernel threads such as writeback and the journal; other "
                "processes' I/Os are counted in the summary, not recorded)");
  add_progress_option(*cmd, opt->progress_s);
  cmd->add_flag("--no-file-io", opt->no_file_io,
                "do not record the server's file I/O (recorded by default where it can be: root and the "
                "kernel's syscall tracepoints; it gives project --memory its miss-ratio curve)");
  cmd->add_flag("--hostless", opt->hostless,
                "sample the server over SQL only, as one that runs elsewhere (RDS, Aurora, Cloud SQL: chosen "
                "by itself when the server's address is not this machine's): no CPU of its processes, no "
                "block or file I/O");
  cmd->callback([opt, listen, upstream, threads, io, tls_flags, iface, port, host, buffer] {
    opt->proxy_flags = listen->count() + upstream->count() + threads->count() + io->count() > 0;
    for (CLI::Option* f : *tls_flags) opt->proxy_flags |= f->count() > 0;
    opt->passive_flags = iface->count() + port->count() + host->count() + buffer->count() > 0;
    run_capture_run(*opt);
  });
}

}  // namespace tierlab::app
