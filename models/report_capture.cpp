// The capture over time for the report (models/report.h): one pass over the
// trace into buckets of time, and its statements by fingerprint.
#include "models/report.h"

#include "trace/reader.h"

#include <algorithm>
#include <unordered_map>

namespace tierlab::models {

namespace {

constexpr double kNs = 1e9;

struct Pending {
  bool open = false;
  bool query = false;  // a simple Query: it ends at ReadyForQuery
  bool error = false;
  Nanos start = 0;
  size_t stmt = 0;  // index into Builder::stats
};

struct Session {
  Pending pending;
  bool in_statement = false;  // since a statement, no idle ReadyForQuery yet
  std::unordered_map<std::string, size_t> prepared;  // statement name -> stats index
  std::unordered_map<std::string, size_t> portals;   // portal -> stats index
};

struct Builder {
  CaptureTimeline t;
  Nanos t0 = 0;
  bool started = false;
  Nanos bucket_ns = 100'000'000;
  std::unordered_map<uint64_t, Session> sessions;
  std::unordered_map<std::string, size_t> by_sql;

  size_t stmt_index(std::string_view sql) {
    std::string f = fingerprint_sql(sql);
    auto [it, fresh] = by_sql.try_emplace(f, t.statements.size());
    if (fresh) t.statements.push_back({std::move(f), 0, 0, 0});
    return it->second;
  }

  CaptureTimeline::Bucket& at(Nanos ts) {
    if (!started) {
      started = true;
      t0 = ts;
    }
    Nanos d = std::max<Nanos>(0, ts - t0);
    size_t i = static_cast<size_t>(d / bucket_ns);
    // Invariant: every bucket spans bucket_ns; past kMaxTimelineBuckets
    // neighbours merge and the span doubles.
    while (i >= kMaxTimelineBuckets) {
      auto& b = t.buckets;
      for (size_t k = 0; k < b.size(); ++k) {
        const auto& src = b[k];
        auto& dst = b[k / 2];
        if (k % 2 == 0)
          dst = src;
        else
          dst += src;
      }
      b.resize((b.size() + 1) / 2);
      bucket_ns *= 2;
      i = static_cast<size_t>(d / bucket_ns);
    }
    if (i >= t.buckets.size()) t.buckets.resize(i + 1);
    return t.buckets[i];
  }

  void start(Session& s, Nanos ts, size_t stmt, bool query) {
    s.pending = {true, query, false, ts, stmt};
    s.in_statement = true;
    at(ts).statements += 1;
  }

  void finish(Session& s, Nanos ts) {
    if (!s.pending.open) return;
    auto& st = t.statements[s.pending.stmt];
    ++st.count;
    if (s.pending.error) ++st.errors;
    st.total_s += static_cast<double>(std::max<Nanos>(0, ts - s.pending.start)) / kNs;
    s.pending.open = false;
  }

  void add(const trace::Record& r) {
    using namespace trace;
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, Query>) {
            auto& s = sessions[r.session];
            finish(s, r.ts);
            start(s, r.ts, stmt_index(b.sql), true);
          } else if constexpr (std::is_same_v<T, Parse>) {
            sessions[r.session].prepared[std::string(b.statement)] = stmt_index(b.sql);
          } else if constexpr (std::is_same_v<T, Bind>) {
            auto& s = sessions[r.session];
            auto it = s.prepared.find(std::string(b.statement));
            if (it != s.prepared.end()) s.portals[std::string(b.portal)] = it->second;
          } else if constexpr (std::is_same_v<T, Execute>) {
            auto& s = sessions[r.session];
            auto it = s.portals.find(std::string(b.portal));
            finish(s, r.ts);
            start(s, r.ts, it != s.portals.end() ? it->second : stmt_index(""), false);
          } else if constexpr (std::is_same_v<T, Result> || std::is_same_v<T, EmptyQuery> ||
                               std::is_same_v<T, Suspended>) {
            auto& s = sessions[r.session];
            if (!s.pending.query) finish(s, r.ts);
          } else if constexpr (std::is_same_v<T, Error>) {
            auto& s = sessions[r.session];
            at(r.ts).errors += 1;
            if (s.pending.open) {
              s.pending.error = true;
              if (!s.pending.query) finish(s, r.ts);
            }
          } else if constexpr (std::is_same_v<T, Ready>) {
            auto& s = sessions[r.session];
            finish(s, r.ts);
            if (b.status == 'I' && s.in_statement) {
              s.in_statement = false;
              at(r.ts).transactions += 1;
            }
          } else if constexpr (std::is_same_v<T, SessionEnd>) {
            sessions.erase(r.session);
          } else if constexpr (std::is_same_v<T, BlockIo>) {
            if (b.op != IoOp::Read && b.op != IoOp::Write) return;
            t.has_block_io = true;
            auto& k = at(r.ts);
            double lat = b.complete_ns > r.ts && !(b.flags & kIoIncomplete)
                             ? static_cast<double>(b.complete_ns - r.ts) / kNs
                             : 0;
            if (b.op == IoOp::Read) {
              k.reads += 1;
              k.read_bytes += b.length;
              k.read_latency_s += lat;
            } else {
              k.writes += 1;
              k.write_bytes += b.length;
              k.write_latency_s += lat;
            }
          }
        },
        r.body);
  }

  CaptureTimeline done(const std::string& source) {
    t.source = source;
    t.bucket_s = static_cast<double>(bucket_ns) / kNs;
    std::stable_sort(t.statements.begin(), t.statements.end(),
                     [](const auto& a, const auto& b) { return a.total_s > b.total_s; });
    // A statement never answered (the capture ended first) is not one.
    std::erase_if(t.statements, [](const auto& s) { return s.count == 0; });
    for (const auto& s : t.statements) {
      t.statement_count += s.count;
      t.statement_time_s += s.total_s;
    }
    return std::move(t);
  }
};

}  // namespace

CaptureTimeline capture_timeline(trace::Reader& reader, const std::string& source) {
  Builder b;
  trace::Record r;
  while (reader.next(r)) b.add(r);
  return b.done(source);
}

CaptureTimeline capture_timeline(const std::string& path) {
  auto reader = trace::open_reader(path);
  return capture_timeline(*reader, path);
}

}  // namespace tierlab::models
