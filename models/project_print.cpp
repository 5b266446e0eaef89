// The projection as the reports give it: the text table and the JSON.
#include "models/project.h"
#include "models/fmt.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <utility>

namespace tierlab::models {

std::string capture_tier_line(const Projection& p) {
  std::string s = "capture's own tier: ";
  if (p.capture_tier_source == "assumed uncapped")
    s += "assumed uncapped (no --captured-on or --captured-iops-cap, no cap detected)";
  else
    s += p.capture_tier + " (" + p.capture_tier_source + ")";
  const std::string q = fmt("%.3f ms", p.queued_s_per_tx * 1e3);
  if (p.capture_capped)
    s += ", at its cap: the " + q + " per transaction queued before issue is the wait for it, "
         "replaced on each tier by that tier's own caps";
  else if (p.queued_s_per_tx > 0)
    s += "; queued before issue " + q + " per transaction, kept on every tier";
  return s;
}

namespace {
std::string duration_text(double s) {
  if (!std::isfinite(s)) return "ever";
  if (s < 120) return fmt("%.0f s", s);
  if (s < 2 * 3600) return fmt("%.0f min", s / 60);
  return fmt("%.1f h", s / 3600);
}
}  // namespace

std::string busiest_text(const TierProjection& t) {
  if (t.busiest.empty()) return "-";  // nothing has demand: no utilisation to give
  return t.busiest + fmt(" %.0f%%", t.busiest_utilisation * 100);
}

std::string bottleneck_text(const TierProjection& t) {
  if (t.bottleneck.empty()) return "none";
  return t.bottleneck + fmt(" %.0f%%", t.bottleneck_utilisation * 100);
}

std::string time_split_text(const TierProjection& t, bool cpu_modelled) {
  const double total = t.split.cpu_s + t.split.storage_s + t.split.other_s;
  if (total <= 0) return "-";
  std::vector<std::pair<double, const char*>> parts = {{t.split.storage_s, "storage wait"},
                                                       {t.split.other_s, "other"}};
  if (cpu_modelled) parts.insert(parts.begin() + 1, {t.split.cpu_s, "cpu"});
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (const auto& [v, name] : parts) {
    if (!s.empty()) s += ", ";
    s += std::string(name) + fmt(" %.0f%%", 100 * v / total);
  }
  return s;
}

void print_projection(std::ostream& out, const Projection& p) {
  out << "trace: " << p.source << "\n";
  if (!p.same_on_every_tier.empty()) out << p.same_on_every_tier << "\n";
  out << "per transaction: cpu " << (p.cpu_modelled ? fmt("%.3f ms", p.cpu_s_per_tx * 1e3) : "not sampled (in other)");
  if (p.client_cpu_s_per_tx > 0)
    out << " (" << fmt("%.3f ms", p.client_cpu_s_per_tx * 1e3) << " of it the clients on the server's machine, "
        << fmt("%.3f ms", p.client_cpu_in_tx_s_per_tx * 1e3) << " of that inside transactions)";
  out << ", device reads " << fmt("%.3f", p.reads_per_tx);
  if (p.read_factor != 1.0) out << " (x" << fmt("%.3f", p.read_factor) << " for memory)";
  out << ", commit writes " << fmt("%.3f", p.sync_writes_per_tx) << ", WAL flushes "
      << fmt("%.3f", p.flushes_per_tx) << "; think " << fmt("%.3f ms", p.think_time_s * 1e3)
      << ", other " << fmt("%.3f ms", p.other_s * 1e3)
      << (p.other_source == "residual" ? "" : " (" + p.other_source + ")") << "\n";
  out << "model at capture: " << fmt("%.1f", p.modelled_capture_tps) << " tps (measured "
      << fmt("%.1f", p.captured_tps) << ")\n";
  out << capture_tier_line(p) << "\n";
  if (p.group_commit)
    out << "group commit: " << fmt("%.0f%%", p.committing_share * 100) << " of transactions commit with a flush, "
        << fmt("%.2f", p.flushes_per_tx > 0 ? p.committing_share / p.flushes_per_tx : 0)
        << " per flush at capture, a flush cycle of " << fmt("%.3f ms", p.cycle_s * 1e3)
        << " (device " << fmt("%.3f ms", p.cycle_device_s * 1e3) << "), "
        << fmt("%.2f", p.flushes_per_cycle) << " flushes per cycle\n";
  out << "clients " << p.clients_hi << ", vcpus " << p.vcpus;
  if (p.capture_vcpus != p.vcpus && p.capture_cores > 0)
    out << " (" << p.capture_vcpus << " at capture, of which the capture took " << fmt("%.2f", p.capture_cores)
        << ": projected without it)";
  else if (p.capture_vcpus != p.vcpus)
    out << " (" << p.capture_vcpus << " at capture)";
  else if (p.capture_cores > 0)
    out << " (the capture took " << fmt("%.2f", p.capture_cores) << " of them: projected without it)";
  if (p.memory_bytes > 0) out << ", memory " << fmt("%.0f MiB", p.memory_bytes / 1048576.0);
  out << "\n\n";
  char line[512];
  if (p.windows > 0)
    out << "in brackets: lowest\u2013highest of the capture's " << p.windows << " windows of "
        << fmt("%.1f s", p.window_s) << " each, projected alone\n";
  // With windows, tps, ratio and mean latency carry their ranges.
  const bool w = p.windows > 0;
  std::snprintf(line, sizeof line, "%-22s %*s %*s %*s %11s %9s %9s %9s  %-22s %s\n", "tier", w ? 24 : 10, "tps",
                w ? 20 : 8, "ratio", w ? 25 : 11, "lat avg ms", "lat p99 ms", "read/s", "write/s", "flush/tx",
                "busiest", "bottleneck");
  out << line;
  for (const auto& t : p.tiers) {
    std::string tps = fmt("%.1f", t.tps), ratio = fmt("%.2fx", t.ratio), lat = fmt("%.3f", t.latency_s * 1e3);
    if (w) {
      tps += " (" + fmt("%.1f", t.tps_range.lo) + "\u2013" + fmt("%.1f", t.tps_range.hi) + ")";
      ratio += " (" + fmt("%.2f", t.ratio_range.lo) + "\u2013" + fmt("%.2f", t.ratio_range.hi) + ")";
      lat += " (" + fmt("%.3f", t.latency_range.lo * 1e3) + "\u2013" + fmt("%.3f", t.latency_range.hi * 1e3) + ")";
    }
    // The en dash is 3 bytes and one column.
    auto pad = [&](const std::string& v, int width) {
      int cols = static_cast<int>(v.size()) - (w ? 2 : 0);
      return std::string(static_cast<size_t>(std::max(0, width - cols)), ' ') + v;
    };
    std::snprintf(line, sizeof line, "%-22s %s %s %s %11.3f %9.0f %9.0f %9.3f  %-22s %s\n", t.tier.c_str(),
                  pad(tps, w ? 24 : 10).c_str(), pad(ratio, w ? 20 : 8).c_str(), pad(lat, w ? 25 : 11).c_str(),
                  t.p99_s * 1e3, t.read_iops, t.write_iops, t.flushes_per_tx, busiest_text(t).c_str(),
                  bottleneck_text(t).c_str());
    out << line;
  }
  for (const auto& t : p.tiers) {
    if (t.burst_iops <= 0) continue;
    out << t.tier << ": burst " << fmt("%.0f", t.burst_iops) << " IOPS ";
    if (t.after_burst.empty()) {
      out << "throughout: at the projected " << fmt("%.0f", t.read_iops + t.write_iops)
          << " IOPS the credits never run out (" << fmt("%.0f", t.baseline_iops) << " IOPS baseline)\n";
      continue;
    }
    const auto& a = t.after_burst.front();
    out << "for " << duration_text(t.burst_lasts_s) << " at the projected rate ("
        << fmt("%.0f", t.read_iops + t.write_iops) << " IOPS on " << fmt("%.3g", t.burst_credits)
        << " credits), then " << fmt("%.0f", t.baseline_iops) << " IOPS baseline: " << fmt("%.1f", a.tps)
        << " tps (" << fmt("%.2fx", a.ratio) << "), latency " << fmt("%.3f ms", a.latency_s * 1e3)
        << ", bottleneck " << bottleneck_text(a) << "\n";
  }
  out << "\nwhere a transaction's time goes at " << p.clients_hi << " clients (bottleneck: a resource "
      << fmt("%.0f%%", kSaturated * 100) << " busy or more, or a cap's bound reached):\n";
  for (const auto& t : p.tiers) {
    std::snprintf(line, sizeof line, "%-22s ", t.tier.c_str());
    out << line << time_split_text(t, p.cpu_modelled) << "\n";
  }
  if (p.clients_lo < p.clients_hi) {
    out << "\ntps by clients:\n";
    std::snprintf(line, sizeof line, "%8s", "clients");
    out << line;
    for (const auto& t : p.tiers) {
      std::snprintf(line, sizeof line, " %14.14s", t.tier.c_str());
      out << line;
    }
    out << "\n";
    int span = p.clients_hi - p.clients_lo;
    int step = std::max(1, span / 10);
    for (int n = p.clients_lo; n <= p.clients_hi; n += step) {
      std::snprintf(line, sizeof line, "%8d", n);
      out << line;
      for (const auto& t : p.tiers) {
        std::snprintf(line, sizeof line, " %14.1f", t.curve[static_cast<size_t>(n - 1)].tps);
        out << line;
      }
      out << "\n";
      if (n != p.clients_hi && n + step > p.clients_hi) n = p.clients_hi - step;
    }
  }
  for (const auto& n : p.notes) out << "note: " << n << "\n";
}

namespace {
// Shares of the mean response time, as time_split_text gives them.
nlohmann::json time_share(const TierProjection& t, bool cpu_modelled) {
  const double total = t.split.cpu_s + t.split.storage_s + t.split.other_s;
  auto share = [&](double v) { return total > 0 ? nlohmann::json(v / total) : nlohmann::json(); };
  return {{"cpu", cpu_modelled ? share(t.split.cpu_s) : nlohmann::json()},
          {"storage", share(t.split.storage_s)},
          {"other", share(t.split.other_s)}};
}
}  // namespace

std::string projection_json(const Projection& p, int indent) {
  nlohmann::json j;
  j["source"] = p.source;
  j["windows"] = {{"count", p.windows}, {"seconds", p.window_s}};
  j["same_on_every_tier"] = p.same_on_every_tier.empty() ? nlohmann::json() : nlohmann::json(p.same_on_every_tier);
  j["commit_durability_warning"] = p.durability_warning;
  j["clients"] = {p.clients_lo, p.clients_hi};
  j["vcpus"] = p.vcpus;
  j["capture_vcpus"] = p.capture_vcpus;
  j["capture_cores"] = p.capture_cores;
  j["cpu_fixed_cores"] = p.cpu_fixed_cores;
  j["memory_bytes"] = p.memory_bytes;
  j["capture_memory_bytes"] = p.capture_memory_bytes;
  j["read_factor"] = p.read_factor;
  // No CPU samples: the CPU's time is in "other" and its figures are null.
  const nlohmann::json no_cpu;
  j["per_transaction"] = {{"cpu_ms", p.cpu_modelled ? nlohmann::json(p.cpu_s_per_tx * 1e3) : no_cpu},
                          {"client_cpu_ms", p.client_cpu_s_per_tx * 1e3},
                          {"client_cpu_in_tx_ms", p.client_cpu_in_tx_s_per_tx * 1e3},
                          {"device_reads", p.reads_per_tx},
                          {"sync_writes", p.sync_writes_per_tx},
                          {"wal_flushes", p.flushes_per_tx},
                          {"think_ms", p.think_time_s * 1e3},
                          {"other_ms", p.other_s * 1e3},
                          {"other_source", p.other_source},
                          {"commit_wait_cycles", p.commit_wait_cycles}};
  j["capture"] = {{"measured_tps", p.captured_tps}, {"modelled_tps", p.modelled_capture_tps}};
  j["capture_tier"] = {{"source", p.capture_tier_source},
                       {"name", p.capture_tier},
                       {"capped", p.capture_capped},
                       {"queued_ms_per_tx", p.queued_s_per_tx * 1e3}};
  if (p.group_commit)
    j["group_commit"] = {{"committing_share", p.committing_share},
                         {"cycle_ms", p.cycle_s * 1e3},
                         {"cycle_device_ms", p.cycle_device_s * 1e3},
                         {"flushes_per_cycle", p.flushes_per_cycle}};
  auto& tj = j["tiers"] = nlohmann::json::array();
  for (const auto& t : p.tiers) {
    nlohmann::json c = nlohmann::json::array();
    for (const auto& q : t.curve)
      if (q.clients >= p.clients_lo) c.push_back({{"clients", q.clients}, {"tps", q.tps}, {"latency_ms", q.latency_s * 1e3}});
    tj.push_back({{"tier", t.tier},
                  {"description", t.description},
                  {"capture_tier_source", t.capture_tier_source},
                  {"clients", t.clients},
                  {"tps", t.tps},
                  {"ratio", t.ratio},
                  {"latency_avg_ms", t.latency_s * 1e3},
                  {"latency_p99_ms", t.p99_s * 1e3},
                  {"read_iops", t.read_iops},
                  {"write_iops", t.write_iops},
                  {"bytes_per_s", t.bytes_per_s},
                  {"wal_flushes_per_tx", t.flushes_per_tx},
                  {"busiest", t.busiest.empty() ? nlohmann::json() : nlohmann::json(t.busiest)},
                  {"busiest_utilisation", t.busiest_utilisation},
                  {"bottleneck", t.bottleneck.empty() ? nlohmann::json() : nlohmann::json(t.bottleneck)},
                  {"bottleneck_utilisation", t.bottleneck.empty() ? nlohmann::json() : nlohmann::json(t.bottleneck_utilisation)},
                  {"time_share", time_share(t, p.cpu_modelled)},
                  {"time_ms", {{"cpu", p.cpu_modelled ? nlohmann::json(t.split.cpu_s * 1e3) : no_cpu},
                               {"storage", t.split.storage_s * 1e3},
                               {"other", t.split.other_s * 1e3}, {"think", t.split.think_s * 1e3}}},
                  {"curve", c}});
    if (p.windows > 0)
      tj.back()["windows"] = {{"tps", {t.tps_range.lo, t.tps_range.hi}},
                              {"ratio", {t.ratio_range.lo, t.ratio_range.hi}},
                              {"latency_avg_ms", {t.latency_range.lo * 1e3, t.latency_range.hi * 1e3}}};
    if (t.burst_iops > 0) {
      nlohmann::json b = {{"burst_iops", t.burst_iops},
                          {"baseline_iops", t.baseline_iops},
                          {"credits", t.burst_credits},
                          {"lasts_s", std::isfinite(t.burst_lasts_s) ? nlohmann::json(t.burst_lasts_s) : nlohmann::json()}};
      if (!t.after_burst.empty()) {
        const auto& a = t.after_burst.front();
        b["after_burst"] = {{"tps", a.tps},
                            {"ratio", a.ratio},
                            {"latency_avg_ms", a.latency_s * 1e3},
                            {"latency_p99_ms", a.p99_s * 1e3},
                            {"read_iops", a.read_iops},
                            {"write_iops", a.write_iops},
                            {"bottleneck", a.bottleneck.empty() ? nlohmann::json() : nlohmann::json(a.bottleneck)}};
      }
      tj.back()["burst"] = b;
    }
  }
  j["data_growth"] = p.data_growth;
  if (!p.loads.empty() || !p.load_by.empty()) {
    j["load_by"] = p.load_by;
    j["slo_p99_ms"] = p.slo_p99_s > 0 ? nlohmann::json(p.slo_p99_s * 1e3) : nlohmann::json();
    auto& lj = j["loads"] = nlohmann::json::array();
    for (const auto& lp : p.loads) {
      nlohmann::json ts = nlohmann::json::array();
      for (size_t i = 0; i < lp.tiers.size() && i < p.tiers.size(); ++i) {
        const auto& t = lp.tiers[i];
        ts.push_back({{"tier", p.tiers[i].tier},
                      {"tps", t.tps},
                      {"latency_avg_ms", t.latency_s * 1e3},
                      {"latency_p99_ms", t.p99_s * 1e3},
                      {"read_iops", t.read_iops},
                      {"write_iops", t.write_iops},
                      {"bottleneck", t.bottleneck.empty() ? nlohmann::json() : nlohmann::json(t.bottleneck)}});
      }
      lj.push_back({{"load", lp.load}, {"clients", lp.clients}, {"think_ms", lp.think_s * 1e3}, {"tiers", ts}});
    }
    for (size_t i = 0; i < p.tiers.size(); ++i) {
      const auto& t = p.tiers[i];
      if (t.headroom == 0) continue;
      const bool finite = std::isfinite(t.headroom);
      j["tiers"][i]["headroom"] = {
          {"load", finite ? nlohmann::json(t.headroom) : nlohmann::json()},
          {"by", t.headroom_by},
          {"tps", finite ? nlohmann::json(t.headroom_tps) : nlohmann::json()},
          {"iops", finite ? nlohmann::json(t.headroom_iops) : nlohmann::json()},
          {"latency_p99_ms", finite ? nlohmann::json(t.headroom_p99_s * 1e3) : nlohmann::json()}};
    }
  }
  j["notes"] = p.notes;
  return j.dump(indent);
}

}  // namespace tierlab::models
