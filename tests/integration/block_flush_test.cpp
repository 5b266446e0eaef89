// Cache flushes in a block capture against the kernel's own flush counters:
// ext4 on a loop device (image in /dev/shm), a process doing write +
// fdatasync in a loop (first growing the file, so each one commits the
// journal with a PREFLUSH/FUA write, then overwriting, so each one is an
// empty flush), and /sys/block/loopN/stat read before and after. Needs root.
#include "capture/block.h"
#include "support/block_capture.h"
#include "support/support.h"

#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// ext4 on a loop device over a tmpfs image, mounted on a temporary directory.
struct Ext4Loop {
  std::string image, dev, name, mnt;
  bool mounted = false;
  explicit Ext4Loop(const test::TempDir& dir) {
    image = "/dev/shm/tierlab-flush-" + std::to_string(::getpid()) + ".img";
    mnt = dir.file("mnt");
    ::mkdir(mnt.c_str(), 0700);
    if (std::system(("truncate -s 64M " + image).c_str()) != 0) test::skip("cannot create " + image);
    dev = test::shell_output("losetup -f --show " + image + " 2>&1");
    if (dev.rfind("/dev/loop", 0) != 0) {
      ::unlink(image.c_str());
      test::skip("cannot attach a loop device (losetup: " + dev + ")");
    }
    name = dev.substr(5);
    if (read_text("/sys/block/" + name + "/queue/write_cache") != "write back") {
      cleanup();
      test::skip(dev + " has no volatile write cache: the kernel sends it no flushes");
    }
    if (std::system(("mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 " + dev + " >/dev/null 2>&1").c_str()) != 0) {
      cleanup();
      test::skip("mkfs.ext4 failed on " + dev);
    }
    if (::mount(dev.c_str(), mnt.c_str(), "ext4", 0, nullptr) != 0) {
      cleanup();
      test::skip("cannot mount ext4 from " + dev);
    }
    mounted = true;
  }
  ~Ext4Loop() { cleanup(); }
  void cleanup() {
    if (mounted) ::umount(mnt.c_str());
    mounted = false;
    if (!dev.empty()) std::system(("losetup -d " + dev + " 2>/dev/null").c_str());
    dev.clear();
    ::unlink(image.c_str());
  }
  // Fields 16 and 17 of /sys/block/NAME/stat: flushes done, ms spent flushing.
  std::pair<uint64_t, uint64_t> flush_stat() const {
    std::istringstream in(read_text("/sys/block/" + name + "/stat"));
    std::vector<uint64_t> f;
    for (uint64_t v; in >> v;) f.push_back(v);
    if (f.size() < 17) test::skip("/sys/block/" + name + "/stat has no flush fields (kernel before 5.5)");
    return {f[15], f[16]};
  }
};

}  // namespace

TEST_CASE("block capture times each cache flush like the kernel's flush counters", "[block][flush]") {
  test::require_root("block capture (tracefs, loop devices, mount)");
  test::TempDir dir;
  Ext4Loop loop(dir);
  struct stat st{};
  REQUIRE(::stat(loop.dev.c_str(), &st) == 0);
  const uint32_t kdev = (major(st.st_rdev) << 20) | minor(st.st_rdev);

  // The file exists and is on disk before the capture.
  const std::string file = loop.mnt + "/wal";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  std::vector<char> block(4096, 'x');
  REQUIRE(::fsync(fd) == 0);
  ::sync();

  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  capture::BlockCaptureOptions o;
  o.device = loop.name;
  o.duration_ns = 120'000'000'000;  // stopped long before
  test::BackgroundBlockCapture capture(o, w);

  const int grow = 150, overwrite = 600;
  trace::Nanos t0 = now_ns();
  auto [flushes0, ticks0] = loop.flush_stat();
  for (int i = 0; i < grow; ++i) {  // a journal commit each (PREFLUSH + FUA write)
    REQUIRE(::pwrite(fd, block.data(), block.size(), off_t(i) * 4096) == ssize_t(block.size()));
    REQUIRE(::fdatasync(fd) == 0);
  }
  for (int i = 0; i < overwrite; ++i) {  // an empty PREFLUSH bio each
    REQUIRE(::pwrite(fd, block.data(), block.size(), off_t(i % grow) * 4096) == ssize_t(block.size()));
    REQUIRE(::fdatasync(fd) == 0);
  }
  auto [flushes1, ticks1] = loop.flush_stat();
  trace::Nanos t1 = now_ns();
  ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  capture::BlockCaptureStats stats = capture.stop();
  w.close();

  trace::Reader r(trace::memory_source(mem->bytes()));
  trace::Record rec;
  uint64_t flushes = 0, mine = 0, incomplete = 0, outside = 0;
  double latency_sum_ms = 0;
  std::string flush_pid;
  while (r.next(rec)) {
    if (auto* m = std::get_if<trace::Meta>(&rec.body))
      if (m->key == "capture.block.flush_pid") flush_pid = std::string(m->value);
    auto* b = std::get_if<trace::BlockIo>(&rec.body);
    if (!b || b->device != kdev || b->op != trace::IoOp::Flush) continue;
    if (rec.ts < t0 || rec.ts > t1) {
      ++outside;  // the journal's timer, the unmount's flush
      continue;
    }
    ++flushes;
    CHECK(b->offset == 0);
    CHECK(b->length == 0);
    if (b->flags & trace::kIoIncomplete) {
      ++incomplete;
      continue;
    }
    REQUIRE(b->complete_ns >= rec.ts);
    latency_sum_ms += double(b->complete_ns - rec.ts) / 1e6;
    if (b->pid == ::getpid()) ++mine;
  }

  const uint64_t stat_flushes = flushes1 - flushes0;
  const double stat_ms = double(ticks1 - ticks0);
  INFO("device " << loop.dev << ": /sys stat " << stat_flushes << " flushes, " << stat_ms << " ms flushing; trace "
                 << flushes << " flushes (" << incomplete << " incomplete, " << mine << " with this pid, " << outside
                 << " outside the run), " << latency_sum_ms << " ms; capture: " << stats.orphans
                 << " completions without issue, " << stats.flush_seq_ends << " flush sequence ends, " << stats.lost
                 << " lost");

  // Every fdatasync flushed the device at least once.
  REQUIRE(stat_flushes >= uint64_t(grow + overwrite));
  CHECK(stats.lost == 0);
  CHECK(stats.orphans == 0);
  CHECK(incomplete == 0);
  // One record per flush the device did (a flush in flight at either edge of
  // the stat window may fall on the other side).
  CHECK(flushes + 2 >= stat_flushes);
  CHECK(flushes <= stat_flushes + 2);
  // The kernel times a flush from when the flush machinery starts it, a
  // little before its issue: the records' total is at most the stat's (plus
  // its ms rounding), and not a small part of it. (Pairing a completion with
  // an ever older issue, as pairing by sector did, gave seconds against the
  // stat's milliseconds.)
  CHECK(latency_sum_ms <= stat_ms * 1.1 + 2);
  CHECK(latency_sum_ms >= stat_ms * 0.2 - 2);
  // Flushes are issued by a kblockd worker but carry the pid of the process
  // whose fdatasync asked for them (the journal thread for commits).
  if (flush_pid == "submitter") {
    CHECK(mine >= uint64_t(overwrite) * 9 / 10);
  } else {
    WARN("this kernel cannot filter bios on rwbs: flushes keep the worker's pid");
  }
  // The tracing instance is gone.
  CHECK(::access(("/sys/kernel/tracing/instances/tierlab-" + std::to_string(::getpid())).c_str(), F_OK) != 0);
}
