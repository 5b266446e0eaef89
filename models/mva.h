// Exact mean value analysis of a single-class closed queueing network
// (private to models/).
//
// Stations:
//   Delay   — infinite servers: residence time = demand (think time, a
//             device's fixed latency when it serves requests in parallel).
//   Queue   — one FCFS/PS server: R = D (1 + Q(n-1)).
//   Multi   — m identical servers (the CPU with m vcpus, a tier's
//             parallelism), solved exactly with load-dependent MVA (Reiser &
//             Lavenberg; Bolch et al. "Queueing Networks and Markov Chains"
//             §8.2):
//               R(n)   = D/m [1 + Q(n-1) + sum_{j=0}^{m-2} (m-1-j) p(j|n-1)]
//               p(j|n) = X(n) D / j * p(j-1|n-1)        for j = 1..m-1
//               p(0|n) = p(0|n-1) X(n) / X_c(n)
//             where p(j|n) is the probability of j customers at the station
//             with n in the network (only j < m is needed) and X_c(n) the
//             throughput of the complementary network, the same network
//             without this station (solved alongside, recursively). The
//             textbook p(0|n) = 1 - [X(n) D + sum (m-j) p(j|n)] / m subtracts
//             nearly equal numbers and loses all its digits near saturation
//             once m is above about 8; this form only multiplies positive
//             numbers (p(0|n) = G_c(n) / G(n) with G the normalising
//             constants), so it stays exact for any m and n.
//   Cycle   — a delay whose residence time depends on the network's
//             throughput: R = residence(X, n), non-decreasing in X (a WAL
//             flush cycle that the commits arriving during it share: the
//             faster they arrive, the more share one flush and the longer a
//             commit waits for the cycle in progress). At each population the
//             other stations' residence times come from Q(n-1) as usual and
//             X solves n = X (sum of those + sum of the Cycle stations'
//             R(X, n)) by bisection: an approximate MVA step, exact when the
//             residence function is constant.
//
// Populations n = 1..N are solved in one pass; each step is O(K*m), plus
// the bisection's evaluations of the Cycle stations. A network with L
// multi-server stations (m > 1) also solves its complementary networks: for
// L = 2 (CPU and storage) five passes in all.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::models {

enum class StationKind { Delay, Queue, Multi, Cycle };

struct Station {
  Station() = default;
  Station(std::string n, StationKind k, double demand, int m = 1,
          std::function<double(double x, int n)> r = {})
      : name(std::move(n)), kind(k), demand_s(demand), servers(m), residence(std::move(r)) {}

  std::string name;
  StationKind kind = StationKind::Queue;
  double demand_s = 0;  // service demand per transaction, seconds
  int servers = 1;      // Multi only
  // Cycle only: residence time at throughput x with n in the network;
  // non-decreasing in x, may be +infinity (a rate the station cannot carry).
  std::function<double(double x, int n)> residence;
};

struct MvaPoint {
  int n = 0;
  double throughput = 0;            // transactions per second
  double response_s = 0;            // sum of residence times, excluding Delay stations
                                    // named in `think` (see solve_mva)
  std::vector<double> residence_s;  // per station
  std::vector<double> queue;        // mean customers per station
  std::vector<double> utilisation;  // per server, in [0, 1]; 0 for Delay
  int bottleneck = -1;              // station with the highest utilisation
};

// Solves the network for n = 1..max_n. `think_station` is the index of the
// station whose residence time is the clients' think time (excluded from
// response_s), or -1. Throws std::invalid_argument on negative demands,
// a Cycle station without a residence function, or max_n < 1.
std::vector<MvaPoint> solve_mva(const std::vector<Station>& stations, int max_n,
                                int think_station = -1);

}  // namespace tierlab::models
