#include "capture/run.h"

#include "common/error.h"
#include "trace/merge.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <unordered_map>

namespace tierlab::capture {

namespace {

struct Stat {
  int32_t ppid = 0;
  uint64_t utime = 0, stime = 0, cutime = 0, cstime = 0;  // clock ticks
};

bool read_stat(int32_t pid, Stat& out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The command name may hold spaces and parentheses: fields restart after
  // the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p) return false;
  char state;
  long long ppid;
  unsigned long long ut, st;
  long long cut, cst;
  int got = std::sscanf(p + 1, " %c %lld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
                        &state, &ppid, &ut, &st, &cut, &cst);
  if (got != 6) return false;
  out.ppid = static_cast<int32_t>(ppid);
  out.utime = ut;
  out.stime = st;
  out.cutime = static_cast<uint64_t>(cut < 0 ? 0 : cut);
  out.cstime = static_cast<uint64_t>(cst < 0 ? 0 : cst);
  return true;
}

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

double mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key) {
    if (key == "MemTotal:") {
      f >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(f, rest);
  }
  return 0;
}

}  // namespace

TreeCpu process_tree_cpu(int32_t root) {
  Stat rs;
  if (!read_stat(root, rs))
    throw RuntimeError("process " + std::to_string(root) + " is gone (reading /proc/" +
                       std::to_string(root) + "/stat)");
  std::unordered_map<int32_t, Stat> all;
  std::unordered_multimap<int32_t, int32_t> children;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (!end || *end || pid <= 0) continue;
      Stat s;
      if (!read_stat(static_cast<int32_t>(pid), s)) continue;
      all.emplace(static_cast<int32_t>(pid), s);
      children.emplace(s.ppid, static_cast<int32_t>(pid));
    }
    closedir(d);
  }
  const double tick_ns = 1e9 / static_cast<double>(sysconf(_SC_CLK_TCK));
  uint64_t ut = rs.utime + rs.cutime, st = rs.stime + rs.cstime;
  int procs = 1;
  TreeCpu out;
  out.pids.push_back(root);
  std::vector<int32_t> stack{root};
  while (!stack.empty()) {
    int32_t p = stack.back();
    stack.pop_back();
    auto range = children.equal_range(p);
    for (auto it = range.first; it != range.second; ++it) {
      const Stat& c = all[it->second];
      ut += c.utime;
      st += c.stime;
      ++procs;
      out.pids.push_back(it->second);
      stack.push_back(it->second);
    }
  }
  out.user_ns = static_cast<int64_t>(static_cast<double>(ut) * tick_ns);
  out.system_ns = static_cast<int64_t>(static_cast<double>(st) * tick_ns);
  out.processes = procs;
  return out;
}

bool process_cpu_ns(int32_t pid, int64_t& ns) {
  Stat s;
  if (!read_stat(pid, s)) return false;
  ns = static_cast<int64_t>(static_cast<double>(s.utime + s.stime) * 1e9 / static_cast<double>(sysconf(_SC_CLK_TCK)));
  return true;
}

double memory_limit_bytes(int32_t pid) {
  double total = mem_total_bytes();
  double limit = std::numeric_limits<double>::infinity();
  std::ifstream f("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // "4:memory:/tierlab" (v1) or "0::/user.slice" (v2).
    auto a = line.find(':');
    auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string value;
    if (ctrl.find("memory") != std::string::npos)
      value = read_first_line("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
    else if (ctrl.empty()) {
      value = read_first_line("/sys/fs/cgroup" + path + "/memory.max");
      if (value.empty()) value = read_first_line("/sys/fs/cgroup/unified" + path + "/memory.max");
    }
    if (value.empty() || value == "max") continue;
    double v = std::strtod(value.c_str(), nullptr);
    if (v > 0 && v < limit) limit = v;
  }
  if (total > 0 && limit < total) return limit;
  return total;
}

int cpu_count(int32_t pid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(pid, sizeof set, &set) != 0) return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return CPU_COUNT(&set);
}

int32_t postmaster_pid_from_datadir(const std::string& datadir) {
  std::string path = datadir + "/postmaster.pid";
  std::string line = read_first_line(path);
  char* end = nullptr;
  long pid = std::strtol(line.c_str(), &end, 10);
  if (line.empty() || pid <= 0 || (end && *end))
    throw InputError(path + ": no postmaster pid (is the server running, and readable by this user?)");
  return static_cast<int32_t>(pid);
}

uint64_t merge_traces(const std::vector<std::string>& parts, const std::string& out) {
  std::vector<std::unique_ptr<trace::Reader>> readers;
  for (const auto& p : parts) readers.push_back(trace::open_reader(p));
  trace::WriterOptions wo;
  if (!readers.empty()) {
    wo.start_mono_ns = readers.front()->header().start_mono_ns;
    wo.realtime_offset_ns = readers.front()->header().realtime_offset_ns;
  }
  auto writer = trace::open_writer(out, wo);
  trace::interleave(readers, *writer);
  writer->close();
  return writer->records_written();
}

}  // namespace tierlab::capture
