#include "common/realtime.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "common/error.h"

namespace tierlab {

CpuLatencyHold::CpuLatencyHold(bool want) {
  if (!want) return;
  fd_ = ::open("/dev/cpu_dma_latency", O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  int32_t zero = 0;
  if (::write(fd_, &zero, sizeof zero) != sizeof zero) {
    ::close(fd_);
    fd_ = -1;
  }
}

CpuLatencyHold::~CpuLatencyHold() {
  if (fd_ >= 0) ::close(fd_);
}

RealTimeScope::RealTimeScope(bool want) {
  if (!want) return;
  policy_ = sched_getscheduler(0);
  sched_getparam(0, &old_);
  sched_param p{};
  p.sched_priority = 1;
  if (sched_setscheduler(0, SCHED_FIFO, &p) != 0)
    throw RuntimeError(errno_message("real-time priority: sched_setscheduler(SCHED_FIFO) (needs root or CAP_SYS_NICE)", errno));
  on_ = true;
}

RealTimeScope::~RealTimeScope() {
  if (on_) sched_setscheduler(0, policy_, &old_);
}

bool run_as_batch_thread() {
  sched_param p{};  // SCHED_BATCH takes priority 0
  return sched_setscheduler(0, SCHED_BATCH, &p) == 0;  // 0: this thread
}

namespace {
// struct sched_attr of sched_setattr(2) (the uapi header's version clashes
// with glibc's <sched.h> over struct sched_param).
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
  uint32_t sched_util_min, sched_util_max;
};
}  // namespace

uint64_t request_short_slice(uint64_t ns) {
  SchedAttr a{};
  a.size = sizeof a;
  if (::syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) != 0) return 0;
  if (a.sched_policy != SCHED_OTHER) return 0;  // real-time or batch: leave it
  a.sched_runtime = ns;
  a.sched_flags = 0;
  if (::syscall(SYS_sched_setattr, 0, &a, 0) != 0) return 0;
  SchedAttr got{};
  if (::syscall(SYS_sched_getattr, 0, &got, sizeof got, 0) != 0) return 0;
  return got.sched_runtime;
}

void tight_timer_slack() { prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

}  // namespace tierlab
