// Simulated I/Os per second of the discrete-event simulator on one core.
//
//   tierlab_bench_sim_throughput [IOS] [TIER] [IODEPTH]
//
// Runs a closed-loop 4 KiB randrw 70/30 pattern of IOS I/Os (default 20 M)
// through TIER (default ebs-gp3-16k) at IODEPTH (default 32) and prints one
// line: "sim_ios_per_sec <N> ios <IOS> tier <TIER> ..." where N is I/Os per CPU
// second of the simulation.
#include "iosim/sim.h"

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  using namespace tierlab;
  uint64_t ios = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20'000'000;
  std::string tier_name = argc > 2 ? argv[2] : "ebs-gp3-16k";
  uint32_t depth = argc > 3 ? static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)) : 32;
  try {
    auto catalog = models::Catalog::builtin();
    iosim::ClosedLoop loop;
    loop.pattern.rw = iosim::Rw::RandRw;
    loop.pattern.rwmixread = 70;
    loop.iodepth = depth;
    loop.ios = ios;
    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    auto r = iosim::simulate_closed(catalog.get(tier_name), loop, iosim::SimOptions{});
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    // Per CPU second of this process: other load on the machine does not count.
    std::printf(
        "sim_ios_per_sec %.0f ios %llu tier %s iodepth %u cpu_s %.3f wall_s %.3f simulated_iops %.0f\n",
        static_cast<double>(r.ios) / cpu, static_cast<unsigned long long>(r.ios), tier_name.c_str(),
        depth, cpu, wall, r.iops);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlab_bench_sim_throughput: %s\n", e.what());
    return 2;
  }
  return 0;
}
