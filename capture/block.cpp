#include "capture/block.h"

#include "capture/probe_table.h"
#include "capture/process_tree.h"
#include "capture/tracefs.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace tierlab::capture {
namespace {

using tracefs::read_file;
using tracefs::trim;
using tracefs::Field;
using tracefs::load;

bool parse_mm(const std::string& s, unsigned& maj, unsigned& min) {
  size_t c = s.find(':');
  if (c == std::string::npos) return false;
  auto a = std::from_chars(s.data(), s.data() + c, maj);
  auto b = std::from_chars(s.data() + c + 1, s.data() + s.size(), min);
  return a.ec == std::errc() && a.ptr == s.data() + c && b.ec == std::errc() &&
         b.ptr == s.data() + s.size();
}

// The fields of a block event we use.
struct EventFormat {
  uint16_t id = 0;
  Field pid, dev, sector, nr_sector, bytes, rwbs;
};

EventFormat block_format(const tracefs::Instance& inst, const std::string& event) {
  tracefs::EventFormat t = inst.format(event);
  EventFormat f;
  f.id = t.id;
  f.pid = t.field("common_pid");
  f.dev = t.field("dev");
  f.sector = t.field("sector");
  f.nr_sector = t.field("nr_sector");
  f.bytes = t.field("bytes");
  f.rwbs = t.field("rwbs");
  if (!f.dev.present() || !f.sector.present() || !f.rwbs.present() || !f.pid.present())
    throw RuntimeError("tracefs: " + event + " lacks the fields dev, sector, rwbs or common_pid");
  return f;
}

// Event kinds, in the order events of the same instant are processed.
enum : uint8_t { kRemap = 0, kBio = 1, kIssue = 2, kComplete = 3 };

struct Ev {
  trace::Nanos ts;
  uint64_t sector;
  uint32_t dev;
  uint32_t bytes;
  int32_t pid;
  uint8_t kind;
  uint8_t carried;
  char rwbs[10];
  trace::Nanos queued;  // an issue: when its earliest bio was queued (0 unknown)
};

// The operation letter of an rwbs string: "FWS" (preflush write) -> 'W',
// "FF" (the flush machinery's own request: preflush + REQ_OP_FLUSH) -> 'F',
// "F" (a bare REQ_OP_FLUSH) -> 'F'.
char op_letter(const char* r) {
  if (r[0] == 'F' && r[1] && std::strchr("WRDNF", r[1])) return r[1];
  return r[0];
}

// A bio that asks for a cache flush: PREFLUSH, and on a device without
// FUA also a FUA write (the flush machinery follows it with a flush).
bool asks_flush(const char* rwbs, bool fua) {
  return fua ? rwbs[0] == 'F' : std::strchr(rwbs, 'F') != nullptr;
}

void rwbs_to_op(const char* r, trace::IoOp& op, uint8_t& flags) {
  op = trace::IoOp::Read;
  flags = 0;
  size_t i = 0;
  bool preflush = false;
  if (r[0] == 'F') {
    preflush = true;
    ++i;
  }
  switch (r[i]) {
    case 'W': op = trace::IoOp::Write; break;
    case 'R': op = trace::IoOp::Read; break;
    case 'D': case 'E': op = trace::IoOp::Discard; break;
    default: op = preflush ? trace::IoOp::Flush : trace::IoOp::Read; break;
  }
  if (r[i]) ++i;
  for (; i < 10 && r[i]; ++i) {
    if (r[i] == 'F') flags |= trace::kIoFua;
    else if (r[i] == 'S') flags |= trace::kIoSync;
    else if (r[i] == 'M') flags |= trace::kIoMeta;
  }
}

// Flush requests waiting for their completion. The kernel's flush request
// (blk-flush.c: one per hardware queue, never two in flight on the same
// queue) is issued with sector 0 and completes with sector ~0, so it cannot
// be keyed by sector: its completion is the oldest flush issued on the
// device. At most one per hardware queue can be in flight: when more were
// issued before a completion, the oldest lost theirs (events dropped).
// Fixed capacity, no allocation after construction.
class FlushQueue {
 public:
  explicit FlushQueue(size_t cap) : ring_(cap) {}
  bool push(const Ev& e) {
    if (n_ == ring_.size()) return false;
    ring_[(head_ + n_) % ring_.size()] = e;
    ++n_;
    return true;
  }
  bool pop(Ev& out) {
    if (!n_) return false;
    out = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --n_;
    return true;
  }
  const Ev* front() const { return n_ ? &ring_[head_] : nullptr; }
  // How many were issued at or before `ts` (later ones may already be
  // queued when their CPU's events were read first).
  size_t issued_by(trace::Nanos ts) const {
    size_t k = 0;
    while (k < n_ && ring_[(head_ + k) % ring_.size()].ts <= ts) ++k;
    return k;
  }

 private:
  std::vector<Ev> ring_;
  size_t head_ = 0, n_ = 0;
};

// The most recent bios that ask for a flush (PREFLUSH, or FUA on a device
// without FUA), for naming the process a flush request was issued for: the
// flush request itself is issued by a kblockd worker.
class FlushBios {
 public:
  explicit FlushBios(size_t cap) : ring_(cap) {}
  void add(trace::Nanos ts, int32_t pid) {
    ring_[next_ % ring_.size()] = {ts, pid};
    ++next_;
  }
  // The pid of the latest bio queued at or before `ts`; false if none is
  // remembered (none seen, or all remembered ones are later).
  bool latest_before(trace::Nanos ts, int32_t& pid) const {
    size_t n = std::min(next_, ring_.size());
    for (size_t k = 1; k <= n; ++k) {
      const auto& b = ring_[(next_ - k) % ring_.size()];
      if (b.ts <= ts) {
        pid = b.pid;
        return true;
      }
    }
    return false;
  }

 private:
  struct Bio {
    trace::Nanos ts = 0;
    int32_t pid = 0;
  };
  std::vector<Bio> ring_;
  size_t next_ = 0;
};

// Issued requests waiting for their completion, keyed by (dev, sector),
// duplicates allowed (a requeued request may repeat a key; the first one
// found is the oldest). No allocation after construction.
class InflightTable {
 public:
  explicit InflightTable(size_t cap_pow2) : t_(cap_pow2) {}
  bool insert(const Ev& e) { return t_.insert(e); }
  bool take(uint32_t dev, uint64_t sector, Ev& out) {
    Ev* e = t_.find(hash(dev, sector), [&](const Ev& v) { return v.dev == dev && v.sector == sector; });
    if (!e) return false;
    out = *e;
    t_.erase(e);
    return true;
  }
  template <class F>
  void for_each(F f) const {
    t_.for_each(f);
  }

 private:
  static size_t hash(uint32_t dev, uint64_t sector) {
    uint64_t x = sector * 0x9e3779b97f4a7c15ull ^ dev;
    return size_t(x ^ (x >> 29));
  }
  struct Hash {
    size_t operator()(const Ev& e) const { return hash(e.dev, e.sector); }
  };
  ProbeTable<Ev, Hash> t_;
};


// When the bios of the requests not issued yet were queued, and by whom,
// for a BlockIo's queued_ns and pid. Two tracepoints see a bio before its
// request: block_bio_remap, for a bio submitted to a partition, in the
// submitter's context before cgroup blkio throttling can hold it; and
// block_bio_queue, after the throttle (a bio it held is queued by the
// throttle's kernel worker when released, and its request issued by that
// worker). The earliest of the two counts. Keyed by whole-disk sector: a
// request covers bios from its sector on (back merges follow the first
// bio, a front merge starts the request); a bio split into several
// requests gives each of them its time. Fixed capacity, open addressing,
// no allocation after construction; when it fills, bios queued more than
// kStale ago (that never became a request of this device) are dropped.
class BioQueue {
 public:
  static constexpr trace::Nanos kStale = 10'000'000'000;
  explicit BioQueue(size_t cap_pow2) : t_(cap_pow2), scratch_(cap_pow2) {}

  void add(trace::Nanos ts, uint64_t sector, uint32_t sectors, int32_t pid, char op) {
    if (sectors == 0) return;  // a flush without data: no request of its own to time
    Slot* s = find(sector);
    if (s) {
      // The same bio seen twice (remap, then queue), or a stale one.
      if (s->op != op || ts < s->ts || s->ts + kStale < ts) *s = Slot{op, sectors, pid, sector, ts};
      return;
    }
    if (t_.full()) purge(ts);
    t_.insert(Slot{op, sectors, pid, sector, ts});  // still full: this bio goes untimed
  }

  // For a request of `sectors` from `sector` of operation `op`: the
  // earliest queue time of the bios it covers and their submitter's pid;
  // false when none was seen.
  bool take(uint64_t sector, uint32_t sectors, char op, trace::Nanos& queued, int32_t& pid) {
    bool found = false;
    const uint64_t end = sector + sectors;
    // Invariant: every bio of the request before `at` has been taken.
    for (uint64_t at = sector; at < end;) {
      Slot* s = find(at);
      if (!s) break;
      Slot b = *s;
      t_.erase(s);
      if (b.op == op && (!found || b.ts < queued)) {
        queued = b.ts;
        pid = b.pid;
        found = true;
      }
      uint64_t next = at + b.sectors;
      if (next > end) {  // split: the rest is another request's
        t_.insert(Slot{b.op, static_cast<uint32_t>(next - end), b.pid, end, b.ts});
        next = end;
      }
      at = next;
    }
    return found;
  }

 private:
  struct Slot {
    char op = 0;
    uint32_t sectors = 0;
    int32_t pid = 0;
    uint64_t sector = 0;
    trace::Nanos ts = 0;
  };
  static size_t hash(uint64_t sector) {
    uint64_t x = sector * 0x9e3779b97f4a7c15ull;
    return size_t(x ^ (x >> 29));
  }
  struct Hash {
    size_t operator()(const Slot& s) const { return hash(s.sector); }
  };
  Slot* find(uint64_t sector) {
    return t_.find(hash(sector), [&](const Slot& s) { return s.sector == sector; });
  }
  // Drops the bios queued more than kStale before `now`.
  void purge(trace::Nanos now) {
    size_t n = 0;
    t_.for_each([&](const Slot& s) {
      if (s.ts + kStale >= now) scratch_[n++] = s;
    });
    t_.clear();
    for (size_t i = 0; i < n; ++i) t_.insert(scratch_[i]);
  }
  ProbeTable<Slot, Hash> t_;
  std::vector<Slot> scratch_;
};

// Remembers when a bio (a block_bio_queue or block_bio_remap event) was
// queued, and by whom.
void queue_bio(BioQueue& q, const Ev& e) { q.add(e.ts, e.sector, e.bytes / 512, e.pid, op_letter(e.rwbs)); }

// An issued request: the queue time of its earliest bio, and the pid of
// that bio's submitter (the process a throttle's worker issued it for).
void time_queued(BioQueue& q, Ev& issue) {
  trace::Nanos queued = 0;
  int32_t pid = 0;
  if (q.take(issue.sector, issue.bytes / 512, op_letter(issue.rwbs), queued, pid) && queued <= issue.ts) {
    issue.queued = queued;
    issue.pid = pid;
  }
}


// "MAJ:MIN" of a kernel dev_t as the block events carry it (major << 20 | minor).
std::string major_minor(uint32_t dev) { return std::to_string(dev >> 20) + ":" + std::to_string(dev & 0xfffff); }

// The dev_t (major << 20 | minor) of the disk and of each of its partitions:
// bios are queued on a partition, requests issued to the disk.
std::vector<uint32_t> disk_and_partitions(uint32_t disk) {
  std::vector<uint32_t> devs{disk};
  std::string sys = "/sys/dev/block/" + major_minor(disk);
  std::error_code ec;
  for (const auto& ent : std::filesystem::directory_iterator(sys + "/", ec)) {
    if (::access((ent.path() / "partition").c_str(), F_OK) != 0) continue;
    unsigned maj = 0, min = 0;
    if (parse_mm(trim(read_file((ent.path() / "dev").string())), maj, min)) devs.push_back((maj << 20) | min);
  }
  return devs;
}

// How many flush requests the disk can have in flight: one per hardware
// queue (its mq/N directories); the CPU count if that cannot be read.
size_t hardware_queues(uint32_t disk) {
  std::string sys = "/sys/dev/block/" + major_minor(disk);
  size_t n = 0;
  std::error_code ec;
  for (const auto& ent : std::filesystem::directory_iterator(sys + "/mq", ec)) {
    (void)ent;
    ++n;
  }
  return n ? n : size_t(std::max(1L, ::sysconf(_SC_NPROCESSORS_CONF)));
}

}  // namespace

std::string require_block_tracing(const std::string& tracefs) {
  if (::geteuid() != 0)
    throw RuntimeError("capture block needs root (it reads kernel block tracepoints from tracefs); run it as root");
  std::string path = tracefs::find(tracefs);
  if (::access((path + "/events/block/block_rq_issue").c_str(), F_OK) != 0)
    throw RuntimeError("tracefs: the kernel has no block/block_rq_issue tracepoint");
  return path;
}

BlockDevice resolve_block_device(const std::string& spec) {
  if (spec.empty()) throw InputError("no block device given");
  unsigned maj = 0, min = 0;
  if (!parse_mm(spec, maj, min)) {
    struct stat st{};
    std::string path = spec;
    if (spec.find('/') == std::string::npos) {
      std::string dev = trim(read_file("/sys/class/block/" + spec + "/dev"));
      if (!dev.empty() && parse_mm(dev, maj, min)) path.clear();
      else path = "/dev/" + spec;
    }
    if (!path.empty()) {
      if (::stat(path.c_str(), &st) != 0)
        throw InputError(errno_message(spec, errno));
      if (S_ISBLK(st.st_mode)) {
        maj = major(st.st_rdev);
        min = minor(st.st_rdev);
      } else {
        // A file or directory: the device its file system lives on.
        maj = major(st.st_dev);
        min = minor(st.st_dev);
      }
    }
  }
  std::string mm = std::to_string(maj) + ":" + std::to_string(min);
  std::string sys = "/sys/dev/block/" + mm;
  if (::access(sys.c_str(), F_OK) != 0)
    throw InputError(spec + ": " + mm + " is not a block device (no " + sys + ")");
  BlockDevice d;
  if (::access((sys + "/partition").c_str(), F_OK) == 0) {
    // Requests are issued to the whole disk: record that one.
    std::string parent = trim(read_file(sys + "/../dev"));
    if (!parse_mm(parent, maj, min)) throw InputError(spec + ": cannot find the disk of partition " + mm);
    sys = "/sys/dev/block/" + parent;
    d.from_partition = true;
  }
  d.dev = (maj << 20) | min;
  std::string ue = read_file(sys + "/uevent");
  if (auto p = ue.find("DEVNAME="); p != std::string::npos)
    d.name = ue.substr(p + 8, ue.find('\n', p) - p - 8);
  else
    d.name = std::to_string(maj) + ":" + std::to_string(min);
  return d;
}

void check_pid(int64_t pid) {
  if (pid < 0) throw InputError(std::to_string(pid) + ": must be a process id");
}

void check_buffer_kb(uint32_t buffer_kb) {
  // tracefs refuses 0; the kernel allocates the ring on every CPU at once.
  constexpr uint32_t kMaxBufferKb = 1u << 20;
  if (buffer_kb == 0 || buffer_kb > kMaxBufferKb)
    throw InputError(std::to_string(buffer_kb) + ": must be 1 to " +
                     std::to_string(kMaxBufferKb) + " (KiB per CPU)");
  long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (cpus > 0 && pages > 0 && page > 0) {
    uint64_t want = uint64_t(buffer_kb) * 1024 * uint64_t(cpus);
    uint64_t mem = uint64_t(pages) * uint64_t(page);
    if (want > mem / 2)
      throw InputError(std::to_string(buffer_kb) + ": " + std::to_string(cpus) +
                       " CPUs would take " + format_bytes(double(want)) + ", more than half of memory (" +
                       format_bytes(double(mem)) + ")");
  }
}

void check_block_capture_options(const BlockCaptureOptions& opts) {
  for (int32_t pid : opts.pids) check_pid(pid);
  check_buffer_kb(opts.buffer_kb);
}

BlockCaptureStats capture_block(const BlockCaptureOptions& opts, trace::Writer& out,
                                const std::atomic<bool>* stop, const std::function<void()>& ready) {
  check_block_capture_options(opts);
  BlockDevice dev = resolve_block_device(opts.device);
  std::string tfs = require_block_tracing(opts.tracefs);

  tracefs::Instance inst(tfs, "tierlab-block", opts.buffer_kb);
  const tracefs::PageDecoder decoder(tfs);
  EventFormat fi = block_format(inst, "block/block_rq_issue");
  EventFormat fc = block_format(inst, "block/block_rq_complete");
  std::string filter = "dev == " + std::to_string(dev.dev);
  inst.filter("block/block_rq_issue", filter);
  inst.filter("block/block_rq_complete", filter);

  // The flush machinery issues a device's flush requests from a kblockd
  // worker; the bios that asked for them name the process (fdatasync's
  // caller, the journal thread): PREFLUSH ones, and on a device without FUA
  // also FUA writes (each is followed by a flush). Every bio is recorded,
  // for the queue times of the requests (BioQueue) as well. Bios are
  // queued on the partition, so its number counts too.
  const std::string disk_sys = "/sys/dev/block/" + major_minor(dev.dev);
  EventFormat fb, fr;
  const bool fua = trim(read_file(disk_sys + "/queue/fua")) == "1";
  const bool bio_events = inst.has("block/block_bio_queue");
  const bool remap_events = inst.has("block/block_bio_remap");
  if (bio_events) {
    fb = block_format(inst, "block/block_bio_queue");
    std::string devs;
    for (uint32_t d : disk_and_partitions(dev.dev))
      devs += (devs.empty() ? "dev == " : " || dev == ") + std::to_string(d);
    inst.filter("block/block_bio_queue", devs);
  }
  if (remap_events) {
    // A bio submitted to a partition, in its submitter's context, before
    // cgroup blkio throttling holds it; its dev is then the disk's.
    fr = block_format(inst, "block/block_bio_remap");
    inst.filter("block/block_bio_remap", "dev == " + std::to_string(dev.dev));
  }
  const size_t flush_slots = hardware_queues(dev.dev);

  out.write(now_ns(), 0, trace::Meta{"device", dev.name});
  out.write(now_ns(), 0, trace::Meta{"capture.block.dev", major_minor(dev.dev)});
  out.write(now_ns(), 0, trace::Meta{"capture.block.flush_pid", bio_events ? "submitter" : "issuer"});
  if (opts.process_tree > 0)
    out.write(now_ns(), 0,
              trace::Meta{"capture.block.processes",
                          "tree of " + std::to_string(opts.process_tree) + " and kernel threads"});

  inst.enable("block/block_rq_issue");
  inst.enable("block/block_rq_complete");
  if (bio_events) inst.enable("block/block_bio_queue");
  if (remap_events) inst.enable("block/block_bio_remap");
  inst.start();
  if (ready) ready();

  BlockCaptureStats st;
  InflightTable table(1 << 16);
  FlushQueue flushes(4096);
  FlushBios flush_bios(256);
  BioQueue bio_queue(1 << 16);
  std::vector<Ev> batch, carry;
  batch.reserve(1 << 16);
  carry.reserve(1 << 16);
  std::vector<uint8_t> buf(inst.page_size());
  const trace::Nanos start = now_ns();
  const trace::Nanos end = opts.duration_ns ? start + opts.duration_ns : INT64_MAX;

  ProcessTreeFilter tree(opts.process_tree);
  st.process_tree = tree.active();
  // Whether an I/O of `pid` is recorded; counts it where it is not.
  auto want_pid = [&](int32_t pid) {
    if (!opts.pids.empty() && std::find(opts.pids.begin(), opts.pids.end(), pid) == opts.pids.end()) {
      ++st.filtered;
      return false;
    }
    if (tree.active()) {
      switch (tree.check(pid)) {
        case ProcessTreeFilter::kOther:
          ++st.others;
          return false;
        case ProcessTreeFilter::kGone:
          ++st.exited_unchecked;  // kept: it may have been a short-lived backend
          break;
        default:
          break;
      }
    }
    return true;
  };
  // Completions whose issue was filtered out are not orphans.
  const bool filtering = !opts.pids.empty() || tree.active();
  auto emit = [&](const Ev& issue, trace::Nanos complete, bool incomplete) {
    trace::BlockIo b;
    b.complete_ns = complete;
    b.device = issue.dev;
    b.offset = issue.sector * 512;
    b.length = issue.bytes;
    rwbs_to_op(issue.rwbs, b.op, b.flags);
    if (incomplete) b.flags |= trace::kIoIncomplete;
    b.pid = issue.pid;
    if (issue.queued > 0 && issue.queued <= issue.ts) b.queued_ns = issue.queued;
    out.write(issue.ts, 0, b);
  };
  // A flush request: pid of the bio it was issued for, offset 0 whatever
  // sector the kernel reported (0 or ~0 by version). False if --pid
  // filters it out.
  auto emit_flush = [&](Ev issue, trace::Nanos complete, bool incomplete) {
    if (!flush_bios.latest_before(issue.ts, issue.pid) && bio_events) ++st.flush_unattributed;
    if (!want_pid(issue.pid)) return false;
    issue.sector = 0;
    issue.bytes = 0;
    emit(issue, complete, incomplete);
    ++st.flushes;
    return true;
  };

  // One event of a ring-buffer page into `batch`.
  auto on_event = [&](uint64_t ts, const uint8_t* data, size_t) {
    uint16_t id;
    std::memcpy(&id, data, 2);
    const EventFormat* f = id == fi.id                   ? &fi
                           : id == fc.id                 ? &fc
                           : bio_events && id == fb.id   ? &fb
                           : remap_events && id == fr.id ? &fr
                                                         : nullptr;
    if (!f) return;
    ++st.events;
    Ev e{};
    e.ts = trace::Nanos(ts);
    e.kind = f == &fi ? kIssue : f == &fc ? kComplete : f == &fb ? kBio : kRemap;
    e.dev = uint32_t(load(data, f->dev));
    e.sector = load(data, f->sector);
    e.pid = int32_t(load(data, f->pid));
    if (f->bytes.present()) e.bytes = uint32_t(load(data, f->bytes));
    else if (f->nr_sector.present()) e.bytes = uint32_t(load(data, f->nr_sector) * 512);
    std::memcpy(e.rwbs, data + f->rwbs.offset, std::min<int>(f->rwbs.size, 10));
    e.rwbs[9] = 0;
    if (e.dev != dev.dev && e.kind != kBio) return;  // a bio's dev may be a partition
    if (batch.size() < batch.capacity()) batch.push_back(e);
    else ++st.lost;  // cannot happen with drain-per-page below; counted if it does
  };

  auto process = [&]() {
    for (auto& c : carry) batch.push_back(c);
    carry.clear();
    std::sort(batch.begin(), batch.end(), [](const Ev& a, const Ev& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.kind < b.kind;
    });
    for (Ev& e : batch) {
      if (e.kind == kBio || e.kind == kRemap) {
        if (e.kind == kBio && asks_flush(e.rwbs, fua)) flush_bios.add(e.ts, e.pid);
        queue_bio(bio_queue, e);
        continue;
      }
      const bool flush_op = op_letter(e.rwbs) == 'F';
      if (e.kind == kIssue && flush_op) {
        // Filtered on pid at its completion, once its bio's pid is known.
        if (!flushes.push(e)) {
          if (emit_flush(e, e.ts, true)) ++st.incomplete;
        }
        continue;
      }
      if (e.kind == kIssue) {
        time_queued(bio_queue, e);
        if (!want_pid(e.pid)) continue;
        if (!table.insert(e)) {  // table full: record it as incomplete
          emit(e, e.ts, true);
          ++st.incomplete;
        }
        continue;
      }
      Ev issue;
      if (flush_op) {
        // More flushes waiting than the device can have in flight: the
        // oldest lost their completion (events dropped); they must not
        // take this one.
        while (flushes.issued_by(e.ts) > flush_slots && flushes.pop(issue))
          if (emit_flush(issue, issue.ts, true)) ++st.incomplete;
        if (flushes.front() && flushes.front()->ts <= e.ts && flushes.pop(issue)) {
          if (emit_flush(issue, e.ts, false)) ++st.ios;
        } else if (!e.carried) {
          Ev c = e;
          c.carried = 1;
          carry.push_back(c);
        } else {
          ++st.orphans;
        }
        continue;
      }
      if (e.bytes == 0 && op_letter(e.rwbs) == 'W') {
        // The end of a request that went through the flush machinery (an
        // empty PREFLUSH bio, or a PREFLUSH/FUA write whose data part was
        // issued and completed on its own): no issue of its own to pair.
        ++st.flush_seq_ends;
        continue;
      }
      if (table.take(e.dev, e.sector, issue)) {
        emit(issue, e.ts, false);
        ++st.ios;
      } else if (!e.carried) {
        // Its issue may sit on another CPU's page not read yet.
        Ev c = e;
        c.carried = 1;
        carry.push_back(c);
      } else if (!filtering) {
        ++st.orphans;
      }
    }
    batch.clear();
    if (opts.live_ios) opts.live_ios->store(st.ios, std::memory_order_relaxed);
  };

  auto drain = [&]() {
    inst.read_ready(buf, [&](const uint8_t* p, size_t n) {
      decoder.decode(p, n, on_event);
      if (batch.size() + buf.size() / 8 > batch.capacity()) process();
    });
    process();
  };

  inst.pump(end, stop, drain);  // its last passes: carried completions get their last chance
  st.orphans += filtering ? 0 : carry.size();
  carry.clear();

  table.for_each([&](const Ev& e) {
    emit(e, e.ts, true);
    ++st.incomplete;
  });
  for (Ev e; flushes.pop(e);)
    if (emit_flush(e, e.ts, true)) ++st.incomplete;
  st.lost += inst.lost();
  if (st.lost) out.write(now_ns(), 0, trace::Loss{trace::LossKind::EventsLost, st.lost});
  return st;
}

std::string describe(const BlockCaptureStats& st, bool pid_filter) {
  std::string s = std::to_string(st.ios) + " I/Os (" + std::to_string(st.flushes) + " flushes), " +
                  std::to_string(st.incomplete) + " incomplete, " + std::to_string(st.orphans) +
                  " completions without issue, " + std::to_string(st.lost) + " events lost";
  if (pid_filter) s += ", " + std::to_string(st.filtered) + " of other pids skipped";
  if (st.process_tree) {
    s += "; " + std::to_string(st.others) + " I/Os of other processes counted, not recorded";
    if (st.exited_unchecked)
      s += " (" + std::to_string(st.exited_unchecked) + " of processes that exited before they could be looked up "
           "recorded)";
  }
  if (st.flush_unattributed)
    s += "; " + std::to_string(st.flush_unattributed) +
         " flushes keep the kernel worker's pid (no fdatasync or journal bio seen before them)";
  return s;
}

}  // namespace tierlab::capture
