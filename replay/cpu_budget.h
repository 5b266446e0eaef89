// How many CPUs a replay may use by default: the CPUs the process may run
// on (its affinity mask), capped by its cgroup's CPU quota (cgroup v2
// cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up. A replayer
// held to half a CPU runs one worker, not two taking turns on half a CPU.
#pragma once

#include <string>
#include <string_view>

namespace tierlab::replay {

// The CPUs a quota allows, rounded up (at least 1); 0 when there is none
// ("max", a negative v1 quota, or text that is not a quota).
// v2: `cpu_max` is cpu.max's text ("QUOTA PERIOD" or "max PERIOD").
int quota_cpus_v2(std::string_view cpu_max);
// v1: cpu.cfs_quota_us's and cpu.cfs_period_us's texts.
int quota_cpus_v1(std::string_view quota, std::string_view period);

// The least CPU quota on the process's cgroup and its ancestors, in CPUs
// rounded up, read under `cgroup_root` with /proc/self/cgroup's paths; 0
// when none applies.
int cgroup_quota_cpus(const std::string& cgroup_root = "/sys/fs/cgroup");

// The default worker count: affinity, capped by the quota of the process's
// cgroup (and its ancestors'), read under `cgroup_root` (/sys/fs/cgroup)
// with /proc/self/cgroup's paths. Never below 1.
int default_cpus(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace tierlab::replay
