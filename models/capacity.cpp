#include "models/capacity.h"
#include "models/fmt.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>

namespace tierlab::models {

namespace {

constexpr int kMaxClients = 100000;  // project()'s own limit

// The tier's figures a headroom is judged on: sustained, so a burst tier's
// baseline once its credits run out.
const TierProjection& sustained(const TierProjection& t) {
  return t.after_burst.empty() ? t : t.after_burst.front();
}

struct Judged {
  bool saturated = false;
  std::string by;
  double tps = 0, iops = 0, p99_s = 0;
};

std::string slo_text(double slo_s) { return "p99 over " + fmt("%g ms", slo_s * 1e3); }

ProjectOptions at_load(ProjectOptions o, const LoadConfig& cfg) {
  o.clients_lo = o.clients_hi = cfg.clients;
  o.think_s = cfg.think_s;
  return o;
}

Judged judge(const TierProjection& tp, double slo_s) {
  const TierProjection& t = sustained(tp);
  Judged j;
  j.tps = t.tps;
  j.iops = t.read_iops + t.write_iops;
  j.p99_s = t.p99_s;
  // A cap is a token bucket, not a queue: it delays nothing below its
  // rate, so it saturates only where its bound is reached.
  if (!t.bottleneck.empty() && (!t.busiest_is_cap || t.bottleneck_utilisation >= 1 - 1e-9)) {
    j.saturated = true;
    j.by = t.bottleneck;
  } else if (slo_s > 0 && t.p99_s > slo_s) {
    j.saturated = true;
    j.by = slo_text(slo_s);
  }
  return j;
}

std::string load_text(double load) { return fmt("%.3g", load) + "x"; }

}  // namespace

LoadConfig load_config(double load, int clients, double think_s, double response_s, LoadBy by) {
  if (!(load > 0) || !std::isfinite(load))
    throw InputError("load " + fmt("%g", load) + ": expected a multiple more than 0");
  LoadConfig c;
  c.clients = std::max(1, clients);
  c.think_s = std::max(0.0, think_s);
  const double cycle = c.think_s + std::max(0.0, response_s);
  if (by == LoadBy::Clients || cycle <= 0) {
    // Without a cycle to shorten (no think time, no latency), only more
    // clients give more load.
    c.clients = static_cast<int>(std::max(1.0, std::min(2.0 * kMaxClients, std::round(load * clients))));
    return c;
  }
  const double think = cycle / load - response_s;
  if (think >= 0) {
    c.think_s = think;
    return c;
  }
  // The think time is gone: each client offers 1 / R, and the rest of the
  // load takes more of them.
  c.think_s = 0;
  const double n = load * clients * response_s / cycle;
  c.clients = static_cast<int>(std::min(2.0 * kMaxClients, std::max<double>(clients, std::ceil(n - 1e-9))));
  return c;
}

void add_capacity(Projection& p, const Profile& profile, const std::vector<Tier>& tiers, const ProjectOptions& base,
                  const CapacityOptions& c) {
  p.load_by = c.by == LoadBy::Clients ? "clients" : "think";
  p.slo_p99_s = c.slo_p99_s;
  const int n = p.clients_hi;
  const double z = profile.think_time_s, r = profile.latency.mean_s;
  auto config = [&](double load) {
    LoadConfig cfg = load_config(load, n, z, r, c.by);
    if (cfg.clients > kMaxClients)
      throw InputError("load " + load_text(load) + ": needs " + std::to_string(cfg.clients) +
                       " clients, more than " + std::to_string(kMaxClients));
    return cfg;
  };
  for (double load : c.loads) {
    LoadConfig cfg = config(load);
    Projection at = project(profile, tiers, at_load(base, cfg));
    LoadPoint lp;
    lp.load = load;
    lp.clients = cfg.clients;
    lp.think_s = cfg.think_s;
    for (const auto& t : at.tiers)
      lp.tiers.push_back({t.tps, t.latency_s, t.p99_s, t.read_iops, t.write_iops, t.bottleneck,
                          t.bottleneck_utilisation});
    p.loads.push_back(std::move(lp));
  }
  if (!c.headroom) return;
  for (size_t i = 0; i < tiers.size(); ++i) {
    const Tier& tier = tiers[i];
    // Saturation at a load, or "cannot be asked" past the client limit.
    auto eval = [&](double load, bool* beyond) {
      *beyond = false;
      LoadConfig cfg = load_config(load, n, z, r, c.by);
      if (cfg.clients > kMaxClients) {
        *beyond = true;
        return Judged{};
      }
      Projection one = project(profile, {tier}, at_load(base, cfg));
      return judge(one.tiers.front(), c.slo_p99_s);
    };
    bool beyond = false;
    Judged at_one = eval(1.0, &beyond);
    double lo = 0, hi = 0;
    Judged found;
    if (at_one.saturated) {
      // Today's load already saturates it: how far below does it not?
      hi = 1;
      found = at_one;
      for (double l = 0.5; l >= 1.0 / 1024; l /= 2) {
        Judged j = eval(l, &beyond);
        if (!j.saturated) {
          lo = l;
          break;
        }
        hi = l;
        found = j;
      }
    } else {
      lo = 1;
      for (double l = 2; l <= kMaxLoad; l *= 2) {
        Judged j = eval(l, &beyond);
        if (beyond) {
          found.by = "more than " + std::to_string(kMaxClients) + " clients to offer " + load_text(l);
          break;
        }
        if (j.saturated) {
          hi = l;
          found = j;
          break;
        }
        lo = l;
      }
    }
    TierProjection& tp = p.tiers[i];
    if (hi == 0) {
      tp.headroom = std::numeric_limits<double>::infinity();
      tp.headroom_by = found.by;  // what ended the search before kMaxLoad, if anything
      continue;
    }
    while (lo > 0 && hi - lo > kHeadroomPrecision * hi) {
      double mid = std::sqrt(lo * hi);
      Judged j = eval(mid, &beyond);
      if (j.saturated) {
        hi = mid;
        found = j;
      } else {
        lo = mid;
      }
    }
    tp.headroom = hi;
    tp.headroom_by = found.by;
    tp.headroom_tps = found.tps;
    tp.headroom_iops = found.iops;
    tp.headroom_p99_s = found.p99_s;
  }
}

std::string headroom_line(const TierProjection& t) {
  if (t.headroom == 0) return t.tier + ": headroom not computed";
  if (!std::isfinite(t.headroom))
    return t.tier + ": does not saturate within " + fmt("%.0f", kMaxLoad) + "x today's load" +
           (t.headroom_by.empty() ? "" : " (searched up to " + t.headroom_by + ")");
  std::string s = t.tier + ": saturates at " + load_text(t.headroom) + " today's load (" + t.headroom_by + ")";
  if (t.headroom <= 1) s += ": today's load already saturates it";
  return s;
}

void print_capacity(std::ostream& out, const Projection& p, int width) {
  if (p.data_growth != 1)
    out << "\ndata growth " << fmt("%.3g", p.data_growth)
        << "x: every figure above and below is projected with the data that much larger (see the notes)\n";
  if (!p.loads.empty()) {
    out << "\nby load (multiples of today's arrival rate; "
        << (p.load_by == "clients" ? "the client count scaled" : "the think time shortened, then more clients")
        << "):\n";
    char line[256];
    std::snprintf(line, sizeof line, "%7s %8s %9s  %-22s %10s %11s %11s  %s\n", "load", "clients", "think ms", "tier",
                  "tps", "lat avg ms", "lat p99 ms", "bottleneck");
    out << line;
    for (const auto& lp : p.loads)
      for (size_t i = 0; i < lp.tiers.size() && i < p.tiers.size(); ++i) {
        const auto& t = lp.tiers[i];
        std::string b = t.bottleneck.empty() ? "none" : t.bottleneck + fmt(" %.0f%%", t.bottleneck_utilisation * 100);
        std::snprintf(line, sizeof line, "%7s %8d %9.3f  %-22s %10.1f %11.3f %11.3f  %s\n",
                      i == 0 ? load_text(lp.load).c_str() : "", lp.clients, lp.think_s * 1e3, p.tiers[i].tier.c_str(),
                      t.tps, t.latency_s * 1e3, t.p99_s * 1e3, b.c_str());
        out << line;
      }
  }
  bool any = false;
  for (const auto& t : p.tiers) any = any || t.headroom != 0;
  if (any) {
    out << "\nheadroom (the load at which a tier saturates: its CPU or storage " << fmt("%.0f%%", kSaturated * 100)
        << " busy or more, a cap's bound reached" << (p.slo_p99_s > 0 ? ", or " + slo_text(p.slo_p99_s) : "")
        << "):\n";
    for (const auto& t : p.tiers) out << "  " << headroom_line(t) << "\n";
  }
  // TPS against load, one letter per tier, where the terminal is wide
  // enough for a plot worth reading.
  constexpr int kRows = 8, kLeft = 10;
  if (p.loads.size() < 2 || width < 40 || p.tiers.empty()) return;
  const int cols = std::min(72, width - kLeft - 2);
  double lmin = p.loads.front().load, lmax = lmin, tmax = 0;
  for (const auto& lp : p.loads) {
    lmin = std::min(lmin, lp.load);
    lmax = std::max(lmax, lp.load);
    for (const auto& t : lp.tiers) tmax = std::max(tmax, t.tps);
  }
  if (tmax <= 0 || lmax <= lmin) return;
  std::vector<std::string> grid(kRows, std::string(static_cast<size_t>(cols), ' '));
  for (const auto& lp : p.loads)
    for (size_t i = 0; i < lp.tiers.size(); ++i) {
      int x = static_cast<int>(std::lround((lp.load - lmin) / (lmax - lmin) * (cols - 1)));
      int y = static_cast<int>(std::lround(lp.tiers[i].tps / tmax * (kRows - 1)));
      char& cell = grid[static_cast<size_t>(kRows - 1 - y)][static_cast<size_t>(x)];
      const char mark = static_cast<char>('a' + static_cast<int>(i % 26));
      cell = cell == ' ' || cell == mark ? mark : '*';
    }
  out << "\ntps against load (";
  for (size_t i = 0; i < p.tiers.size(); ++i)
    out << (i ? ", " : "") << static_cast<char>('a' + static_cast<int>(i % 26)) << " " << p.tiers[i].tier;
  out << "; * several):\n";
  for (int row = 0; row < kRows; ++row) {
    std::string label = row == 0 ? fmt("%.0f", tmax) : row == kRows - 1 ? "0" : "";
    out << std::string(static_cast<size_t>(std::max(0, kLeft - 1 - static_cast<int>(label.size()))), ' ') << label
        << " |" << grid[static_cast<size_t>(row)] << "\n";
  }
  out << std::string(kLeft, ' ') << '+' << std::string(static_cast<size_t>(cols), '-') << "\n";
  std::string lo = load_text(lmin), hi = load_text(lmax);
  out << std::string(kLeft + 1, ' ') << lo
      << std::string(static_cast<size_t>(std::max(1, cols - static_cast<int>(lo.size() + hi.size()))), ' ') << hi
      << "  load\n";
}

}  // namespace tierlab::models
