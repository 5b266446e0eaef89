#include "common/realtime.h"

#include <fcntl.h>
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
    throw RuntimeError(errno_message("--rt: sched_setscheduler(SCHED_FIFO) (needs root or CAP_SYS_NICE)", errno));
  on_ = true;
}

RealTimeScope::~RealTimeScope() {
  if (on_) sched_setscheduler(0, policy_, &old_);
}

bool run_as_batch_thread() {
  sched_param p{};  // SCHED_BATCH takes priority 0
  return sched_setscheduler(0, SCHED_BATCH, &p) == 0;  // 0: this thread
}

}  // namespace tierlab
