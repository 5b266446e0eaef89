// The replay's default worker count (replay/cpu_budget.h).
#include "replay/cpu_budget.h"

#include "common/fd.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <thread>

namespace tierlab::replay {
namespace {

bool parse_i64(std::string_view s, long long* v) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

int cpus_of(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::max<long long>(1, (quota + period - 1) / period));
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The least quota on the way from `dir` up to `root` (a parent's quota
// holds its children too); 0 when none.
int least_quota(const std::string& root, std::string dir, bool v2) {
  int least = 0;
  for (;;) {
    const std::string d = root + dir;
    const int q = v2 ? quota_cpus_v2(read_small_file(d + "/cpu.max"))
                     : quota_cpus_v1(read_small_file(d + "/cpu.cfs_quota_us"), read_small_file(d + "/cpu.cfs_period_us"));
    if (q > 0) least = least == 0 ? q : std::min(least, q);
    if (dir.empty() || dir == "/") return least;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
}

}  // namespace

int quota_cpus_v2(std::string_view cpu_max) {
  const size_t sp = cpu_max.find(' ');
  if (sp == std::string_view::npos) return 0;
  long long quota, period;
  if (!parse_i64(cpu_max.substr(0, sp), &quota) || !parse_i64(cpu_max.substr(sp + 1), &period)) return 0;
  return cpus_of(quota, period);
}

int quota_cpus_v1(std::string_view quota, std::string_view period) {
  long long q, p;
  if (!parse_i64(quota, &q) || !parse_i64(period, &p)) return 0;
  return cpus_of(q, p);
}

int default_cpus(const std::string& cgroup_root) {
  const int q = cgroup_quota_cpus(cgroup_root);
  return std::max(1, q > 0 ? std::min(affinity_cpus(), q) : affinity_cpus());
}

int cgroup_quota_cpus(const std::string& cgroup_root) {
  int least = 0;
  // /proc/self/cgroup: "0::/path" (v2) or "N:cpu,cpuacct:/path" (v1).
  std::istringstream lines(read_small_file("/proc/self/cgroup"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    int q = 0;
    if (ctrls.empty()) {
      q = least_quota(cgroup_root, path == "/" ? "" : path, true);
    } else {
      std::istringstream names(ctrls);
      std::string n;
      bool cpu = false;
      while (std::getline(names, n, ',')) cpu = cpu || n == "cpu";
      if (!cpu) continue;
      // The v1 hierarchy is mounted as cpu, or cpu,cpuacct.
      for (const char* m : {"/cpu", "/cpu,cpuacct"}) {
        q = least_quota(cgroup_root + m, path == "/" ? "" : path, false);
        if (q > 0) break;
      }
    }
    if (q > 0) least = least == 0 ? q : std::min(least, q);
  }
  return least;
}

}  // namespace tierlab::replay
