// Queue times of block requests under a cgroup v1 IOPS limit (needs root, a
// loop device and the blkio controller).
#include "capture/block.h"
#include "support/block_capture.h"
#include "support/support.h"

#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace tierlab;
namespace fs = std::filesystem;

namespace {

// A 64 MiB loop device with one partition from sector 2048 (an MBR written
// by hand: the test needs no partitioning tool), and a blkio cgroup.
struct PartitionedLoop {
  fs::path dir, image;
  std::string dev, cgroup;
  PartitionedLoop() {
    if (::geteuid() != 0) skip("block capture needs root (tracefs, loop devices, cgroups)");
    if (!fs::exists("/sys/fs/cgroup/blkio")) skip("no cgroup v1 blkio controller at /sys/fs/cgroup/blkio");
    char tmpl[] = "/tmp/tierlab-bq-XXXXXX";
    dir = ::mkdtemp(tmpl);
    image = dir / "image";
    std::system(("truncate -s 64M " + image.string()).c_str());
    {
      std::fstream f(image, std::ios::in | std::ios::out | std::ios::binary);
      unsigned char mbr[512] = {};
      unsigned char* e = mbr + 446;
      e[4] = 0x83;  // Linux
      uint32_t start = 2048, count = 131072 - 2048;
      std::memcpy(e + 8, &start, 4);
      std::memcpy(e + 12, &count, 4);
      mbr[510] = 0x55;
      mbr[511] = 0xaa;
      f.write(reinterpret_cast<char*>(mbr), sizeof mbr);
    }
    dev = test::shell_output("losetup -P -f --show " + image.string() + " 2>/dev/null");
    if (dev.rfind("/dev/loop", 0) != 0) {
      fs::remove_all(dir);
      skip("cannot attach a loop device");
    }
    std::system(("partx -a " + dev + " >/dev/null 2>&1").c_str());
    for (int i = 0; i < 50 && !fs::exists(dev + "p1"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cgroup = "/sys/fs/cgroup/blkio/tierlab-bq-" + std::to_string(::getpid());
    fs::create_directory(cgroup);
  }
  ~PartitionedLoop() {
    ::rmdir(cgroup.c_str());
    std::system(("partx -d " + dev + " >/dev/null 2>&1; losetup -d " + dev).c_str());
    fs::remove_all(dir);
  }
  [[noreturn]] static void skip(const std::string& why) {
    std::printf("skipped: %s\n", why.c_str());
    std::exit(77);
  }
};

}  // namespace

TEST_CASE("block capture: a request the IOPS limit held is timed from its submission, with its submitter's pid",
          "[block][queued]") {
  PartitionedLoop loop;
  if (!fs::exists(loop.dev + "p1")) PartitionedLoop::skip("the loop device's partition did not appear");
  std::string majmin = test::shell_output("lsblk -dno MAJ:MIN " + loop.dev + " | tr -d ' '");
  {
    std::ofstream(loop.cgroup + "/blkio.throttle.read_iops_device") << majmin << " 20\n";
  }
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  capture::BlockCaptureOptions o;
  o.device = loop.dev;
  o.duration_ns = 60'000'000'000;
  test::BackgroundBlockCapture capture(o, w);
  // 40 direct reads of 4 KiB at 20 IOPS from a process in the cgroup: past
  // the throttle's first allowance, each waits for the limit, about 50 ms.
  fs::path pidfile = loop.dir / "pid";
  std::string cmd = "sh -c 'echo $$ > " + loop.cgroup + "/cgroup.procs; echo $$ > " + pidfile.string() +
                    "; exec dd if=" + loop.dev + "p1 of=/dev/null bs=4k count=40 iflag=direct status=none'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  capture.stop();
  w.close();
  int32_t dd = std::stoi(test::shell_output("cat " + pidfile.string()));

  trace::Reader r(trace::memory_source(mem->bytes()));
  trace::Record rec;
  int reads = 0, timed = 0, held = 0, by_dd = 0;
  while (r.next(rec)) {
    auto* b = std::get_if<trace::BlockIo>(&rec.body);
    if (!b || b->op != trace::IoOp::Read || b->offset < 2048ull * 512) continue;
    ++reads;
    if (b->queued_ns > 0) {
      ++timed;
      CHECK(b->queued_ns <= rec.ts);
      if (rec.ts - b->queued_ns >= 20'000'000) ++held;
    }
    if (b->pid == dd) ++by_dd;
  }
  CHECK(reads >= 40);
  CHECK(timed >= 40);
  CHECK(held >= 15);     // the limit's wait is in the queue time
  CHECK(by_dd >= 40);    // issued by the throttle's worker, on dd's behalf
}
