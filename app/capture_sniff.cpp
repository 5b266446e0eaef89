// tierlab capture sniff: record PostgreSQL traffic passively from packets.
#include "app/command.h"
#include "app/progress.h"
#include "app/sniff_thread.h"
#include "app/stop_signals.h"
#include "capture/server.h"
#include "common/units.h"
#include "capture/sniff.h"
#include "common/error.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

namespace tierlab::app {
namespace {

struct SniffCli {
  capture::SniffOptions opts;
  std::string duration;     // "60s", "5m", "250ms", "1h", or seconds
  std::string buffer_size;  // "64M", "1G", "65536"
  std::string reassembly_buffer;  // "" = SniffOptions' default
  std::string conninfo;     // "" = --host (or 127.0.0.1) and --port, dbname=postgres
  double progress_s = -1;   // -P: see progress_period()
};

void run_sniff_cli(SniffCli& cli) {
  if (!cli.duration.empty()) cli.opts.duration_s = static_cast<double>(parse_positive_duration("--duration", cli.duration)) / 1e9;
  if (!cli.buffer_size.empty()) cli.opts.buffer_bytes = parse_size("--buffer-size", cli.buffer_size);
  if (!cli.reassembly_buffer.empty())
    cli.opts.reassembly_bytes = parse_size("--reassembly-buffer", cli.reassembly_buffer);
  if (!cli.opts.pcap_file.empty() && !cli.opts.interface.empty())
    throw InputError("capture sniff: give either --interface or --pcap, not both");
  if (!cli.opts.pcap_file.empty() && !cli.duration.empty())
    throw InputError("capture sniff: --duration applies to live capture only");

  for_settings("capture sniff", kSniffFlags, [&] { capture::check_sniff_options(cli.opts, "capture sniff"); });
  // The server's durability settings go into the trace. The connection is
  // closed before the capture starts, so it is not recorded.
  std::string no_settings;
  if (!cli.conninfo.empty()) {
    cli.opts.meta = capture::server_meta(cli.conninfo, &no_settings);
  } else if (!cli.opts.pcap_file.empty()) {
    no_settings = "reading a pcap file, no server to ask (give --conninfo)";
  } else {
    const std::string host = cli.opts.host.empty() ? std::string("127.0.0.1") : cli.opts.host;
    cli.opts.meta = capture::server_meta(capture::conninfo_for(host + ":" + std::to_string(cli.opts.port)), &no_settings);
    if (!no_settings.empty()) no_settings += " (give --conninfo)";
  }
  if (!no_settings.empty()) say_settings_skipped("capture sniff", no_settings);

  // SIGINT/SIGTERM are taken with sigtimedwait; block them before the
  // recorder's and the status line's threads start, so that they inherit
  // the mask. --duration is the recorder's own (it drains what is in
  // flight when it passes).
  StopSignals signals;
  SniffThread sniff(cli.opts, true);
  // The status line: the packets captured over the last period.
  ProgressLine progress(progress_period(cli.progress_s), [&](double secs) { return sniff.progress(secs); });
  sniff.start();
  signals.until_stop(0, [&] { return sniff.done(); }, "ended");
  progress.stop();
  sniff.stop();
  const capture::SniffSummary& sum = sniff.summary();
  bool live = !cli.opts.interface.empty();
  std::cout << "capture sniff: " << (live ? "interface " + cli.opts.interface : cli.opts.pcap_file)
            << ", port " << cli.opts.port << " -> " << cli.opts.out << "\n";
  capture::print_summary(sum, live, std::cout);
  std::cout.flush();
  if (!sum.recording_error.empty())
    throw RuntimeError("capture sniff: the trace " + cli.opts.out + " is incomplete: " + sum.recording_error);
}

}  // namespace

void setup_capture_sniff(CLI::App& parent) {
  auto& cap = group(parent, "capture");
  auto cli = std::make_shared<SniffCli>();
  auto* sub = cap.add_subcommand(
      "sniff",
      "record PostgreSQL traffic passively from network packets (live or a pcap file); "
      "nothing sits in the path of the traffic");
  auto& o = cli->opts;
  auto* iface = sub->add_option("--interface,-i", o.interface,
                                "capture live on this interface (lo, eth0, any); needs root");
  auto* pcap = sub->add_option("--pcap", o.pcap_file,
                               "read packets from this pcap or pcapng file instead");
  iface->excludes(pcap);
  sub->add_option("--port,-p", o.port, "the PostgreSQL server's TCP port")->capture_default_str();
  sub->add_option("--host", o.host, "the PostgreSQL server's IP address (default: any)");
  sub->add_option("--out,-o", o.out, "trace file to write")->required();
  sub->add_option("--duration,-T", cli->duration,
                  "stop live capture after this long (30s, 5m); default: until SIGINT/SIGTERM");
  sub->add_option("--snaplen,-s", o.snaplen, "bytes captured per packet")->capture_default_str();
  sub->add_option("--buffer-size,-B", cli->buffer_size,
                  "kernel capture buffer, 64K to 1G (default 8M; larger means fewer drops under load)");
  add_compress_level(*sub, o.compression_level);
  sub->add_option("--session-map", o.session_map,
                  "file naming user and database of sessions already open when capture starts; "
                  "lines: CLIENT USER DATABASE [APPLICATION_NAME], CLIENT = ADDR:PORT, ADDR "
                  "or :PORT");
  sub->add_option("--max-connections", o.max_connections,
                  "connections tracked at once (the least recently active is dropped beyond)")
      ->capture_default_str();
  sub->add_option("--reassembly-buffer", cli->reassembly_buffer,
                  "memory for segments held back behind a hole in their stream, 64K to 16G (default 64M; a "
                  "connection holds at most 1/64 of it, or 256K); beyond, the hole becomes a stream gap");
  sub->add_option("--conninfo", cli->conninfo,
                  "libpq connection string to read the server's durability settings (fsync, synchronous_commit, "
                  "...) into the trace (default: --host, or 127.0.0.1, and --port, dbname=postgres; "
                  "none for --pcap)");
  add_progress_option(*sub, cli->progress_s);
  sub->callback([cli] { run_sniff_cli(*cli); });
}

}  // namespace tierlab::app
