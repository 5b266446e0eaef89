// Simulated I/Os per second of the discrete-event simulator on one core.
//
//   tierlab_bench_sim_throughput [IOS] [TIER] [IODEPTH] [REPS]
//
// Runs a closed-loop 4 KiB randrw 70/30 pattern of IOS I/Os (default 20 M)
// through TIER (default ebs-gp3-16k) at IODEPTH (default 32), REPS times
// (default 3), and prints one line:
//
//   sim_ios_per_sec <best> median <median> ios <IOS> tier <TIER> iodepth <Q> ...
//
// Rates are I/Os per CPU second of this process, so other load on the
// machine counts less; the best of the repetitions is the least disturbed.
#include "common/clock.h"
#include "iosim/sim.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace tierlab;
  uint64_t ios = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20'000'000;
  std::string tier_name = argc > 2 ? argv[2] : "ebs-gp3-16k";
  uint32_t depth = argc > 3 ? static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)) : 32;
  int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  if (reps < 1) reps = 1;
  try {
    auto catalog = tiers::Catalog::builtin();
    iosim::ClosedLoop loop;
    loop.pattern.rw = iosim::Rw::RandRw;
    loop.pattern.rwmixread = 70;
    loop.iodepth = depth;
    loop.ios = ios;
    std::vector<double> rates;
    double simulated_iops = 0;
    for (int i = 0; i < reps; ++i) {
      const Nanos a = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
      auto r = iosim::simulate_closed(catalog.get(tier_name), loop, iosim::SimOptions{});
      double cpu = static_cast<double>(clock_ns(CLOCK_PROCESS_CPUTIME_ID) - a) / 1e9;
      rates.push_back(static_cast<double>(r.ios) / cpu);
      simulated_iops = r.iops;
    }
    std::sort(rates.begin(), rates.end());
    std::printf("sim_ios_per_sec %.0f median %.0f ios %llu tier %s iodepth %u reps %d simulated_iops %.0f\n",
                rates.back(), rates[rates.size() / 2], static_cast<unsigned long long>(ios),
                tier_name.c_str(), depth, reps, simulated_iops);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlab_bench_sim_throughput: %s\n", e.what());
    return 2;
  }
  return 0;
}
