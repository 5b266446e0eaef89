// tierlab capture run: the transaction capture (proxy), the block recorder
// and periodic samples of the server (CPU time of its process tree,
// PostgreSQL's counters) together, on one clock, into one trace.
#include "app/command.h"
#include "app/stop_signals.h"
#include "app/units.h"
#include "capture/block.h"
#include "capture/proxy.h"
#include "capture/run.h"
#include "common/error.h"
#include "trace/writer.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace tierlab::app {
namespace {

struct CaptureRunOptions {
  std::string listen = "127.0.0.1:6432";
  std::string upstream;
  std::string device;
  std::string out;
  std::string duration;
  std::string sample_interval = "1s";
  int pid = 0;
  std::string conninfo;
  int threads = 0;
};

// "host=H port=P dbname=postgres" from --upstream HOST:PORT or DIR[:PORT].
std::string conninfo_for(const std::string& upstream) {
  std::string host = upstream, port = "5432";
  auto colon = upstream.rfind(':');
  if (colon != std::string::npos) {
    host = upstream.substr(0, colon);
    port = upstream.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return "host='" + host + "' port='" + port + "' dbname=postgres connect_timeout=5 application_name=tierlab_sampler";
}

// PostgreSQL's counters over one libpq connection (not through the proxy, so
// the sampler's own queries stay out of the recorded sessions).
class PgSampler {
 public:
  explicit PgSampler(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      error_ = PQerrorMessage(conn_);
      while (!error_.empty() && (error_.back() == '\n' || error_.back() == ' ')) error_.pop_back();
      for (auto& c : error_)
        if (c == '\n') c = ' ';
    }
  }
  ~PgSampler() { PQfinish(conn_); }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // First column of the first row, or "" on failure.
  std::string value(const char* sql) {
    PGresult* r = PQexec(conn_, sql);
    std::string v;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
      v = PQgetvalue(r, 0, 0);
    PQclear(r);
    return v;
  }

  // Names and values of the counters, or false if the query failed.
  bool counters(std::vector<std::pair<const char*, double>>& out) {
    static const char* kNames[] = {"pg.blks_read", "pg.blks_hit", "pg.xact_commit", "pg.xact_rollback",
                                   "pg.buffers_checkpoint", "pg.buffers_clean", "pg.buffers_backend",
                                   "pg.wal_bytes"};
    PGresult* r = PQexec(conn_,
                         "SELECT (SELECT sum(blks_read) FROM pg_stat_database),"
                         " (SELECT sum(blks_hit) FROM pg_stat_database),"
                         " (SELECT sum(xact_commit) FROM pg_stat_database),"
                         " (SELECT sum(xact_rollback) FROM pg_stat_database),"
                         " b.buffers_checkpoint, b.buffers_clean, b.buffers_backend,"
                         " pg_current_wal_lsn() - '0/0'::pg_lsn"
                         " FROM pg_stat_bgwriter b");
    bool good = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    out.clear();
    if (good)
      for (int i = 0; i < 8; ++i)
        if (!PQgetisnull(r, 0, i)) out.push_back({kNames[i], std::strtod(PQgetvalue(r, 0, i), nullptr)});
    PQclear(r);
    return good;
  }

 private:
  PGconn* conn_;
  std::string error_;
};

void say(const std::string& line) {
  std::fprintf(stderr, "tierlab capture run: %s\n", line.c_str());
  std::fflush(stderr);
}

void run_capture_run(const CaptureRunOptions& o) {
  int64_t duration = o.duration.empty() ? 0 : parse_duration("--duration", o.duration);
  int64_t interval = parse_duration("--sample-interval", o.sample_interval);
  if (o.threads < 0) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 0");
  if (o.pid < 0) throw InputError("--pid " + std::to_string(o.pid) + ": must be a process id");
  if (!o.device.empty()) capture::resolve_block_device(o.device);  // bad name -> exit 2 now

  const std::string part_proxy = o.out + ".proxy.part", part_block = o.out + ".block.part",
                    part_samples = o.out + ".samples.part";
  std::vector<std::string> parts{part_proxy, part_samples};

  // What the server is: version, shared_buffers, postmaster pid, memory.
  PgSampler pg(o.conninfo.empty() ? conninfo_for(o.upstream) : o.conninfo);
  int32_t postmaster = o.pid;
  std::vector<std::pair<std::string, std::string>> meta;
  if (pg.ok()) {
    meta.push_back({"server_version", pg.value("SHOW server_version")});
    meta.push_back({"setting.shared_buffers", pg.value("SHOW shared_buffers")});
    std::string datadir = pg.value("SHOW data_directory");
    if (!datadir.empty()) meta.push_back({"data_directory", datadir});
    if (postmaster == 0 && !datadir.empty()) {
      try {
        postmaster = capture::postmaster_pid_from_datadir(datadir);
      } catch (const InputError& e) {
        say(std::string("CPU samples skipped: ") + e.what() + " (give --pid)");
      }
    }
  } else {
    say("PostgreSQL counters skipped: " + pg.error() + " (give --conninfo)");
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
  if (block) parts.push_back(part_block);

  StopSignals signals;

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr block_error, sample_error;
  capture::BlockCaptureStats block_stats;
  std::atomic<uint64_t> samples{0};

  // Block recorder first: the I/O of the first transactions must be seen.
  std::thread block_thread;
  std::mutex rmu;  // outlive the block thread: it signals through them at its end
  std::condition_variable rcv;
  bool ready = false;
  if (block) {
    block_thread = std::thread([&] {
      try {
        auto w = trace::open_writer(part_block);
        capture::BlockCaptureOptions bo;
        bo.device = o.device;
        block_stats = capture::capture_block(bo, *w, &stop, [&] {
          std::lock_guard<std::mutex> l(rmu);
          ready = true;
          rcv.notify_all();
        });
        w->close();
      } catch (...) {
        block_error = std::current_exception();
      }
      std::lock_guard<std::mutex> l(rmu);
      ready = true;
      rcv.notify_all();
    });
    std::unique_lock<std::mutex> l(rmu);
    rcv.wait(l, [&] { return ready; });
    if (block_error) {
      l.unlock();
      block_thread.join();
      std::rethrow_exception(block_error);
    }
  }

  // Samples: CPU of the postmaster's tree and PostgreSQL's counters.
  auto sample_writer = trace::open_writer(part_samples);
  for (const auto& [k, v] : meta) sample_writer->write(trace::monotonic_now(), 0, trace::Meta{k, v});
  std::thread sample_thread([&] {
    try {
      std::vector<std::pair<const char*, double>> c;
      bool pg_on = pg.ok();
      for (;;) {
        trace::Nanos now = trace::monotonic_now();
        if (postmaster > 0) {
          try {
            auto cpu = capture::process_tree_cpu(postmaster);
            sample_writer->write(now, 0, trace::Sample{"cpu.user_ns", static_cast<double>(cpu.user_ns)});
            sample_writer->write(now, 0, trace::Sample{"cpu.system_ns", static_cast<double>(cpu.system_ns)});
            samples += 2;
          } catch (const RuntimeError&) {
            postmaster = 0;  // the server went away; keep the rest going
          }
        }
        if (pg_on) {
          if (pg.counters(c)) {
            for (const auto& [name, v] : c) sample_writer->write(now, 0, trace::Sample{name, v});
            samples += c.size();
          } else {
            pg_on = false;
          }
        }
        std::unique_lock<std::mutex> l(mu);
        if (cv.wait_for(l, std::chrono::nanoseconds(interval), [&] { return stop.load(); })) break;
      }
      sample_writer->close();
    } catch (...) {
      sample_error = std::current_exception();
    }
  });

  capture::ProxyOptions po;
  po.listen = o.listen;
  po.upstream = o.upstream;
  po.out = part_proxy;
  po.threads = o.threads;
  std::unique_ptr<capture::Proxy> proxy;
  try {
    proxy = std::make_unique<capture::Proxy>(po);
    proxy->start();
  } catch (...) {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    sample_thread.join();
    if (block_thread.joinable()) block_thread.join();
    for (const auto& p : parts) ::unlink(p.c_str());
    throw;
  }
  say("listening on " + proxy->listening() + ", upstream " + o.upstream + ", recording to " + o.out +
      (block ? ", block I/O of " + o.device : std::string()) +
      (duration > 0 ? "" : "; Ctrl-C to stop"));

  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  const char* why = "stopped";
  for (;;) {
    int sig = signals.wait(200'000'000);
    if (sig == SIGINT || sig == SIGTERM) {
      why = sig == SIGINT ? "SIGINT" : "SIGTERM";
      break;
    }
    if (proxy->failed()) break;
    if (duration > 0) {
      timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      int64_t el = (now.tv_sec - start.tv_sec) * 1'000'000'000LL + (now.tv_nsec - start.tv_nsec);
      if (el >= duration) {
        why = "duration reached";
        break;
      }
    }
  }
  std::exception_ptr proxy_error;
  try {
    proxy->stop();
  } catch (...) {
    proxy_error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  sample_thread.join();
  if (block_thread.joinable()) block_thread.join();
  for (auto* e : {&proxy_error, &block_error, &sample_error})
    if (*e) {
      for (const auto& p : parts) ::unlink(p.c_str());
      std::rethrow_exception(*e);
    }

  uint64_t records = capture::merge_traces(parts, o.out);
  for (const auto& p : parts) ::unlink(p.c_str());
  auto s = proxy->summary();
  std::printf("capture run: %s after %.1f s\n", why, static_cast<double>(s.duration_ns) / 1e9);
  std::printf("sessions: %llu, statements: %llu, transactions: %llu, errors: %llu\n",
              static_cast<unsigned long long>(s.sessions), static_cast<unsigned long long>(s.statements),
              static_cast<unsigned long long>(s.transactions), static_cast<unsigned long long>(s.errors));
  if (block)
    std::printf("block I/O: %llu requests (%llu incomplete, %llu events lost)\n",
                static_cast<unsigned long long>(block_stats.ios),
                static_cast<unsigned long long>(block_stats.incomplete),
                static_cast<unsigned long long>(block_stats.lost));
  std::printf("samples: %llu\n", static_cast<unsigned long long>(samples.load()));
  if (s.dropped) std::printf("dropped records: %llu\n", static_cast<unsigned long long>(s.dropped));
  std::printf("trace: %s (%llu records)\n", o.out.c_str(), static_cast<unsigned long long>(records));
  std::fflush(stdout);
}

void setup_capture_run(CLI::App& parent) {
  auto& capture = group(parent, "capture", "record live traffic and block I/O into a trace");
  auto opt = std::make_shared<CaptureRunOptions>();
  auto* cmd = capture.add_subcommand(
      "run",
      "record everything a projection needs in one trace: the transactions (through the proxy:\n"
      "point clients at --listen), the block I/O of --device (needs root), and every\n"
      "--sample-interval the CPU time of the server's process tree and PostgreSQL's counters\n"
      "(pg_stat_database, pg_stat_bgwriter, WAL position). Transactions are taken through the\n"
      "proxy only (--listen/--upstream).");
  cmd->add_option("--listen", opt->listen, "HOST:PORT to accept clients on (port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--upstream", opt->upstream, "the server: HOST:PORT or SOCKET_DIR[:PORT]")->required();
  cmd->add_option("--device", opt->device,
                  "block device holding the data directory (vda, /dev/vda, 254:0 or a path on it); needs root");
  cmd->add_option("--out,-o", opt->out, "trace file to write (.tlt)")->required();
  cmd->add_option("--duration", opt->duration, "stop after this long (60s, 5m); default: until SIGINT/SIGTERM");
  cmd->add_option("--sample-interval", opt->sample_interval, "how often to sample CPU and counters")
      ->capture_default_str();
  cmd->add_option("--pid", opt->pid, "postmaster pid (default: from the server's postmaster.pid)");
  cmd->add_option("--conninfo", opt->conninfo,
                  "libpq connection string for the counters (default: host and port of --upstream, dbname=postgres)");
  cmd->add_option("--threads", opt->threads, "proxy event-loop threads (0: one per core)")->capture_default_str();
  cmd->callback([opt] { run_capture_run(*opt); });
}

const Registration reg{"capture run", 19, &setup_capture_run};

}  // namespace
}  // namespace tierlab::app
