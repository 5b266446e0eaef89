// Capacity plans: a projection at multiples of today's load, and each
// tier's headroom.
//
// A load multiple L offers L times the arrival rate of the projected
// clients (--clients, else the captured ones) as the capture ran it:
// clients that took Z of think time and R of response time per cycle
// arrive N / (Z + R) times a second. By think time (the default) the
// clients stay and think less, Z' = (Z + R) / L - R; once that is below
// zero the think time is gone and the rest comes from more clients,
// N' = L N R / (Z + R), rounded up. By clients the population is scaled,
// N' = L N rounded (at least 1), with the captured think time. R is the
// capture's mean latency, the same for every tier: the load is the
// workload's, and each tier answers it with its own response time.
//
// The headroom of a tier is the lowest load multiple at which it
// saturates: its busiest station kSaturated busy or more, a cap's bound
// reached (a token bucket delays nothing below its rate, so a cap 90% used
// is not yet saturated), or (with an SLO) its p99 estimate above it. Saturation grows
// with load, so it is found by doubling from 1 (halving when today's load
// already saturates) and bisection to kHeadroomPrecision.
#pragma once

#include "models/profile.h"
#include "models/project.h"
#include "tiers/tiers.h"

#include <string>
#include <vector>

namespace tierlab::models {

enum class LoadBy { Think, Clients };

// Highest load multiple searched for a headroom, and the relative
// precision the headroom is found to.
inline constexpr double kMaxLoad = 1000;
inline constexpr double kHeadroomPrecision = 0.005;

struct LoadConfig {
  int clients = 1;
  double think_s = 0;
};

// The population and think time at load multiple `load` (> 0) of `clients`
// clients with think time `think_s` whose transactions took `response_s`.
LoadConfig load_config(double load, int clients, double think_s, double response_s, LoadBy by);

struct CapacityOptions {
  std::vector<double> loads;  // multiples to tabulate; empty: none
  LoadBy by = LoadBy::Think;
  double slo_p99_s = 0;       // 0: saturation only
  bool headroom = true;
};

// Adds to `p` (project(profile, tiers, base)) the figures at each load
// multiple and every tier's headroom. Throws InputError for a load that is
// not a positive number or needs more than 100000 clients.
void add_capacity(Projection& p, const Profile& profile, const std::vector<Tier>& tiers, const ProjectOptions& base,
                  const CapacityOptions& c);

// "rds-16k: saturates at 1.7x today's load (read IOPS cap)".
std::string headroom_line(const TierProjection& t);

// The load table, the headroom lines and, `width` columns allowing, a text
// plot of TPS against load per tier.
void print_capacity(std::ostream& out, const Projection& p, int width);

}  // namespace tierlab::models
