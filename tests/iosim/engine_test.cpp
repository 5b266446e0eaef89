// The io_uring engine against real files in a temporary directory.
#include "iosim/engine.h"

#include "common/error.h"
// Counts every operator new of this binary for the steady-state test; this is
// the one file of the binary that includes it.
#include "support/alloc_counter.h"

#include <catch2/catch.hpp>
#include <liburing.h>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;
using namespace tierlab;
using namespace tierlab::iosim;

namespace {

void require_io_uring() {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc == -ENOSYS || rc == -EPERM) {
    std::printf("skipped: io_uring is not available here (io_uring_queue_init: %s)\n",
                std::strerror(-rc));
    std::exit(77);
  }
  if (rc == 0) io_uring_queue_exit(&ring);
}

struct EngineTempDir {
  fs::path path;
  EngineTempDir() {
    char tmpl[] = "/tmp/tierlab-engine-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~EngineTempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Random or sequential fixed-size I/Os over [0, size).
class PatternSource : public IoSource {
 public:
  PatternSource(IoOp op, uint64_t size, uint32_t bs, uint64_t count, bool random)
      : op_(op), size_(size), bs_(bs), count_(count), random_(random) {}
  bool next(TimedIo& q) override {
    if (n_ >= count_) return false;
    uint64_t blocks = size_ / bs_;
    uint64_t b;
    if (random_) {
      x_ = x_ * 6364136223846793005ull + 1442695040888963407ull;
      b = (x_ >> 33) % blocks;
    } else {
      b = n_ % blocks;
    }
    q = TimedIo{0, b * bs_, bs_, op_, 0};
    ++n_;
    return true;
  }

 private:
  IoOp op_;
  uint64_t size_;
  uint32_t bs_;
  uint64_t count_;
  bool random_;
  uint64_t n_ = 0;
  uint64_t x_ = 42;
};

}  // namespace

TEST_CASE("engine: written data reads back with verify", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "data").string();
  const uint64_t size = 4 << 20;

  EngineOptions o;
  o.target = file;
  o.size = size;
  o.iodepth = 16;
  o.max_block = 16384;
  o.verify = true;
  o.direct = true;
  // Each request submitted on its own, in fours, or all that are ready at once.
  o.submit_batch = GENERATE(1u, 4u, 0u);
  INFO("submit_batch " << o.submit_batch);
  {
    // Sequential writes over the whole file, then random writes on top:
    // the verify pass reads every written sector back.
    PatternSource seq(IoOp::Write, size, 16384, size / 16384, false);
    EngineResult r = run_engine(o, seq);
    CHECK(r.ios == size / 16384);
    CHECK(r.bytes == size);
    CHECK(r.verified_bytes == size);
  }
  {
    // A read-only run checks every sector it reads against the pattern.
    EngineOptions ro = o;
    ro.verify_existing = true;
    PatternSource rnd(IoOp::Read, size, 4096, 2000, true);
    EngineResult r = run_engine(ro, rnd);
    CHECK(r.ios == 2000);
    CHECK(r.verified_bytes == 2000u * 4096u);
  }
  {
    // Corrupt one byte: the read-back names its offset.
    int fd = ::open(file.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    char c = 0x5a;
    REQUIRE(::pwrite(fd, &c, 1, 123457) == 1);
    ::close(fd);
    EngineOptions ro = o;
    ro.verify_existing = true;
    PatternSource seq(IoOp::Read, size, 16384, size / 16384, false);
    try {
      run_engine(ro, seq);
      FAIL("the corrupted byte was not reported");
    } catch (const RuntimeError& e) {
      CHECK(std::string(e.what()).find("offset 123457") != std::string::npos);
    }
  }
}

TEST_CASE("engine: a short read at end of file is handled and counted", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "short").string();
  {
    std::ofstream f(file, std::ios::binary);
    std::string data(10000, 'x');
    f << data;
  }
  EngineOptions o;
  o.target = file;
  o.iodepth = 4;
  o.max_block = 4096;
  // 8192 + 4096 is past the end (10000 bytes): 1808 bytes come back.
  VectorSource src({TimedIo{0, 8192, 4096, IoOp::Read, 0}, TimedIo{0, 0, 4096, IoOp::Read, 0}});
  EngineResult r = run_engine(o, src);
  CHECK(r.ios == 2);
  CHECK(r.short_ios == 1);
  CHECK(r.eof_short == 1);
  CHECK(r.bytes == 4096 + 1808);
}

TEST_CASE("engine: a missing target without --size is an input error", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  EngineOptions o;
  o.target = (tmp.path / "absent").string();
  VectorSource src({});
  CHECK_THROWS_AS(run_engine(o, src), InputError);
}

// The engine is a library: it names the target and says what is wrong, and
// says through TargetError::fix what would mend it; the command names the
// flag (tests/iosim/engine_cli_test.cpp).
TEST_CASE("engine: target errors name the target and what mends it, not a flag", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  EngineOptions o;
  o.target = (tmp.path / "absent").string();
  VectorSource none({});
  auto fix_of = [&](EngineOptions& opts) {
    try {
      run_engine(opts, none);
    } catch (const TargetError& e) {
      CHECK(std::string(e.what()).find("--") == std::string::npos);
      return std::make_pair(std::string(e.what()), e.fix);
    }
    FAIL("no TargetError");
    return std::make_pair(std::string(), TargetError::Fix::None);
  };
  CHECK(fix_of(o) == std::make_pair(o.target + ": does not exist", TargetError::Fix::CreateWithSize));
  o.allow_create = false;
  o.size = 1 << 20;
  CHECK(fix_of(o) == std::make_pair(o.target + ": does not exist", TargetError::Fix::None));
  o = EngineOptions{};
  o.target = (tmp.path / "empty").string();
  { std::ofstream empty(o.target); }
  CHECK(fix_of(o) == std::make_pair(o.target + ": is empty", TargetError::Fix::GiveSize));
}

TEST_CASE("engine: closed loop latency obeys Little's law (IOPS x mean lat = iodepth)", "[engine]") {
  // In a closed loop every slot holds one I/O from the moment it frees to
  // its next completion, so the mean number in flight, IOPS x mean latency,
  // is the depth whatever the machine's speed. Latency that started only at
  // each I/O's own submission would miss the time it waited behind the
  // other submissions of its pass and come out well under the depth.
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "little").string();
  const uint32_t depth = GENERATE(4u, 32u);
  const bool direct = GENERATE(false, true);
  const uint32_t batch = GENERATE(1u, 0u);
  INFO("iodepth " << depth << ", direct " << direct << ", submit_batch " << batch);
  EngineOptions o;
  o.target = file;
  o.size = 32 << 20;
  o.iodepth = depth;
  o.submit_batch = batch;
  o.max_block = 4096;
  o.direct = direct;
  PatternSource src(IoOp::Read, o.size, 4096, 40'000, true);
  EngineResult r;
  try {
    r = run_engine(o, src);
  } catch (const InputError& e) {
    if (direct && std::string(e.what()).find("O_DIRECT") != std::string::npos) return;  // not on this fs
    throw;
  }
  REQUIRE(r.ios == 40'000);
  const double iops = double(r.ios) / (double(r.elapsed_ns) / 1e9);
  const double in_flight = iops * r.lat.mean() / 1e9;
  INFO("IOPS " << iops << ", mean lat " << r.lat.mean() / 1e3 << " us, device " << r.op[0].device_lat.mean() / 1e3
               << " us: " << in_flight << " in flight");
  // Only the drain at the end (the last `depth` I/Os) runs below the depth.
  CHECK(in_flight == Approx(depth).epsilon(0.05));
  // The device's own time starts at the submission: never longer.
  CHECK(r.op[0].device_lat.mean() <= r.lat.mean());
}

TEST_CASE("engine: a stop request ends the run early with its results", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "stop").string();
  EngineOptions o;
  o.target = file;
  o.size = 8 << 20;
  o.iodepth = 8;
  o.max_block = 4096;
  std::atomic<int> stop{0};
  o.stop = &stop;
  auto stop_after = [&](int ms) {
    return std::thread([&stop, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      stop.store(2);
    });
  };
  {
    // A closed loop of 60 s stops at the request.
    o.runtime_ns = 60'000'000'000;
    PatternSource src(IoOp::Read, o.size, 4096, UINT64_MAX, true);
    auto t = stop_after(300);
    EngineResult r = run_engine(o, src);
    t.join();
    CHECK(r.stopped);
    CHECK(r.ios > 0);
    CHECK(r.op[0].lat.count() == r.ios);
    CHECK(r.elapsed_ns < 10'000'000'000);
  }
  {
    // An open loop waiting 60 s for its next I/O does not wait that long.
    stop.store(0);
    o.runtime_ns = 0;
    o.open_loop = true;
    VectorSource src({TimedIo{0, 0, 4096, IoOp::Read, 0}, TimedIo{60'000'000'000, 4096, 4096, IoOp::Read, 0}});
    auto t0 = std::chrono::steady_clock::now();
    auto t = stop_after(300);
    EngineResult r = run_engine(o, src);
    t.join();
    CHECK(r.stopped);
    CHECK(r.ios == 1);
    CHECK(r.schedule_ns == 0);  // the I/O not issued is not in the schedule run
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  }
  {
    // Without a request the same flag changes nothing.
    stop.store(0);
    o.open_loop = false;
    PatternSource src(IoOp::Read, o.size, 4096, 500, true);
    EngineResult r = run_engine(o, src);
    CHECK_FALSE(r.stopped);
    CHECK(r.ios == 500);
  }
}

TEST_CASE("engine: a read-only source drives a file it may not write", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "ro").string();
  {
    std::ofstream f(file, std::ios::binary);
    std::string data(1 << 20, 'r');
    f << data;
  }
  // Not writable: immutable as root (chattr +i), mode 0444 otherwise.
  struct Unlock {
    std::string path;
    bool immutable = false;
    ~Unlock() {
      if (!immutable) return;
      int fd = ::open(path.c_str(), O_RDONLY);
      int flags = 0;
      if (fd >= 0 && ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
        flags &= ~FS_IMMUTABLE_FL;
        ioctl(fd, FS_IOC_SETFLAGS, &flags);
      }
      if (fd >= 0) ::close(fd);
    }
  } unlock{file};
  if (::geteuid() == 0) {
    int fd = ::open(file.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    int flags = 0;
    bool ok = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
    flags |= FS_IMMUTABLE_FL;
    ok = ok && ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    ::close(fd);
    if (!ok) {
      std::printf("skipped: %s cannot be made immutable here\n", file.c_str());
      std::exit(77);
    }
    unlock.immutable = true;
  } else {
    REQUIRE(::chmod(file.c_str(), 0444) == 0);
  }
  REQUIRE(::open(file.c_str(), O_RDWR) < 0);  // the file really is read-only

  EngineOptions o;
  o.target = file;
  o.iodepth = 8;
  o.max_block = 4096;
  o.read_only = true;
  PatternSource reads(IoOp::Read, 1 << 20, 4096, 1000, true);
  EngineResult r = run_engine(o, reads);
  CHECK(r.ios == 1000);
  // A flush on a read-only descriptor is fine too.
  VectorSource flush({TimedIo{0, 0, 4096, IoOp::Read, 0}, TimedIo{0, 0, 0, IoOp::Flush, 0}});
  CHECK(run_engine(o, flush).ios == 2);
  // Growing it to --size needs write access: the open says why it failed.
  o.size = 2 << 20;
  PatternSource more(IoOp::Read, 1 << 20, 4096, 10, true);
  CHECK_THROWS_AS(run_engine(o, more), InputError);
  // Without read_only the target is opened for writing, and refused.
  o.size = 0;
  o.read_only = false;
  PatternSource again(IoOp::Read, 1 << 20, 4096, 10, true);
  CHECK_THROWS_AS(run_engine(o, again), InputError);
}

TEST_CASE("engine: open loop issues at the scheduled times", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "open").string();
  std::vector<TimedIo> reqs;
  // 2,000 reads at 10,000 per second: a 0.2 s schedule.
  for (int i = 0; i < 2000; ++i)
    reqs.push_back(TimedIo{Nanos(i) * 100'000, uint64_t(i % 256) * 4096, 4096, IoOp::Read, 0});
  VectorSource src(reqs);
  EngineOptions o;
  o.target = file;
  o.size = 1 << 20;
  o.iodepth = 32;
  o.max_block = 4096;
  o.open_loop = true;
  EngineResult r = run_engine(o, src);
  CHECK(r.ios == 2000);
  CHECK(r.schedule_ns == 1999 * 100'000);
  CHECK(r.issue_lag.count() == 2000);
  // Loose bounds: a timing test must not be flaky on a busy machine.
  CHECK(r.elapsed_ns >= r.schedule_ns);
  CHECK(r.elapsed_ns < r.schedule_ns + 100'000'000);
  CHECK(r.late_issues <= r.ios);
  CHECK(r.issue_stalls <= r.late_issues);
}

TEST_CASE("engine: late issues are counted and a backlog is one stall", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "late").string();
  // 2,000 reads all due at once through one slot: each waits for the one
  // before it, so the lag grows with every issue and, once over the
  // threshold, stays over it: one stall holding every late issue.
  std::vector<TimedIo> reqs;
  for (int i = 0; i < 2000; ++i) reqs.push_back(TimedIo{0, uint64_t(i % 256) * 4096, 4096, IoOp::Read, 0});
  VectorSource src(reqs);
  EngineOptions o;
  o.target = file;
  o.size = 1 << 20;
  o.iodepth = 1;
  o.max_block = 4096;
  o.open_loop = true;
  EngineResult r = run_engine(o, src);
  REQUIRE(r.ios == 2000);
  INFO("late " << r.late_issues << ", lag max " << r.issue_lag.max());
  CHECK(r.issue_lag.max() > EngineResult::kLateIssueNs);
  CHECK(r.late_issues >= 1000);
  CHECK(r.issue_stalls == 1);
}

TEST_CASE("engine: no allocation per I/O in steady state", "[engine]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string file = (tmp.path / "alloc").string();
  EngineOptions o;
  o.target = file;
  o.size = 8 << 20;
  o.iodepth = 32;
  o.max_block = 4096;
  o.submit_batch = GENERATE(1u, 0u);
  INFO("submit_batch " << o.submit_batch);
  auto allocs_for = [&](uint64_t n, bool open_loop) {
    std::vector<TimedIo> reqs;
    for (uint64_t i = 0; i < n; ++i)
      reqs.push_back(TimedIo{Nanos(i) * 20'000, (i * 7919 % 2048) * 4096, 4096,
                               i % 3 ? IoOp::Read : IoOp::Write, 0});
    VectorSource src(std::move(reqs));
    EngineOptions oo = o;
    oo.open_loop = open_loop;
    uint64_t before = test::allocations_all_threads();
    EngineResult r = run_engine(oo, src);
    uint64_t after = test::allocations_all_threads();
    REQUIRE(r.ios == n);
    return after - before;
  };
  allocs_for(100, false);  // warm up anything lazily initialised
  uint64_t small = allocs_for(1000, false), large = allocs_for(20000, false);
  CHECK(small == large);
  uint64_t osmall = allocs_for(200, true), olarge = allocs_for(2000, true);
  CHECK(osmall == olarge);
}

#include "iosim/shaper.h"
#include "tiers/tiers.h"

TEST_CASE("engine: a tier's latency floor and IOPS cap hold on a real file", "[engine][tier]") {
  require_io_uring();
  EngineTempDir tmp;
  std::string tiers = (tmp.path / "tiers.json").string();
  {
    // 2,000 IOPS, fixed 500 us reads, no parallelism limit, 1 ms of banked tokens.
    std::ofstream f(tiers);
    f << R"({"tiers": [{"name": "test-capped", "description": "test tier", "iops": 2000,
            "bucket_ms": 1, "parallelism": 0,
            "latency": {"read": {"dist": "fixed", "p50_us": 500},
                        "write": {"dist": "fixed", "p50_us": 500},
                        "flush": {"dist": "fixed", "p50_us": 500}}}]})";
  }
  tiers::Catalog cat = tiers::load_catalog(tiers);
  const tiers::Tier& tier = cat.get("test-capped");
  Shaper shaper(tier, 7);

  std::string file = (tmp.path / "tiered").string();
  EngineOptions o;
  o.target = file;
  o.size = 16 << 20;
  o.iodepth = 64;
  o.max_block = 4096;
  o.runtime_ns = 1'500'000'000;
  o.shaper = &shaper;
  std::vector<Nanos> done;
  done.reserve(100000);
  o.completion_log = &done;
  PatternSource src(IoOp::Read, o.size, 4096, 1'000'000, true);
  EngineResult r = run_engine(o, src);

  REQUIRE(r.ios > 1000);
  CHECK(r.tier == "test-capped");
  // Latency floor: every completion at least 500 us after its issue.
  CHECK(r.lat.min() >= 500'000);
  CHECK(r.op[0].lat.min() >= 500'000);
  // The cap over the run: within 3% of 2,000 IOPS.
  double iops = double(r.ios) / (double(r.elapsed_ns) / 1e9);
  CHECK(iops <= 2000 * 1.03);
  CHECK(iops >= 2000 * 0.97);
  // The tier never completes more than its cap over any 100 ms window: at
  // most 200 I/Os plus the 2 tokens a 1 ms bucket banks and the one being
  // admitted. (Reported times can bunch after a stall of this process: an
  // I/O reaped after its tier time is reported when reaped and counted in
  // slower_than_tier.)
  std::sort(done.begin(), done.end());
  size_t worst = 0;
  for (size_t i = 0, j = 0; i < done.size(); ++i) {
    while (done[i] - done[j] >= 100'000'000) ++j;
    worst = std::max(worst, i - j + 1);
  }
  INFO("most I/Os completed in a 100 ms window: " << worst << "; reaped after the tier's time: "
                                                   << r.slower_than_tier);
  CHECK(worst <= 203);
}
