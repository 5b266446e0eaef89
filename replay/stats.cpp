#include "replay/session.h"
#include "replay/start_at.h"
#include "replay/stats.h"

#include "common/clock.h"
#include "common/error.h"

#include <algorithm>
#include <map>
#include <cstdio>
#include <cstring>

namespace tierlab::replay {

const char* state_name(State s) {
  switch (s) {
    case State::Pending: return "pending";
    case State::Connecting: return "connecting";
    case State::Idle: return "idle";
    case State::Busy: return "busy";
    case State::CopyIn: return "copy-in";
    case State::CopyOut: return "copy-out";
    case State::Done: return "done";
    case State::Invalid: return "invalid";
  }
  return "invalid";
}

uint64_t SqlstateCounts::key(const char* s) {
  uint64_t k = 0;
  for (int i = 0; i < 5 && s[i]; ++i) k |= static_cast<uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return k | (1ull << 56);  // never zero
}

std::string SqlstateCounts::name(uint64_t key) {
  std::string s;
  for (int b = 0; b < 5; ++b) {
    char c = static_cast<char>((key >> (8 * b)) & 0xff);
    if (c) s += c;
  }
  return s;
}

size_t SqlstateCounts::slot(uint64_t k, bool* added) {
  *added = false;
  size_t i = (k * 0x9E3779B97F4A7C15ull) >> 56;  // top 8 bits
  for (size_t probe = 0; probe < kSlots; ++probe, i = (i + 1) % kSlots) {
    if (keys_[i] == k) return i;
    if (keys_[i] == 0) {
      keys_[i] = k;
      *added = true;
      return i;
    }
  }
  return kSlots;
}

size_t SqlstateCounts::find(uint64_t k) const {
  size_t i = (k * 0x9E3779B97F4A7C15ull) >> 56;
  for (size_t probe = 0; probe < kSlots; ++probe, i = (i + 1) % kSlots) {
    if (keys_[i] == k) return i;
    if (keys_[i] == 0) return kSlots;
  }
  return kSlots;
}

void SqlstateCounts::add(const char* sqlstate, uint64_t n, std::string_view message) {
  total_ += n;
  bool added;
  size_t i = slot(key(sqlstate), &added);
  if (i == kSlots) {
    other_ += n;
    return;
  }
  counts_[i] += n;
  if (added) {
    // Slow path, once per SQLSTATE.
    message_[i].assign(message);
    first_at_[i] = now_ns();
    statement_[i] = kNoStatement;
  }
}

void SqlstateCounts::attach(const char* sqlstate, uint32_t fp) {
  size_t i = find(key(sqlstate));
  if (i != kSlots && statement_[i] == kNoStatement) statement_[i] = fp;
}

uint64_t SqlstateCounts::get(const char* sqlstate) const {
  size_t i = find(key(sqlstate));
  return i == kSlots ? 0 : counts_[i];
}

void SqlstateCounts::merge(const SqlstateCounts& o) {
  for (size_t j = 0; j < kSlots; ++j) {
    if (!o.keys_[j]) continue;
    total_ += o.counts_[j];
    bool added;
    size_t i = slot(o.keys_[j], &added);
    if (i == kSlots) {
      other_ += o.counts_[j];
      continue;
    }
    counts_[i] += o.counts_[j];
    if (added || o.first_at_[j] < first_at_[i]) {
      message_[i] = o.message_[j];
      first_at_[i] = o.first_at_[j];
      statement_[i] = o.statement_[j];
    }
  }
  other_ += o.other_;
  total_ += o.other_;
}

std::vector<std::pair<std::string, uint64_t>> SqlstateCounts::sorted() const {
  std::vector<std::pair<std::string, uint64_t>> v;
  for (const First& f : firsts()) v.emplace_back(f.sqlstate, f.count);
  return v;
}

std::vector<SqlstateCounts::First> SqlstateCounts::firsts() const {
  std::vector<First> v;
  for (size_t i = 0; i < kSlots; ++i)
    if (keys_[i]) v.push_back(First{name(keys_[i]), counts_[i], message_[i], statement_[i]});
  std::sort(v.begin(), v.end(), [](const First& a, const First& b) { return a.sqlstate < b.sqlstate; });
  if (other_) v.push_back(First{"other", other_, "", kNoStatement});
  return v;
}

Divergence compare(const Outcome& c, const Outcome& r) {
  Divergence d;
  bool c_known = c.status == Status::Ok || c.status == Status::Error;
  bool r_known = r.status == Status::Ok || r.status == Status::Error;
  if (!c_known || !r_known) return d;  // skipped or unknown on one side
  if (c.status != r.status) {
    d.error_status = true;
    d.new_error = r.status == Status::Error;
  } else if (c.status == Status::Error) {
    d.error_status = std::memcmp(c.sqlstate, r.sqlstate, 5) != 0;
  } else if (c.has_rows && r.has_rows && c.rows != r.rows) {
    d.row_count = true;
  }
  return d;
}

void Stats::merge(const Stats& o) {
  lat.merge(o.lat);
  lag.merge(o.lag);
  own_lag.merge(o.own_lag);
  sync_wait.merge(o.sync_wait);
  sync_timeouts += o.sync_timeouts;
  statements += o.statements;
  transactions += o.transactions;
  failed_transactions += o.failed_transactions;
  div_error_status += o.div_error_status;
  div_row_count += o.div_row_count;
  div_new_errors += o.div_new_errors;
  sessions_failed += o.sessions_failed;
  sessions_stopped += o.sessions_stopped;
  sessions_direct += o.sessions_direct;
  unsupported += o.unsupported;
  if (first_session_error.empty()) first_session_error = o.first_session_error;
  errors.merge(o.errors);
  if (fps.size() < o.fps.size()) fps.resize(o.fps.size());
  for (size_t i = 0; i < o.fps.size(); ++i) {
    fps[i].count += o.fps[i].count;
    fps[i].pairs += o.fps[i].pairs;
    fps[i].replay_ns += o.fps[i].replay_ns;
    fps[i].captured_ns += o.fps[i].captured_ns;
  }
}

void fill_report(Report& r, const Stats& s, const Plan& plan, Nanos duration_ns) {
  r.sessions = plan.sessions.size();
  r.shard = plan.summary.shard;
  r.sessions_failed = s.sessions_failed;
  r.sessions_stopped = s.sessions_stopped;
  r.sessions_direct = s.sessions_direct;
  r.first_session_error = s.first_session_error;
  r.transactions = s.transactions;
  r.failed_transactions = s.failed_transactions;
  r.statements = s.statements;
  r.errors = s.errors.total();
  r.errors_by_sqlstate = s.errors.sorted();
  for (const auto& f : s.errors.firsts())
    r.first_errors.push_back(FirstError{
        f.sqlstate, f.count, f.message,
        f.statement < plan.fingerprints.size() ? plan.fingerprints[f.statement] : std::string()});
  r.divergence_error_status = s.div_error_status;
  r.divergence_row_count = s.div_row_count;
  r.divergence_new_errors = s.div_new_errors;
  r.unsupported = plan.summary.unsupported + s.unsupported;
  r.duration_s = static_cast<double>(duration_ns) / 1e9;
  r.captured_duration_s = static_cast<double>(plan.summary.duration_ns) / 1e9;
  r.lat_hist = s.lat;
  r.lag_hist = s.lag;
  r.own_lag_hist = s.own_lag;
  r.sync_wait_hist = s.sync_wait;
  r.commit_points = plan.commits;
  r.sync_timeouts = s.sync_timeouts;
  r.fingerprints.clear();
  for (size_t i = 0; i < s.fps.size(); ++i) {
    const FpStat& f = s.fps[i];
    if (f.count == 0) continue;
    r.fingerprints.push_back(FingerprintTotals{i < plan.fingerprints.size() ? plan.fingerprints[i] : std::string(),
                                               f.count, f.pairs, f.captured_ns, f.replay_ns});
  }
  derive(r);
}

void derive(Report& r) {
  auto ms = [](double ns) { return ns / 1e6; };
  r.divergence_rate =
      r.statements ? static_cast<double>(r.divergence_new_errors) / static_cast<double>(r.statements) : 0;
  r.tps = r.duration_s > 0 ? static_cast<double>(r.transactions) / r.duration_s : 0;
  const Histogram& lat = r.lat_hist;
  r.lat_avg_ms = ms(lat.mean());
  r.lat_stddev_ms = ms(lat.stddev());
  r.lat_p50_ms = ms(static_cast<double>(lat.quantile(0.50)));
  r.lat_p90_ms = ms(static_cast<double>(lat.quantile(0.90)));
  r.lat_p99_ms = ms(static_cast<double>(lat.quantile(0.99)));
  r.lat_p999_ms = ms(static_cast<double>(lat.quantile(0.999)));
  r.lat_max_ms = ms(static_cast<double>(lat.max()));
  r.lag_avg_ms = ms(r.lag_hist.mean());
  r.lag_p99_ms = ms(static_cast<double>(r.lag_hist.quantile(0.99)));
  r.lag_max_ms = ms(static_cast<double>(r.lag_hist.max()));
  r.own_lag_p99_ms = ms(static_cast<double>(r.own_lag_hist.quantile(0.99)));
  r.own_lag_max_ms = ms(static_cast<double>(r.own_lag_hist.max()));
  const Histogram& sw = r.sync_wait_hist;
  r.sync_waits = sw.count();
  r.sync_wait_s = sw.mean() * static_cast<double>(sw.count()) / 1e9;
  r.sync_wait_p99_ms = ms(static_cast<double>(sw.quantile(0.99)));
  r.sync_wait_max_ms = ms(static_cast<double>(sw.max()));

  std::vector<FingerprintDelta> deltas;
  for (const FingerprintTotals& f : r.fingerprints) {
    if (f.pairs == 0) continue;
    FingerprintDelta d;
    d.sql = f.sql;
    d.count = f.pairs;
    d.captured_ms = ms(f.captured_ns / static_cast<double>(f.pairs));
    d.replay_ms = ms(f.replay_ns / static_cast<double>(f.pairs));
    deltas.push_back(std::move(d));
  }
  auto diff = [](const FingerprintDelta& d) { return d.replay_ms - d.captured_ms; };
  // Ties (the same difference) in text order, so that a merged report
  // lists what the single replay lists.
  std::stable_sort(deltas.begin(), deltas.end(), [&](const auto& a, const auto& b) {
    return diff(a) != diff(b) ? diff(a) > diff(b) : a.sql < b.sql;
  });
  r.slowed.clear();
  r.sped_up.clear();
  for (const auto& d : deltas)
    if (diff(d) > 0 && r.slowed.size() < 10) r.slowed.push_back(d);
  for (auto it = deltas.rbegin(); it != deltas.rend(); ++it)
    if (diff(*it) < 0 && r.sped_up.size() < 10) r.sped_up.push_back(*it);
}

Report merge_reports(const std::vector<Report>& reports, const std::vector<std::string>& names) {
  Report m;
  if (reports.empty()) return m;
  auto name = [&](size_t i) { return i < names.size() ? names[i] : "report " + std::to_string(i + 1); };
  const Report& a = reports.front();
  m.speed = a.speed;
  m.max_speed = a.max_speed;
  m.shard.count = a.shard.count;
  m.cpu_latency_held = true;
  m.realtime = true;
  m.slice_ms = a.slice_ms;
  std::map<std::string, uint64_t> by_state;
  std::map<std::string, FirstError> firsts;
  std::map<std::string, size_t> fp_index;
  std::vector<size_t> shard_of_report(a.shard.count, SIZE_MAX);
  for (size_t i = 0; i < reports.size(); ++i) {
    const Report& r = reports[i];
    auto mode = [](const Report& x) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "at speed %g", x.speed);
      return x.max_speed ? std::string("at max speed") : std::string(buf);
    };
    if (r.max_speed != a.max_speed || (!r.max_speed && r.speed != a.speed))
      throw InputError(name(i) + " was replayed " + mode(r) + ", " + name(0) + " " + mode(a) +
                       ": not shards of one replay");
    if (r.shard.count != a.shard.count)
      throw InputError(name(i) + " is shard " + std::to_string(r.shard.index) + " of " +
                       std::to_string(r.shard.count) + ", " + name(0) + " one of " + std::to_string(a.shard.count) +
                       ": not shards of one replay");
    if (r.shard.index >= r.shard.count)
      throw InputError(name(i) + ": shard " + std::to_string(r.shard.index) + " of " + std::to_string(r.shard.count) +
                       " does not exist");
    size_t& seen = shard_of_report[r.shard.index];
    if (seen != SIZE_MAX)
      throw InputError(name(seen) + " and " + name(i) + " are both shard " + std::to_string(r.shard.index) + " of " +
                       std::to_string(r.shard.count));
    seen = i;
    m.merged_shards.push_back(r.shard.index);
    m.sessions += r.sessions;
    m.sessions_failed += r.sessions_failed;
    m.sessions_stopped += r.sessions_stopped;
    m.sessions_direct += r.sessions_direct;
    if (m.first_session_error.empty()) m.first_session_error = r.first_session_error;
    m.transactions += r.transactions;
    m.failed_transactions += r.failed_transactions;
    m.statements += r.statements;
    m.errors += r.errors;
    for (const auto& [state, n] : r.errors_by_sqlstate) by_state[state] += n;
    for (const FirstError& e : r.first_errors) {
      auto [it, fresh] = firsts.try_emplace(e.sqlstate, e);
      if (!fresh) {
        it->second.count += e.count;
        if (it->second.message.empty() && it->second.statement.empty()) {
          it->second.message = e.message;
          it->second.statement = e.statement;
        }
      }
    }
    m.divergence_error_status += r.divergence_error_status;
    m.divergence_row_count += r.divergence_row_count;
    m.divergence_new_errors += r.divergence_new_errors;
    m.unsupported += r.unsupported;
    m.duration_s = std::max(m.duration_s, r.duration_s);
    m.connect_s = std::max(m.connect_s, r.connect_s);
    m.captured_duration_s = std::max(m.captured_duration_s, r.captured_duration_s);
    m.threads += r.threads;
    m.cpu_latency_held = m.cpu_latency_held && r.cpu_latency_held;
    m.realtime = m.realtime && r.realtime;
    m.slice_ms = std::min(m.slice_ms, r.slice_ms);
    if (m.io.empty()) m.io = r.io;
    else if (m.io.find(r.io) == std::string::npos) m.io += " and " + r.io;
    m.cpu_s += r.cpu_s;
    if (!r.log_path.empty()) m.log_path += (m.log_path.empty() ? "" : ", ") + r.log_path;
    m.log_lines += r.log_lines;
    if (m.log_error.empty()) m.log_error = r.log_error;
    if (m.stopped.empty()) m.stopped = r.stopped;
    if (i == 0) {
      m.start_at_ns = r.start_at_ns;
      m.start_offset_ns = r.start_offset_ns;
      m.start_offset_max_ns = r.start_offset_max_ns;
    } else if (r.start_at_ns != m.start_at_ns) {
      auto started = [](int64_t at) { return at ? "started at " + format_realtime(at) : std::string("had no start time"); };
      throw InputError(name(i) + " " + started(r.start_at_ns) + ", " + name(0) + " " + started(m.start_at_ns) +
                       ": not shards of one replay");
    }
    m.start_offset_ns = std::min(m.start_offset_ns, r.start_offset_ns);
    m.start_offset_max_ns = std::max(m.start_offset_max_ns, r.start_offset_max_ns);
    if (m.clock.find(r.clock) == std::string::npos) m.clock += (m.clock.empty() ? "" : "; ") + r.clock;
    m.lat_hist.merge(r.lat_hist);
    m.lag_hist.merge(r.lag_hist);
    m.own_lag_hist.merge(r.own_lag_hist);
    m.sync_wait_hist.merge(r.sync_wait_hist);
    if (i == 0) {
      m.sync = r.sync;
      m.sync_all = r.sync_all;
      m.sync_timeout_s = r.sync_timeout_s;
    }
    m.commit_points += r.commit_points;
    m.sync_timeouts += r.sync_timeouts;
    for (const FingerprintTotals& f : r.fingerprints) {
      auto [it, fresh] = fp_index.try_emplace(f.sql, m.fingerprints.size());
      if (fresh) {
        m.fingerprints.push_back(f);
        continue;
      }
      FingerprintTotals& t = m.fingerprints[it->second];
      t.count += f.count;
      t.pairs += f.pairs;
      t.captured_ns += f.captured_ns;
      t.replay_ns += f.replay_ns;
    }
  }
  // "other" (beyond the SQLSTATEs told apart) last, as a replay lists them.
  for (const auto& [state, n] : by_state)
    if (state != "other") m.errors_by_sqlstate.emplace_back(state, n);
  if (by_state.count("other")) m.errors_by_sqlstate.emplace_back("other", by_state["other"]);
  for (const auto& [state, n] : m.errors_by_sqlstate) m.first_errors.push_back(firsts.count(state) ? firsts[state] : FirstError{state, n, "", ""});
  std::sort(m.merged_shards.begin(), m.merged_shards.end());
  derive(m);
  return m;
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string shorten(const std::string& sql) {
  return sql.size() <= 100 ? sql : sql.substr(0, 97) + "...";
}

// `text` on one line (every run of whitespace one space), cut to at most
// `max` bytes with "..." at a character boundary.
std::string one_line(std::string_view text, size_t max) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  if (out.size() <= max) return out;
  size_t cut = max - 3;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 continuation
  return out.substr(0, cut) + "...";
}

void print_deltas(std::ostream& out, const char* title, const std::vector<FingerprintDelta>& v) {
  out << title << (v.empty() ? " none\n" : "\n");
  for (const auto& d : v) {
    out << "  " << fmt("%+10.3f ms", d.replay_ms - d.captured_ms) << "  (" << fmt("%.3f", d.captured_ms)
        << " -> " << fmt("%.3f", d.replay_ms) << " ms, " << d.count << "x)  " << shorten(d.sql)
        << "\n";
  }
}

}  // namespace

std::string percent(double fraction) {
  const double v = fraction * 100;
  if (v == 0) return "0%";
  return fmt(v < 0.01 ? "%.2g%%" : "%.2f%%", v);
}

void print_report(std::ostream& out, const Report& r) {
  out << "replay mode: " << (r.max_speed ? std::string("max speed") : fmt("speed %g", r.speed)) << "\n";
  if (!r.stopped.empty())
    out << "stopped by " << r.stopped << " after " << fmt("%.3f", r.duration_s)
        << " s: the figures below cover what ran\n";
  if (!r.merged_shards.empty()) {
    out << "shards merged: " << r.merged_shards.size() << " of " << r.shard.count << " (";
    for (size_t i = 0; i < r.merged_shards.size(); ++i) out << (i ? ", " : "") << r.merged_shards[i];
    out << ")\n";
  } else if (r.shard.count > 1) {
    out << "shard: " << r.shard.index << " of " << r.shard.count << " (0-based)\n";
  }
  out << "number of sessions: " << r.sessions;
  if (r.sessions_failed || r.sessions_stopped) {
    out << " (";
    if (r.sessions_failed) out << r.sessions_failed << " failed: " << r.first_session_error;
    if (r.sessions_failed && r.sessions_stopped) out << "; ";
    if (r.sessions_stopped) out << r.sessions_stopped << " cut short by " << r.stopped;
    out << ")";
  }
  out << "\n";
  out << "sessions driven directly: " << r.sessions_direct << " of " << r.sessions
      << (r.sessions_direct < r.sessions ? " (the others: through libpq (GSS encryption, --wire libpq) or not connected)" : "")
      << "\n";
  if (r.start_at_ns) {
    out << "start: --start-at " << format_realtime(r.start_at_ns) << "; ";
    if (r.merged_shards.empty())
      out << "began " << fmt("%.3f", static_cast<double>(r.start_offset_ns) / 1e6) << " ms after it";
    else
      out << "the shards began " << fmt("%.3f", static_cast<double>(r.start_offset_ns) / 1e6) << " to "
          << fmt("%.3f", static_cast<double>(r.start_offset_max_ns) / 1e6) << " ms after it";
    out << " (" << r.clock << ")\n";
  }
  out << "number of threads: " << r.threads
      << (r.realtime ? " (SCHED_FIFO)" : r.slice_ms > 0 ? fmt(" (scheduler slice %g ms)", r.slice_ms) : "")
      << ", event loop: " << r.io << "\n";
  out << "number of transactions actually processed: " << r.transactions << "\n";
  const uint64_t ended = r.transactions + r.failed_transactions;
  out << "number of failed transactions: " << r.failed_transactions << " ("
      << fmt("%.3f", ended ? 100.0 * static_cast<double>(r.failed_transactions) / static_cast<double>(ended) : 0.0)
      << "%)\n";
  out << "number of statements: " << r.statements << "\n";
  out << "number of failed statements: " << r.errors << "\n";
  out << "duration: " << fmt("%.3f", r.duration_s) << " s (captured " << fmt("%.3f", r.captured_duration_s)
      << " s";
  if (r.max_speed) out << "; initial connection time " << fmt("%.3f", r.connect_s) << " s, not included";
  out << ")\n";
  out << "latency average = " << fmt("%.3f", r.lat_avg_ms) << " ms (per statement)\n";
  out << "latency stddev = " << fmt("%.3f", r.lat_stddev_ms) << " ms\n";
  out << "latency p50/p90/p99/p99.9/max = " << fmt("%.3f", r.lat_p50_ms) << "/" << fmt("%.3f", r.lat_p90_ms)
      << "/" << fmt("%.3f", r.lat_p99_ms) << "/" << fmt("%.3f", r.lat_p999_ms) << "/"
      << fmt("%.3f", r.lat_max_ms) << " ms\n";
  if (!r.max_speed)
    out << "schedule lag average/p99/max = " << fmt("%.3f", r.lag_avg_ms) << "/" << fmt("%.3f", r.lag_p99_ms)
        << "/" << fmt("%.3f", r.lag_max_ms) << " ms (in tierlab p99/max = " << fmt("%.3f", r.own_lag_p99_ms)
        << "/" << fmt("%.3f", r.own_lag_max_ms) << " ms; the rest waited for the target's previous answer)\n";
  if (r.sync)
    out << "commit order: kept (--sync " << (r.sync_all ? "all" : "commit") << "), " << r.commit_points << " commit points; " << r.sync_waits
        << " units waited for other sessions' commits, " << fmt("%.3f", r.sync_wait_s) << " s in all (p99/max = "
        << fmt("%.3f", r.sync_wait_p99_ms) << "/" << fmt("%.3f", r.sync_wait_max_ms) << " ms)"
        << (r.sync_timeouts ? ", " + std::to_string(r.sync_timeouts) + " went on after --sync-timeout" : "")
        << "\n";
  else
    out << "commit order: not kept (--sync none)\n";
  if (!r.max_speed)
    out << "cpu wake-up latency: "
        << (r.cpu_latency_held ? "held at 0 us (/dev/cpu_dma_latency)" : "not held (--no-pm-qos, or not root)")
        << "\n";
  out << "tps = " << fmt("%.6f", r.tps) << (r.max_speed ? " (without initial connection time)" : "") << "\n";
  out << "replayer CPU = " << fmt("%.3f", r.cpu_s) << " s in the worker and connection threads (";
  if (r.cpu_us_per_transaction() >= 0)
    out << fmt("%.1f", r.cpu_us_per_transaction()) << " us per transaction"
        << (r.failed_transactions ? ", failed ones included)" : ")");
  else
    out << "per transaction: n/a, none ended)";
  out << "\n";
  if (!r.log_path.empty())
    out << "round-trip log: " << r.log_lines << " lines in " << r.log_path
        << (r.log_error.empty() ? "" : " (stopped: " + r.log_error + ")") << "\n";
  out << "errors by SQLSTATE:" << (r.errors_by_sqlstate.empty() ? " none" : "");
  for (const auto& [state, n] : r.errors_by_sqlstate) out << " " << state << "=" << n;
  out << "\n";
  for (const FirstError& e : r.first_errors) {
    if (e.message.empty() && e.statement.empty()) continue;
    out << "  " << e.sqlstate << " first: " << (e.message.empty() ? "(no message)" : one_line(e.message, 100))
        << "\n";
    if (!e.statement.empty()) out << "    in: " << one_line(e.statement, 80) << "\n";
  }
  out << "divergence: " << r.divergence_error_status << " error status, " << r.divergence_row_count
      << " row count; " << r.divergence_new_errors << " of " << r.statements
      << " statements failed that succeeded at capture (" << percent(r.divergence_rate) << ")\n";
  if (r.unsupported) out << "not replayable (see tierlab replay --help): " << r.unsupported << " messages\n";
  print_deltas(out, "slowed down most (mean, captured -> replay):", r.slowed);
  print_deltas(out, "sped up most (mean, captured -> replay):", r.sped_up);
}

void print_dry_run(std::ostream& out, const WorkloadSummary& s) {
  if (s.shard.count > 1)
    out << "shard: " << s.shard.index << " of " << s.shard.count << " (0-based): " << s.sessions << " of "
        << s.trace_sessions << " sessions\n";
  out << "sessions: " << s.sessions << "\n";
  out << "statements: " << s.statements << "\n";
  out << "transactions: " << s.transactions << "\n";
  out << "round trips: " << s.units << "\n";
  out << "captured errors: " << s.captured_errors << "\n";
  out << "COPY data: " << s.copy_bytes << " bytes\n";
  out << "duration: " << fmt("%.3f", static_cast<double>(s.duration_ns) / 1e9) << " s\n";
  out << "max concurrency: " << s.max_concurrency << " sessions\n";
  out << "statement fingerprints: " << s.fingerprints << "\n";
  if (s.unsupported) out << "not replayable: " << s.unsupported << " messages\n";
  out << "commit points: " << s.commit_points
      << " (transactions and autocommit statements that changed data or schema; --sync commit keeps their order)\n";
  if (s.joined_in_transaction)
    out << "sessions joined inside a transaction: " << s.joined_in_transaction
        << " (the capture started mid-transaction; each replays from its next idle point)\n";
  if (s.libpq_unsupported)
    out << "not replayable through libpq: " << s.libpq_unsupported
        << " messages (resumed portals, Binds never executed; sent on directly driven sessions)\n";
}

}  // namespace tierlab::replay
