// The projection as one self-contained HTML page: inline CSS and SVG only,
// no scripts, no fonts or images from anywhere.
#include "models/project.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tierlab::models {

namespace {

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A "nice" axis maximum and tick step for values up to `v`.
std::pair<double, double> axis(double v) {
  if (v <= 0) return {1, 0.2};
  double mag = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= v) return {m * mag, m * mag / 5};
  return {10 * mag, 2 * mag};
}

void tps_chart(std::ostringstream& h, const Projection& p) {
  const double W = 720, H = 360, L = 70, R = 170, T = 20, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  int n_hi = p.clients_hi;
  double ymax = 0;
  for (const auto& t : p.tiers)
    for (const auto& c : t.curve) ymax = std::max(ymax, c.tps);
  auto [ytop, ystep] = axis(ymax * 1.05);
  auto [xtop, xstep] = axis(n_hi);
  if (n_hi <= 10) {
    xtop = std::max(1, n_hi);
    xstep = 1;
  }
  auto X = [&](double n) { return L + pw * n / xtop; };
  auto Y = [&](double v) { return T + ph * (1 - v / ytop); };
  h << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\" role=\"img\" aria-label=\"TPS against clients per tier\">\n";
  h << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  for (double y = 0; y <= ytop + 1e-9; y += ystep) {
    h << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 8 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\" class=\"tick\">" << num(y, "%.0f") << "</text>\n";
  }
  for (double x = 0; x <= xtop + 1e-9; x += xstep)
    h << "<text x=\"" << X(x) << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\" class=\"tick\">"
      << num(x, "%.0f") << "</text>\n";
  h << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\">clients</text>\n";
  h << "<text transform=\"translate(16 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
       "transactions per second</text>\n";
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const auto& t = p.tiers[i];
    const char* col = kColours[i % 10];
    h << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\" points=\"" << X(0) << ","
      << Y(0);
    for (const auto& c : t.curve) h << " " << num(X(c.clients), "%.2f") << "," << num(Y(c.tps), "%.2f");
    h << "\"/>\n";
    const auto& last = t.curve.back();
    h << "<circle cx=\"" << X(last.clients) << "\" cy=\"" << Y(last.tps) << "\" r=\"3\" fill=\"" << col
      << "\"/>\n";
    double ly = T + 14 + 20 * static_cast<double>(i);
    h << "<line x1=\"" << L + pw + 12 << "\" x2=\"" << L + pw + 32 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << col << "\" stroke-width=\"3\"/><text x=\""
      << L + pw + 38 << "\" y=\"" << ly << "\">" << esc(t.tier) << "</text>\n";
  }
  h << "</svg>\n";
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
    lx += 40 + 7.0 * static_cast<double>(std::string(part.name).size());
  }
  h << "</svg>\n";
}

}  // namespace

std::string projection_html(const Projection& p, const Profile& profile) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<title>tierlab projection: "
    << esc(p.source) << "</title>\n<style>\n"
       "body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;"
       "margin:2em auto;max-width:780px;color:#222}\n"
       "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.8em}\n"
       "table{border-collapse:collapse;font-size:.9em}th,td{padding:4px 10px;text-align:right;"
       "border-bottom:1px solid #ddd}th:first-child,td:first-child{text-align:left}\n"
       "svg{font-size:12px;display:block;margin:.5em 0}.tick{fill:#555;font-size:11px}\n"
       ".note{color:#555;font-size:.85em}code{background:#f3f3f3;padding:0 3px}\n"
       "</style></head><body>\n";
  h << "<h1>What this workload would do on other storage tiers</h1>\n";
  h << "<p>Trace <code>" << esc(p.source) << "</code>: " << profile.transactions
    << " transactions in " << num(profile.duration_s) << " s (" << num(profile.tps)
    << " tps measured), " << profile.templates.size() << " transaction templates, "
    << profile.clients << " clients. Projected at " << p.clients_hi << " clients, " << p.vcpus
    << " vCPUs";
  if (p.capture_vcpus != p.vcpus) h << " (" << p.capture_vcpus << " at capture)";
  if (p.memory_bytes > 0) h << ", " << num(p.memory_bytes / 1048576.0, "%.0f") << " MiB memory";
  h << ".</p>\n";
  h << "<table><tr><th>tier</th><th>tps</th><th>ratio</th><th>latency avg ms</th>"
       "<th>p99 ms (est.)</th><th>read IOPS</th><th>write IOPS</th><th>busiest</th><th>bottleneck</th></tr>\n";
  for (const auto& t : p.tiers)
    h << "<tr><td>" << esc(t.tier) << "</td><td>" << num(t.tps) << "</td><td>" << num(t.ratio, "%.2fx")
      << "</td><td>" << num(t.latency_s * 1e3, "%.3f") << "</td><td>" << num(t.p99_s * 1e3, "%.3f")
      << "</td><td>" << num(t.read_iops, "%.0f") << "</td><td>" << num(t.write_iops, "%.0f")
      << "</td><td>" << esc(busiest_text(t)) << "</td><td>" << esc(bottleneck_text(t)) << "</td></tr>\n";
  h << "</table>\n";
  h << "<h2>Throughput against clients</h2>\n";
  tps_chart(h, p);
  h << "<h2>Where a transaction's time goes (at " << p.clients_hi << " clients)</h2>\n";
  split_chart(h, p);
  h << "<h2>Per transaction</h2>\n<p>CPU "
    << (p.cpu_modelled ? num(p.cpu_s_per_tx * 1e3, "%.3f") + " ms" : std::string("not sampled (in other)"))
    << ", device reads "
    << num(p.reads_per_tx, "%.3f") << ", commit writes " << num(p.sync_writes_per_tx, "%.3f")
    << ", WAL flushes " << num(p.flushes_per_tx, "%.3f") << ", think time "
    << num(p.think_time_s * 1e3, "%.3f") << " ms. The model reproduces the capture at "
    << num(p.modelled_capture_tps) << " tps (measured " << num(p.captured_tps) << ").</p>\n";
  h << "<p class=\"note\">Closed queueing model solved by exact mean value analysis: CPU with "
       "one server per vCPU, the tier's I/O latency and parallelism, its IOPS and throughput caps "
       "as rate-limited queues, the captured think time. p99 is a gamma-fit estimate.</p>\n";
  for (const auto& n : p.notes) h << "<p class=\"note\">note: " << esc(n) << "</p>\n";
  h << "</body></html>\n";
  return h.str();
}

}  // namespace tierlab::models
