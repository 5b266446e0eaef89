#include "capture/file_io.h"

#include "capture/probe_table.h"
#include "capture/process_tree.h"
#include "capture/tracefs.h"
#include "common/clock.h"
#include "common/error.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace tierlab::capture {
namespace {

// The system calls recorded, in the order of their index in Ev::call.
struct Call {
  const char* name;
  trace::IoOp op;
  uint8_t flags;
  const char* pos_field;  // nullptr: no offset (a sync)
};
constexpr Call kCalls[] = {
    {"pread64", trace::IoOp::Read, 0, "pos"},    {"pwrite64", trace::IoOp::Write, 0, "pos"},
    {"preadv", trace::IoOp::Read, 0, "pos_l"},   {"pwritev", trace::IoOp::Write, 0, "pos_l"},
    {"preadv2", trace::IoOp::Read, 0, "pos_l"},  {"pwritev2", trace::IoOp::Write, 0, "pos_l"},
    {"fdatasync", trace::IoOp::Flush, 0, nullptr}, {"fsync", trace::IoOp::Flush, trace::kIoMeta, nullptr},
};
constexpr uint8_t kNumCalls = sizeof kCalls / sizeof kCalls[0];
constexpr uint8_t kClose = kNumCalls;  // sys_enter_close
constexpr uint8_t kNone = 0xff;

// Syscall events this recorder reads, by tracefs event id.
struct IdEntry {
  uint8_t call = kNone;
  bool exit = false;
};

struct Ev {
  trace::Nanos ts;
  uint64_t pos;  // an entry: the offset; an exit: the return value
  uint32_t fd;
  int32_t tid;
  uint8_t call;
  bool exit;
  bool carried;
};

// A call entered and not yet exited, by thread.
struct Pending {
  trace::Nanos ts = 0;
  uint64_t pos = 0;
  uint32_t fd = 0;
  int32_t tid = 0;
  uint8_t call = 0;
};
size_t tid_hash(int32_t tid) {
  uint64_t x = uint64_t(uint32_t(tid)) * 0x9e3779b97f4a7c15ull;
  return size_t(x ^ (x >> 29));
}
struct PendingHash {
  size_t operator()(const Pending& p) const { return tid_hash(p.tid); }
};


// The names of open files, once per (pid, fd).
class FileNames {
 public:
  explicit FileNames(std::string data_dir) : prefix_(std::move(data_dir)) {
    if (!prefix_.empty()) {
      if (char* real = ::realpath(prefix_.c_str(), nullptr)) {
        prefix_ = real;
        std::free(real);
      }
      if (prefix_.back() != '/') prefix_ += '/';
    }
    names_.reserve(4096);
  }
  // The file `fd` of `pid` names; `named` false when it is "fd:N".
  const std::string& get(int32_t pid, uint32_t fd, bool& named) {
    auto [it, fresh] = names_.try_emplace(key(pid, fd));
    if (fresh) {
      if (names_.size() > (1u << 16)) {  // processes gone long ago: start over
        names_.clear();
        it = names_.try_emplace(key(pid, fd)).first;
      }
      it->second = resolve(pid, fd);
    }
    named = it->second.rfind("fd:", 0) != 0;
    return it->second;
  }
  void forget(int32_t pid, uint32_t fd) { names_.erase(key(pid, fd)); }

 private:
  static uint64_t key(int32_t pid, uint32_t fd) { return uint64_t(uint32_t(pid)) << 32 | fd; }
  std::string resolve(int32_t pid, uint32_t fd) const {
    char link[64], path[PATH_MAX];
    std::snprintf(link, sizeof link, "/proc/%d/fd/%u", pid, fd);
    ssize_t n = ::readlink(link, path, sizeof path - 1);
    if (n <= 0) return "fd:" + std::to_string(fd);
    std::string p(path, size_t(n));
    if (!prefix_.empty() && p.size() > prefix_.size() && p.compare(0, prefix_.size(), prefix_) == 0)
      p.erase(0, prefix_.size());
    return p;
  }
  std::string prefix_;
  std::unordered_map<uint64_t, std::string> names_;
};

}  // namespace

std::string require_file_io_tracing(const std::string& tracefs) {
  if (::geteuid() != 0)
    throw RuntimeError("recording file I/O needs root (it reads the kernel's syscall tracepoints from tracefs)");
  std::string path = tracefs::find(tracefs);
  if (::access((path + "/events/syscalls/sys_enter_pread64").c_str(), F_OK) != 0)
    throw RuntimeError("tracefs: the kernel has no syscall tracepoints (syscalls/sys_enter_pread64; "
                       "CONFIG_FTRACE_SYSCALLS)");
  return path;
}

std::string describe(const FileIoCaptureStats& st) {
  auto mb = [](uint64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f MB", double(b) / 1e6);
    return std::string(s);
  };
  std::string s = std::to_string(st.reads) + " reads (" + mb(st.read_bytes) + "), " + std::to_string(st.writes) +
                  " writes (" + mb(st.write_bytes) + "), " + std::to_string(st.flushes) + " syncs, " +
                  std::to_string(st.lost) + " events lost";
  if (st.failed) s += ", " + std::to_string(st.failed) + " failed calls not recorded";
  if (st.unpaired)
    s += ", " + std::to_string(st.unpaired) + " calls seen only entering or exiting (running at the start or end)";
  if (st.unnamed) s += ", " + std::to_string(st.unnamed) + " on files that could not be named (fd:N)";
  if (st.others) s += "; " + std::to_string(st.others) + " calls of other processes counted, not recorded";
  return s;
}

FileIoCaptureStats capture_file_io(const FileIoCaptureOptions& opts, trace::Writer& out,
                                   const std::atomic<bool>* stop, const std::function<void()>& ready) {
  std::string tfs = require_file_io_tracing(opts.tracefs);
  tracefs::Instance inst(tfs, "tierlab-fileio", opts.buffer_kb);
  const tracefs::PageDecoder decoder(tfs);

  // Event id -> call; each call's fields.
  std::vector<IdEntry> ids(65536);
  tracefs::Field pid_f;
  tracefs::Field fd_f[kNumCalls + 1], pos_f[kNumCalls + 1], ret_f[kNumCalls + 1];
  std::vector<std::string> events;
  for (uint8_t c = 0; c <= kNumCalls; ++c) {
    const std::string name = c == kClose ? "close" : kCalls[c].name;
    const std::string enter = "syscalls/sys_enter_" + name, exit = "syscalls/sys_exit_" + name;
    if (!inst.has(enter) || (c != kClose && !inst.has(exit))) continue;  // an older kernel: no preadv2
    tracefs::EventFormat fe = inst.format(enter);
    pid_f = fe.field("common_pid");
    fd_f[c] = fe.field("fd");
    if (c != kClose && kCalls[c].pos_field) pos_f[c] = fe.field(kCalls[c].pos_field);
    ids[fe.id] = {c, false};
    events.push_back(enter);
    if (c != kClose) {
      tracefs::EventFormat fx = inst.format(exit);
      ret_f[c] = fx.field("ret");
      ids[fx.id] = {c, true};
      events.push_back(exit);
      if (!ret_f[c].present()) throw RuntimeError("tracefs: " + exit + " lacks the field ret");
    }
    if (!pid_f.present() || !fd_f[c].present())
      throw RuntimeError("tracefs: " + enter + " lacks the fields fd or common_pid");
  }

  if (opts.process_tree > 0)
    out.write(now_ns(), 0,
              trace::Meta{"capture.file_io.processes", "tree of " + std::to_string(opts.process_tree)});
  for (const auto& e : events) inst.enable(e);
  inst.start();
  if (ready) ready();

  FileIoCaptureStats st;
  ProcessTreeFilter tree(opts.process_tree);
  FileNames names(opts.data_dir);
  ProbeTable<Pending, PendingHash> pending(1 << 14);
  std::vector<Ev> batch, carry;
  batch.reserve(1 << 16);
  carry.reserve(1 << 16);
  std::vector<uint8_t> buf(inst.page_size());
  const trace::Nanos start = now_ns();
  const trace::Nanos end = opts.duration_ns ? start + opts.duration_ns : INT64_MAX;

  auto on_event = [&](uint64_t ts, const uint8_t* data, size_t len) {
    uint16_t id;
    std::memcpy(&id, data, 2);
    const IdEntry k = ids[id];
    if (k.call == kNone || len < 24) return;
    ++st.events;
    Ev e{};
    e.ts = trace::Nanos(ts);
    e.tid = int32_t(tracefs::load(data, pid_f));
    e.call = k.call;
    e.exit = k.exit;
    if (k.exit) {
      e.pos = tracefs::load(data, ret_f[k.call]);
    } else {
      e.fd = uint32_t(tracefs::load(data, fd_f[k.call]));
      if (pos_f[k.call].present()) e.pos = tracefs::load(data, pos_f[k.call]);
    }
    if (batch.size() < batch.capacity()) batch.push_back(e);
    else ++st.lost;  // cannot happen with a process() per page; counted if it does
  };

  auto keep = [&](int32_t tid) {
    if (!tree.active()) return true;
    switch (tree.check(tid)) {
      case ProcessTreeFilter::kTree:
      case ProcessTreeFilter::kGone:  // kept: it may have been a short-lived backend
        return true;
      default:
        return false;
    }
  };

  auto record = [&](const Pending& in, const Ev& ex) {
    const int64_t ret = int64_t(ex.pos);
    if (ret < 0) {
      ++st.failed;
      return;
    }
    const Call& c = kCalls[in.call];
    bool named = true;
    trace::FileIo f;
    f.pid = in.tid;
    f.file = names.get(in.tid, in.fd, named);
    f.op = c.op;
    f.flags = c.flags;
    f.latency_ns = ex.ts - in.ts;
    if (c.op != trace::IoOp::Flush) {
      f.offset = in.pos == UINT64_MAX ? 0 : in.pos;  // -1: the file position (preadv2)
      f.length = uint32_t(std::min<int64_t>(ret, UINT32_MAX));
    }
    if (!named) ++st.unnamed;
    if (c.op == trace::IoOp::Read) {
      ++st.reads;
      st.read_bytes += f.length;
    } else if (c.op == trace::IoOp::Write) {
      ++st.writes;
      st.write_bytes += f.length;
    } else {
      ++st.flushes;
    }
    out.write(in.ts, 0, f);
  };

  auto process = [&]() {
    for (auto& c : carry) batch.push_back(c);
    carry.clear();
    std::sort(batch.begin(), batch.end(), [](const Ev& a, const Ev& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.exit < b.exit;
    });
    for (const Ev& e : batch) {
      if (e.call == kClose) {
        if (keep(e.tid)) names.forget(e.tid, e.fd);
        continue;
      }
      const size_t h = tid_hash(e.tid);
      Pending* p = pending.find(h, [&](const Pending& v) { return v.tid == e.tid; });
      if (!e.exit) {
        if (!keep(e.tid)) {
          ++st.others;
          continue;
        }
        if (p) {  // its previous call's exit was lost
          ++st.unpaired;
          *p = Pending{e.ts, e.pos, e.fd, e.tid, e.call};
        } else if (!pending.insert(Pending{e.ts, e.pos, e.fd, e.tid, e.call})) {
          ++st.unpaired;  // more threads in a call than the table holds
        }
        continue;
      }
      if (p && p->call == e.call && p->ts <= e.ts) {
        Pending in = *p;
        pending.erase(p);
        record(in, e);
      } else if (!keep(e.tid)) {
        continue;  // counted at its entry
      } else if (!e.carried) {
        // Its entry may sit on another CPU's page not read yet.
        Ev c = e;
        c.carried = true;
        carry.push_back(c);
      } else {
        ++st.unpaired;
      }
    }
    batch.clear();
    if (opts.live_calls) opts.live_calls->store(st.reads + st.writes + st.flushes, std::memory_order_relaxed);
  };

  auto drain = [&]() {
    inst.read_ready(buf, [&](const uint8_t* p, size_t n) {
      decoder.decode(p, n, on_event);
      if (batch.size() + buf.size() / 8 > batch.capacity()) process();
    });
    process();
  };

  inst.pump(end, stop, drain);  // its last passes: carried exits get their last chance
  st.unpaired += carry.size() + pending.size();
  st.lost += inst.lost();
  if (st.lost) out.write(now_ns(), 0, trace::Loss{trace::LossKind::EventsLost, st.lost});
  return st;
}

}  // namespace tierlab::capture
