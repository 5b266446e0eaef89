// How a profile is shown: the text `tierlab profile` prints and its JSON.
#include "models/fmt.h"
#include "models/profile.h"

#include "common/units.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>
#include <ostream>

namespace tierlab::models {

namespace {

std::string ms(double s) { return fmt("%.3f ms", s * 1e3); }

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

nlohmann::json lat_json(const LatencySummary& l) {
  return {{"count", l.count}, {"mean_ms", l.mean_s * 1e3}, {"p50_ms", l.p50_s * 1e3},
          {"p99_ms", l.p99_s * 1e3}};
}

}  // namespace

void print_profile(std::ostream& out, const Profile& p) {
  out << "trace: " << p.source << "\n";
  out << "window: " << fmt("%.1f s", p.duration_s) << ", " << p.sessions << " sessions ("
      << p.clients << " at most open at once, " << fmt("%.1f", p.mean_clients) << " on average)\n";
  out << "transactions: " << p.transactions << " (" << fmt("%.1f", p.tps) << " tps), "
      << p.statements << " statements, " << p.errors << " errors\n";
  out << "latency: mean " << ms(p.latency.mean_s) << ", p50 " << ms(p.latency.p50_s) << ", p99 "
      << ms(p.latency.p99_s) << "; concurrency " << fmt("%.2f", p.concurrency)
      << " in flight; think time " << ms(p.think_time_s) << ", the client's turns inside a transaction "
      << ms(p.client_in_tx_s) << "\n";
  if (p.waits.rounds > 0) {
    const auto& w = p.waits;
    std::vector<std::pair<double, const char*>> cls{{w.commit_s, "commit"}, {w.io_s, "io"},         {w.client_s, "client"},
                                                    {w.lock_s, "lock"},     {w.cpu_s, "cpu"},        {w.other_s, "other"}};
    std::stable_sort(cls.begin(), cls.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    out << "time in a transaction by wait (" << w.source << "):";
    if (!(w.backends > 0)) out << " no backend was in a transaction when sampled";
    const char* sep = " ";
    for (const auto& [s, name] : cls)
      if (w.backends > 0) {
        out << sep << name << " " << ms(s);
        sep = ", ";
      }
    out << "\n";
  }
  out << "\ntemplates (" << p.templates.size() << "):\n";
  size_t shown = 0;
  for (const auto& t : p.templates) {
    if (++shown > 10) {
      out << "  ... " << (p.templates.size() - 10) << " more\n";
      break;
    }
    out << "  " << fmt("%5.1f%%", t.share * 100) << "  " << t.count << " tx, " << t.statements
        << " stmt, mean " << ms(t.mean_latency_s) << ", concurrency " << fmt("%.2f", t.concurrency)
        << ", reads/tx " << fmt("%.2f", t.reads_per_tx) << ", writes/tx " << fmt("%.2f", t.writes_per_tx)
        << "\n      " << t.text << "\n";
  }
  out << "\nper transaction:\n";
  if (p.has_cpu)
    out << "  cpu: " << ms(p.cpu_s_per_tx) << " (server busy " << fmt("%.2f", p.cpu_cores_busy)
        << " cores" << (p.capture_cores_busy > 0 ? ", the capture " + fmt("%.2f", p.capture_cores_busy) : std::string())
        << ")\n";
  else
    out << "  cpu: not sampled\n";
  if (p.cpu_split)
    out << "  cpu over the capture's sample intervals: " << ms(p.cpu_marginal_s_per_tx) << " a transaction plus "
        << fmt("%.3f", p.cpu_fixed_cores) << " cores whatever the throughput\n";
  if (p.client_cpu_s_per_tx >= 0)
    out << "  cpu of the clients on the server's machine: " << ms(p.client_cpu_s_per_tx)
        << " (they share its cores)\n";
  if (p.has_block_io || p.io_from_counters) {
    out << "  device reads: " << fmt("%.3f", p.reads_per_tx) << " (" << format_bytes(p.read_bytes_per_tx)
        << ")\n";
    out << "  device writes by the backend: " << fmt("%.3f", p.sync_writes_per_tx) << " ("
        << format_bytes(p.write_bytes_per_tx) << "), WAL flushes " << fmt("%.3f", p.flushes_per_tx) << "\n";
  }
  if (p.pg_blks_read_per_tx >= 0)
    out << "  pg blocks read " << fmt("%.2f", p.pg_blks_read_per_tx) << ", hit "
        << fmt("%.2f", p.pg_blks_hit_per_tx) << "\n";
  if (p.pg_wal_bytes_per_tx >= 0) out << "  WAL " << format_bytes(p.pg_wal_bytes_per_tx) << "\n";
  if (p.has_block_io || p.io_from_counters) {
    out << "\ndevice" << (p.device.empty() ? "" : " " + p.device) << (p.io_from_counters ? " (from counters)" : "")
        << ": "
        << fmt("%.0f", p.device_read_iops) << " read IOPS, " << fmt("%.0f", p.device_write_iops)
        << " write IOPS; background writes " << fmt("%.1f/s", p.background_writes_per_s) << " ("
        << format_bytes(p.background_write_bytes_per_s) << "/s), other reads "
        << fmt("%.1f/s", p.other_reads_per_s) << "\n";
    if (p.knows_server_processes)
      out << "  background writes by the server's processes " << fmt("%.1f/s", p.server_writes_per_s) << " ("
          << format_bytes(p.server_write_bytes_per_s) << "/s), by the kernel "
          << fmt("%.1f/s", p.background_writes_per_s - p.server_writes_per_s) << "\n";
    auto line = [&](const char* what, const LatencySummary& l) {
      if (l.count)
        out << "  " << what << " latency: mean " << ms(l.mean_s) << ", p50 " << ms(l.p50_s)
            << ", p99 " << ms(l.p99_s) << " (" << l.count << ")\n";
    };
    line("read", p.native_read);
    line("write", p.native_write);
    line("flush", p.native_flush);
    if (p.has_queue_times) {
      out << "  queued before issue:";
      if (p.queued_read.count)
        out << " read mean " << ms(p.queued_read.mean_s) << ", p99 " << ms(p.queued_read.p99_s) << " ("
            << p.queued_read.count << ")" << (p.queued_write.count ? ";" : "");
      if (p.queued_write.count)
        out << " write mean " << ms(p.queued_write.mean_s) << ", p99 " << ms(p.queued_write.p99_s) << " ("
            << p.queued_write.count << ")";
      out << "; " << ms(p.queued_s_per_tx) << " per transaction (storage time)\n";
    }
    if (p.cap_bound)
      out << "  this capture looks cap-bound at ~" << fmt("%.0f", p.cap_iops) << " " << p.cap_op
          << (p.io_from_counters ? " IOPS: steady while the transactions waited on reads"
                                 : " IOPS: steady while its requests waited before issue")
          << " (project takes it as the capture's tier; give --captured-on or --captured-iops-cap to say "
             "otherwise)\n";
  }
  if (!p.sources.empty()) {
    out << "\nsources:\n";
    for (const auto& [figure, from] : p.sources) out << "  " << figure << ": " << from << "\n";
  }
  out << "\nmemory at capture: "
      << (p.memory_bytes > 0 ? format_bytes(p.memory_bytes) : std::string("unknown"))
      << ", shared_buffers "
      << (p.shared_buffers_bytes > 0 ? format_bytes(p.shared_buffers_bytes) : std::string("unknown"))
      << "\n";
  if (!p.mrc.empty()) {
    out << "miss-ratio curve (" << p.mrc.source << ", " << fmt("%.0f", p.mrc.references)
        << " page references, " << format_bytes(p.mrc.distinct_pages * 8192) << " touched"
        << (p.mrc.sampled ? fmt(", sampled at %.4f", p.mrc.sample_rate) : std::string()) << "):\n";
    double top = p.mrc.points.back().first;
    for (double f : {0.05, 0.1, 0.25, 0.5, 0.75, 1.0})
      out << "  cache " << format_bytes(top * f) << ": miss ratio " << fmt("%.3f", p.mrc.at(top * f))
          << "\n";
  }
  for (const auto& n : p.notes) out << "note: " << n << "\n";
}

std::string profile_json(const Profile& p, int indent) {
  nlohmann::json j;
  j["source"] = p.source;
  j["commit_durability_warning"] = commit_durability_warning(p);
  j["settings"] = nlohmann::json::object();
  for (const auto& [name, value] : p.settings) j["settings"][name] = value;
  j["duration_s"] = p.duration_s;
  j["sessions"] = p.sessions;
  j["clients"] = p.clients;
  j["mean_clients"] = p.mean_clients;
  j["transactions"] = p.transactions;
  j["statements"] = p.statements;
  j["errors"] = p.errors;
  j["tps"] = p.tps;
  j["concurrency"] = p.concurrency;
  j["latency"] = lat_json(p.latency);
  j["think_time_ms"] = p.think_time_s * 1e3;
  j["client_in_tx_ms"] = p.client_in_tx_s * 1e3;
  auto& tj = j["templates"] = nlohmann::json::array();
  for (const auto& t : p.templates)
    tj.push_back({{"id", hex(t.id)},
                  {"text", t.text},
                  {"statements", t.statements},
                  {"count", t.count},
                  {"share", t.share},
                  {"mean_latency_ms", t.mean_latency_s * 1e3},
                  {"concurrency", t.concurrency},
                  {"reads_per_tx", t.reads_per_tx},
                  {"writes_per_tx", t.writes_per_tx}});
  nlohmann::json per;
  per["cpu_ms"] = p.has_cpu ? nlohmann::json(p.cpu_s_per_tx * 1e3) : nlohmann::json();
  per["client_cpu_ms"] = p.client_cpu_s_per_tx >= 0 ? nlohmann::json(p.client_cpu_s_per_tx * 1e3) : nlohmann::json();
  per["device_reads"] = p.reads_per_tx;
  per["device_read_bytes"] = p.read_bytes_per_tx;
  per["sync_writes"] = p.sync_writes_per_tx;
  per["sync_write_bytes"] = p.write_bytes_per_tx;
  per["wal_flushes"] = p.flushes_per_tx;
  per["queued_ms"] = p.has_queue_times ? nlohmann::json(p.queued_s_per_tx * 1e3) : nlohmann::json();
  j["quiet_transactions"] = {{"count", p.quiet_transactions}, {"latency_ms", p.quiet_latency_s * 1e3}};
  j["commit_statements"] = {{"count", p.commit_statements}, {"latency_ms", p.commit_statement_s * 1e3}};
  if (p.waits.rounds > 0)
    j["waits"] = {{"source", p.waits.source},  {"rounds", p.waits.rounds},      {"backends", p.waits.backends},
                  {"io_ms", p.waits.io_s * 1e3}, {"commit_ms", p.waits.commit_s * 1e3}, {"lock_ms", p.waits.lock_s * 1e3},
                  {"client_ms", p.waits.client_s * 1e3}, {"cpu_ms", p.waits.cpu_s * 1e3}, {"other_ms", p.waits.other_s * 1e3}};
  else
    j["waits"] = nullptr;
  auto opt = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(); };
  per["pg_blks_read"] = opt(p.pg_blks_read_per_tx);
  per["pg_blks_hit"] = opt(p.pg_blks_hit_per_tx);
  per["pg_wal_bytes"] = opt(p.pg_wal_bytes_per_tx);
  j["per_transaction"] = per;
  j["cpu_cores_busy"] = p.has_cpu ? nlohmann::json(p.cpu_cores_busy) : nlohmann::json();
  j["capture_cores_busy"] = p.capture_cores_busy;
  j["cpu_split"] = p.cpu_split ? nlohmann::json{{"per_tx_ms", p.cpu_marginal_s_per_tx * 1e3},
                                                {"fixed_cores", p.cpu_fixed_cores}}
                               : nlohmann::json();
  nlohmann::json dev;
  dev["has_block_io"] = p.has_block_io;
  dev["name"] = p.device;
  dev["read_iops"] = p.device_read_iops;
  dev["write_iops"] = p.device_write_iops;
  dev["background_writes_per_s"] = p.background_writes_per_s;
  dev["background_write_bytes_per_s"] = p.background_write_bytes_per_s;
  if (p.knows_server_processes) {
    dev["server_writes_per_s"] = p.server_writes_per_s;
    dev["server_write_bytes_per_s"] = p.server_write_bytes_per_s;
  }
  dev["other_reads_per_s"] = p.other_reads_per_s;
  dev["unattributed_backend_ios"] = p.unattributed_backend_ios;
  dev["read_latency"] = lat_json(p.native_read);
  dev["write_latency"] = lat_json(p.native_write);
  dev["flush_latency"] = lat_json(p.native_flush);
  if (p.has_queue_times) {
    dev["queued_read"] = lat_json(p.queued_read);
    dev["queued_write"] = lat_json(p.queued_write);
  }
  dev["cap_bound"] = p.cap_bound;
  if (p.cap_bound) {
    dev["cap_op"] = p.cap_op;
    dev["cap_iops"] = p.cap_iops;
  }
  dev["from_counters"] = p.io_from_counters;
  dev["latency_holds_cap_wait"] = p.latency_holds_cap_wait;
  j["device"] = dev;
  auto& src = j["sources"] = nlohmann::json::array();
  for (const auto& [figure, from] : p.sources) src.push_back({{"figure", figure}, {"source", from}});
  j["vcpus"] = p.vcpus;  // the server's at capture, 0 when unknown
  j["memory_bytes"] = p.memory_bytes;
  j["shared_buffers_bytes"] = p.shared_buffers_bytes;
  nlohmann::json m;
  m["source"] = p.mrc.source;
  m["references"] = p.mrc.references;
  m["distinct_pages"] = p.mrc.distinct_pages;
  m["sampled"] = p.mrc.sampled;
  m["sample_rate"] = p.mrc.sample_rate;
  auto& pts = m["points"] = nlohmann::json::array();
  for (const auto& [b, r] : p.mrc.points) pts.push_back({b, r});
  j["mrc"] = m;
  j["notes"] = p.notes;
  return j.dump(indent);
}

}  // namespace tierlab::models
