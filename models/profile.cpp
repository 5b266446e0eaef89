#include "models/profile.h"
#include "models/fmt.h"

#include "common/error.h"
#include "common/histogram.h"
#include "common/units.h"
#include "models/mrc.h"
#include "models/profile_counters.h"
#include "models/profile_internal.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
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

// A backend's transaction that ended, while I/O may still be attributed to it.
struct TxRec {
  Nanos start = 0, end = 0;
  uint32_t tmpl = 0;
  bool did_io = false;     // a block read or write was attributed to it
  bool did_flush = false;  // a block flush was
};

// What the I/O attributed to one transaction gives it.
struct TxIo {
  double reads = 0, read_bytes = 0, writes = 0, write_bytes = 0, file_flushes = 0, queued_ns = 0;
  uint64_t ios = 0;            // I/O attributed but block flushes
  uint64_t block_flushes = 0;
  bool did_io = false, did_flush = false;
  void add(const TxIo& o) {
    reads += o.reads;
    read_bytes += o.read_bytes;
    writes += o.writes;
    write_bytes += o.write_bytes;
    file_flushes += o.file_flushes;
    queued_ns += o.queued_ns;
    ios += o.ios;
    block_flushes += o.block_flushes;
    did_io = did_io || o.did_io;
    did_flush = did_flush || o.did_flush;
  }
};

// The transactions of one backend (pid) that I/O may still be attributed
// to: the one open, and the last kRecentTx that ended (a block I/O record
// is written when the request completes, after the transaction that
// issued it may have ended).
// I/O of a backend between its transactions, issued after the last one
// ended, may be of the next one (recorded before that one's first message:
// the capture's sources interleave slightly out of order): up to
// kEarlyIo of them wait for it to open.
constexpr size_t kRecentTx = 256;
constexpr size_t kEarlyIo = 64;
struct Backend {
  bool open = false;
  Nanos start = 0;
  TxIo pending;               // the open one's, applied to its template when it ends
  std::deque<TxRec> recent;   // ended, oldest first
  std::vector<std::pair<Nanos, TxIo>> early;  // (issue time, what it gives) waiting for the next
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
  Nanos last_stmt = 0;      // when the transaction's latest statement began
  bool last_commit = false;  // and whether it is COMMIT or END
  // The client's turns inside the transaction: a ReadyForQuery that left it
  // open, and the time from each such to the client's next message.
  Nanos ready_in_tx = -1;
  Nanos client_in_tx = 0;
  bool had_tx = false;
  std::unordered_map<std::string, std::string> prepared;  // statement name -> sql
  std::unordered_map<std::string, std::string> portals;   // portal -> sql
};

// COMMIT or END as fingerprint_sql writes it (lower case), with or
// without WORK/TRANSACTION and AND CHAIN's absence.
bool is_commit(std::string_view f) {
  while (!f.empty() && (f.back() == ';' || f.back() == ' ')) f.remove_suffix(1);
  return f == "commit" || f == "end" || f == "commit work" || f == "commit transaction" || f == "end work" ||
         f == "end transaction";
}

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
  // Transactions are counted as they end; none is held.
  uint64_t tx_count = 0;
  Nanos tx_first = std::numeric_limits<Nanos>::max();  // first start and last end of those counted
  Nanos tx_last = std::numeric_limits<Nanos>::min();
  MsCounts tx_ends;
  Histogram tx_latency;
  double think_sum_s = 0;
  uint64_t think_n = 0;
  uint64_t statements = 0, errors = 0;
  // Device I/O, folded in as it is read (io_seen, place, span_io). What
  // counts only inside the transactions' span [tx_first, tx_last] is
  // counted at once when the span seen so far holds it (the final one can
  // only be wider); an I/O outside it waits in head (before tx_first) or
  // tail (after tx_last) until the span grows over it, and is left out at
  // the end: only I/O issued before the first transaction or after the
  // latest end seen is held.
  bool any_file_flush = false;
  std::unordered_map<int32_t, Backend> backends;  // sessions' backend pids
  std::vector<IoRec> head, tail;
  Histogram rd, wr, fl, qrd, qwr;
  uint64_t block_records = 0;
  MsCounts cap_reads, cap_writes;  // block reads and writes by issue time, for detect_cap
  TxIo attributed;                 // to transactions that ended
  double block_flushes = 0;        // in the span: the flushes when no fdatasync is recorded
  double other_reads = 0, bg_writes = 0, bg_write_bytes = 0, all_reads = 0, all_writes = 0;
  double srv_writes = 0, srv_write_bytes = 0;
  double unattributed = 0, unattributed_flushes = 0;
  // Transactions of backends without device I/O: [0] not counting block
  // flushes (fdatasync recorded), [1] counting them as I/O too.
  uint64_t quiet[2] = {0, 0};
  double quiet_ns[2] = {0, 0};
  uint64_t commits = 0;  // transactions ending with COMMIT/END, and that statement's time
  double client_in_tx_ns = 0;  // the counted transactions' client turns (Session::client_in_tx)
  double commit_ns = 0;
  StackDistances file_stack, block_stack;
  std::unordered_map<std::string, uint64_t> file_ids;
  std::map<std::string, SampleCounter> counters;
  CounterSeries counter_series;  // the counters a host-less capture's figures come from
  // The server's CPU counters, every sample: (time, value) by name.
  CpuSeries cpu_series;
  ActivitySamples activity;  // the backends' sampled wait events
  std::map<std::string, std::string> meta;
  std::unordered_set<int32_t> server_pids;  // Meta "server.pid" (and "postmaster_pid")

  // A message from the client: inside a transaction, it ends the client's
  // turn that the last ReadyForQuery began.
  void client_message(Session& s, Nanos ts) {
    if (s.in_tx && s.ready_in_tx >= 0 && ts >= s.ready_in_tx) s.client_in_tx += ts - s.ready_in_tx;
    s.ready_in_tx = -1;
  }

  void start_statement(Session& s, Nanos ts, std::string_view sql) {
    client_message(s, ts);
    if (!s.in_tx) {
      s.in_tx = true;
      s.tx_start = ts;
      s.client_in_tx = 0;
      open_tx(s, ts);
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
    s.last_stmt = ts;
    s.last_commit = is_commit(f);
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
    s.ready_in_tx = -1;
    Backend* be = nullptr;
    if (s.pid != 0) {
      be = &backends[s.pid];
      if (be->open && (s.nstmt == 0 || !in_window(ts))) discard(*be);
      if (!be->open) be = nullptr;  // an idle point after one without statements: nothing pending
      else be->open = false;
    }
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
    client_in_tx_ns += static_cast<double>(s.client_in_tx);
    if (s.last_commit && s.nstmt >= 2 && ts >= s.last_stmt) {
      ++commits;
      commit_ns += static_cast<double>(ts - s.last_stmt);
    }
    double lat = static_cast<double>(ts - s.tx_start) / kNs;
    t.latency_sum_s += lat;
    tx_latency.record(ts - s.tx_start);
    const bool first = tx_count++ == 0;
    tx_ends.add(ts);
    if (s.pid != 0) {
      Backend& b = backends[s.pid];
      TxRec rec{s.tx_start, ts, it->second};
      if (be && be->start == s.tx_start) {
        const TxIo& d = be->pending;
        attributed.add(d);
        t.reads += d.reads;
        t.writes += d.writes;
        rec.did_io = d.did_io;
        rec.did_flush = d.did_flush;
        be->pending = TxIo{};
      } else if (be) {
        discard(*be);
      }
      b.recent.push_back(rec);
      if (b.recent.size() > kRecentTx) {
        ended(b.recent.front());
        b.recent.pop_front();
      }
    }
    const bool first_moved = first || s.tx_start < tx_first, last_moved = first || ts > tx_last;
    tx_first = std::min(tx_first, s.tx_start);
    tx_last = std::max(tx_last, ts);
    if (first_moved) {
      // I/O before the span: what it now holds counts, what lies after it waits in tail.
      size_t keep = 0;
      for (size_t i = 0; i < head.size(); ++i) {
        if (head[i].ts < tx_first) head[keep++] = head[i];
        else if (head[i].ts > tx_last) tail.push_back(head[i]);
        else span_io(head[i]);
      }
      head.resize(keep);
    }
    if (last_moved) {
      size_t keep = 0;
      for (size_t i = 0; i < tail.size(); ++i) {
        if (tail[i].ts > tx_last) tail[keep++] = tail[i];
        else span_io(tail[i]);
      }
      tail.resize(keep);
    }
  }

  // A backend's transaction opens: I/O of its pid from `ts` on is its.
  void open_tx(const Session& s, Nanos ts) {
    if (s.pid == 0) return;
    Backend& b = backends[s.pid];
    if (b.open) discard(b);
    b.open = true;
    b.start = ts;
    for (const auto& [at, d] : b.early) {
      if (at >= ts) b.pending.add(d);
      else count_unattributed(d);
    }
    b.early.clear();
  }

  void count_unattributed(const TxIo& d) {
    unattributed += static_cast<double>(d.ios);
    unattributed_flushes += static_cast<double>(d.block_flushes);
  }

  // The open transaction of `b` is not counted (no statement, or it ended
  // outside the window): the I/O given to it is nobody's.
  void discard(Backend& b) {
    count_unattributed(b.pending);
    b.pending = TxIo{};
    b.open = false;
  }

  // A transaction no I/O can be attributed to any more: quiet or not.
  void ended(const TxRec& t) {
    if (t.did_io) return;
    const double ns = static_cast<double>(t.end - t.start);
    ++quiet[0];
    quiet_ns[0] += ns;
    if (t.did_flush) return;
    ++quiet[1];
    quiet_ns[1] += ns;
  }

  // What counts of an I/O whatever the span: latencies, queue times, the
  // per-millisecond rates detect_cap looks at.
  void io_seen(const IoRec& io) {
    if (!io.file) ++block_records;
    const bool completed = io.complete > io.ts;
    if (!io.file && completed) {
      Nanos lat = io.complete - io.ts;
      if (io.op == trace::IoOp::Read) rd.record(lat);
      else if (io.op == trace::IoOp::Write) wr.record(lat);
      else if (io.op == trace::IoOp::Flush) fl.record(lat);
    } else if (io.file && io.op == trace::IoOp::Flush && completed) {
      fl.record(io.complete - io.ts);
    }
    const bool has_queued = !io.file && io.queued > 0 && io.queued <= io.ts;
    if (has_queued && io.op == trace::IoOp::Read) qrd.record(io.ts - io.queued);
    if (has_queued && io.op == trace::IoOp::Write) qwr.record(io.ts - io.queued);
    if (!io.file && io.op == trace::IoOp::Read) cap_reads.add(io.ts);
    if (!io.file && io.op == trace::IoOp::Write) cap_writes.add(io.ts);
  }

  // Counts an I/O in the span now, or holds it until the span holds it.
  void place(const IoRec& io) {
    io_seen(io);
    if (tx_count > 0 && io.ts >= tx_first && io.ts <= tx_last) span_io(io);
    else if (tx_count == 0 || io.ts < tx_first) head.push_back(io);
    else tail.push_back(io);
  }

  // An I/O inside the transactions' span: the device's rates, and the
  // transaction of its backend it belongs to.
  void span_io(const IoRec& io) {
    if (!io.file) {
      if (io.op == trace::IoOp::Read) ++all_reads;
      if (io.op == trace::IoOp::Write) ++all_writes;
    }
    const bool backend = backends.count(io.pid) > 0;
    const bool block_flush = !io.file && io.op == trace::IoOp::Flush;
    // A commit's flush reaches the device from whoever the file system has
    // do it (ext4: the journal thread), so block flushes count whatever
    // their pid (when no fdatasync is recorded: any_file_flush, known at
    // the end); fdatasync calls, when recorded, only the backends'.
    if (block_flush) ++block_flushes;
    if (!backend) {
      if (io.file || block_flush) return;
      if (io.op == trace::IoOp::Read) ++other_reads;
      if (io.op == trace::IoOp::Write) {
        ++bg_writes;
        bg_write_bytes += io.length;
        if (server_pids.count(io.pid)) {
          ++srv_writes;
          srv_write_bytes += io.length;
        }
      }
      return;
    }
    TxIo d;
    const bool has_queued = !io.file && io.queued > 0 && io.queued <= io.ts;
    if (block_flush) {
      d.block_flushes = 1;
      d.did_flush = true;
    } else {
      d.ios = 1;
      if (!io.file) d.did_io = true;
      if (io.file && io.op == trace::IoOp::Flush) d.file_flushes = 1;
      if (!io.file && io.op == trace::IoOp::Read) {
        d.reads = 1;
        d.read_bytes = io.length;
        if (has_queued) d.queued_ns = static_cast<double>(io.ts - io.queued);
      }
      if (!io.file && io.op == trace::IoOp::Write) {
        d.writes = 1;
        d.write_bytes = io.length;
        if (has_queued) d.queued_ns = static_cast<double>(io.ts - io.queued);
      }
    }
    // A backend's I/O: inside which of its transactions?
    Backend& b = backends[io.pid];
    if (b.open && io.ts >= b.start) {
      b.pending.add(d);
      return;
    }
    for (auto it = b.recent.rbegin(); it != b.recent.rend(); ++it) {
      if (it->start > io.ts) continue;
      if (io.ts > it->end) break;
      attributed.add(d);
      templates[it->tmpl].reads += d.reads;
      templates[it->tmpl].writes += d.writes;
      it->did_io = it->did_io || d.did_io;
      it->did_flush = it->did_flush || d.did_flush;
      return;
    }
    if (!b.open && (b.recent.empty() || io.ts > b.recent.back().end) && b.early.size() < kEarlyIo) {
      b.early.emplace_back(io.ts, d);
      return;
    }
    count_unattributed(d);
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
            if (s.pid != 0) backends.try_emplace(s.pid);
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
            client_message(s, r.ts);
            if (!s.in_tx) begin_without_statement(s, r.ts);
          } else if constexpr (std::is_same_v<T, Bind>) {
            auto& s = touch(r);
            auto it = s.prepared.find(std::string(b.statement));
            s.portals[std::string(b.portal)] = it == s.prepared.end() ? std::string() : it->second;
            client_message(s, r.ts);
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
            else if (s.in_tx) s.ready_in_tx = r.ts;
          } else if constexpr (std::is_same_v<T, BlockIo>) {
            place(IoRec{r.ts, b.complete_ns, b.pid, b.length, b.op, false, b.queued_ns});
            if (b.op == IoOp::Read && b.length > 0) {
              uint64_t first = b.offset / opts.page_bytes;
              uint64_t last = (b.offset + b.length - 1) / opts.page_bytes;
              uint64_t dev = static_cast<uint64_t>(b.device) << 40;
              for (uint64_t p = first; p <= last; ++p) block_stack.reference(dev ^ p);
            }
          } else if constexpr (std::is_same_v<T, FileIo>) {
            if (b.op == IoOp::Flush) {
              any_file_flush = true;
              place(IoRec{r.ts, r.ts + b.latency_ns, b.pid, 0, IoOp::Flush, true});
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
            if (b.name.starts_with("cpu.") && b.name.ends_with("_ns"))
              cpu_series[std::string(b.name)].emplace_back(r.ts, b.value);
            activity.add(b.name, b.value);
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
    s.client_in_tx = 0;
    open_tx(s, ts);
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
};

ProfileBuilder::ProfileBuilder(ProfileOptions opts) : impl_(std::make_unique<Impl>(opts)) {}
ProfileBuilder::~ProfileBuilder() = default;
void ProfileBuilder::add(const trace::Record& r) { impl_->add(r); }
Profile ProfileBuilder::finish(const std::string& source) { return impl_->finish(source); }

Profile ProfileBuilder::Impl::finish(const std::string& source) {
  Profile p;
  p.source = source;
  if (tx_count == 0)
    throw InputError(source + ": no completed transaction (no idle ReadyForQuery after a statement)");
  const Nanos w0 = tx_first, w1 = tx_last;
  p.first_ns = w0;
  p.last_ns = w1;
  p.duration_s = std::max(1e-9, static_cast<double>(w1 - w0) / kNs);
  p.transactions = tx_count;
  p.statements = statements;
  p.errors = errors;
  p.tps = static_cast<double>(p.transactions) / p.duration_s;
  p.latency = summarise(tx_latency);
  p.concurrency = tx_latency.sum() / kNs / p.duration_s;
  p.think_time_s = think_n ? think_sum_s / static_cast<double>(think_n) : 0.0;
  p.client_in_tx_s = client_in_tx_ns / kNs / static_cast<double>(tx_count);

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
  profile_samples(p, counters, cpu_series, tx_ends);
  profile_waits(p, activity);
  profile_memory(p, meta, file_stack, block_stack, opts.page_bytes);
  profile_from_counters(p, counter_series, meta, tx_ends);
  return p;
}

void ProfileBuilder::Impl::block_io(Profile& p, Nanos w0, Nanos w1) {
  // The transactions still open to late I/O are done with, and so is the
  // I/O of backends' transactions that never ended.
  for (auto& [pid, b] : backends) {
    for (const TxRec& t : b.recent) ended(t);
    b.recent.clear();
    if (b.open) discard(b);
    for (const auto& [at, d] : b.early) count_unattributed(d);
    b.early.clear();
  }
  const double reads = attributed.reads, read_bytes = attributed.read_bytes;
  const double writes = attributed.writes, write_bytes = attributed.write_bytes;
  const double queued = attributed.queued_ns;  // queue time of the I/Os attributed to transactions, ns
  const double flushes = any_file_flush ? attributed.file_flushes : block_flushes;
  const double unattributed_all = unattributed + (any_file_flush ? unattributed_flushes : 0);
  p.has_block_io = block_records > 0;
  double n = static_cast<double>(p.transactions);
  p.reads_per_tx = reads / n;
  p.read_bytes_per_tx = read_bytes / n;
  p.sync_writes_per_tx = writes / n;
  p.write_bytes_per_tx = write_bytes / n;
  p.flushes_per_tx = flushes / n;
  p.unattributed_backend_ios = unattributed_all;
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
  // With fdatasync recorded, a block flush in a transaction is I/O of it too.
  p.quiet_transactions = quiet[any_file_flush ? 1 : 0];
  const double quiet_ns_all = quiet_ns[any_file_flush ? 1 : 0];
  p.quiet_latency_s = p.quiet_transactions ? quiet_ns_all / kNs / static_cast<double>(p.quiet_transactions) : 0;
  p.commit_statements = commits;
  p.commit_statement_s = commits ? commit_ns / kNs / static_cast<double>(commits) : 0;
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
    const MsCounts& c = op == trace::IoOp::Read ? cap_reads : cap_writes;
    for (int64_t i = 0; i < whole; ++i) bins[static_cast<size_t>(i)] = c.in(w0 + i * kS, w0 + (i + 1) * kS);
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

}  // namespace tierlab::models
