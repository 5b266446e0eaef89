// The machine's timer wake-up floor: how late a thread that sleeps until a
// deadline runs again, set up as a timed replay's worker is (cpu_dma_latency
// held at 0 when root, 1 ns timer slack, the 0.1 ms scheduler slice), as
// cyclictest measures it.
//
//   tierlab_bench_wake_latency [PERIOD_US] [COUNT]
//
// Sleeps COUNT times (default 5000) until deadlines PERIOD_US apart
// (default 1000) and prints one line:
//
//   wake_latency_ms p50 <X> p99 <X> p999 <X> max <X> sleeps <N> period_us <P> held <0|1>
//
// No schedule can be kept more closely than this on an idle machine: a
// replay's schedule lag p99 below the p99 here is out of any client's reach.
#include "common/clock.h"
#include "common/histogram.h"
#include "common/realtime.h"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  using namespace tierlab;
  long period_us = argc > 1 ? std::atol(argv[1]) : 1000;
  long count = argc > 2 ? std::atol(argv[2]) : 5000;
  if (period_us < 1 || count < 1) {
    std::fprintf(stderr, "usage: tierlab_bench_wake_latency [PERIOD_US >= 1] [COUNT >= 1]\n");
    return 2;
  }
  CpuLatencyHold hold(true);
  tight_timer_slack();
  request_short_slice(kShortestSliceNs);  // as replay's kWorkerSliceNs
  Histogram late;  // the replay's own, as its lag figures come from
  Nanos due = now_ns();
  for (long i = 0; i < count; ++i) {
    due += period_us * 1000;
    sleep_until_ns(due);
    late.record(now_ns() - due);
  }
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::printf("wake_latency_ms p50 %.3f p99 %.3f p999 %.3f max %.3f sleeps %ld period_us %ld held %d\n",
              ms(late.quantile(0.5)), ms(late.quantile(0.99)), ms(late.quantile(0.999)), ms(late.max()), count,
              period_us, hold.held() ? 1 : 0);
  return 0;
}
