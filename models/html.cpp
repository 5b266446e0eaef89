// The report's projection sections (models/report.h): the tiers table, the
// charts against clients and load, headroom, where the time goes.
#include "models/capacity.h"
#include "models/html_parts.h"
#include "models/project.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tierlab::models::html {

namespace {

// One chart of a figure against clients, a series per tier, from
// clients_lo to clients_hi.
void clients_chart(std::ostringstream& h, const Projection& p, const char* label, const char* what,
                   double (*value)(const CurvePoint&)) {
  const double W = 560, H = 340, L = 62, R = 12, T = 12, B = 46;
  const double pw = W - L - R, ph = H - T - B;
  const int lo = p.clients_lo, hi = p.clients_hi;
  double ymax = 0;
  for (const auto& t : p.tiers)
    for (const auto& c : t.curve)
      if (c.clients >= lo) ymax = std::max(ymax, value(c));
  auto [ytop, ystep] = axis(ymax * 1.02);
  // x from the first client count shown (0 for a curve from 1) to the last.
  const double x0 = lo > 1 ? lo : 0;
  auto [xspan, xstep] = axis(std::max(1.0, hi - x0));
  if (hi - x0 <= 10) xstep = 1;
  xstep = std::max(1.0, std::round(xstep));
  auto X = [&](double n) { return L + pw * (n - x0) / std::max(1.0, hi - x0); };
  auto Y = [&](double v) { return T + ph * (1 - v / ytop); };
  h << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"" << what << " against clients per tier\">\n";
  h << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  const char* yf = ystep >= 1 ? "%.0f" : ystep >= 0.1 ? "%.1f" : ystep >= 0.01 ? "%.2f" : "%.3f";
  for (double y = 0; y <= ytop + ystep * 1e-6; y += ystep) {
    h << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\" class=\"tick\">" << num(y, yf) << "</text>\n";
  }
  for (double x = x0; x <= hi + 1e-9; x += xstep)
    h << "<text x=\"" << X(x) << "\" y=\"" << T + ph + 16 << "\" text-anchor=\"middle\" class=\"tick\">"
      << num(x, "%.0f") << "</text>\n";
  (void)xspan;
  h << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">clients</text>\n";
  h << "<text transform=\"translate(14 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << label
    << "</text>\n";
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const auto& t = p.tiers[i];
    const char* col = kColours[i % 10];
    h << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\"";
    if (*kDashes[i % 8]) h << " stroke-dasharray=\"" << kDashes[i % 8] << "\"";
    h << " points=\"";
    if (x0 == 0) h << X(0) << "," << Y(0);
    for (const auto& c : t.curve)
      if (c.clients >= lo) h << " " << num(X(c.clients), "%.2f") << "," << num(Y(value(c)), "%.2f");
    h << "\"><title>" << esc(t.tier) << "</title></polyline>\n";
    // Markers at about 8 points of the curve (and the last), offset per
    // series so that coinciding curves show each one's.
    const int n = hi - lo + 1;
    const int every = std::max(1, n / 8);
    for (const auto& c : t.curve) {
      if (c.clients < lo) continue;
      int k = c.clients - lo;
      if (k % every != static_cast<int>(i) % every && c.clients != hi) continue;
      marker(h, i, X(c.clients), Y(value(c)), col);
    }
    h << "\n";
  }
  h << "</svg>\n";
}

// The legend both charts share: colour, dash and marker per tier.
void legend(std::ostringstream& h, const Projection& p) {
  h << "<div class=\"legend\">";
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const char* col = kColours[i % 10];
    h << "<span><svg width=\"44\" height=\"12\" style=\"display:inline;margin:0\"><line x1=\"2\" x2=\"42\" y1=\"6\" "
         "y2=\"6\" stroke=\""
      << col << "\" stroke-width=\"2\"";
    if (*kDashes[i % 8]) h << " stroke-dasharray=\"" << kDashes[i % 8] << "\"";
    h << "/>";
    marker(h, i, 22, 6, col);
    h << "</svg> " << esc(p.tiers[i].tier) << "</span>";
  }
  h << "</div>\n";
}

void split_chart(std::ostringstream& h, const Projection& p) {
  struct Part {
    const char* name;
    const char* colour;
    double TimeSplit::*field;
  };
  const Part parts[] = {{"CPU", "#4e79a7", &TimeSplit::cpu_s},
                        {"storage wait", "#e15759", &TimeSplit::storage_s},
                        {"other (network, locks, client)", "#bab0ac", &TimeSplit::other_s},
                        {"think", "#59a14f", &TimeSplit::think_s}};
  const double W = 720, L = 170, R = 80, bar = 26, gap = 14, T = 10;
  double H = T + static_cast<double>(p.tiers.size()) * (bar + gap) + 50;
  double maxt = 0;
  for (const auto& t : p.tiers)
    maxt = std::max(maxt, t.split.cpu_s + t.split.storage_s + t.split.other_s + t.split.think_s);
  auto [top, step] = axis(maxt * 1e3);
  double pw = W - L - R;
  h << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"Where a transaction's time goes, per tier\">\n";
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const auto& t = p.tiers[i];
    double y = T + static_cast<double>(i) * (bar + gap);
    h << "<text x=\"" << L - 8 << "\" y=\"" << y + bar / 2 + 5 << "\" text-anchor=\"end\">"
      << esc(t.tier) << "</text>\n";
    double x = L, total = 0;
    for (const auto& part : parts) {
      double ms = t.split.*part.field * 1e3;
      total += ms;
      double w = pw * ms / top;
      if (w <= 0) continue;
      h << "<rect x=\"" << num(x, "%.2f") << "\" y=\"" << y << "\" width=\"" << num(w, "%.2f")
        << "\" height=\"" << bar << "\" fill=\"" << part.colour << "\"><title>" << part.name << ": "
        << num(ms, "%.3f") << " ms</title></rect>\n";
      x += w;
    }
    h << "<text x=\"" << x + 6 << "\" y=\"" << y + bar / 2 + 5 << "\" class=\"tick\">"
      << num(total, "%.2f") << " ms</text>\n";
  }
  double ay = T + static_cast<double>(p.tiers.size()) * (bar + gap);
  for (double v = 0; v <= top + 1e-9; v += step)
    h << "<text x=\"" << L + pw * v / top << "\" y=\"" << ay + 4 << "\" text-anchor=\"middle\" class=\"tick\">"
      << num(v, step < 1 ? "%.1f" : "%.0f") << "</text>\n";
  double lx = L;
  for (const auto& part : parts) {
    h << "<rect x=\"" << lx << "\" y=\"" << ay + 18 << "\" width=\"12\" height=\"12\" fill=\""
      << part.colour << "\"/><text x=\"" << lx + 16 << "\" y=\"" << ay + 29 << "\" class=\"tick\">"
      << part.name << "</text>\n";
    lx += 30 + 6.2 * static_cast<double>(std::string(part.name).size());
  }
  h << "</svg>\n";
}

// One chart of a figure against the load multiple, a series per tier, the
// loads of p.loads (at least two).
void load_chart(std::ostringstream& h, const Projection& p, const char* label, const char* what,
                double (*value)(const LoadTier&)) {
  const double W = 560, H = 340, L = 62, R = 12, T = 12, B = 46;
  const double pw = W - L - R, ph = H - T - B;
  double lmax = 0, ymax = 0;
  for (const auto& lp : p.loads) {
    lmax = std::max(lmax, lp.load);
    for (const auto& t : lp.tiers) ymax = std::max(ymax, value(t));
  }
  auto [ytop, ystep] = axis(ymax * 1.02);
  auto [xtop, xstep] = axis(lmax);
  auto X = [&](double l) { return L + pw * l / xtop; };
  auto Y = [&](double v) { return T + ph * (1 - v / ytop); };
  h << "<svg class=\"plot\" viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"" << what << " against load per tier\">\n";
  h << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  const char* yf = ystep >= 1 ? "%.0f" : ystep >= 0.1 ? "%.1f" : ystep >= 0.01 ? "%.2f" : "%.3f";
  for (double y = 0; y <= ytop + ystep * 1e-6; y += ystep)
    h << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\" class=\"tick\">" << num(y, yf) << "</text>\n";
  for (double x = 0; x <= xtop + xstep * 1e-6; x += xstep)
    h << "<text x=\"" << X(x) << "\" y=\"" << T + ph + 16 << "\" text-anchor=\"middle\" class=\"tick\">"
      << num(x, "%gx") << "</text>\n";
  h << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 10
    << "\" text-anchor=\"middle\">load (multiple of today's arrival rate)</text>\n";
  h << "<text transform=\"translate(14 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << label
    << "</text>\n";
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const char* col = kColours[i % 10];
    h << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\"";
    if (*kDashes[i % 8]) h << " stroke-dasharray=\"" << kDashes[i % 8] << "\"";
    h << " points=\"";
    for (const auto& lp : p.loads)
      if (i < lp.tiers.size())
        h << " " << num(X(lp.load), "%.2f") << "," << num(Y(value(lp.tiers[i])), "%.2f");
    h << "\"><title>" << esc(p.tiers[i].tier) << "</title></polyline>\n";
    for (const auto& lp : p.loads)
      if (i < lp.tiers.size()) marker(h, i, X(lp.load), Y(value(lp.tiers[i])), col);
    h << "\n";
  }
  h << "</svg>\n";
}

// Loads, headroom and their charts, when the projection has them.
void capacity_section(std::ostringstream& h, const Projection& p) {
  bool headroom = false;
  for (const auto& t : p.tiers) headroom = headroom || t.headroom != 0;
  if (p.loads.empty() && !headroom && p.data_growth == 1) return;
  h << "<h3 id=\"capacity\">Capacity: load and headroom</h3>\n";
  if (p.data_growth != 1)
    h << "<p>Data growth " << num(p.data_growth, "%.3g")
      << "x: every figure on this page is projected with the data that much larger (see the notes).</p>\n";
  if (headroom) {
    h << "<p>Headroom: the load at which a tier saturates (its CPU or storage " << num(kSaturated * 100, "%.0f")
      << "% busy or more, a cap's bound reached";
    if (p.slo_p99_s > 0) h << ", or its p99 above " << num(p.slo_p99_s * 1e3, "%g") << " ms";
    h << ").</p>\n<ul class=\"headroom\">\n";
    for (const auto& t : p.tiers) h << "<li>" << esc(headroom_line(t)) << "</li>\n";
    h << "</ul>\n";
  }
  if (p.loads.empty()) return;
  if (p.loads.size() >= 2) {
    h << "<div class=\"charts\"><div><h3>Throughput against load</h3>\n";
    load_chart(h, p, "transactions per second", "TPS", [](const LoadTier& t) { return t.tps; });
    h << "</div><div><h3>p99 latency against load</h3>\n";
    load_chart(h, p, "p99 latency estimate, ms", "p99 latency", [](const LoadTier& t) { return t.p99_s * 1e3; });
    h << "</div></div>\n";
    legend(h, p);
  }
  h << "<p>Each load multiple is made by "
    << (p.load_by == "clients" ? "scaling the client count" : "shortening the think time, then adding clients")
    << ".</p>\n<table><tr><th>load</th><th>clients</th><th>think ms</th><th>tier</th><th>tps</th>"
       "<th>latency avg ms</th><th>p99 ms est.</th><th>read IOPS</th><th>write IOPS</th><th>bottleneck</th></tr>\n";
  for (const auto& lp : p.loads)
    for (size_t i = 0; i < lp.tiers.size() && i < p.tiers.size(); ++i) {
      const auto& t = lp.tiers[i];
      h << "<tr><td>" << (i == 0 ? num(lp.load, "%gx") : std::string()) << "</td><td>" << lp.clients << "</td><td>"
        << num(lp.think_s * 1e3, "%.3f") << "</td><td class=\"left\">" << esc(p.tiers[i].tier) << "</td><td>"
        << num(t.tps) << "</td><td>" << num(t.latency_s * 1e3, "%.3f") << "</td><td>" << num(t.p99_s * 1e3, "%.3f")
        << "</td><td>" << num(t.read_iops, "%.0f") << "</td><td>" << num(t.write_iops, "%.0f") << "</td><td>"
        << esc(t.bottleneck.empty() ? std::string("none")
                                    : t.bottleneck + " " + num(t.bottleneck_utilisation * 100, "%.0f") + "%")
        << "</td></tr>\n";
    }
  h << "</table>\n";
}

}  // namespace

void projection_sections(std::ostringstream& h, const Projection& p, const Profile& profile) {
  h << "<h2 id=\"projection\" class=\"section\">Projection onto storage tiers</h2>\n";
  if (!p.same_on_every_tier.empty()) h << "<p class=\"lead\">" << esc(p.same_on_every_tier) << ".</p>\n";
  // A `profile synth` profile was computed, not captured: no capture to
  // compare with.
  const bool synthetic = profile.source.rfind("synth:", 0) == 0;
  h << "<p>Projected at ";
  h << p.clients_hi << " clients, " << p.vcpus
    << " vCPUs";
  if (p.capture_vcpus != p.vcpus) h << " (" << p.capture_vcpus << " at capture)";
  if (p.memory_bytes > 0) h << ", " << num(p.memory_bytes / 1048576.0, "%.0f") << " MiB memory";
  h << ".";
  if (p.windows > 0)
    h << " Below each of tps, ratio and latency: its lowest\u2013highest over the capture's " << p.windows
      << " windows of " << num(p.window_s) << " s, each projected alone.";
  h << "</p>\n";
  auto range = [&](const Range& r, double scale, const char* f) {
    if (p.windows == 0) return std::string();
    return "<br><span class=\"range\">" + num(r.lo * scale, f) + "\u2013" + num(r.hi * scale, f) + "</span>";
  };
  h << "<table><tr><th>tier</th><th>tps</th><th>ratio</th><th title=\"projected tps / the capture's measured "
       "tps\">vs capture</th><th>latency avg ms</th>"
       "<th>p99 ms est.</th><th>read IOPS</th><th>write IOPS</th><th>busiest</th><th>bottleneck</th>"
       "<th>time goes to</th></tr>\n";
  for (const auto& t : p.tiers) {
    h << "<tr><td>" << esc(t.tier) << "</td><td>" << num(t.tps) << range(t.tps_range, 1, "%.1f") << "</td><td>"
      << num(t.ratio, "%.2fx") << range(t.ratio_range, 1, "%.2f") << "</td><td>"
      << (p.captured_tps > 0 && !synthetic ? num(t.tps / p.captured_tps, "%.2fx") : std::string("-"))
      << "</td><td>"
      << num(t.latency_s * 1e3, "%.3f")
      << range(t.latency_range, 1e3, "%.3f") << "</td><td>" << num(t.p99_s * 1e3, "%.3f") << "</td><td>"
      << num(t.read_iops, "%.0f") << "</td><td>" << num(t.write_iops, "%.0f") << "</td><td>"
      << esc(busiest_text(t)) << "</td><td>" << esc(bottleneck_text(t)) << "</td><td class=\"left\">"
      << esc(time_split_text(t, p.cpu_modelled)) << "</td></tr>\n";
    if (t.burst_iops > 0) {
      h << "<tr><td colspan=\"11\" class=\"left note\">" << esc(t.tier) << ": burst " << num(t.burst_iops, "%.0f")
        << " IOPS ";
      if (t.after_burst.empty()) {
        h << "throughout: at the projected " << num(t.read_iops + t.write_iops, "%.0f")
          << " IOPS the credits never run out";
      } else {
        const auto& a = t.after_burst.front();
        double s = t.burst_lasts_s;
        h << "for " << (s < 120 ? num(s, "%.0f") + " s" : s < 7200 ? num(s / 60, "%.0f") + " min" : num(s / 3600, "%.1f") + " h")
          << " at the projected rate, then " << num(t.baseline_iops, "%.0f") << " IOPS baseline: " << num(a.tps)
          << " tps (" << num(a.ratio, "%.2fx") << "), latency " << num(a.latency_s * 1e3, "%.3f") << " ms";
      }
      h << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  h << "<p class=\"note\">Bottleneck: the busiest resource when it is " << num(kSaturated * 100, "%.0f")
    << "% busy or more, or a cap's bound reached; \"none\" below that.</p>\n";
  h << "<div class=\"charts\"><div><h3>Throughput against clients</h3>\n";
  clients_chart(h, p, "transactions per second", "TPS", [](const CurvePoint& c) { return c.tps; });
  h << "</div><div><h3>Mean latency against clients</h3>\n";
  clients_chart(h, p, "mean latency, ms", "Mean latency", [](const CurvePoint& c) { return c.latency_s * 1e3; });
  h << "</div></div>\n";
  legend(h, p);
  capacity_section(h, p);
  h << "<h3>Where a transaction's time goes (at " << p.clients_hi << " clients)</h3>\n";
  split_chart(h, p);
  h << "<h3>Per transaction</h3>\n<p>CPU "
    << (p.cpu_modelled ? num(p.cpu_s_per_tx * 1e3, "%.3f") + " ms" : std::string("not sampled (in other)"))
    << ", device reads "
    << num(p.reads_per_tx, "%.3f") << ", commit writes " << num(p.sync_writes_per_tx, "%.3f")
    << ", WAL flushes " << num(p.flushes_per_tx, "%.3f") << ", think time "
    << num(p.think_time_s * 1e3, "%.3f") << " ms.";
  if (!synthetic)
    h << " The model reproduces the capture at " << num(p.modelled_capture_tps) << " tps (measured "
      << num(p.captured_tps) << ").";
  h << "</p>\n";
  h << "<p class=\"note\">Closed queueing model solved by exact mean value analysis: CPU with "
       "one server per vCPU, the tier's I/O latency and parallelism, its IOPS and throughput caps "
       "as rate-limited queues, the captured think time. p99 is a gamma-fit estimate.</p>\n";
  h << "<p>" << esc(capture_tier_line(p)) << ".</p>\n";
  if (!p.notes.empty()) {
    h << "<h3>Notes</h3>\n";
    for (const auto& n : p.notes) h << "<p class=\"note\">" << esc(n) << "</p>\n";
  }
}

}  // namespace tierlab::models::html
