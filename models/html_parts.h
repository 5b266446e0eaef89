// Pieces the report's HTML sections share (private to models/): escaping,
// numbers, axes, the series' colours, dashes and markers.
#pragma once

#include "models/profile.h"
#include "models/project.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>

namespace tierlab::models::html {

inline const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

inline std::string esc(const std::string& s) {
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

inline std::string num(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A "nice" axis maximum and tick step for values up to `v`: the smallest of
// 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10 x a power of ten that holds v, so
// that the data fills most of the chart.
inline std::pair<double, double> axis(double v) {
  if (v <= 0) return {1, 0.2};
  double mag = std::pow(10.0, std::floor(std::log10(v)));
  static const std::pair<double, double> kNice[] = {{1, 0.2},  {1.2, 0.2}, {1.5, 0.5}, {2, 0.5},
                                                    {2.5, 0.5}, {3, 0.5},  {4, 1},     {5, 1},
                                                    {6, 1},    {8, 2},    {10, 2}};
  for (auto [m, step] : kNice)
    if (m * mag >= v * (1 - 1e-12)) return {m * mag, step * mag};
  return {10 * mag, 2 * mag};
}

// Dash patterns and marker shapes, so that curves that coincide stay
// visible: each series differs from the others in colour, dash and marker.
inline const char* const kDashes[] = {"", "8 4", "2 3", "10 3 2 3", "5 5", "1 4", "12 6", "6 2 2 2 2 2"};

inline void marker(std::ostringstream& h, size_t i, double x, double y, const char* col) {
  char b[320];
  switch (i % 4) {
    case 0:
      std::snprintf(b, sizeof b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"/>", x, y, col);
      break;
    case 1:
      std::snprintf(b, sizeof b, "<rect x=\"%.2f\" y=\"%.2f\" width=\"7\" height=\"7\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>",
                    x - 3.5, y - 3.5, col);
      break;
    case 2:
      std::snprintf(b, sizeof b, "<path d=\"M%.2f %.2fl4 7h-8z\" fill=\"%s\"/>", x, y - 4.5, col);
      break;
    default:
      std::snprintf(b, sizeof b, "<path d=\"M%.2f %.2fl4.5 4.5l-4.5 4.5l-4.5 -4.5z\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>",
                    x, y - 4.5, col);
  }
  h << b;
}

// The projection's sections: the tiers table, the charts against clients,
// capacity (loads and headroom), the time split, per transaction, notes.
void projection_sections(std::ostringstream& h, const Projection& p, const Profile& profile);

}  // namespace tierlab::models::html
