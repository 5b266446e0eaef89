// Pieces of `tierlab capture run` that live on the capture side: the CPU
// time and limits of a server's process tree from /proc and cgroups, and the
// merge of the traces each recorder wrote into one, in timestamp order.
//
// `capture run` runs the proxy, the block recorder and a sampler at once;
// each owns its trace::Writer (a Writer is single-threaded) on a part file,
// all stamped with CLOCK_MONOTONIC. merge_traces() then interleaves the
// parts into the final trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tierlab::capture {

struct TreeCpu {
  int64_t user_ns = 0;    // utime of the tree, plus cutime of its root
  int64_t system_ns = 0;  // stime likewise
  int processes = 0;      // live processes in the tree
  std::vector<int32_t> pids;  // their pids, root first
};

// CPU time used so far by `root` and every live descendant, plus what its
// reaped children used (cutime/cstime of the root), so the sum only grows.
// Throws RuntimeError if `root` is gone.
TreeCpu process_tree_cpu(int32_t root);

// CPU time (user + system, ns) used so far by `pid` itself (all its
// threads; not its reaped children). False if it is gone.
bool process_cpu_ns(int32_t pid, int64_t& ns);

// The memory the process may use for its data and page cache: the limit of
// its cgroup's memory controller (v1 memory.limit_in_bytes or v2
// memory.max) when that is below the machine's MemTotal, else MemTotal.
double memory_limit_bytes(int32_t pid);

// CPUs the process may run on (its affinity mask).
int cpu_count(int32_t pid);

// The postmaster's pid from DATADIR/postmaster.pid. Throws InputError.
int32_t postmaster_pid_from_datadir(const std::string& datadir);

// Writes every record of `parts` into a new trace at `out`, in timestamp
// order (a k-way merge; each part is read once). The header's clock origin
// and realtime offset are the first part's. Returns records written. Throws
// like trace::Reader and trace::Writer.
uint64_t merge_traces(const std::vector<std::string>& parts, const std::string& out);

}  // namespace tierlab::capture
