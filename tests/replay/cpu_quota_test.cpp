// The replay's default worker count under a CPU quota (replay/cpu_budget.h).
#include "replay/cpu_budget.h"


#include <catch2/catch.hpp>

#include <sched.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

using namespace tierlab::replay;

TEST_CASE("cpu quota: cgroup v2 cpu.max read as CPUs, rounded up", "[replay][cpu]") {
  CHECK(quota_cpus_v2("50000 100000\n") == 1);
  CHECK(quota_cpus_v2("100000 100000") == 1);
  CHECK(quota_cpus_v2("150000 100000\n") == 2);
  CHECK(quota_cpus_v2("400000 100000\n") == 4);
  CHECK(quota_cpus_v2("max 100000\n") == 0);
  CHECK(quota_cpus_v2("") == 0);
  CHECK(quota_cpus_v2("junk") == 0);
}

TEST_CASE("cpu quota: cgroup v1 cfs quota and period read as CPUs", "[replay][cpu]") {
  CHECK(quota_cpus_v1("50000\n", "100000\n") == 1);
  CHECK(quota_cpus_v1("250000\n", "100000\n") == 3);
  CHECK(quota_cpus_v1("-1\n", "100000\n") == 0);
  CHECK(quota_cpus_v1("", "100000") == 0);
}

TEST_CASE("cpu quota: the default is the affinity when no quota applies", "[replay][cpu]") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  // A cgroup root with no cpu files: no quota read, the affinity stands.
  const std::filesystem::path empty = std::filesystem::temp_directory_path() / "tierlab-cpuq-empty";
  std::filesystem::create_directories(empty);
  CHECK(default_cpus(empty.string()) == CPU_COUNT(&set));
  std::filesystem::remove_all(empty);
}

// Writes `text` to dir/name, making dir.
static void cpuq_write(const std::filesystem::path& dir, const char* name, const char* text) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name) << text;
}

TEST_CASE("cpu quota: half a CPU on the process's cgroup gives one worker", "[replay][cpu]") {
  // A cgroup tree of files laid out as the kernel's, at the process's own
  // cgroup paths (/proc/self/cgroup), v2 and v1 both.
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "tierlab-cpuq-half";
  std::filesystem::remove_all(root);
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  bool any = false;
  while (std::getline(self, line)) {
    const std::string path = line.substr(line.find(':', line.find(':') + 1) + 1);
    const std::string rel = path == "/" ? "" : path.substr(1);
    cpuq_write(root / rel, "cpu.max", "50000 100000\n");
    cpuq_write(root / "cpu" / rel, "cpu.cfs_quota_us", "50000\n");
    cpuq_write(root / "cpu" / rel, "cpu.cfs_period_us", "100000\n");
    any = true;
  }
  REQUIRE(any);
  CHECK(default_cpus(root.string()) == 1);
  // Two and a half CPUs: three, or the affinity when that is fewer.
  std::ifstream self2("/proc/self/cgroup");
  while (std::getline(self2, line)) {
    const std::string path = line.substr(line.find(':', line.find(':') + 1) + 1);
    const std::string rel = path == "/" ? "" : path.substr(1);
    cpuq_write(root / rel, "cpu.max", "250000 100000\n");
    cpuq_write(root / "cpu" / rel, "cpu.cfs_quota_us", "250000\n");
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  CHECK(default_cpus(root.string()) == std::min(3, CPU_COUNT(&set)));
  std::filesystem::remove_all(root);
}
