// Synthetic pgbench profiles (see synth.h for the model).
#include "models/synth.h"
#include "models/fmt.h"

#include "common/error.h"
#include "models/project.h"
#include "tiers/tiers.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace tierlab::models {

namespace {

constexpr double kCheckpointS = 300;
constexpr double kWalRecordBytes = 600;

}  // namespace

double PgbenchGeometry::bytes() const {
  double pages = heap_pages;
  for (double l : index_levels) pages += l;
  return pages * kPageBytes;
}

PgbenchGeometry pgbench_geometry(double scale) {
  if (!(scale > 0) || scale > 1e7) throw InputError("scale " + fmt("%g", scale) + ": expected 1e-5 to 1e7");
  PgbenchGeometry g;
  g.rows = std::max(1.0, std::round(scale * kRowsPerScale));
  g.heap_pages = std::ceil(g.rows / kHeapRowsPerPage);
  double level = std::ceil(g.rows / kLeafEntriesPerPage);
  std::vector<double> up{level};
  while (level > 1) {
    level = std::ceil(level / kInnerEntriesPerPage);
    up.push_back(level);
  }
  g.index_levels.assign(up.rbegin(), up.rend());
  return g;
}

double uniform_miss_ratio(double pages, double cache_pages) {
  if (pages <= 0 || cache_pages >= pages) return 0;
  return 1 - std::max(0.0, cache_pages) / pages;
}

CacheSizes cache_sizes(double memory_bytes, double shared_buffers_bytes, int clients) {
  if (!(shared_buffers_bytes > 0) || !(shared_buffers_bytes < memory_bytes))
    throw InputError("shared_buffers " + fmt("%.0f", shared_buffers_bytes) + " bytes: expected above 0 and below " +
                     "the memory, " + fmt("%.0f", memory_bytes) + " bytes");
  CacheSizes c;
  c.shared_buffers_pages = shared_buffers_bytes / kPageBytes;
  c.os_pages = std::max(0.0, memory_bytes - shared_buffers_bytes - kNotCacheBytes -
                                 kNotCacheBytesPerClient * std::max(0, clients)) /
               kPageBytes;
  return c;
}

namespace {

// The t at which increasing f reaches `target` (f(0) <= target).
template <class F>
double solve_increasing(F f, double target) {
  double lo = 0, hi = 1;
  while (f(hi) < target) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    double mid = (lo + hi) / 2;
    (f(mid) < target ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace

std::vector<double> lru_hit_ratios(const std::vector<PageClass>& classes, double cache_pages) {
  double total = 0;
  for (const auto& c : classes)
    if (c.refs_per_tx > 0) total += c.pages;
  std::vector<double> hit(classes.size(), 1.0);
  if (total <= cache_pages) return hit;
  // Occupancy at characteristic time T (in transactions); increasing in T.
  auto occupancy = [&](double t) {
    double s = 0;
    for (const auto& c : classes)
      if (c.refs_per_tx > 0) s += c.pages * -std::expm1(-c.refs_per_tx / c.pages * t);
    return s;
  };
  const double t = solve_increasing(occupancy, cache_pages);
  for (size_t i = 0; i < classes.size(); ++i)
    hit[i] = classes[i].refs_per_tx > 0 ? -std::expm1(-classes[i].refs_per_tx / classes[i].pages * t) : 1.0;
  return hit;
}

TwoLevelHits two_level_hit_ratios(const std::vector<PageClass>& classes, const CacheSizes& cache) {
  TwoLevelHits h;
  h.shared_buffers = lru_hit_ratios(classes, cache.shared_buffers_pages);
  h.either = h.shared_buffers;
  double total = 0;
  for (const auto& c : classes)
    if (c.refs_per_tx > 0) total += c.pages;
  if (total <= cache.shared_buffers_pages) return h;
  // shared_buffers' characteristic time T1, back from a class's hit ratio
  // (1 - exp(-r T1)); all classes give the same T1.
  double t1 = 0;
  for (size_t i = 0; i < classes.size(); ++i)
    if (classes[i].refs_per_tx > 0 && h.shared_buffers[i] < 1) {
      t1 = -std::log1p(-h.shared_buffers[i]) * classes[i].pages / classes[i].refs_per_tx;
      break;
    }
  // Per class: how long before its last reference a page was last read
  // from the OS, on average (the file comment's c).
  std::vector<double> lag(classes.size(), 0);
  for (size_t i = 0; i < classes.size(); ++i) {
    const auto& c = classes[i];
    if (c.refs_per_tx <= 0) continue;
    const double r = c.refs_per_tx / c.pages, x = r * t1;
    // (1 - q) / (q r) - T1 = (e^x - 1) / r - T1, for x of any size.
    lag[i] = x > 700 ? HUGE_VAL : std::expm1(x) / r - t1;
  }
  auto occupancy = [&](double t) {
    double s = 0;
    for (size_t i = 0; i < classes.size(); ++i) {
      const auto& c = classes[i];
      if (c.refs_per_tx > 0 && t > lag[i]) s += c.pages * -std::expm1(-c.refs_per_tx / c.pages * (t - lag[i]));
    }
    return s;
  };
  if (cache.os_pages <= 0) return h;
  if (total <= cache.os_pages) {
    std::fill(h.either.begin(), h.either.end(), 1.0);
    return h;
  }
  const double t2 = solve_increasing(occupancy, cache.os_pages);
  for (size_t i = 0; i < classes.size(); ++i) {
    const auto& c = classes[i];
    if (c.refs_per_tx <= 0) continue;
    const double t = std::max(t1, t2 - lag[i]);
    h.either[i] = -std::expm1(-c.refs_per_tx / c.pages * t);
  }
  return h;
}

SynthCalibration default_calibration(PgbenchMode mode) {
  SynthCalibration c;
  c.source = "defaults";
  const bool tpcb = mode == PgbenchMode::TpcbLike;
  c.cpu_s_per_tx = tpcb ? 800e-6 : 100e-6;
  c.other_s = (tpcb ? 7 : 1) * 50e-6;
  c.think_time_s = 0;
  const Tier nvme = Catalog::builtin().get("nvme-local");
  c.read_latency_s = mean_latency_s(nvme.read);
  c.write_latency_s = mean_latency_s(nvme.write);
  c.flush_latency_s = mean_latency_s(nvme.flush);
  return c;
}

SynthCalibration calibration_from(const Profile& p) {
  if (!p.has_cpu)
    throw InputError(p.source + ": no CPU samples, so CPU per transaction cannot be calibrated (capture with "
                     "`capture run`, which samples the server's CPU)");
  SynthCalibration c;
  c.source = p.source;
  c.cpu_s_per_tx = p.cpu_s_per_tx;
  c.think_time_s = p.think_time_s;
  const Tier nvme = Catalog::builtin().get("nvme-local");
  c.read_latency_s = p.native_read.count > 0 ? p.native_read.mean_s : mean_latency_s(nvme.read);
  c.write_latency_s = p.native_write.count > 0 ? p.native_write.mean_s : mean_latency_s(nvme.write);
  c.flush_latency_s = p.native_flush.count > 0 ? p.native_flush.mean_s : mean_latency_s(nvme.flush);
  // "Other" as `project` calibrates it on the capture: what its latency
  // holds beyond CPU, device and commit time at its own client count.
  Projection pr = project(p, {nvme}, ProjectOptions{});
  c.other_s = pr.other_s;
  return c;
}

SynthResult synth_pgbench(const SynthOptions& o, const SynthCalibration& cal) {
  if (o.clients < 1) throw InputError("clients " + std::to_string(o.clients) + ": expected at least 1");
  if (o.vcpus < 1) throw InputError("vcpus " + std::to_string(o.vcpus) + ": expected at least 1");
  if (!(o.memory_bytes > 0)) throw InputError("memory " + fmt("%g", o.memory_bytes) + ": expected bytes above 0");
  if (!(o.checkpoint_tps > 0)) throw InputError("checkpoint tps " + fmt("%g", o.checkpoint_tps) + ": expected above 0");
  SynthResult r;
  const bool tpcb = o.mode == PgbenchMode::TpcbLike;
  r.geometry = pgbench_geometry(o.scale);
  const auto& g = r.geometry;
  const double shared_buffers = o.shared_buffers_bytes > 0 ? o.shared_buffers_bytes : o.memory_bytes / 4;
  r.cache = cache_sizes(o.memory_bytes, shared_buffers, o.clients);

  // One primary-key lookup per transaction (the UPDATE's; tpcb-like's
  // SELECT of the same row then hits), one heap page.
  const KeyAccess& k = o.aid;
  const double lo = std::max(1.0, k.lo), hi = k.hi > 0 ? std::min(k.hi, g.rows) : g.rows;
  if (!(hi >= lo)) throw InputError("key range " + fmt("%.0f", lo) + ".." + fmt("%.0f", hi) + " is empty");
  if (k.dist != KeyDist::Uniform && !(k.param > 0))
    throw InputError("distribution parameter " + fmt("%g", k.param) + ": expected above 0");
  if (k.dist == KeyDist::Gaussian && k.param < 2)
    throw InputError("gaussian parameter " + fmt("%g", k.param) + ": pgbench needs at least 2.0");
  const bool sliced = k.dist != KeyDist::Uniform;
  const int slices = sliced ? 1000 : 1;
  // Share of the references in the key slice [a, b] (fractions of lo..hi).
  auto mass = [&](double a, double b) {
    if (k.dist == KeyDist::Uniform) return b - a;
    if (k.dist == KeyDist::Exponential) return (std::exp(-k.param * a) - std::exp(-k.param * b)) / -std::expm1(-k.param);
    // Gaussian on [0, 1]: mean 1/2, deviation 1 / (2 param), cut at +-param deviations.
    auto cdf = [&](double x) { return 0.5 * std::erfc(-(x - 0.5) * 2 * k.param / std::sqrt(2.0)); };
    return (cdf(b) - cdf(a)) / (cdf(1) - cdf(0));
  };
  const double keys = hi - lo + 1;
  for (size_t i = 0; i + 1 < g.index_levels.size(); ++i) {
    // Inner levels: the part of each level over the key range.
    double pages = std::max(1.0, std::ceil(g.index_levels[i] * keys / g.rows));
    r.classes.push_back({"pkey level " + std::to_string(i), pages, 1.0});
  }
  const size_t first_slice = r.classes.size();
  for (int s = 0; s < slices; ++s) {
    const double a = static_cast<double>(s) / slices, b = static_cast<double>(s + 1) / slices;
    const double m = mass(a, b);
    const std::string tag = sliced ? " (keys " + fmt("%.0f%%", a * 100) + "-" + fmt("%.0f%%)", b * 100) : "";
    r.classes.push_back({"pkey leaves" + tag, std::max(1.0, keys / slices / kLeafEntriesPerPage), m});
    r.classes.push_back({"accounts heap" + tag, std::max(1.0, keys / slices / kHeapRowsPerPage), m});
  }
  TwoLevelHits both = two_level_hit_ratios(r.classes, r.cache);
  r.hit = both.either;
  r.shared_buffers_hit = both.shared_buffers;
  for (size_t i = 0; i < r.classes.size(); ++i) {
    r.reads_per_tx += r.classes[i].refs_per_tx * (1 - r.hit[i]);
    r.os_reads_per_tx += r.classes[i].refs_per_tx * (1 - r.shared_buffers_hit[i]);
  }

  if (tpcb) {
    const double per_ckpt = o.checkpoint_tps * kCheckpointS;
    // Each slice's leaves and heap pages are dirtied at its share of the
    // transactions.
    double w = 0, fpi = 0;
    for (size_t i = first_slice; i < r.classes.size(); ++i) {
      const auto& c = r.classes[i];
      if (c.refs_per_tx <= 0) continue;
      const double u = per_ckpt * c.refs_per_tx / c.pages;
      const double distinct = u < 1e-9 ? 1.0 : -std::expm1(-u) / u;
      w += c.refs_per_tx * std::max(1 - r.hit[i], distinct);
      fpi += c.refs_per_tx * distinct;
    }
    const double append = 1 / kHeapRowsPerPage;
    r.dirty_writes_per_tx = w + append;
    r.wal_bytes_per_tx = kWalRecordBytes + (fpi + append) * kPageBytes;
  }

  Profile& p = r.profile;
  p.source = std::string("synth: pgbench ") + (tpcb ? "tpcb-like" : "select-only") + " scale " +
             fmt("%g", o.scale);
  p.clients = o.clients;
  // `project` calibrates "other" at one client, where nothing queues: the
  // latency below is CPU + device + commit + other there.
  p.mean_clients = 1;
  p.sessions = static_cast<uint64_t>(o.clients);
  p.vcpus = o.vcpus;
  p.memory_bytes = o.memory_bytes;
  p.shared_buffers_bytes = shared_buffers;
  p.think_time_s = cal.think_time_s;
  p.has_cpu = true;
  p.cpu_s_per_tx = cal.cpu_s_per_tx;
  p.has_block_io = true;
  p.device = "synthetic (calibrated on " + cal.source + ")";
  p.reads_per_tx = r.reads_per_tx;
  p.read_bytes_per_tx = r.reads_per_tx * kPageBytes;
  p.sync_writes_per_tx = tpcb ? 1.0 : 0.0;
  p.write_bytes_per_tx = tpcb ? r.wal_bytes_per_tx : 0.0;
  p.flushes_per_tx = tpcb ? 1.0 : 0.0;
  p.pg_wal_bytes_per_tx = tpcb ? r.wal_bytes_per_tx : 0.0;
  p.native_read = {1, cal.read_latency_s, cal.read_latency_s, cal.read_latency_s};
  p.native_write = {1, cal.write_latency_s, cal.write_latency_s, cal.write_latency_s};
  p.native_flush = {1, cal.flush_latency_s, cal.flush_latency_s, cal.flush_latency_s};
  TemplateStats t;
  t.text = tpcb ? "pgbench tpcb-like (7 statements)" : "pgbench select-only (1 statement)";
  t.statements = tpcb ? 7 : 1;
  t.share = 1;
  t.reads_per_tx = r.reads_per_tx;
  t.writes_per_tx = p.sync_writes_per_tx;

  // Latency at one client such that `project`'s calibration finds
  // cal.other_s: start from the sum of the parts and correct by what the
  // calibration finds (at one client the response is linear in "other").
  const Tier nvme = Catalog::builtin().get("nvme-local");
  double lat = cal.cpu_s_per_tx + r.reads_per_tx * cal.read_latency_s + cal.other_s +
               (tpcb ? cal.write_latency_s + cal.flush_latency_s : 0.0);
  for (int i = 0; i < 4; ++i) {
    p.latency = {1, lat, lat, lat};
    p.tps = 1 / lat;
    p.transactions = 1;
    p.duration_s = lat;
    p.concurrency = 1;
    p.background_writes_per_s = r.dirty_writes_per_tx * p.tps;
    p.background_write_bytes_per_s = r.dirty_writes_per_tx * kPageBytes * p.tps;
    p.device_read_iops = r.reads_per_tx * p.tps;
    p.device_write_iops = (p.sync_writes_per_tx + r.dirty_writes_per_tx) * p.tps;
    t.mean_latency_s = lat;
    t.concurrency = 1;
    p.templates = {t};
    Projection pr = project(p, {nvme}, ProjectOptions{});
    double gap = cal.other_s - pr.other_s;
    if (std::abs(gap) < 1e-9) break;
    lat = std::max(lat + gap, 1e-7);
  }

  auto& a = r.assumptions;
  a.push_back("pgbench_accounts: " + fmt("%.0f rows, ", g.rows) + fmt("%.0f heap pages (", g.heap_pages) +
              fmt("%.1f GiB), ", g.heap_pages * kPageBytes / 1073741824.0) + "primary key of " +
              std::to_string(g.index_levels.size()) + " levels, " + fmt("%.0f leaf pages (", g.index_levels.back()) +
              fmt("%.1f GiB)", g.index_levels.back() * kPageBytes / 1073741824.0));
  auto gib = [](double pages) {
    const double b = pages * kPageBytes;
    return b < 1073741824.0 ? fmt("%.0f MiB", b / 1048576.0) : fmt("%.2f GiB", b / 1073741824.0);
  };
  a.push_back("cache: shared_buffers " + gib(r.cache.shared_buffers_pages) +
              (o.shared_buffers_bytes > 0 ? std::string() : std::string(" (25% of memory)")) +
              " in front of the OS page cache, " + gib(r.cache.os_pages) +
              " (memory less shared_buffers, 40 MiB and 1 MiB per client that hold no data pages); the OS cache "
              "holds the pages last read from it, so it duplicates what shared_buffers just loaded; hit ratios "
              "by Che's approximation for each, references uniform within each page class; " +
              fmt("%.3f reads from the OS per transaction (blks_read), ", r.os_reads_per_tx) +
              fmt("%.3f of them from the device", r.reads_per_tx));
  std::string hits = "hit ratio per transaction's page:";
  for (size_t i = 0; i < first_slice; ++i) hits += " " + r.classes[i].name + fmt(" %.3f,", r.hit[i]);
  for (int kind = 0; kind < 2; ++kind) {
    double refs = 0, hit = 0;
    for (size_t i = first_slice + kind; i < r.classes.size(); i += 2) {
      refs += r.classes[i].refs_per_tx;
      hit += r.classes[i].refs_per_tx * r.hit[i];
    }
    hits += std::string(kind ? " accounts heap" : " pkey leaves") + fmt(" %.3f,", refs > 0 ? hit / refs : 1.0);
  }
  hits.pop_back();
  a.push_back(hits);
  if (sliced)
    a.push_back(std::string("keys ") + fmt("%.0f", lo) + ".." + fmt("%.0f ", hi) +
                (k.dist == KeyDist::Gaussian ? "random_gaussian" : "random_exponential") +
                fmt(" with parameter %g", k.param) + ", cut into 1000 slices of pages");
  if (tpcb)
    a.push_back("writes: accounts update not HOT (fillfactor 100): its heap page and primary-key leaf dirtied, "
                "1/61 of an appended page; each dirtied page written once per checkpoint (300 s at " +
                fmt("%.0f tps", o.checkpoint_tps) + ") or at eviction: " +
                fmt("%.3f background writes", r.dirty_writes_per_tx) +
                fmt(" and %.0f WAL bytes per transaction (full-page images included), one WAL write and "
                    "flush per commit",
                    r.wal_bytes_per_tx));
  a.push_back("CPU " + fmt("%.1f us", cal.cpu_s_per_tx * 1e6) + ", round trips and client time " +
              fmt("%.1f us", cal.other_s * 1e6) + ", think time " + fmt("%.1f us", cal.think_time_s * 1e6) +
              " per transaction, from " +
              (cal.source == "defaults"
                   ? std::string("defaults (CPU: the machine's busy CPU per direct pgbench transaction measured "
                                 "on the machine tierlab was developed on, docs/benchmarks.md; round trips: "
                                 "50 us each, assumed)")
                   : "the capture " + cal.source));
  p.notes = a;
  return r;
}

namespace {

// Integer expressions of pgbench's \set: numbers, :NAME, + - * / and
// parentheses (recursive descent).
struct Expr {
  const std::string& s;
  size_t i = 0;
  const std::vector<std::pair<std::string, double>>& vars;
  const std::string& where;

  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  [[noreturn]] void fail(const std::string& what) {
    throw InputError(where + ": " + what + " in '" + s + "'");
  }
  double atom() {
    ws();
    if (i < s.size() && s[i] == '(') {
      ++i;
      double v = sum();
      ws();
      if (i >= s.size() || s[i] != ')') fail("missing ')'");
      ++i;
      return v;
    }
    if (i < s.size() && s[i] == '-') {
      ++i;
      return -atom();
    }
    if (i < s.size() && s[i] == ':') {
      size_t b = ++i;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      const std::string n = s.substr(b, i - b);
      for (const auto& [k, v] : vars)
        if (k == n) return v;
      fail("variable :" + n + " is not defined (give -D " + n + "=VALUE)");
    }
    size_t b = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (b == i) fail("expected a number or :variable");
    return std::stod(s.substr(b, i - b));
  }
  double product() {
    double v = atom();
    for (ws(); i < s.size() && (s[i] == '*' || s[i] == '/'); ws()) {
      char op = s[i++];
      double r = atom();
      if (op == '/' && r == 0) fail("division by zero");
      v = op == '*' ? v * r : std::trunc(v / r);
    }
    return v;
  }
  double sum() {
    double v = product();
    for (ws(); i < s.size() && (s[i] == '+' || s[i] == '-'); ws()) {
      char op = s[i++];
      double r = product();
      v = op == '+' ? v + r : v - r;
    }
    return v;
  }
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

ScriptAccess parse_pgbench_script(const std::string& text, const std::vector<std::pair<std::string, double>>& vars_in,
                                  const std::string& name) {
  auto vars = vars_in;
  struct Set {
    std::string var;
    KeyAccess access;
    bool random = false;
  };
  std::vector<Set> sets;
  ScriptAccess out;
  std::string lookup_var;
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    const std::string where = name + ":" + std::to_string(no);
    std::string t = line.substr(0, line.find("--"));
    size_t b = t.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    t = t.substr(b);
    if (t.rfind("\\set", 0) == 0) {
      std::istringstream ls(t.substr(4));
      std::string var;
      ls >> var;
      std::string rest;
      std::getline(ls, rest);
      if (var.empty()) throw InputError(where + ": \\set without a variable");
      std::string fn;
      size_t open = rest.find('(');
      std::string head = open == std::string::npos ? "" : rest.substr(0, open);
      head.erase(0, head.find_first_not_of(" \t"));
      head.erase(head.find_last_not_of(" \t") + 1);
      Set st;
      st.var = var;
      if (head == "random" || head == "random_gaussian" || head == "random_exponential") {
        size_t close = rest.rfind(')');
        if (close == std::string::npos || close < open) throw InputError(where + ": missing ')' in '" + t + "'");
        std::vector<double> args;
        std::string inner = rest.substr(open + 1, close - open - 1);
        int depth = 0;
        size_t from = 0;
        for (size_t j = 0; j <= inner.size(); ++j) {
          if (j < inner.size() && inner[j] == '(') ++depth;
          if (j < inner.size() && inner[j] == ')') --depth;
          if (j == inner.size() || (inner[j] == ',' && depth == 0)) {
            std::string arg = inner.substr(from, j - from);
            Expr e{arg, 0, vars, where};
            double v = e.sum();
            e.ws();
            if (e.i != arg.size()) e.fail("unexpected text");
            args.push_back(v);
            from = j + 1;
          }
        }
        const size_t want = head == "random" ? 2 : 3;
        if (args.size() != want)
          throw InputError(where + ": " + head + " takes " + std::to_string(want) + " arguments");
        st.random = true;
        st.access.dist = head == "random" ? KeyDist::Uniform
                         : head == "random_gaussian" ? KeyDist::Gaussian : KeyDist::Exponential;
        st.access.lo = args[0];
        st.access.hi = args[1];
        st.access.param = want == 3 ? args[2] : 0;
        if (!(st.access.hi >= st.access.lo))
          throw InputError(where + ": " + head + " range " + fmt("%.0f", args[0]) + ".." + fmt("%.0f", args[1]) +
                           " is empty");
      } else {
        Expr e{rest, 0, vars, where};
        double v = e.sum();
        vars.emplace_back(var, v);
      }
      sets.push_back(st);
      continue;
    }
    if (t[0] == '\\') continue;  // \sleep, \if ...: no pages
    const std::string l = lower(t);
    if (l.find("pgbench_accounts") == std::string::npos) continue;
    if (l.find("update") != std::string::npos) out.updates_accounts = true;
    size_t at = l.find("aid");
    while (at != std::string::npos) {
      size_t c = l.find(':', at);
      size_t eq = l.find('=', at);
      if (eq != std::string::npos && c != std::string::npos && eq < c &&
          l.find_first_not_of(" \t", eq + 1) == c) {
        size_t e = c + 1;
        while (e < l.size() && (std::isalnum(static_cast<unsigned char>(l[e])) || l[e] == '_')) ++e;
        lookup_var = t.substr(c + 1, e - c - 1);
        break;
      }
      at = l.find("aid", at + 3);
    }
  }
  if (lookup_var.empty())
    throw InputError(name + ": no statement on pgbench_accounts looks a row up by 'aid = :variable'");
  for (auto it = sets.rbegin(); it != sets.rend(); ++it)
    if (it->var == lookup_var) {
      if (!it->random)
        throw InputError(name + ": :" + lookup_var + " is not set by random, random_gaussian or random_exponential");
      out.aid = it->access;
      return out;
    }
  throw InputError(name + ": :" + lookup_var + " is not \\set in the script");
}

namespace {

double num(const nlohmann::json& j, const char* key, const std::string& where, double dflt = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) throw InputError(where + "." + key + ": expected a number");
  return it->get<double>();
}

LatencySummary lat(const nlohmann::json& j, const char* key, const std::string& where) {
  LatencySummary l;
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return l;
  const std::string w = where + "." + key;
  l.count = static_cast<uint64_t>(num(*it, "count", w));
  l.mean_s = num(*it, "mean_ms", w) / 1e3;
  l.p50_s = num(*it, "p50_ms", w) / 1e3;
  l.p99_s = num(*it, "p99_ms", w) / 1e3;
  return l;
}

}  // namespace

Profile profile_from_json(const std::string& text, const std::string& name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(name + ": not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("per_transaction") || !j.contains("latency"))
    throw InputError(name + ": not a profile (no per_transaction or latency: the JSON report of a profile, captured or "
                     "synthetic, has both)");
  Profile p;
  const std::string& w = name;
  p.source = j.value("source", name);
  p.duration_s = num(j, "duration_s", w);
  p.sessions = static_cast<uint64_t>(num(j, "sessions", w));
  p.clients = static_cast<int>(num(j, "clients", w));
  p.mean_clients = num(j, "mean_clients", w);
  p.transactions = static_cast<uint64_t>(num(j, "transactions", w));
  p.statements = static_cast<uint64_t>(num(j, "statements", w));
  p.errors = static_cast<uint64_t>(num(j, "errors", w));
  p.tps = num(j, "tps", w);
  p.concurrency = num(j, "concurrency", w);
  p.latency = lat(j, "latency", w);
  p.think_time_s = num(j, "think_time_ms", w) / 1e3;
  p.client_in_tx_s = num(j, "client_in_tx_ms", w) / 1e3;
  if (auto it = j.find("cpu_split"); it != j.end() && it->is_object()) {
    p.cpu_split = true;
    p.cpu_marginal_s_per_tx = num(*it, "per_tx_ms", w + ".cpu_split") / 1e3;
    p.cpu_fixed_cores = num(*it, "fixed_cores", w + ".cpu_split");
  }
  p.vcpus = static_cast<int>(num(j, "vcpus", w));
  if (auto it = j.find("templates"); it != j.end() && it->is_array())
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& tj = (*it)[i];
      const std::string tw = w + ".templates[" + std::to_string(i) + "]";
      TemplateStats t;
      t.id = std::strtoull(tj.value("id", std::string("0")).c_str(), nullptr, 16);
      t.text = tj.value("text", std::string());
      t.statements = static_cast<int>(num(tj, "statements", tw));
      t.count = static_cast<uint64_t>(num(tj, "count", tw));
      t.share = num(tj, "share", tw);
      t.mean_latency_s = num(tj, "mean_latency_ms", tw) / 1e3;
      t.concurrency = num(tj, "concurrency", tw);
      t.reads_per_tx = num(tj, "reads_per_tx", tw);
      t.writes_per_tx = num(tj, "writes_per_tx", tw);
      p.templates.push_back(t);
    }
  const auto& per = j["per_transaction"];
  const std::string pw = w + ".per_transaction";
  p.has_cpu = per.contains("cpu_ms") && !per["cpu_ms"].is_null();
  p.cpu_s_per_tx = num(per, "cpu_ms", pw) / 1e3;
  if (per.contains("client_cpu_ms") && !per["client_cpu_ms"].is_null())
    p.client_cpu_s_per_tx = num(per, "client_cpu_ms", pw) / 1e3;
  p.reads_per_tx = num(per, "device_reads", pw);
  p.read_bytes_per_tx = num(per, "device_read_bytes", pw);
  p.sync_writes_per_tx = num(per, "sync_writes", pw);
  p.write_bytes_per_tx = num(per, "sync_write_bytes", pw);
  p.flushes_per_tx = num(per, "wal_flushes", pw);
  p.has_queue_times = per.contains("queued_ms") && !per["queued_ms"].is_null();
  p.queued_s_per_tx = num(per, "queued_ms", pw) / 1e3;
  if (j.contains("quiet_transactions") && j["quiet_transactions"].is_object()) {
    const auto& q = j["quiet_transactions"];
    p.quiet_transactions = static_cast<uint64_t>(std::max(0.0, num(q, "count", w + ".quiet_transactions")));
    p.quiet_latency_s = num(q, "latency_ms", w + ".quiet_transactions") / 1e3;
  }
  if (j.contains("commit_statements") && j["commit_statements"].is_object()) {
    const auto& q = j["commit_statements"];
    p.commit_statements = static_cast<uint64_t>(std::max(0.0, num(q, "count", w + ".commit_statements")));
    p.commit_statement_s = num(q, "latency_ms", w + ".commit_statements") / 1e3;
  }
  p.pg_blks_read_per_tx = num(per, "pg_blks_read", pw, -1);
  p.pg_blks_hit_per_tx = num(per, "pg_blks_hit", pw, -1);
  p.pg_wal_bytes_per_tx = num(per, "pg_wal_bytes", pw, -1);
  p.cpu_cores_busy = num(j, "cpu_cores_busy", w);
  p.capture_cores_busy = num(j, "capture_cores_busy", w);
  if (auto it = j.find("device"); it != j.end() && it->is_object()) {
    const auto& d = *it;
    const std::string dw = w + ".device";
    p.has_block_io = d.value("has_block_io", false);
    p.device = d.value("name", std::string());
    p.device_read_iops = num(d, "read_iops", dw);
    p.device_write_iops = num(d, "write_iops", dw);
    p.background_writes_per_s = num(d, "background_writes_per_s", dw);
    p.background_write_bytes_per_s = num(d, "background_write_bytes_per_s", dw);
    p.knows_server_processes = d.contains("server_writes_per_s");
    p.server_writes_per_s = num(d, "server_writes_per_s", dw);
    p.server_write_bytes_per_s = num(d, "server_write_bytes_per_s", dw);
    p.other_reads_per_s = num(d, "other_reads_per_s", dw);
    p.unattributed_backend_ios = num(d, "unattributed_backend_ios", dw);
    p.native_read = lat(d, "read_latency", dw);
    p.native_write = lat(d, "write_latency", dw);
    p.native_flush = lat(d, "flush_latency", dw);
    p.queued_read = lat(d, "queued_read", dw);
    p.queued_write = lat(d, "queued_write", dw);
    p.cap_bound = d.value("cap_bound", false);
    p.cap_op = d.value("cap_op", std::string());
    p.cap_iops = num(d, "cap_iops", dw);
    p.io_from_counters = d.value("from_counters", false);
    p.latency_holds_cap_wait = d.value("latency_holds_cap_wait", false);
  }
  if (auto it = j.find("sources"); it != j.end() && it->is_array())
    for (const auto& s : *it)
      if (s.is_object() && s.value("figure", std::string()) != "")
        p.sources.push_back({s.value("figure", std::string()), s.value("source", std::string())});
  p.memory_bytes = num(j, "memory_bytes", w);
  p.shared_buffers_bytes = num(j, "shared_buffers_bytes", w);
  if (auto it = j.find("mrc"); it != j.end() && it->is_object()) {
    const auto& m = *it;
    p.mrc.source = m.value("source", std::string());
    p.mrc.references = num(m, "references", w + ".mrc");
    p.mrc.distinct_pages = num(m, "distinct_pages", w + ".mrc");
    p.mrc.sampled = m.value("sampled", false);
    p.mrc.sample_rate = num(m, "sample_rate", w + ".mrc", 1.0);
    if (auto pt = m.find("points"); pt != m.end() && pt->is_array()) {
      for (const auto& q : *pt) {
        if (!q.is_array() || q.size() != 2 || !q[0].is_number() || !q[1].is_number())
          throw InputError(w + ".mrc.points: expected [bytes, miss ratio] pairs");
        p.mrc.points.emplace_back(q[0].get<double>(), q[1].get<double>());
      }
    }
  }
  if (auto it = j.find("notes"); it != j.end() && it->is_array())
    for (const auto& n : *it)
      if (n.is_string()) p.notes.push_back(n.get<std::string>());
  if (p.transactions == 0 || !(p.tps > 0))
    throw InputError(name + ": the profile has no transactions");
  return p;
}

Profile read_profile_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return profile_from_json(s.str(), path);
}

}  // namespace tierlab::models
