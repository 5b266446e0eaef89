// Which processes' I/O a tracefs recorder keeps: a root process, its
// descendants and kernel threads (capture/block.h, capture/file_io.h).
#pragma once

#include <cstdint>
#include <unordered_map>

namespace tierlab::capture {

// /proc/PID/stat is read once per pid (and its ancestors) and the answer
// kept, so a process forked after the start is found when its first I/O
// is, and the lookups cost nothing once the server's processes are known.
// A pid reused within the capture keeps its first answer. A thread id
// answers by its process's parent, so threads of a descendant are in the
// tree and the root's own threads (but its first) are not.
class ProcessTreeFilter {
 public:
  enum Verdict : uint8_t { kTree, kKernel, kOther, kGone };
  // root 0: inactive (every process is kept).
  explicit ProcessTreeFilter(int32_t root) : root_(root) {}
  bool active() const { return root_ > 0; }
  // kGone: the process exited before it could be looked up.
  Verdict check(int32_t pid);

 private:
  int32_t root_;
  std::unordered_map<int32_t, Verdict> known_;
};

}  // namespace tierlab::capture
