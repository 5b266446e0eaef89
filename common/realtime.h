// Scheduling aids for runs that keep deadlines (timed replay, open-loop and
// tier-shaped I/O): a hold on the CPUs' wake-up latency and a real-time
// priority scope; and, for threads that only watch a workload, a way to
// stay out of its way.
#pragma once

#include <sched.h>

#include <cstdint>

namespace tierlab {

// Holds the CPU wake-up latency limit (PM QoS, /dev/cpu_dma_latency) at
// 0 us while alive, as cyclictest does: idle CPUs then stay in states they
// leave at once (on a virtual machine: they poll instead of halting the
// vCPU), so a timer or a completion interrupt reaches the waiting thread
// within microseconds rather than the hundreds a halted vCPU takes. The
// kernel drops the limit when the descriptor closes. Without write access
// (not root) nothing is held and held() is false.
class CpuLatencyHold {
 public:
  explicit CpuLatencyHold(bool want);
  ~CpuLatencyHold();
  CpuLatencyHold(const CpuLatencyHold&) = delete;
  CpuLatencyHold& operator=(const CpuLatencyHold&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// While alive, the calling thread runs at SCHED_FIFO 1 (when `want`);
// threads it creates inherit that (glibc's default PTHREAD_INHERIT_SCHED).
// Its old policy is restored at the end of the scope. Throws RuntimeError
// when the priority cannot be had (needs root or CAP_SYS_NICE).
class RealTimeScope {
 public:
  explicit RealTimeScope(bool want);
  ~RealTimeScope();
  RealTimeScope(const RealTimeScope&) = delete;
  RealTimeScope& operator=(const RealTimeScope&) = delete;

 private:
  bool on_ = false;
  int policy_ = SCHED_OTHER;
  sched_param old_{};
};

// Puts the calling thread in SCHED_BATCH. It keeps its fair share of the
// CPUs, but when it wakes it no longer preempts the thread running on a CPU:
// it runs when that thread blocks or at the next scheduler tick. For
// threads that record a workload without being in its path (the passive
// capture's packet reader, the proxy's trace writer): their work waits in a
// buffer (the kernel's packet ring, the proxy's record rings) for a few
// milliseconds instead of cutting into a server backend or a client mid-
// transaction. Returns false, changing nothing, when the kernel refuses.
bool run_as_batch_thread();

// Asks the scheduler for a short time slice for the calling thread (EEVDF's
// per-task slice, sched_attr.sched_runtime of a SCHED_OTHER thread, Linux
// 6.12 and later; the kernel clamps it to 0.1-100 ms). A task with a shorter
// slice has an earlier virtual deadline, so when it wakes it preempts a
// thread on the default slice (which grows with the CPU count: 1.4 ms on
// 2 CPUs) instead of queueing behind it: a timed
// sender's wake-ups reach the CPU sooner without real-time priority and
// without taking more than its fair share. Returns the slice the kernel
// reports afterwards in ns, 0 when it has none to give (older kernels).
uint64_t request_short_slice(uint64_t ns);

// The shortest slice the kernel gives (request_short_slice clamps to it).
constexpr uint64_t kShortestSliceNs = 100'000;

// Sets the calling thread's timer slack to 1 ns: the default 50 us would be
// added to every timed wake-up of a thread that keeps deadlines.
void tight_timer_slack();

}  // namespace tierlab
