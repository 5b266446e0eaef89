// Windows of a capture: each profiled and projected on its own, so that a
// projection carries the spread of what the capture's parts give, and a
// capture too short or unsteady to project from is called so.
#include "models/profile.h"
#include "models/fmt.h"
#include "models/project.h"

#include "common/error.h"
#include "trace/reader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>

#include <nlohmann/json.hpp>

namespace tierlab::models {

namespace {

// A spread's bounds as printed: TPS to a tenth, the rest to a thousandth.
std::string bounds(const Spread& sp) {
  const char* f = sp.input == "TPS" ? "%.1f" : "%.3f";
  return fmt(f, sp.lo) + "\u2013" + fmt(f, sp.hi) + sp.unit;
}

}  // namespace

int windows_for(const Profile& whole, int want) {
  int n = want;
  n = std::min<int64_t>(n, static_cast<int64_t>(whole.transactions / kMinWindowTransactions));
  n = std::min<int64_t>(n, static_cast<int64_t>(std::floor(whole.duration_s / kMinWindowSeconds)));
  return n >= 2 ? n : 0;
}

std::vector<Profile> profile_windows(const std::string& path, const Profile& whole, int n, ProfileOptions opts) {
  std::vector<Profile> out;
  if (n < 2) return out;
  const double span = static_cast<double>(whole.last_ns - whole.first_ns);
  std::vector<std::unique_ptr<ProfileBuilder>> builders;
  for (int i = 0; i < n; ++i) {
    ProfileOptions w = opts;
    w.from_ns = whole.first_ns + static_cast<int64_t>(span * i / n);
    // The last window takes the last transaction's end too.
    w.to_ns = i + 1 == n ? whole.last_ns + 1 : whole.first_ns + static_cast<int64_t>(span * (i + 1) / n);
    builders.push_back(std::make_unique<ProfileBuilder>(w));
  }
  auto reader = trace::open_reader(path);
  trace::Record r;
  while (reader->next(r))
    for (auto& b : builders) b->add(r);
  for (int i = 0; i < n; ++i) {
    try {
      out.push_back(builders[static_cast<size_t>(i)]->finish(path + " window " + std::to_string(i + 1) + "/" +
                                                             std::to_string(n)));
    } catch (const InputError&) {
      // No completed transaction in this window: it has nothing to say.
    }
  }
  return out;
}

bool Steadiness::unsteady() const {
  return std::any_of(spreads.begin(), spreads.end(), [](const Spread& s) { return s.unsteady; });
}

std::vector<std::string> Steadiness::warnings(const Profile& whole) const {
  std::vector<std::string> w;
  if (too_short)
    w.push_back("capture too short to project from: " + fmt("%.1f s", whole.duration_s) + ", " +
                std::to_string(whole.transactions) + " transactions; an interval needs " +
                std::to_string(kDefaultWindows) + " windows of at least " + std::to_string(kMinWindowTransactions) +
                " transactions and " + fmt("%.0f s", kMinWindowSeconds) + " each");
  for (const auto& s : spreads)
    if (s.unsteady)
      w.push_back("unsteady capture: " + s.input + " " + bounds(s) +
                  " over " + std::to_string(windows) + " windows (more than " + fmt("%.1f", kUnsteadyFactor) +
                  "x apart): a projection from it depends on the part of it taken");
  return w;
}

Steadiness steadiness(const Profile& whole, const std::vector<Profile>& windows) {
  Steadiness s;
  s.windows = static_cast<int>(windows.size());
  s.window_s = windows.empty() ? 0 : whole.duration_s / static_cast<double>(windows.size());
  s.too_short = windows_for(whole) < kDefaultWindows;
  if (windows.size() < 2) return s;
  auto spread = [&](const char* input, const char* unit, double scale, auto value) {
    Spread sp{input, std::numeric_limits<double>::infinity(), 0, unit, false};
    for (const auto& w : windows) {
      double v = value(w) * scale;
      sp.lo = std::min(sp.lo, v);
      sp.hi = std::max(sp.hi, v);
    }
    sp.unsteady = sp.hi > kUnsteadyFactor * sp.lo;
    s.spreads.push_back(sp);
  };
  spread("TPS", "", 1, [](const Profile& w) { return w.tps; });
  // The device's flush time sets a commit's: compared when every window has
  // flushes.
  if (std::all_of(windows.begin(), windows.end(), [](const Profile& w) { return w.native_flush.count > 0; }))
    spread("WAL flush latency", " ms", 1e3, [](const Profile& w) { return w.native_flush.mean_s; });
  // Reads per transaction, once there are enough of them to compare (below
  // 0.05 a window's few reads are noise): from block I/O, or from a
  // host-less capture's counters when every window has its own.
  double max_reads = 0;
  for (const auto& w : windows) max_reads = std::max(max_reads, w.reads_per_tx);
  const bool reads_known =
      whole.has_block_io ||
      (whole.io_from_counters &&
       std::all_of(windows.begin(), windows.end(), [](const Profile& w) { return w.io_from_counters; }));
  if (reads_known && max_reads >= 0.05)
    spread("device reads per transaction", "", 1, [](const Profile& w) { return w.reads_per_tx; });
  return s;
}

void print_steadiness(std::ostream& out, const Profile& whole, const Steadiness& s) {
  if (s.windows >= 2) {
    out << "\nsteadiness over " << s.windows << " windows of " << fmt("%.1f s", s.window_s) << ":";
    const char* sep = " ";
    for (const auto& sp : s.spreads) {
      out << sep << sp.input << " " << bounds(sp)
          << (sp.unsteady ? " (unsteady)" : "");
      sep = ", ";
    }
    out << "\n";
  }
  for (const auto& w : s.warnings(whole)) out << "warning: " << w << "\n";
}

std::string profile_json(const Profile& p, const Steadiness& s, int indent) {
  nlohmann::json j = nlohmann::json::parse(profile_json(p, -1));
  nlohmann::json spreads = nlohmann::json::array();
  for (const auto& sp : s.spreads)
    spreads.push_back({{"input", sp.input}, {"lo", sp.lo}, {"hi", sp.hi}, {"unsteady", sp.unsteady}});
  j["steadiness"] = {{"windows", s.windows},     {"window_s", s.window_s},      {"too_short", s.too_short},
                     {"unsteady", s.unsteady()}, {"spreads", spreads},          {"warnings", s.warnings(p)}};
  return j.dump(indent);
}

void add_windows(Projection& p, const std::vector<Profile>& windows, const std::vector<Tier>& tiers,
                 const ProjectOptions& o) {
  if (windows.size() < 2) return;
  ProjectOptions wo = o;
  // Every window at the whole capture's client range and vCPUs.
  wo.clients_lo = p.clients_lo;
  wo.clients_hi = p.clients_hi;
  wo.vcpus = p.vcpus;
  wo.capture_memory_bytes = p.capture_memory_bytes;
  wo.capture_at_cap = p.capture_capped ? 1 : 0;
  std::vector<Projection> each;
  try {
    for (const auto& w : windows) each.push_back(project(w, tiers, wo));
  } catch (const InputError& e) {
    // A window the whole's options do not fit (e.g. --memory with no page
    // references in it): no interval rather than no projection.
    p.notes.push_back(std::string("no interval over the capture's windows: ") + e.what());
    return;
  }
  p.windows = static_cast<int>(windows.size());
  double total = 0;
  for (const auto& w : windows) total += w.duration_s;
  p.window_s = total / static_cast<double>(windows.size());
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    auto& t = p.tiers[i];
    t.tps_range = {std::numeric_limits<double>::infinity(), 0};
    t.ratio_range = t.tps_range;
    t.latency_range = t.tps_range;
    for (const auto& e : each) {
      const auto& w = e.tiers[i];
      auto widen = [](Range& r, double v) {
        r.lo = std::min(r.lo, v);
        r.hi = std::max(r.hi, v);
      };
      widen(t.tps_range, w.tps);
      widen(t.ratio_range, w.ratio);
      widen(t.latency_range, w.latency_s);
    }
  }
}

}  // namespace tierlab::models
