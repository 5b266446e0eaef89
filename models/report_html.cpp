// The report as one page (models/report.h): the head, the capture, replay,
// profile and miss-ratio curve sections; the projection's are in html.cpp.
#include "models/report.h"

#include "common/units.h"
#include "models/html_parts.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace tierlab::models {

std::string projection_html(const Projection& p, const Profile& profile) {
  ReportInput in;
  in.profile = &profile;
  in.projection = &p;
  return report_html(in);
}

namespace {

using html::esc;
using html::num;

constexpr double kGap = std::numeric_limits<double>::quiet_NaN();

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // a NaN y breaks the line
};

struct Mark {
  double x = 0;
  std::string label;
};

const char* tick_format(double step) {
  return step >= 1 ? "%.0f" : step >= 0.1 ? "%.1f" : step >= 0.01 ? "%.2f" : "%.3f";
}

// A chart of series against x from 0, each series its own colour, dash and
// marker (markers only where there are few points), labelled vertical
// marks, the legend below. `aria` names the plot (the tests find it so).
void xy_chart(std::ostringstream& h, const std::string& aria, const std::string& xlabel, const std::string& ylabel,
              const std::vector<Series>& series, const std::vector<Mark>& marks = {},
              const std::function<std::string(double)>& xtick = {}) {
  const double W = 560, H = 300, L = 62, R = 14, T = 12, B = 46;
  const double pw = W - L - R, ph = H - T - B;
  double xmax = 0, ymax = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      xmax = std::max(xmax, x);
      if (std::isfinite(y)) ymax = std::max(ymax, y);
    }
  for (const auto& m : marks) xmax = std::max(xmax, m.x);
  auto [ytop, ystep] = html::axis(ymax * 1.02);
  auto [xtop, xstep] = html::axis(xmax);
  auto X = [&](double x) { return L + pw * x / xtop; };
  auto Y = [&](double v) { return T + ph * (1 - v / ytop); };
  h << "<svg class=\"plot\" viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"" << esc(aria) << "\">\n";
  h << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  for (double y = 0; y <= ytop + ystep * 1e-6; y += ystep)
    h << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\" class=\"tick\">" << num(y, tick_format(ystep)) << "</text>\n";
  for (double x = 0; x <= xtop + xstep * 1e-6; x += xstep)
    h << "<text x=\"" << X(x) << "\" y=\"" << T + ph + 16 << "\" text-anchor=\"middle\" class=\"tick\">"
      << (xtick ? xtick(x) : num(x, tick_format(xstep))) << "</text>\n";
  h << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">" << esc(xlabel)
    << "</text>\n";
  h << "<text transform=\"translate(14 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << esc(ylabel)
    << "</text>\n";
  for (const auto& m : marks)
    h << "<line x1=\"" << num(X(m.x), "%.2f") << "\" x2=\"" << num(X(m.x), "%.2f") << "\" y1=\"" << T
      << "\" y2=\"" << T + ph << "\" stroke=\"#888\" stroke-dasharray=\"3 3\"/><text x=\"" << num(X(m.x) + 3, "%.2f")
      << "\" y=\"" << T + 12 << "\" class=\"tick\">" << esc(m.label) << "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const char* col = html::kColours[i % 10];
    const auto& pts = series[i].points;
    // One polyline per run of points between gaps.
    for (size_t a = 0; a < pts.size();) {
      while (a < pts.size() && !std::isfinite(pts[a].second)) ++a;
      size_t b = a;
      while (b < pts.size() && std::isfinite(pts[b].second)) ++b;
      if (b > a) {
        h << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"1.8\"";
        if (*html::kDashes[i % 8]) h << " stroke-dasharray=\"" << html::kDashes[i % 8] << "\"";
        h << " points=\"";
        for (size_t k = a; k < b; ++k)
          h << (k > a ? " " : "") << num(X(pts[k].first), "%.2f") << "," << num(Y(pts[k].second), "%.2f");
        h << "\"><title>" << esc(series[i].name) << "</title></polyline>\n";
      }
      a = b;
    }
    if (pts.size() <= 40)
      for (const auto& [x, y] : pts)
        if (std::isfinite(y)) html::marker(h, i, X(x), Y(y), col);
    h << "\n";
  }
  h << "</svg>\n<div class=\"legend\">";
  for (size_t i = 0; i < series.size(); ++i) {
    const char* col = html::kColours[i % 10];
    h << "<span><svg width=\"44\" height=\"12\" style=\"display:inline;margin:0\"><line x1=\"2\" x2=\"42\" y1=\"6\" "
         "y2=\"6\" stroke=\""
      << col << "\" stroke-width=\"2\"";
    if (*html::kDashes[i % 8]) h << " stroke-dasharray=\"" << html::kDashes[i % 8] << "\"";
    h << "/></svg> " << esc(series[i].name) << "</span>";
  }
  h << "</div>\n";
}

// Horizontal bars, one group per row and one bar per value in it (a
// colour each), the value written after the group's longest bar.
struct BarRow {
  std::string label;
  std::vector<double> values;
  std::string note;  // written after the bars
};

void bar_chart(std::ostringstream& h, const std::string& aria, const std::string& unit,
               const std::vector<std::string>& names, const std::vector<BarRow>& rows) {
  const size_t per = std::max<size_t>(1, names.size());
  const double W = 1100, L = 430, R = 190, bar = per > 1 ? 11 : 16, gap = 9, T = 8;
  const double pw = W - L - R;
  double H = T + static_cast<double>(rows.size()) * (bar * static_cast<double>(per) + gap) + 44;
  double vmax = 0;
  for (const auto& r : rows)
    for (double v : r.values) vmax = std::max(vmax, v);
  auto [top, step] = html::axis(vmax);
  h << "<svg class=\"plot\" viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"" << esc(aria) << "\">\n";
  double y = T;
  for (const auto& r : rows) {
    std::string label = r.label.size() > 64 ? r.label.substr(0, 61) + "..." : r.label;
    h << "<text x=\"" << L - 8 << "\" y=\"" << y + bar * static_cast<double>(per) / 2 + 4
      << "\" text-anchor=\"end\" class=\"sql\"><title>" << esc(r.label) << "</title>" << esc(label) << "</text>\n";
    double longest = 0;
    for (size_t k = 0; k < r.values.size(); ++k) {
      double w = pw * r.values[k] / top;
      longest = std::max(longest, w);
      h << "<rect x=\"" << L << "\" y=\"" << num(y + bar * static_cast<double>(k), "%.2f") << "\" width=\""
        << num(std::max(w, 0.5), "%.2f") << "\" height=\"" << bar - 1 << "\" fill=\"" << html::kColours[k % 10]
        << "\"><title>" << esc(k < names.size() ? names[k] : std::string()) << ": " << num(r.values[k], "%.3f")
        << " " << esc(unit) << "</title></rect>\n";
    }
    h << "<text x=\"" << num(L + longest + 6, "%.2f") << "\" y=\"" << y + bar * static_cast<double>(per) / 2 + 4
      << "\" class=\"tick\">" << esc(r.note) << "</text>\n";
    y += bar * static_cast<double>(per) + gap;
  }
  for (double v = 0; v <= top + step * 1e-6; v += step)
    h << "<text x=\"" << num(L + pw * v / top, "%.2f") << "\" y=\"" << y + 8
      << "\" text-anchor=\"middle\" class=\"tick\">" << num(v, tick_format(step)) << "</text>\n";
  h << "<text x=\"" << L + pw / 2 << "\" y=\"" << y + 28 << "\" text-anchor=\"middle\">" << esc(unit) << "</text>\n";
  double lx = L;
  if (names.size() > 1)
    for (size_t k = 0; k < names.size(); ++k) {
      h << "<rect x=\"" << num(lx, "%.1f") << "\" y=\"" << y + 18 << "\" width=\"12\" height=\"12\" fill=\""
        << html::kColours[k % 10] << "\"/><text x=\"" << num(lx + 16, "%.1f") << "\" y=\"" << y + 29
        << "\" class=\"tick\">" << esc(names[k]) << "</text>\n";
      lx += 40 + 6.5 * static_cast<double>(names[k].size());
    }
  h << "</svg>\n";
}

std::string sql_label(const std::string& sql) { return sql.empty() ? "(prepared before the capture)" : sql; }

void capture_section(std::ostringstream& h, const CaptureTimeline& c) {
  h << "<h2 id=\"capture\" class=\"section\">The capture</h2>\n";
  // At most kPoints buckets on a plot: neighbours merged.
  constexpr size_t kPoints = 120;
  const size_t k = std::max<size_t>(1, (c.buckets.size() + kPoints - 1) / kPoints);
  std::vector<CaptureTimeline::Bucket> buckets((c.buckets.size() + k - 1) / k);
  for (size_t i = 0; i < c.buckets.size(); ++i) buckets[i / k] += c.buckets[i];
  const double w = c.bucket_s * static_cast<double>(k);
  h << "<p>" << c.statement_count << " statements of " << c.statements.size() << " templates in "
    << num(static_cast<double>(c.buckets.size()) * c.bucket_s) << " s, taking " << num(c.statement_time_s, "%.2f")
    << " s in all. Over time in buckets of " << num(w, "%g") << " s.</p>\n";
  Series tx{"transactions/s", {}}, st{"statements/s", {}}, er{"errors/s", {}};
  Series rd{"reads/s", {}}, wr{"writes/s", {}}, rl{"read latency (mean)", {}}, wl{"write latency (mean)", {}};
  bool errors = false;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto& b = buckets[i];
    const double x = (static_cast<double>(i) + 0.5) * w;
    tx.points.push_back({x, b.transactions / w});
    st.points.push_back({x, b.statements / w});
    er.points.push_back({x, b.errors / w});
    errors = errors || b.errors > 0;
    rd.points.push_back({x, b.reads / w});
    wr.points.push_back({x, b.writes / w});
    rl.points.push_back({x, b.reads > 0 ? b.read_latency_s / b.reads * 1e3 : kGap});
    wl.points.push_back({x, b.writes > 0 ? b.write_latency_s / b.writes * 1e3 : kGap});
  }
  std::vector<Series> rates = {tx, st};
  if (errors) rates.push_back(er);
  h << "<div class=\"charts\"><div><h3>Rates over time</h3>\n";
  xy_chart(h, "Transactions and statements per second over time", "seconds from the capture's first statement or I/O",
           "per second", rates);
  h << "</div>";
  if (c.has_block_io) {
    h << "<div><h3>Block I/O rate over time</h3>\n";
    xy_chart(h, "Block I/O requests per second over time", "seconds from the capture's first statement or I/O",
             "requests per second", {rd, wr});
    h << "</div><div><h3>Block I/O latency over time</h3>\n";
    xy_chart(h, "Block I/O latency over time", "seconds from the capture's first statement or I/O",
             "mean latency, issue to completion, ms", {rl, wl});
    h << "</div></div>\n";
  } else {
    h << "</div>\n<p class=\"note\">The trace holds no block I/O: <code>capture run</code> (or "
         "<code>capture block</code>) records it beside the statements.</p>\n";
  }
  if (c.statements.empty()) return;
  h << "<h3>Statements by template: time and count</h3>\n";
  std::vector<BarRow> rows;
  for (size_t i = 0; i < c.statements.size() && i < 12; ++i) {
    const auto& s = c.statements[i];
    rows.push_back({sql_label(s.sql), {s.total_s}, std::to_string(s.count) + " x " +
                                                       num(s.total_s / static_cast<double>(s.count) * 1e3, "%.3f") +
                                                       " ms"});
  }
  bar_chart(h, "Time by statement template", "seconds in all", {"time"}, rows);
  h << "<table><tr><th>statement template</th><th>count</th><th>time s</th><th>mean ms</th><th>share of "
       "time</th><th>errors</th></tr>\n";
  for (size_t i = 0; i < c.statements.size() && i < 25; ++i) {
    const auto& s = c.statements[i];
    h << "<tr><td class=\"sqlcell\">" << esc(sql_label(s.sql)) << "</td><td>" << s.count << "</td><td>"
      << num(s.total_s, "%.3f") << "</td><td>" << num(s.total_s / static_cast<double>(s.count) * 1e3, "%.3f")
      << "</td><td>" << num(c.statement_time_s > 0 ? s.total_s / c.statement_time_s * 100 : 0, "%.1f%%")
      << "</td><td>" << s.errors << "</td></tr>\n";
  }
  h << "</table>\n";
  if (c.statements.size() > 25)
    h << "<p class=\"note\">" << c.statements.size() - 25 << " more templates not shown.</p>\n";
}

void replay_section(std::ostringstream& h, const ReplayView& r, size_t index) {
  h << "<h2 id=\"replay-" << index << "\" class=\"section\">Replay against the capture: <code>" << esc(r.source)
    << "</code></h2>\n";
  h << "<p>Speed " << esc(r.speed) << ": " << r.transactions << " transactions, " << r.statements
    << " statements in " << num(r.duration_s, "%.2f") << " s (captured " << num(r.captured_duration_s, "%.2f")
    << " s), " << num(r.tps) << " tps; latency avg " << num(r.lat_avg_ms, "%.3f") << " ms, p50 "
    << num(r.lat_p50_ms, "%.3f") << " ms, p99 " << num(r.lat_p99_ms, "%.3f") << " ms; " << r.sessions
    << " sessions";
  if (r.sessions_failed) h << " (" << r.sessions_failed << " failed)";
  h << ".</p>\n";
  h << "<h3>Divergence and errors</h3>\n<table><tr><th>statements whose outcome differs from the "
       "capture's</th><th>count</th></tr>\n"
    << "<tr><td>error or success differs</td><td>" << r.divergence_error_status << "</td></tr>\n"
    << "<tr><td>row count differs</td><td>" << r.divergence_row_count << "</td></tr>\n"
    << "<tr><td>failed, succeeded at capture</td><td>" << r.divergence_new_errors << "</td></tr>\n"
    << "<tr><td>divergence rate</td><td>" << num(r.divergence_rate * 100, "%.3f%%") << "</td></tr>\n"
    << "<tr><td>errors in the replay</td><td>" << r.errors << "</td></tr>\n</table>\n";
  if (!r.errors_by_sqlstate.empty()) {
    h << "<table><tr><th>SQLSTATE</th><th>errors</th><th class=\"left\">first message</th></tr>\n";
    for (const auto& [state, n] : r.errors_by_sqlstate) {
      std::string msg;
      for (const auto& [s, m] : r.first_errors)
        if (s == state) msg = m;
      h << "<tr><td>" << esc(state) << "</td><td>" << n << "</td><td class=\"left\">" << esc(msg)
        << "</td></tr>\n";
    }
    h << "</table>\n";
  }
  if (r.templates.empty()) {
    h << "<p class=\"note\">No statement was compared with the capture.</p>\n";
    return;
  }
  h << "<h3>Latency per statement template: capture and replay</h3>\n";
  std::vector<BarRow> rows;
  for (size_t i = 0; i < r.templates.size() && i < 12; ++i) {
    const auto& s = r.templates[i];
    rows.push_back({sql_label(s.sql), {s.captured_ms, s.replay_ms},
                    std::to_string(s.pairs) + " compared, " +
                        (s.captured_ms > 0 ? num(s.replay_ms / s.captured_ms, "%.2fx") : std::string("-"))});
  }
  bar_chart(h, "Mean latency per statement template, capture and replay", "mean latency, ms",
            {"capture", "replay"}, rows);
  h << "<table><tr><th>statement template</th><th>replayed</th><th>compared</th><th>captured ms</th>"
       "<th>replay ms</th><th>delta ms</th></tr>\n";
  for (size_t i = 0; i < r.templates.size() && i < 25; ++i) {
    const auto& s = r.templates[i];
    h << "<tr><td class=\"sqlcell\">" << esc(sql_label(s.sql)) << "</td><td>" << s.count << "</td><td>" << s.pairs
      << "</td><td>" << num(s.captured_ms, "%.3f") << "</td><td>" << num(s.replay_ms, "%.3f") << "</td><td>"
      << num(s.replay_ms - s.captured_ms, "%+.3f") << "</td></tr>\n";
  }
  h << "</table>\n";
}

void profile_section(std::ostringstream& h, const Profile& p) {
  h << "<h2 id=\"profile\" class=\"section\">Workload profile</h2>\n";
  h << "<p>Per transaction: " << num(p.latency.mean_s * 1e3, "%.3f") << " ms mean latency (p99 "
    << num(p.latency.p99_s * 1e3, "%.3f") << " ms), think time " << num(p.think_time_s * 1e3, "%.3f") << " ms, CPU "
    << (p.has_cpu ? num(p.cpu_s_per_tx * 1e3, "%.3f") + " ms" : std::string("not sampled")) << ", device reads "
    << num(p.reads_per_tx, "%.3f") << ", commit writes " << num(p.sync_writes_per_tx, "%.3f") << ", WAL flushes "
    << num(p.flushes_per_tx, "%.3f") << ".";
  if (p.has_block_io)
    h << " Device latency at capture: reads " << num(p.native_read.mean_s * 1e3, "%.3f") << " ms, writes "
      << num(p.native_write.mean_s * 1e3, "%.3f") << " ms, flushes " << num(p.native_flush.mean_s * 1e3, "%.3f")
      << " ms.";
  h << "</p>\n<h3>Transaction templates</h3>\n<table><tr><th>template</th><th>count</th><th>share</th>"
       "<th>statements</th><th>latency ms</th><th>reads/tx</th><th>writes/tx</th></tr>\n";
  for (size_t i = 0; i < p.templates.size() && i < 20; ++i) {
    const auto& t = p.templates[i];
    h << "<tr><td class=\"sqlcell\">" << esc(t.text) << "</td><td>" << t.count << "</td><td>"
      << num(t.share * 100, "%.1f%%") << "</td><td>" << t.statements << "</td><td>"
      << num(t.mean_latency_s * 1e3, "%.3f") << "</td><td>" << num(t.reads_per_tx, "%.3f") << "</td><td>"
      << num(t.writes_per_tx, "%.3f") << "</td></tr>\n";
  }
  h << "</table>\n";
  for (const auto& n : p.notes) h << "<p class=\"note\">" << esc(n) << "</p>\n";
}

void mrc_section(std::ostringstream& h, const Profile& p, const Projection* proj) {
  h << "<h2 id=\"mrc\" class=\"section\">Miss-ratio curve</h2>\n";
  if (p.mrc.empty()) {
    h << "<p>"
      << (p.source.rfind("synth:", 0) == 0
              ? "A profile computed by <code>profile synth</code> has no miss-ratio curve: its reads come from "
                "the access pattern."
              : "No miss-ratio curve: the trace holds no file or block reads (<code>capture run</code> as root "
                "records them).")
      << "</p>\n";
    return;
  }
  h << "<p>The share of page reads below shared_buffers an LRU cache of each size would miss, from "
    << num(p.mrc.references, "%.0f") << " page references ("
    << (p.mrc.source == "file_io" ? "the server's file reads, page-cache hits included"
                                  : "block reads: the OS cache's misses only")
    << ", " << esc(format_bytes(p.mrc.distinct_pages * 8192)) << " touched"
    << (p.mrc.sampled ? ", sampled at " + num(p.mrc.sample_rate, "%.4f") : std::string()) << ").</p>\n";
  const double top = p.mrc.points.back().first;
  // The x axis in the unit its range reads best in.
  const double unit = top >= 4.0 * (1 << 30) ? double(1 << 30) : top >= 4.0 * (1 << 20) ? double(1 << 20) : 1024.0;
  const char* uname = unit == double(1 << 30) ? "GiB" : unit == double(1 << 20) ? "MiB" : "KiB";
  Series s{"miss ratio", {}};
  for (const auto& [b, r] : p.mrc.points) s.points.push_back({b / unit, r});
  std::vector<Mark> marks;
  if (p.memory_bytes > 0 && p.memory_bytes <= top * 1.5) marks.push_back({p.memory_bytes / unit, "memory at capture"});
  if (proj && proj->memory_bytes > 0 && proj->memory_bytes != p.memory_bytes &&
      proj->memory_bytes / proj->data_growth <= top * 1.5)
    marks.push_back({proj->memory_bytes / proj->data_growth / unit,
                     proj->data_growth != 1 ? "target memory / data growth" : "target memory"});
  xy_chart(h, "Miss ratio against cache size", std::string("cache size, ") + uname, "miss ratio", {s}, marks);
}

}  // namespace

std::string report_html(const ReportInput& in) {
  const Profile& p = *in.profile;
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>tierlab report: "
    << esc(p.source) << "</title>\n<style>\n"
       "body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;"
       "margin:1.5em auto;max-width:1160px;padding:0 1em;color:#222}\n"
       "h1{font-size:1.4em}h2{font-size:1.25em;margin-top:2em;border-bottom:2px solid #ddd;padding-bottom:.2em}"
       "h3{font-size:1.05em;margin-top:1.4em}\n"
       "table{border-collapse:collapse;font-size:.82em;margin:.4em 0}th,td{padding:4px 6px;text-align:right;"
       "border-bottom:1px solid #ddd;white-space:nowrap}th:first-child,td:first-child{text-align:left}\n"
       "td.left{text-align:left}td.sqlcell{white-space:normal;font-family:monospace;max-width:640px}"
       ".range{color:#666;font-size:.85em}\n"
       "svg{font-size:12px;display:block;margin:.5em 0}.tick{fill:#555;font-size:11px}"
       ".sql{font-family:monospace;font-size:11px}\n"
       ".charts{display:flex;flex-wrap:wrap;gap:16px}.charts h3{margin-top:.6em}\n"
       ".legend{font-size:.9em;display:flex;flex-wrap:wrap;gap:18px}.legend span{white-space:nowrap}\n"
       ".note{color:#555;font-size:.85em}.lead{font-weight:600}code{background:#f3f3f3;padding:0 3px}\n"
       "nav{font-size:.9em}nav a{margin-right:1.2em}\n"
       "</style></head><body>\n";
  h << "<h1>"
    << (in.projection && !in.capture && in.replays.empty()
            ? "What this workload would do on other storage tiers"
            : "tierlab report")
    << "</h1>\n";
  if (p.source.rfind("synth:", 0) == 0)
    h << "<p>Profile <code>" << esc(p.source) << "</code>, computed by <code>profile synth</code>, not captured: "
      << p.clients << " clients.</p>\n";
  else
    h << "<p>Trace <code>" << esc(p.source) << "</code>: " << p.transactions << " transactions in "
      << num(p.duration_s) << " s (" << num(p.tps) << " tps measured), " << p.templates.size()
      << " transaction templates, " << p.clients << " clients.</p>\n";
  // The sections this page holds, linked.
  const bool mrc = in.mrc;
  h << "<nav>";
  if (in.capture) h << "<a href=\"#capture\">capture</a>";
  for (size_t i = 0; i < in.replays.size(); ++i)
    h << "<a href=\"#replay-" << i + 1 << "\">replay" << (in.replays.size() > 1 ? " " + std::to_string(i + 1) : "")
      << "</a>";
  if (in.profile_section) h << "<a href=\"#profile\">profile</a>";
  if (in.projection) h << "<a href=\"#projection\">projection</a>";
  if (mrc) h << "<a href=\"#mrc\">miss-ratio curve</a>";
  h << "</nav>\n";
  if (in.capture) capture_section(h, *in.capture);
  for (size_t i = 0; i < in.replays.size(); ++i) replay_section(h, in.replays[i], i + 1);
  if (in.profile_section) profile_section(h, p);
  if (in.projection) html::projection_sections(h, *in.projection, p);
  if (mrc) mrc_section(h, p, in.projection);
  h << "</body></html>\n";
  return h.str();
}

}  // namespace tierlab::models
