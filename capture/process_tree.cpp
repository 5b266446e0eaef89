#include "capture/process_tree.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace tierlab::capture {
namespace {

// Parent pid and whether PID is a kernel thread (PF_KTHREAD in its flags).
bool read_parent(int32_t pid, int32_t& ppid, bool& kthread) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  if (!p) return false;
  long long pp = 0;
  unsigned long long flags = 0;
  if (std::sscanf(p + 1, " %*c %lld %*d %*d %*d %*d %llu", &pp, &flags) != 2) return false;
  constexpr unsigned long long kPfKthread = 0x00200000;
  ppid = int32_t(pp);
  kthread = (flags & kPfKthread) != 0;
  return true;
}

}  // namespace

ProcessTreeFilter::Verdict ProcessTreeFilter::check(int32_t pid) {
  if (pid == root_) return kTree;
  if (pid <= 0) return kKernel;  // interrupt context, the idle task
  if (auto it = known_.find(pid); it != known_.end()) return it->second;
  // Walk up to the root, init, or a process already known.
  int32_t chain[64];
  int n = 0;
  Verdict v = kOther;
  for (int32_t p = pid;;) {
    if (p == root_) {
      v = kTree;
      break;
    }
    if (auto it = known_.find(p); it != known_.end()) {
      v = it->second;
      break;
    }
    int32_t ppid = 0;
    bool kthread = false;
    if (!read_parent(p, ppid, kthread)) {
      v = p == pid ? kGone : kOther;  // an ancestor gone: reparented, not the root's
      break;
    }
    if (kthread) {
      v = kKernel;
      break;
    }
    if (n < 64) chain[n++] = p;
    if (ppid <= 1 || n == 64) break;  // reached init: not in the tree
    p = ppid;
  }
  if (v == kGone) return v;  // not kept: the pid may come back as another process
  if (known_.size() > (1u << 16)) known_.clear();
  for (int i = 0; i < n; ++i) known_[chain[i]] = v;
  return v;
}

}  // namespace tierlab::capture
