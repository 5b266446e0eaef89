#include "capture/tracefs.h"

#include "common/error.h"
#include "common/fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tierlab::capture::tracefs {

std::string read_file(const std::string& path) { return read_small_file(path); }

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void write_file(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(errno_message("tracefs: open " + path, errno));
  ssize_t n = ::write(fd, value.data(), value.size());
  int err = errno;
  ::close(fd);
  if (n != ssize_t(value.size()))
    throw RuntimeError(errno_message("tracefs: write '" + value + "' to " + path, err));
}

std::string find(const std::string& given) {
  if (!given.empty()) {
    if (::access((given + "/events").c_str(), F_OK) != 0)
      throw RuntimeError("tracefs: " + given + " is not a mounted tracefs");
    return given;
  }
  const std::string std_path = "/sys/kernel/tracing";
  if (::access((std_path + "/events").c_str(), F_OK) == 0) return std_path;
  if (::mount("nodev", std_path.c_str(), "tracefs", 0, nullptr) == 0 &&
      ::access((std_path + "/events").c_str(), F_OK) == 0)
    return std_path;
  int err = errno;
  if (::access("/sys/kernel/debug/tracing/events", F_OK) == 0) return "/sys/kernel/debug/tracing";
  throw RuntimeError(errno_message("tracefs: not mounted at " + std_path + " and mounting it failed", err));
}

uint64_t load(const uint8_t* p, const Field& f) {
  switch (f.size) {
    case 1: return p[f.offset];
    case 2: { uint16_t v; std::memcpy(&v, p + f.offset, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p + f.offset, 4); return v; }
    case 8: { uint64_t v; std::memcpy(&v, p + f.offset, 8); return v; }
    default: return 0;
  }
}

Field EventFormat::field(const std::string& name) const {
  for (const auto& [n, f] : fields)
    if (n == name) return f;
  return {};
}

EventFormat read_format(const std::string& path) {
  std::string text = read_file(path);
  if (text.empty()) throw RuntimeError("tracefs: cannot read " + path);
  EventFormat f;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("ID:", 0) == 0) {
      f.id = uint16_t(std::stoul(line.substr(3)));
      continue;
    }
    size_t fp = line.find("field:");
    if (fp == std::string::npos) continue;
    size_t semi = line.find(';', fp);
    std::string decl = line.substr(fp + 6, semi - fp - 6);
    // name: last identifier of the declaration, before any [N]
    std::string name = decl;
    if (auto br = name.find('['); br != std::string::npos) name = name.substr(0, br);
    if (auto sp = name.find_last_of(" \t"); sp != std::string::npos) name = name.substr(sp + 1);
    Field fld;
    if (auto o = line.find("offset:"); o != std::string::npos) fld.offset = std::stoi(line.substr(o + 7));
    if (auto s = line.find("size:"); s != std::string::npos) fld.size = std::stoi(line.substr(s + 5));
    f.fields.emplace_back(name, fld);
  }
  if (!f.id) throw RuntimeError("tracefs: " + path + " has no event ID");
  return f;
}

PageDecoder::PageDecoder(const std::string& tracefs) {
  // "field: u64 timestamp; offset:0; size:8", "field: local_t commit;
  // offset:8; size:8", "field: char data; offset:16".
  std::istringstream in(read_file(tracefs + "/events/header_page"));
  std::string l;
  while (std::getline(in, l)) {
    auto size_of = [&](const std::string& s) { return size_t(std::stoul(s.substr(s.find("size:") + 5))); };
    auto off_of = [&](const std::string& s) { return size_t(std::stoul(s.substr(s.find("offset:") + 7))); };
    if (l.find("local_t commit") != std::string::npos) commit_size_ = size_of(l);
    if (l.find("char data") != std::string::npos) data_off_ = off_of(l);
  }
}

int remove_stale_instances(const std::string& tracefs, const std::string& prefix) {
  int removed = 0;
  const std::string dir = tracefs + "/instances";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const std::string head = prefix + "-";
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(head, 0) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + head.size(), &end, 10);
    if (!end || *end || pid <= 0) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // its process still runs
    if (::rmdir((dir + "/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

Instance::Instance(const std::string& tracefs, const std::string& prefix, uint32_t buffer_kb) {
  remove_stale_instances(tracefs, prefix);
  path_ = tracefs + "/instances/" + prefix + "-" + std::to_string(::getpid());
  if (::mkdir(path_.c_str(), 0700) != 0 && errno != EEXIST)
    throw RuntimeError(errno_message("tracefs: creating instance " + path_, errno));
  try {
    write_file(path_ + "/trace_clock", "mono");
    write_file(path_ + "/buffer_size_kb", std::to_string(buffer_kb));
    if (::access((path_ + "/options/overwrite").c_str(), F_OK) == 0) write_file(path_ + "/options/overwrite", "0");
  } catch (...) {
    ::rmdir(path_.c_str());
    throw;
  }
  page_ = size_t(::sysconf(_SC_PAGESIZE));
  if (std::string sb = trim(read_file(path_ + "/buffer_subbuf_size_kb")); !sb.empty())
    page_ = std::max(page_, size_t(std::stoul(sb)) * 1024);
}

Instance::~Instance() {
  try {
    disable_all();
  } catch (...) {
  }
  for (int fd : fds_) ::close(fd);
  ::rmdir(path_.c_str());
}

bool Instance::has(const std::string& event) const {
  return ::access((path_ + "/events/" + event + "/format").c_str(), F_OK) == 0;
}

EventFormat Instance::format(const std::string& event) const {
  return read_format(path_ + "/events/" + event + "/format");
}

void Instance::filter(const std::string& event, const std::string& expr) {
  write_file(path_ + "/events/" + event + "/filter", expr);
}

void Instance::enable(const std::string& event) {
  write_file(path_ + "/events/" + event + "/enable", "1");
  enabled_.push_back(event);
}

void Instance::disable_all() {
  // Invariant: enabled_ holds the events still enabled.
  while (!enabled_.empty()) {
    std::string e = enabled_.back();
    enabled_.pop_back();
    write_file(path_ + "/events/" + e + "/enable", "0");
  }
}

void Instance::start() {
  long ncpu = ::sysconf(_SC_NPROCESSORS_CONF);
  for (int c = 0; c < ncpu; ++c) {
    std::string p = path_ + "/per_cpu/cpu" + std::to_string(c) + "/trace_pipe_raw";
    int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // offline CPU
    fds_.push_back(fd);
    cpus_.push_back(c);
  }
  if (fds_.empty()) throw RuntimeError("tracefs: no per_cpu/cpuN/trace_pipe_raw to read in " + path_);
  write_file(path_ + "/tracing_on", "1");
}

void Instance::wait(int ms) {
  pollfd pfds[256];
  size_t n = std::min<size_t>(fds_.size(), 256);
  for (size_t i = 0; i < n; ++i) pfds[i] = pollfd{fds_[i], POLLIN, 0};
  ::poll(pfds, n, ms);
}

int read_ring(int fd, uint8_t* buf, size_t n) { return int(::read(fd, buf, n)); }

uint64_t Instance::lost() const {
  uint64_t lost = 0;
  for (int c : cpus_) {
    std::istringstream s(read_file(path_ + "/per_cpu/cpu" + std::to_string(c) + "/stats"));
    std::string l;
    while (std::getline(s, l)) {
      auto val = [&](const char* key) -> uint64_t {
        if (l.rfind(key, 0) != 0) return 0;
        return std::stoull(l.substr(std::strlen(key)));
      };
      lost += val("overrun:") + val("dropped events:");
    }
  }
  return lost;
}

}  // namespace tierlab::capture::tracefs
