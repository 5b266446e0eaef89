// tierlab capture proxy: record live PostgreSQL traffic through a transparent
// wire-protocol proxy.
#include "app/command.h"
#include "app/progress.h"
#include "app/proxy_tls.h"
#include "capture/proxy.h"
#include "capture/server.h"
#include "capture/wire.h"
#include "app/stop_signals.h"
#include "common/error.h"
#include "common/units.h"

#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <pthread.h>
#include <string>
#include <thread>

namespace tierlab::app {
namespace {

struct CaptureProxyOptions {
  std::string listen = "127.0.0.1:6432";
  std::string listen_unix;
  std::string upstream;
  std::string out;
  std::string duration;      // "" = until SIGINT/SIGTERM
  int threads = 0;           // 0 = half the cores, at least one
  std::string on_overflow = "block";
  std::string max_message_size = "1GiB";
  std::string decoder_memory = "1GiB";
  std::string io = "auto";
  int compression_level = capture::ProxyOptions{}.compression_level;
  std::string conninfo;      // "" = the upstream's host and port, dbname=postgres
  double progress_s = -1;    // -P: see progress_period()
  ProxyTlsFlags tls;
};

void run_capture_proxy(const CaptureProxyOptions& o) {
  capture::ProxyOptions po;
  po.listen = o.listen;
  po.listen_unix = o.listen_unix;
  po.upstream = o.upstream;
  po.out = o.out;
  po.threads = o.threads;
  po.io = io_choice(o.io, "TIERLAB_PROXY_IO");
  po.compression_level = o.compression_level;
  apply_proxy_tls_flags(o.tls, po);
  if (o.threads < 0) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 0");
  if (o.on_overflow == "drop") po.drop_on_overflow = true;
  else if (o.on_overflow != "block")
    throw InputError("--on-overflow " + o.on_overflow + ": expected block or drop");
  uint64_t max_msg = parse_size("--max-message-size", o.max_message_size);
  if (max_msg > (1ull << 30)) throw InputError("--max-message-size " + o.max_message_size + ": at most 1GiB");
  po.max_message = static_cast<uint32_t>(max_msg);
  po.decoder_memory = parse_size("--decoder-memory", o.decoder_memory);
  if (po.decoder_memory < max_msg)
    throw InputError("--decoder-memory " + o.decoder_memory + ": below --max-message-size " + o.max_message_size +
                     " (a message of that size could never be recorded)");
  int64_t duration = o.duration.empty() ? 0 : parse_positive_duration("--duration", o.duration);

  // SIGINT/SIGTERM are taken with sigtimedwait; block them before any thread
  // starts so that every thread inherits the mask.
  StopSignals signals;

  // The server's durability settings go into the trace (straight to the
  // server, not through the proxy); without them the capture goes on.
  std::string no_settings;
  po.meta = capture::server_meta(o.conninfo.empty() ? capture::conninfo_for(o.upstream) : o.conninfo, &no_settings);
  // Checks --listen and --upstream: a bad one is the only line.
  capture::Proxy proxy = for_settings(kProxyFlags, [&] { return capture::Proxy(po); });
  if (!no_settings.empty()) say_settings_skipped("capture proxy", no_settings + " (give --conninfo)");
  proxy.start();
  say_tls_fingerprint("capture proxy", proxy);
  std::fprintf(stderr, "tierlab capture proxy: listening on %s, upstream %s, recording to %s\n",
               proxy.listening().c_str(), o.upstream.c_str(), o.out.c_str());
  std::fflush(stderr);

  // The status line: what the event loops forwarded over the last period.
  capture::ProxySummary prev;
  ProgressLine progress(progress_period(o.progress_s), [&](double secs) {
    capture::ProxySummary now = proxy.progress();
    std::string line = std::to_string(now.connections) + " connections, " +
                       rate_mb(double(now.bytes_to_server - prev.bytes_to_server), secs) + " to the server, " +
                       rate_mb(double(now.bytes_to_client - prev.bytes_to_client), secs) + " to clients";
    prev = now;
    return line;
  });

  bool recording_stopped = false;
  bool decoder_full_said = false;
  capture::ProxySummary at_stop;  // the event loops' counts when recording stopped
  const char* why = signals.until_stop(
      duration,
      [&] {
        if (!recording_stopped && proxy.recording_stopped()) {
          // The trace's disk is full (or failing): clients keep being served.
          recording_stopped = true;
          at_stop = proxy.progress();
          std::fprintf(stderr,
                       "tierlab capture proxy: RECORDING STOPPED: %s: --out %s cannot take more; still forwarding, "
                       "nothing more is recorded (the trace so far is kept)\n",
                       proxy.summary().recording_error.c_str(), o.out.c_str());
          std::fflush(stderr);
        }
        if (!decoder_full_said && proxy.decoder_budget().refused.load(std::memory_order_relaxed) > 0) {
          // Sessions reassembling large messages at once hold more than
          // --decoder-memory: the next ones are forwarded, not recorded.
          decoder_full_said = true;
          std::fprintf(stderr,
                       "tierlab capture proxy: decoder memory full (--decoder-memory %s): large messages are "
                       "forwarded but not recorded while it is (stream gaps in the trace; counted in the summary)\n",
                       o.decoder_memory.c_str());
          std::fflush(stderr);
        }
        return proxy.failed();
      },
      "stopped");
  progress.stop();
  proxy.stop();
  auto s = proxy.summary();
  double secs = static_cast<double>(s.duration_ns) / 1e9;
  std::printf("capture proxy: %s after %.1f s\n", why, secs);
  std::printf("sessions: %llu (connections: %llu)\n", static_cast<unsigned long long>(s.sessions),
              static_cast<unsigned long long>(s.connections));
  if (s.connections > s.sessions)
    std::printf(
        "connections without a session: %llu (a cancel request; a client that asked for TLS (under "
        "--client-tls disable) or GSS encryption, which the proxy refuses, and would not go on in plaintext; a "
        "client whose TLS handshake failed or that left during startup)\n",
        static_cast<unsigned long long>(s.connections - s.sessions));
  std::printf("statements: %llu\n", static_cast<unsigned long long>(s.statements));
  std::printf("transactions: %llu\n", static_cast<unsigned long long>(s.transactions));
  std::printf("errors: %llu\n", static_cast<unsigned long long>(s.errors));
  std::printf("bytes client->server: %llu (%s)\n", static_cast<unsigned long long>(s.bytes_to_server),
              format_bytes(s.bytes_to_server).c_str());
  std::printf("bytes server->client: %llu (%s)\n", static_cast<unsigned long long>(s.bytes_to_client),
              format_bytes(s.bytes_to_client).c_str());
  std::printf("records: %llu\n", static_cast<unsigned long long>(s.records));
  std::printf("dropped records: %llu\n", static_cast<unsigned long long>(s.dropped));
  print_writer_waits(s.queue_waits);
  if (s.protocol_errors)
    std::printf("sessions closed on protocol errors: %llu\n", static_cast<unsigned long long>(s.protocol_errors));
  if (s.upstream_failures)
    std::printf("upstream connection failures: %llu\n", static_cast<unsigned long long>(s.upstream_failures));
  if (s.decoder_refused)
    std::printf("messages not recorded, decoder memory full (--decoder-memory %s): %llu (%s), stream gaps in the "
                "trace\n",
                o.decoder_memory.c_str(), static_cast<unsigned long long>(s.decoder_refused),
                format_bytes(s.decoder_refused_bytes).c_str());
  std::printf("trace: %s\n", o.out.c_str());
  if (!s.recording_error.empty()) {
    if (!recording_stopped) at_stop = s;  // stopped while closing: nothing forwarded after
    std::printf("recording stopped after %.1f s: %s\n", static_cast<double>(s.recording_stopped_ns) / 1e9,
                s.recording_error.c_str());
    std::printf("not recorded: %llu records (the chunk being written and every one after), %llu connections "
                "and %s forwarded after that; the trace ends there, without its end record\n",
                static_cast<unsigned long long>(s.lost_records),
                static_cast<unsigned long long>(s.connections - at_stop.connections),
                format_bytes((s.bytes_to_server + s.bytes_to_client) -
                             (at_stop.bytes_to_server + at_stop.bytes_to_client))
                    .c_str());
  }
  std::fflush(stdout);
  if (!s.recording_error.empty())
    throw RuntimeError("capture proxy: the trace " + o.out + " is incomplete: " + s.recording_error);
}

}  // namespace

void setup_capture_proxy(CLI::App& parent) {
  auto& capture = group(parent, "capture");
  auto opt = std::make_shared<CaptureProxyOptions>();
  auto* cmd = capture.add_subcommand(
      "proxy",
      "record PostgreSQL traffic through a transparent wire-protocol proxy: point clients at\n"
      "--listen, the proxy forwards every byte to --upstream and records each session");
  cmd->add_option("--listen", opt->listen, "HOST:PORT to accept clients on (port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--listen-unix", opt->listen_unix,
                  "also accept clients on DIR/.s.PGSQL.PORT (PORT of --listen)");
  cmd->add_option("--upstream", opt->upstream, "the server: HOST:PORT or SOCKET_DIR[:PORT]")->required();
  cmd->add_option("--out,-o", opt->out, "trace file to write (.tlt)")->required();
  cmd->add_option("--duration", opt->duration, "stop after this long (60s, 5m); default: until SIGINT/SIGTERM");
  cmd->add_option("--threads", opt->threads, "event-loop threads (0: half the cores, at least one)")->capture_default_str();
  cmd->add_option("--on-overflow", opt->on_overflow,
                  "when the trace writer falls behind: block (wait, lose nothing) or drop (count dropped records)")
      ->capture_default_str();
  cmd->add_option("--io", opt->io,
                  "event loop: io_uring, epoll, or auto (io_uring where the kernel has it, else epoll)")
      ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
      ->capture_default_str();
  cmd->add_option("--max-message-size", opt->max_message_size,
                  "close sessions sending a larger message (e.g. 64MB)")
      ->capture_default_str();
  cmd->add_option("--decoder-memory", opt->decoder_memory,
                  "memory the decoders of all sessions may hold together for the messages they reassemble "
                  "(beyond 64K per session and direction); a message that would take more is forwarded but "
                  "recorded as a stream gap, and counted. At least --max-message-size")
      ->capture_default_str();
  add_compress_level(*cmd, opt->compression_level);
  add_proxy_tls_flags(*cmd, opt->tls, "");
  cmd->add_option("--conninfo", opt->conninfo,
                  "libpq connection string to read the server's durability settings (fsync, synchronous_commit, "
                  "...) into the trace (default: the upstream's host and port, dbname=postgres)");
  add_progress_option(*cmd, opt->progress_s);
  cmd->callback([opt] { run_capture_proxy(*opt); });
}

}  // namespace tierlab::app
