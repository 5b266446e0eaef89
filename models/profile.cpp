#include "models/profile.h"
#include "models/fmt.h"

#include "common/error.h"
#include "common/histogram.h"
#include "common/units.h"
#include "models/mrc.h"
#include "models/profile_counters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

namespace tierlab::models {

using trace::Nanos;

namespace {

constexpr double kNs = 1e9;

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

LatencySummary summarise(const Histogram& h) {
  LatencySummary s;
  s.count = h.count();
  if (s.count == 0) return s;
  s.mean_s = h.mean() / kNs;
  s.p50_s = static_cast<double>(h.quantile(0.5)) / kNs;
  s.p99_s = static_cast<double>(h.quantile(0.99)) / kNs;
  return s;
}

struct Counter {
  Nanos first_ts = 0, last_ts = 0;
  double first = 0, last = 0;
  bool seen = false;
};

struct TxRec {
  Nanos start = 0, end = 0;
  uint32_t tmpl = 0;
  bool did_io = false;  // a device I/O was attributed to it
};

struct IoRec {
  Nanos ts = 0, complete = 0;
  int32_t pid = 0;
  uint32_t length = 0;
  trace::IoOp op = trace::IoOp::Read;
  bool file = false;  // a FileIo flush (fdatasync), not a block request
  Nanos queued = 0;   // BlockIo.queued_ns: 0 unknown
};

struct Session {
  int32_t pid = 0;
  Nanos begin = -1, last_seen = 0, end = -1;
  bool in_tx = false;
  Nanos tx_start = 0;
  Nanos last_idle = -1;
  int nstmt = 0;
  uint64_t fp = 0;
  std::string text;
  bool had_tx = false;
  std::unordered_map<std::string, std::string> prepared;  // statement name -> sql
  std::unordered_map<std::string, std::string> portals;   // portal -> sql
};

struct Template {
  uint64_t id = 0;
  std::string text;
  int statements = 0;
  uint64_t count = 0;
  double latency_sum_s = 0;
  double reads = 0;
  double writes = 0;
};

}  // namespace

struct ProfileBuilder::Impl {
  explicit Impl(ProfileOptions o)
      : opts(o),
        file_stack({.rate = 1.0, .max_pages = o.exact_pages, .bucket_pages = 4}),
        block_stack({.rate = 1.0, .max_pages = o.exact_pages, .bucket_pages = 4}) {}

  ProfileOptions opts;
  std::unordered_map<uint64_t, Session> sessions;
  std::vector<Template> templates;
  std::unordered_map<uint64_t, uint32_t> template_index;
  std::vector<std::pair<int32_t, TxRec>> txs;  // (backend pid, tx)
  Histogram tx_latency;
  double think_sum_s = 0;
  uint64_t think_n = 0;
  uint64_t statements = 0, errors = 0;
  std::vector<IoRec> ios;
  bool any_file_flush = false;
  StackDistances file_stack, block_stack;
  std::unordered_map<std::string, uint64_t> file_ids;
  std::map<std::string, Counter> counters;
  CounterSeries counter_series;  // the counters a host-less capture's figures come from
  std::map<std::string, std::string> meta;
  std::unordered_set<int32_t> server_pids;  // Meta "server.pid" (and "postmaster_pid")

  void start_statement(Session& s, Nanos ts, std::string_view sql) {
    if (!s.in_tx) {
      s.in_tx = true;
      s.tx_start = ts;
      s.nstmt = 0;
      s.fp = 1469598103934665603ull;
      s.text.clear();
      if (s.last_idle >= 0 && ts >= s.last_idle && in_window(ts)) {
        think_sum_s += static_cast<double>(ts - s.last_idle) / kNs;
        ++think_n;
      }
    }
    ++statements;
    ++s.nstmt;
    std::string f = fingerprint_sql(sql);
    s.fp = fnv1a(f, fnv1a(";", s.fp));
    while (!f.empty() && (f.back() == ';' || f.back() == ' ')) f.pop_back();
    if (s.text.size() < 300) {
      if (!s.text.empty()) s.text += "; ";
      s.text += f;
    }
  }

  void end_transaction(Session& s, Nanos ts) {
    s.in_tx = false;
    s.last_idle = ts;
    if (s.nstmt == 0 || !in_window(ts)) return;
    s.had_tx = true;
    auto [it, fresh] = template_index.try_emplace(s.fp, static_cast<uint32_t>(templates.size()));
    if (fresh) {
      Template t;
      t.id = s.fp;
      t.text = s.text.size() > 300 ? s.text.substr(0, 300) : s.text;
      t.statements = s.nstmt;
      templates.push_back(std::move(t));
    }
    Template& t = templates[it->second];
    ++t.count;
    double lat = static_cast<double>(ts - s.tx_start) / kNs;
    t.latency_sum_s += lat;
    tx_latency.record(ts - s.tx_start);
    txs.push_back({s.pid, TxRec{s.tx_start, ts, it->second}});
  }

  uint64_t file_key(std::string_view file) {
    auto it = file_ids.find(std::string(file));
    if (it != file_ids.end()) return it->second;
    uint64_t id = fnv1a(file);
    file_ids.emplace(std::string(file), id);
    return id;
  }

  bool in_window(Nanos ts) const { return ts >= opts.from_ns && ts < opts.to_ns; }

  void add(const trace::Record& r) {
    using namespace trace;
    // I/O and samples outside the window do not count; session records
    // always do (a session, or a statement prepared, before the window).
    if (!in_window(r.ts) && (std::holds_alternative<BlockIo>(r.body) || std::holds_alternative<FileIo>(r.body) ||
                             std::holds_alternative<Sample>(r.body)))
      return;
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, SessionBegin>) {
            auto& s = sessions[r.session];
            s.pid = b.backend_pid;
            s.begin = r.ts;
            s.last_seen = r.ts;
          } else if constexpr (std::is_same_v<T, SessionEnd>) {
            auto& s = sessions[r.session];
            s.end = r.ts;
            s.last_seen = r.ts;
          } else if constexpr (std::is_same_v<T, Query>) {
            auto& s = touch(r);
            start_statement(s, r.ts, b.sql);
          } else if constexpr (std::is_same_v<T, Parse>) {
            auto& s = touch(r);
            s.prepared[std::string(b.statement)] = std::string(b.sql);
            if (!s.in_tx) begin_without_statement(s, r.ts);
          } else if constexpr (std::is_same_v<T, Bind>) {
            auto& s = touch(r);
            auto it = s.prepared.find(std::string(b.statement));
            s.portals[std::string(b.portal)] = it == s.prepared.end() ? std::string() : it->second;
            if (!s.in_tx) begin_without_statement(s, r.ts);
          } else if constexpr (std::is_same_v<T, Execute>) {
            auto& s = touch(r);
            auto it = s.portals.find(std::string(b.portal));
            start_statement(s, r.ts, it == s.portals.end() ? std::string_view() : it->second);
          } else if constexpr (std::is_same_v<T, Error>) {
            touch(r);
            ++errors;
          } else if constexpr (std::is_same_v<T, Ready>) {
            auto& s = touch(r);
            if (b.status == 'I') end_transaction(s, r.ts);
          } else if constexpr (std::is_same_v<T, BlockIo>) {
            ios.push_back(IoRec{r.ts, b.complete_ns, b.pid, b.length, b.op, false, b.queued_ns});
            if (b.op == IoOp::Read && b.length > 0) {
              uint64_t first = b.offset / opts.page_bytes;
              uint64_t last = (b.offset + b.length - 1) / opts.page_bytes;
              uint64_t dev = static_cast<uint64_t>(b.device) << 40;
              for (uint64_t p = first; p <= last; ++p) block_stack.reference(dev ^ p);
            }
          } else if constexpr (std::is_same_v<T, FileIo>) {
            if (b.op == IoOp::Flush) {
              any_file_flush = true;
              ios.push_back(IoRec{r.ts, r.ts + b.latency_ns, b.pid, 0, IoOp::Flush, true});
            } else if (b.op == IoOp::Read && b.length > 0) {
              uint64_t id = file_key(b.file) * 0x9e3779b97f4a7c15ull;
              uint64_t first = b.offset / opts.page_bytes;
              uint64_t last = (b.offset + b.length - 1) / opts.page_bytes;
              for (uint64_t p = first; p <= last; ++p) file_stack.reference(id ^ p);
            }
          } else if constexpr (std::is_same_v<T, Sample>) {
            auto& c = counters[std::string(b.name)];
            if (!c.seen) {
              c.seen = true;
              c.first_ts = r.ts;
              c.first = b.value;
            }
            c.last_ts = r.ts;
            c.last = b.value;
            counter_series.add(b.name, r.ts, b.value);
          } else if constexpr (std::is_same_v<T, Meta>) {
            // A session's TLS ("session.ID.tls", one per session of a
            // proxy capture) is no figure of the profile's: not kept.
            if (b.key.starts_with("session.") && b.key.ends_with(".tls")) return;
            if (b.key == "server.pid" || b.key == "postmaster_pid")
              server_pids.insert(static_cast<int32_t>(std::strtol(std::string(b.value).c_str(), nullptr, 10)));
            meta[std::string(b.key)] = std::string(b.value);
          } else {
            if (r.session != 0) touch(r);
          }
        },
        r.body);
  }

  // Parse/Bind open a transaction window without counting a statement.
  void begin_without_statement(Session& s, Nanos ts) {
    s.in_tx = true;
    s.tx_start = ts;
    s.nstmt = 0;
    s.fp = 1469598103934665603ull;
    s.text.clear();
    if (s.last_idle >= 0 && ts >= s.last_idle && in_window(ts)) {
      think_sum_s += static_cast<double>(ts - s.last_idle) / kNs;
      ++think_n;
    }
  }

  Session& touch(const trace::Record& r) {
    auto& s = sessions[r.session];
    if (s.begin < 0) s.begin = r.ts;
    s.last_seen = r.ts;
    return s;
  }

  Profile finish(const std::string& source);
  void block_io(Profile& p, Nanos w0, Nanos w1);
  void detect_cap(Profile& p, Nanos w0, Nanos w1) const;
  void samples(Profile& p, Nanos w0, Nanos w1);
  void memory(Profile& p);
};

ProfileBuilder::ProfileBuilder(ProfileOptions opts) : impl_(std::make_unique<Impl>(opts)) {}
ProfileBuilder::~ProfileBuilder() = default;
void ProfileBuilder::add(const trace::Record& r) { impl_->add(r); }
Profile ProfileBuilder::finish(const std::string& source) { return impl_->finish(source); }

Profile ProfileBuilder::Impl::finish(const std::string& source) {
  Profile p;
  p.source = source;
  if (txs.empty())
    throw InputError(source + ": no completed transaction (no idle ReadyForQuery after a statement)");
  Nanos w0 = std::numeric_limits<Nanos>::max(), w1 = std::numeric_limits<Nanos>::min();
  for (const auto& [pid, t] : txs) {
    w0 = std::min(w0, t.start);
    w1 = std::max(w1, t.end);
  }
  p.first_ns = w0;
  p.last_ns = w1;
  p.duration_s = std::max(1e-9, static_cast<double>(w1 - w0) / kNs);
  p.transactions = txs.size();
  p.statements = statements;
  p.errors = errors;
  p.tps = static_cast<double>(p.transactions) / p.duration_s;
  p.latency = summarise(tx_latency);
  p.concurrency = tx_latency.sum() / kNs / p.duration_s;
  p.think_time_s = think_n ? think_sum_s / static_cast<double>(think_n) : 0.0;

  // Sessions that ran transactions: how many at once, and on average.
  std::vector<std::pair<Nanos, int>> edges;
  double open_sum = 0;
  for (const auto& [id, s] : sessions) {
    if (!s.had_tx) continue;
    ++p.sessions;
    Nanos b = s.begin, e = s.end >= 0 ? s.end : s.last_seen;
    edges.push_back({b, +1});
    edges.push_back({e, -1});
    Nanos ob = std::max(b, w0), oe = std::min(e, w1);
    if (oe > ob) open_sum += static_cast<double>(oe - ob);
  }
  std::sort(edges.begin(), edges.end());
  int open = 0;
  for (const auto& [t, d] : edges) p.clients = std::max(p.clients, open += d);
  p.mean_clients = open_sum / kNs / p.duration_s;

  block_io(p, w0, w1);
  for (const auto& t : templates) {
    TemplateStats ts;
    ts.id = t.id;
    ts.text = t.text;
    ts.statements = t.statements;
    ts.count = t.count;
    ts.share = static_cast<double>(t.count) / static_cast<double>(p.transactions);
    ts.mean_latency_s = t.latency_sum_s / static_cast<double>(t.count);
    ts.concurrency = t.latency_sum_s / p.duration_s;
    ts.reads_per_tx = t.reads / static_cast<double>(t.count);
    ts.writes_per_tx = t.writes / static_cast<double>(t.count);
    p.templates.push_back(std::move(ts));
  }
  std::sort(p.templates.begin(), p.templates.end(),
            [](const TemplateStats& a, const TemplateStats& b) { return a.count > b.count; });
  samples(p, w0, w1);
  memory(p);
  std::vector<Nanos> ends;
  ends.reserve(txs.size());
  for (const auto& [pid, t] : txs) ends.push_back(t.end);
  std::sort(ends.begin(), ends.end());
  profile_from_counters(p, counter_series, meta, ends);
  return p;
}

void ProfileBuilder::Impl::block_io(Profile& p, Nanos w0, Nanos w1) {
  // Transaction windows per backend pid, sorted by start.
  std::unordered_map<int32_t, std::vector<TxRec>> windows;
  for (const auto& [pid, t] : txs)
    if (pid != 0) windows[pid].push_back(t);
  for (auto& [pid, v] : windows)
    std::sort(v.begin(), v.end(), [](const TxRec& a, const TxRec& b) { return a.start < b.start; });
  std::unordered_set<int32_t> backends;
  for (const auto& [id, s] : sessions)
    if (s.pid != 0) backends.insert(s.pid);

  Histogram rd, wr, fl, qrd, qwr;
  double queued = 0;  // queue time of the I/Os attributed to transactions, ns
  double reads = 0, read_bytes = 0, writes = 0, write_bytes = 0, flushes = 0;
  double other_reads = 0, bg_writes = 0, bg_write_bytes = 0, all_reads = 0, all_writes = 0;
  double srv_writes = 0, srv_write_bytes = 0;
  double unattributed = 0;
  uint64_t block_records = 0;
  for (const auto& io : ios) {
    if (!io.file) ++block_records;
    bool completed = io.complete > io.ts;
    if (!io.file && completed) {
      Nanos lat = io.complete - io.ts;
      if (io.op == trace::IoOp::Read) rd.record(lat);
      else if (io.op == trace::IoOp::Write) wr.record(lat);
      else if (io.op == trace::IoOp::Flush) fl.record(lat);
    } else if (io.file && io.op == trace::IoOp::Flush && io.complete > io.ts) {
      fl.record(io.complete - io.ts);
    }
    const bool has_queued = !io.file && io.queued > 0 && io.queued <= io.ts;
    if (has_queued && io.op == trace::IoOp::Read) qrd.record(io.ts - io.queued);
    if (has_queued && io.op == trace::IoOp::Write) qwr.record(io.ts - io.queued);
    if (io.ts < w0 || io.ts > w1) continue;
    if (!io.file) {
      if (io.op == trace::IoOp::Read) ++all_reads;
      if (io.op == trace::IoOp::Write) ++all_writes;
    }
    bool backend = backends.count(io.pid) > 0;
    // A commit's flush reaches the device from whoever the file system has
    // do it (ext4: the journal thread), so block flushes count whatever
    // their pid; fdatasync calls, when recorded, only the backends'.
    if (!io.file && !any_file_flush && io.op == trace::IoOp::Flush) {
      ++flushes;
      continue;
    }
    if (!backend) {
      if (io.file) continue;
      if (io.op == trace::IoOp::Read) ++other_reads;
      if (io.op == trace::IoOp::Write) {
        ++bg_writes;
        bg_write_bytes += io.length;
        if (server_pids.count(io.pid)) {
          ++srv_writes;
          srv_write_bytes += io.length;
        }
      }
      continue;
    }
    // A backend's I/O: inside which of its transactions?
    TxRec* tx = nullptr;
    if (auto w = windows.find(io.pid); w != windows.end()) {
      auto& v = w->second;
      auto it = std::upper_bound(v.begin(), v.end(), io.ts,
                                 [](Nanos t, const TxRec& r) { return t < r.start; });
      if (it != v.begin() && io.ts <= std::prev(it)->end) tx = &*std::prev(it);
    }
    if (!tx) {
      if (!(io.file && !any_file_flush)) ++unattributed;
      continue;
    }
    if (!io.file) tx->did_io = true;
    switch (io.op) {
      case trace::IoOp::Read:
        if (io.file) break;
        ++reads;
        read_bytes += io.length;
        templates[tx->tmpl].reads += 1;
        if (has_queued) queued += static_cast<double>(io.ts - io.queued);
        break;
      case trace::IoOp::Write:
        if (io.file) break;
        if (has_queued) queued += static_cast<double>(io.ts - io.queued);
        ++writes;
        write_bytes += io.length;
        templates[tx->tmpl].writes += 1;
        break;
      case trace::IoOp::Flush:
        if (io.file) ++flushes;
        break;
      default:
        break;
    }
  }
  p.has_block_io = block_records > 0;
  double n = static_cast<double>(p.transactions);
  p.reads_per_tx = reads / n;
  p.read_bytes_per_tx = read_bytes / n;
  p.sync_writes_per_tx = writes / n;
  p.write_bytes_per_tx = write_bytes / n;
  p.flushes_per_tx = flushes / n;
  p.unattributed_backend_ios = unattributed;
  p.other_reads_per_s = other_reads / p.duration_s;
  p.background_writes_per_s = bg_writes / p.duration_s;
  p.background_write_bytes_per_s = bg_write_bytes / p.duration_s;
  p.knows_server_processes = !server_pids.empty();
  p.server_writes_per_s = srv_writes / p.duration_s;
  p.server_write_bytes_per_s = srv_write_bytes / p.duration_s;
  p.native_read = summarise(rd);
  p.native_write = summarise(wr);
  p.native_flush = summarise(fl);
  p.device_read_iops = all_reads / p.duration_s;
  p.device_write_iops = all_writes / p.duration_s;
  p.has_queue_times = qrd.count() + qwr.count() > 0;
  p.queued_read = summarise(qrd);
  p.queued_write = summarise(qwr);
  p.queued_s_per_tx = queued / kNs / n;
  double quiet_ns = 0;
  for (const auto& [pid, v] : windows)
    for (const auto& t : v)
      if (!t.did_io) {
        ++p.quiet_transactions;
        quiet_ns += static_cast<double>(t.end - t.start);
      }
  p.quiet_latency_s = p.quiet_transactions ? quiet_ns / kNs / static_cast<double>(p.quiet_transactions) : 0;
  detect_cap(p, w0, w1);
  if (!p.has_block_io)
    p.notes.push_back("no block I/O in the trace: device reads and writes per transaction unknown");
  else if (backends.empty())
    p.notes.push_back("no backend pids (BackendKeyData) in the trace: device I/O not attributed");
}

void ProfileBuilder::Impl::detect_cap(Profile& p, Nanos w0, Nanos w1) const {
  // An IOPS cap shows as an op whose rate holds steady while its requests
  // wait before issue: a workload that is not capped varies its rate with
  // its mix and does not wait before issue longer than the device serves.
  // A steady rate alone is no sign (a closed loop at its own pace is
  // steady too), nor is waiting alone (an I/O scheduler's queue).
  constexpr Nanos kS = 1'000'000'000;
  const int64_t whole = (w1 - w0) / kS;
  if (!p.has_queue_times || whole < 5 || p.queued_s_per_tx < 0.1 * p.latency.mean_s) return;
  for (trace::IoOp op : {trace::IoOp::Read, trace::IoOp::Write}) {
    const LatencySummary& q = op == trace::IoOp::Read ? p.queued_read : p.queued_write;
    const LatencySummary& dev = op == trace::IoOp::Read ? p.native_read : p.native_write;
    if (q.count == 0 || q.mean_s < std::max(1e-4, dev.mean_s)) continue;
    std::vector<double> bins(static_cast<size_t>(whole), 0.0);
    for (const auto& io : ios)
      if (!io.file && io.op == op && io.ts >= w0 && (io.ts - w0) / kS < whole)
        bins[static_cast<size_t>((io.ts - w0) / kS)] += 1;
    double mean = 0;
    for (double b : bins) mean += b;
    mean /= static_cast<double>(whole);
    std::sort(bins.begin(), bins.end());
    const size_t k = bins.size();
    const double median = bins[k / 2], lo = bins[k / 10], hi = bins[k - 1 - k / 10];
    if (median < 20 || lo < 0.9 * median || hi > 1.1 * median) continue;
    p.cap_bound = true;
    p.cap_op = std::string(trace::op_name(op));
    p.cap_iops = mean;
    return;
  }
}

void ProfileBuilder::Impl::samples(Profile& p, Nanos w0, Nanos w1) {
  // Transactions ending inside (a, b].
  std::vector<Nanos> ends;
  ends.reserve(txs.size());
  for (const auto& [pid, t] : txs) ends.push_back(t.end);
  std::sort(ends.begin(), ends.end());
  auto tx_between = [&](Nanos a, Nanos b) {
    return static_cast<double>(std::upper_bound(ends.begin(), ends.end(), b) -
                               std::upper_bound(ends.begin(), ends.end(), a));
  };
  (void)w0;
  (void)w1;
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
  if (auto it = counters.find("capture.cpu_ns"); it != counters.end() && it->second.last_ts > it->second.first_ts)
    p.capture_cores_busy = (it->second.last - it->second.first) / static_cast<double>(it->second.last_ts - it->second.first_ts);
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

void ProfileBuilder::Impl::memory(Profile& p) {
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
  StackDistances* sd = nullptr;
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
    p.mrc.points.push_back({s * opts.page_bytes, s <= 0 ? 1.0 : c.miss_ratio(s)});
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
