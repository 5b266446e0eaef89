// The profile's figures from samples (CPU, PostgreSQL's counters, the
// backends' wait events) and from page references (the miss-ratio curve).
#include "models/profile_internal.h"
#include "models/fmt.h"

#include "common/error.h"
#include "common/units.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace tierlab::models {

using trace::Nanos;

namespace {

constexpr double kNs = 1e9;

// Sets p.cpu_split and its parts (see Profile) from the CPU series.
void split_cpu(Profile& p, const CpuSeries& cpu_series, const MsCounts& ends) {
  auto tx_between = [&](Nanos a, Nanos b) { return ends.between(a, b); };
  // Intervals between the first counter's samples; every counter's value
  // at those times by linear interpolation between its own samples.
  if (cpu_series.empty()) return;
  const auto& grid = cpu_series.begin()->second;
  if (grid.size() < 11) return;
  auto at = [](const std::vector<std::pair<Nanos, double>>& v, Nanos t) {
    auto it = std::lower_bound(v.begin(), v.end(), t, [](const auto& e, Nanos x) { return e.first < x; });
    if (it == v.begin()) return it->second;
    if (it == v.end()) return v.back().second;
    const auto& [t1, v1] = *it;
    const auto& [t0, v0] = *(it - 1);
    return t1 > t0 ? v0 + (v1 - v0) * static_cast<double>(t - t0) / static_cast<double>(t1 - t0) : v1;
  };
  std::vector<double> xs, ys;
  for (size_t i = 1; i < grid.size(); ++i) {
    const Nanos a = grid[i - 1].first, b = grid[i].first;
    if (b <= a) continue;
    double cpu = 0;
    for (const auto& [name, v] : cpu_series) cpu += at(v, b) - at(v, a);
    const double dt = static_cast<double>(b - a) / kNs;
    xs.push_back(tx_between(a, b) / dt);
    ys.push_back(cpu / kNs / dt);
  }
  const size_t n = xs.size();
  if (n < 10) return;
  const auto [lo, hi] = std::minmax_element(xs.begin(), xs.end());
  if (!(*lo > 0) || *hi < 1.5 * *lo) return;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += xs[i], my += ys[i];
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  if (!(sxx > 0)) return;
  const double slope = sxy / sxx, fixed = my - slope * mx;
  double sse = 0;
  for (size_t i = 0; i < n; ++i) sse += std::pow(ys[i] - fixed - slope * xs[i], 2);
  const double se = std::sqrt(sse / static_cast<double>(n - 2) / sxx);
  if (!(slope > 0) || !(fixed > 0) || se > 0.1 * slope) return;
  p.cpu_split = true;
  p.cpu_fixed_cores = fixed;
  p.cpu_marginal_s_per_tx = slope;
}

}  // namespace

void ActivitySamples::add(std::string_view name, double value) {
  constexpr std::string_view kPrefix = "pg.activity.";
  if (!name.starts_with(kPrefix)) return;
  name.remove_prefix(kPrefix.size());
  if (name == "backends") {
    backends += value;
    ++rounds;
  } else {
    by_event[std::string(name)] += value;
  }
}

std::string wait_class(std::string_view type, std::string_view event) {
  if (type == "CPU") return "cpu";
  if (type == "Client") return "client";
  if (type == "IO") return event.starts_with("WAL") ? "commit" : "io";
  if (type == "LWLock") {
    if (event == "WALWrite" || event == "WALInsert" || event == "WALBufMapping") return "commit";
    if (event == "BufferIO") return "io";  // another backend's read of the same page
    return "lock";
  }
  if (type == "Lock" || type == "BufferPin") return "lock";
  return "other";
}

void profile_waits(Profile& p, const ActivitySamples& a) {
  if (a.rounds == 0) return;
  auto& w = p.waits;
  w.rounds = a.rounds;
  w.backends = a.backends;
  w.source = "pg_stat_activity, " + std::to_string(a.rounds) + " rounds, " + fmt("%.0f", a.backends) +
             " backends in a transaction";
  if (!(a.backends > 0)) return;
  // Backends in a transaction sampled at random moments: each class's share
  // of them is its share of the time a transaction is open (Little's law
  // per class), so of the mean latency.
  const double per = p.latency.mean_s / a.backends;
  for (const auto& [name, n] : a.by_event) {
    const auto dot = name.find('.');
    const std::string_view type = std::string_view(name).substr(0, dot);
    const std::string_view event = dot == std::string::npos ? std::string_view() : std::string_view(name).substr(dot + 1);
    const std::string c = wait_class(type, event);
    double& slot = c == "cpu" ? w.cpu_s : c == "client" ? w.client_s : c == "io" ? w.io_s
                 : c == "commit" ? w.commit_s : c == "lock" ? w.lock_s : w.other_s;
    slot += n * per;
  }
}

void profile_samples(Profile& p, const std::map<std::string, SampleCounter>& counters, const CpuSeries& cpu_series,
                     const MsCounts& ends) {
  // Transactions ending inside (a, b], to the millisecond.
  auto tx_between = [&](Nanos a, Nanos b) { return ends.between(a, b); };
  double cpu_ns = 0;
  Nanos c0 = std::numeric_limits<Nanos>::max(), c1 = std::numeric_limits<Nanos>::min();
  for (const auto& [name, c] : counters) {
    bool cpu = name.rfind("cpu.", 0) == 0 && name.size() > 3 &&
               name.compare(name.size() - 3, 3, "_ns") == 0;
    if (!cpu || c.last_ts <= c.first_ts) continue;
    cpu_ns += c.last - c.first;
    c0 = std::min(c0, c.first_ts);
    c1 = std::max(c1, c.last_ts);
  }
  if (c1 > c0) {
    double n = tx_between(c0, c1);
    if (n > 0) {
      p.has_cpu = true;
      p.cpu_s_per_tx = cpu_ns / kNs / n;
      p.cpu_cores_busy = cpu_ns / static_cast<double>(c1 - c0);
    }
  }
  if (!p.has_cpu)
    p.notes.push_back("no CPU samples in the trace: the server's CPU time per transaction is unknown");
  if (p.has_cpu) split_cpu(p, cpu_series, ends);
  if (auto it = counters.find("capture.cpu_ns"); it != counters.end() && it->second.last_ts > it->second.first_ts)
    p.capture_cores_busy = (it->second.last - it->second.first) / static_cast<double>(it->second.last_ts - it->second.first_ts);
  if (auto it = counters.find("clients.cpu_ns"); it != counters.end() && it->second.last_ts > it->second.first_ts) {
    double n = tx_between(it->second.first_ts, it->second.last_ts);
    if (n > 0) p.client_cpu_s_per_tx = (it->second.last - it->second.first) / kNs / n;
  }
  auto per_tx = [&](const char* name) {
    auto it = counters.find(name);
    if (it == counters.end() || it->second.last_ts <= it->second.first_ts) return -1.0;
    double n = tx_between(it->second.first_ts, it->second.last_ts);
    return n > 0 ? (it->second.last - it->second.first) / n : -1.0;
  };
  p.pg_blks_read_per_tx = per_tx("pg.blks_read");
  p.pg_blks_hit_per_tx = per_tx("pg.blks_hit");
  p.pg_wal_bytes_per_tx = per_tx("pg.wal_bytes");
}

void profile_memory(Profile& p, const std::map<std::string, std::string>& meta, const StackDistances& file_stack,
                    const StackDistances& block_stack, uint32_t page_bytes) {
  for (auto it = meta.lower_bound("setting."); it != meta.end() && it->first.rfind("setting.", 0) == 0; ++it)
    p.settings.emplace_back(it->first.substr(8), it->second);
  if (auto it = meta.find("device"); it != meta.end()) p.device = it->second;
  if (auto it = meta.find("cpu.count"); it != meta.end()) p.vcpus = std::atoi(it->second.c_str());
  if (auto it = meta.find("memory.bytes"); it != meta.end()) {
    try {
      p.memory_bytes = static_cast<double>(parse_size("meta memory.bytes", it->second));
    } catch (const InputError&) {
      p.notes.push_back("meta memory.bytes unreadable: " + it->second);
    }
  }
  if (auto it = meta.find("setting.shared_buffers"); it != meta.end()) {
    try {
      p.shared_buffers_bytes = static_cast<double>(parse_size("meta setting.shared_buffers", it->second));
    } catch (const InputError&) {
      p.notes.push_back("meta setting.shared_buffers unreadable: " + it->second);
    }
  }
  const StackDistances* sd = nullptr;
  if (file_stack.references() > 0) {
    sd = &file_stack;
    p.mrc.source = "file_io";
  } else if (block_stack.references() > 0) {
    sd = &block_stack;
    p.mrc.source = "block_io";
  }
  if (!sd) {
    p.notes.push_back("no page references (file or block reads): no miss-ratio curve");
    return;
  }
  MissRatioCurve c = sd->curve();
  p.mrc.references = c.references();
  p.mrc.distinct_pages = c.cold_misses();
  p.mrc.sample_rate = sd->rate();
  p.mrc.sampled = sd->rate() < 1.0;
  double maxp = static_cast<double>(c.max_distance_pages()) * 1.05 + 1;
  std::vector<double> sizes{0.0};
  for (int i = 0; i <= 64; ++i) sizes.push_back(std::pow(maxp, i / 64.0));
  for (int i = 1; i <= 128; ++i) sizes.push_back(maxp * i / 128.0);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end(),
                          [](double a, double b) { return std::abs(a - b) < 0.5; }),
              sizes.end());
  for (double s : sizes)
    p.mrc.points.push_back({s * page_bytes, s <= 0 ? 1.0 : c.miss_ratio(s)});
}

double MissCurve::at(double cache_bytes) const {
  if (points.empty()) return 1.0;
  if (cache_bytes <= points.front().first) return points.front().second;
  if (cache_bytes >= points.back().first) return points.back().second;
  auto it = std::lower_bound(points.begin(), points.end(), cache_bytes,
                             [](const std::pair<double, double>& p, double v) { return p.first < v; });
  auto lo = std::prev(it);
  double f = (cache_bytes - lo->first) / (it->first - lo->first);
  return lo->second + f * (it->second - lo->second);
}

}  // namespace tierlab::models
