#include "models/profile_counters.h"

#include "models/fmt.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace tierlab::models {

namespace {

constexpr double kNs = 1e9;
constexpr double kPage = 8192;

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

void accumulate(std::vector<std::pair<int64_t, double>>& s, int64_t ts, double v) {
  if (!s.empty() && s.back().first == ts)
    s.back().second += v;
  else
    s.push_back({ts, v});
}

// A cumulative counter between its first and last sample.
struct Delta {
  double d = 0;
  int64_t t0 = 0, t1 = 0;
};

class Figures {
 public:
  Figures(const CounterSeries& c, const MsCounts& ends, int64_t w0, int64_t w1, double period_s)
      : c_(c), ends_(ends), w0_(w0), w1_(w1), period_ns_(static_cast<int64_t>(period_s * kNs)) {}

  std::optional<Delta> delta(const std::string& name) const {
    auto it = c_.series.find(name);
    if (it == c_.series.end() || it->second.size() < 2) return std::nullopt;
    const auto& s = it->second;
    Delta d{s.back().second - s.front().second, s.front().first, s.back().first};
    if (d.t1 <= d.t0 || d.d < 0) return std::nullopt;
    return d;
  }
  double tx_between(int64_t a, int64_t b) const { return ends_.between(a, b); }
  // Per transaction, or nullopt (no samples, no transaction between them).
  std::optional<double> per_tx(const std::string& name) const {
    auto d = delta(name);
    if (!d) return std::nullopt;
    double n = tx_between(d->t0, d->t1);
    if (n <= 0) return std::nullopt;
    return d->d / n;
  }
  std::optional<double> per_s(const std::string& name) const {
    auto d = delta(name);
    if (!d) return std::nullopt;
    return d->d / (static_cast<double>(d->t1 - d->t0) / kNs);
  }
  // The mean of a gauge ("provider.*": each value covers [ts, ts + period))
  // over the transactions' window, weighted by overlap.
  std::optional<double> mean(const std::string& name) const {
    auto it = c_.series.find(name);
    if (it == c_.series.end()) return std::nullopt;
    double sum = 0, weight = 0;
    for (const auto& [t, v] : it->second) {
      const double o = static_cast<double>(std::min(t + period_ns_, w1_) - std::max(t, w0_));
      if (o <= 0) continue;
      sum += v * o;
      weight += o;
    }
    if (weight <= 0) return std::nullopt;
    return sum / weight;
  }
  // The rates of an op in each period or sampling interval inside the
  // window: a gauge's values, or a counter's differences over time.
  std::vector<double> rates(const std::string& name, bool gauge) const {
    std::vector<double> out;
    auto it = c_.series.find(name);
    if (it == c_.series.end()) return out;
    const auto& s = it->second;
    for (size_t i = 0; i < s.size(); ++i) {
      if (gauge) {
        if (s[i].first >= w0_ && s[i].first + period_ns_ <= w1_) out.push_back(s[i].second);
      } else if (i > 0 && s[i - 1].first >= w0_ && s[i].first <= w1_ && s[i].first > s[i - 1].first) {
        out.push_back((s[i].second - s[i - 1].second) / (static_cast<double>(s[i].first - s[i - 1].first) / kNs));
      }
    }
    return out;
  }
  bool has(const std::string& name) const { return c_.series.count(name) > 0; }

 private:
  const CounterSeries& c_;
  const MsCounts& ends_;
  int64_t w0_, w1_, period_ns_;
};

// At a steady ceiling: the middle 80% of the rates within 10% of their
// median, at least 20/s, over five periods or more.
bool steady(std::vector<double> r, double& mean) {
  if (r.size() < 5) return false;
  mean = 0;
  for (double x : r) mean += x;
  mean /= static_cast<double>(r.size());
  std::sort(r.begin(), r.end());
  const size_t k = r.size();
  const double median = r[k / 2], lo = r[k / 10], hi = r[k - 1 - k / 10];
  return median >= 20 && lo >= 0.9 * median && hi <= 1.1 * median;
}

LatencySummary latency(double mean_s, double count) {
  LatencySummary l;
  l.count = static_cast<uint64_t>(std::max(1.0, std::round(count)));
  l.mean_s = l.p50_s = l.p99_s = mean_s;
  return l;
}

}  // namespace

void MsCounts::add(int64_t ts_ns, uint32_t n) {
  const int64_t m = ms(ts_ns);
  if (bins_.empty()) {
    base_ = m;
  } else if (m < base_) {
    bins_.insert(bins_.begin(), static_cast<size_t>(base_ - m), 0);
    base_ = m;
  }
  const size_t i = static_cast<size_t>(m - base_);
  if (i >= bins_.size()) bins_.resize(i + 1, 0);
  bins_[i] += n;
  total_ += n;
}

uint64_t MsCounts::sum(int64_t from, int64_t to) const {
  if (bins_.empty()) return 0;
  const int64_t end = base_ + static_cast<int64_t>(bins_.size());
  from = std::max(from, base_);
  to = std::min(to, end);
  uint64_t n = 0;
  for (int64_t m = from; m < to; ++m) n += bins_[static_cast<size_t>(m - base_)];
  return n;
}

double MsCounts::between(int64_t a_ns, int64_t b_ns) const {
  if (b_ns <= a_ns) return 0;
  return static_cast<double>(sum(ms(a_ns) + 1, ms(b_ns) + 1));
}

double MsCounts::in(int64_t from_ns, int64_t to_ns) const {
  return static_cast<double>(sum(ms(from_ns), ms(to_ns)));
}

void CounterSeries::add(std::string_view name, int64_t ts, double value) {
  if (starts(name, "pg.io.")) {
    // pg.io.BACKEND_TYPE.OBJECT.CONTEXT.COLUMN
    std::string_view parts[4];
    std::string_view rest = name.substr(6);
    for (int i = 0; i < 3; ++i) {
      auto dot = rest.find('.');
      if (dot == std::string_view::npos) return;
      parts[i] = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
    }
    parts[3] = rest;
    const std::string key = std::string(parts[1]) + "." + std::string(parts[3]);
    accumulate(series["pg.io:" + key], ts, value);
    if (parts[0] == "checkpointer" || parts[0] == "background_writer") accumulate(series["pg.io:bg." + key], ts, value);
    return;
  }
  if (starts(name, "provider.") || name == "pg.blks_read" || starts(name, "pg.wal.") || name == "pg.wal_bytes" ||
      name == "pg.buffers_checkpoint" || name == "pg.buffers_clean")
    series[std::string(name)].push_back({ts, value});
}

void profile_from_counters(Profile& p, const CounterSeries& c, const std::map<std::string, std::string>& meta,
                           const MsCounts& ends) {
  auto src = [&](const std::string& figure, const std::string& from) { p.sources.push_back({figure, from}); };
  if (p.has_cpu)
    src("CPU per transaction", "CPU time of the server's process tree (/proc), sampled by capture run");
  if (p.has_block_io) {
    src("device reads per transaction", "block I/O of the transactions' backends");
    src("commit writes and WAL flushes", "block I/O of the transactions' backends");
    src("device latency", "block I/O, issue to completion");
  }
  double period_s = 60;
  if (auto it = meta.find("provider.period_s"); it != meta.end() && std::atof(it->second.c_str()) > 0)
    period_s = std::atof(it->second.c_str());
  const std::string provider = meta.count("provider") ? "provider (" + meta.at("provider") + ") " : "provider ";
  Figures f(c, ends, p.first_ns, p.last_ns, period_s);
  const double n_tx = static_cast<double>(p.transactions);

  // CPU: the whole instance's, from the provider, when the server's
  // processes could not be sampled.
  if (!p.has_cpu) {
    if (auto pct = f.mean("provider.cpu_percent")) {
      if (p.vcpus > 0 && p.tps > 0) {
        p.has_cpu = true;
        p.cpu_cores_busy = *pct / 100.0 * p.vcpus;
        p.cpu_s_per_tx = p.cpu_cores_busy / p.tps;
        src("CPU per transaction", provider + "CPUUtilization " + fmt("%.1f%%", *pct) + " x " +
                                       std::to_string(p.vcpus) + " vCPUs / TPS (the whole instance's CPU)");
        std::erase_if(p.notes, [](const std::string& n) { return starts(n, "no CPU samples in the trace"); });
      } else {
        p.notes.push_back("CPUUtilization without the instance's vCPU count: CPU per transaction unknown (an "
                          "import of the metrics with the instance's vCPUs gives it)");
      }
    }
  }
  if (p.has_block_io) return;

  bool any = false;
  const bool prov_reads = f.mean("provider.read_iops").has_value();
  // Device reads.
  if (auto iops = f.mean("provider.read_iops"); iops && p.tps > 0) {
    p.device_read_iops = *iops;
    p.reads_per_tx = *iops / p.tps;
    auto bps = f.mean("provider.read_bytes_per_s");
    p.read_bytes_per_tx = bps ? *bps / p.tps : p.reads_per_tx * kPage;
    src("device reads per transaction", provider + "ReadIOPS, mean over the window / TPS (the volume's reads)");
    any = true;
  } else if (auto r = f.per_tx("pg.io:relation.reads")) {
    p.reads_per_tx = *r;
    p.read_bytes_per_tx = *r * kPage;
    p.device_read_iops = f.per_s("pg.io:relation.reads").value_or(0);
    src("device reads per transaction",
        "pg_stat_io reads of relations, all backends (reads from the OS: page-cache hits included)");
    any = true;
  } else if (auto b = f.per_tx("pg.blks_read")) {
    p.reads_per_tx = *b;
    p.read_bytes_per_tx = *b * kPage;
    p.device_read_iops = f.per_s("pg.blks_read").value_or(0);
    src("device reads per transaction",
        "pg_stat_database blks_read (reads from the OS: page-cache hits included)");
    any = true;
  }
  const double reads_n = p.reads_per_tx * n_tx;
  if (auto l = f.mean("provider.read_latency_s")) {
    p.native_read = latency(*l, reads_n);
    p.latency_holds_cap_wait = true;
    src("device read latency", provider + "ReadLatency (the volume's, as the instance sees it: the wait for an "
                                          "IOPS cap included)");
  } else if (auto t = f.delta("pg.io:relation.read_time"), r = f.delta("pg.io:relation.reads");
             t && r && t->d > 0 && r->d > 0) {
    p.native_read = latency(t->d / r->d / 1e3, reads_n);
    src("device read latency", "pg_stat_io read_time / reads (track_io_timing; page-cache hits included)");
  } else if (p.reads_per_tx > 0) {
    p.notes.push_back("device read latency at capture unknown (no provider ReadLatency; pg_stat_io without "
                      "track_io_timing): storage time at capture is taken as 0, so each tier's read latency "
                      "is added to the captured latency");
  }

  // The WAL: commit writes and flushes (pg_stat_wal to 17, pg_stat_io's
  // WAL rows from 18 on).
  std::string wal_from;
  if (auto s = f.per_tx("pg.wal.wal_sync")) {
    p.flushes_per_tx = *s;
    p.sync_writes_per_tx = f.per_tx("pg.wal.wal_write").value_or(0);
    wal_from = "pg_stat_wal wal_write and wal_sync";
  } else if (auto s = f.per_tx("pg.io:wal.fsyncs")) {
    p.flushes_per_tx = *s;
    p.sync_writes_per_tx = f.per_tx("pg.io:wal.writes").value_or(0);
    wal_from = "pg_stat_io WAL writes and fsyncs";
  }
  if (!wal_from.empty()) {
    src("commit writes and WAL flushes", wal_from + " (all of the server's)");
    any = true;
    auto bytes = f.per_tx("pg.wal.wal_bytes");
    if (!bytes) bytes = f.per_tx("pg.wal_bytes");
    p.write_bytes_per_tx = p.sync_writes_per_tx > 0 ? bytes.value_or(0) : 0;
  }
  const double writes_n = p.sync_writes_per_tx * n_tx, flushes_n = p.flushes_per_tx * n_tx;
  if (auto l = f.mean("provider.write_latency_s")) {
    p.native_write = latency(*l, writes_n);
    if (p.flushes_per_tx > 0) p.native_flush = latency(*l, flushes_n);
    src("device write and flush latency", provider + "WriteLatency (a WAL flush taken as one write)");
  } else if (auto t = f.delta("pg.wal.wal_sync_time"), s = f.delta("pg.wal.wal_sync"); t && s && t->d > 0 && s->d > 0) {
    p.native_flush = latency(t->d / s->d / 1e3, flushes_n);
    if (auto wt = f.delta("pg.wal.wal_write_time"), w = f.delta("pg.wal.wal_write"); wt && w && wt->d > 0 && w->d > 0)
      p.native_write = latency(wt->d / w->d / 1e3, writes_n);
    src("device write and flush latency", "pg_stat_wal wal_write_time and wal_sync_time (track_wal_io_timing)");
  }

  // Background writes (the checkpointer's and background writer's), a
  // rate; against a provider's IOPS cap every write counts.
  const double wal_iops = (p.sync_writes_per_tx + p.flushes_per_tx) * p.tps;
  std::optional<double> bg;
  if (auto w = f.mean("provider.write_iops")) {
    p.device_write_iops = std::max(*w - p.flushes_per_tx * p.tps, 0.0);
    bg = std::max(*w - wal_iops, 0.0);
    src("background writes", provider + "WriteIOPS less the WAL's writes and flushes");
  } else if (auto w = f.per_s("pg.io:bg.relation.writes")) {
    bg = *w;
    src("background writes", "pg_stat_io writes of the checkpointer and background writer (writes to the OS)");
  } else if (auto a = f.per_s("pg.buffers_checkpoint")) {
    bg = *a + f.per_s("pg.buffers_clean").value_or(0);
    src("background writes", "pg_stat_bgwriter / pg_stat_checkpointer buffers written (writes to the OS)");
  }
  if (bg) {
    any = true;
    p.knows_server_processes = true;
    p.background_writes_per_s = p.server_writes_per_s = *bg;
    p.background_write_bytes_per_s = p.server_write_bytes_per_s = *bg * kPage;
    if (p.device_write_iops == 0) p.device_write_iops = *bg + p.sync_writes_per_tx * p.tps;
  }
  if (!any) return;
  p.io_from_counters = true;
  std::erase_if(p.notes, [](const std::string& n) { return starts(n, "no block I/O in the trace"); });
  p.notes.push_back("host-less: device figures from counters, not block I/O" +
                    std::string(prov_reads ? "" : " (reads from the OS count page-cache hits as reads: "
                                                  "an upper bound of the device's)") +
                    "; server-wide counters include traffic that did not pass the capture");

  // Cap detection: reads, or reads and writes together (a provisioned
  // volume's cap counts both), at a steady ceiling while the transactions
  // waited on them.
  if (p.cap_bound) return;
  std::vector<double> rd, total;
  if (prov_reads) {
    rd = f.rates("provider.read_iops", true);
    auto wr = f.rates("provider.write_iops", true);
    if (wr.size() == rd.size())
      for (size_t i = 0; i < rd.size(); ++i) total.push_back(rd[i] + wr[i]);
  } else {
    rd = f.rates(f.has("pg.io:relation.reads") ? "pg.io:relation.reads" : "pg.blks_read", false);
  }
  const double read_wait_s = p.reads_per_tx * p.native_read.mean_s;
  const bool waiting = p.native_read.count > 0 && read_wait_s >= 0.1 * p.latency.mean_s;
  double mean = 0;
  if (waiting && steady(rd, mean)) {
    p.cap_bound = true;
    p.cap_op = "read";
    p.cap_iops = mean;
  } else if (waiting && steady(total, mean)) {
    p.cap_bound = true;
    p.cap_op = "total";
    p.cap_iops = mean;
  }
  if (p.cap_bound)
    src("IOPS cap", std::string(prov_reads ? provider + "ReadIOPS" + (p.cap_op == "total" ? "+WriteIOPS" : "")
                                           : std::string("pg_stat_io / blks_read reads")) +
                        " steady at ~" + fmt("%.0f", p.cap_iops) + "/s while reads took " +
                        fmt("%.0f%%", 100 * read_wait_s / p.latency.mean_s) + " of the transactions' time");
}

}  // namespace tierlab::models
