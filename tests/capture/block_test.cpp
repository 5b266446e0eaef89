// Block capture of a known dd run on a loop device (needs root).
#include "capture/block.h"
#include "support/block_capture.h"
#include "support/support.h"

#include "common/error.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

using namespace tierlab;
namespace fs = std::filesystem;

namespace {

void require_root() {
  if (::geteuid() != 0) {
    std::printf("skipped: block capture needs root (tracefs)\n");
    std::exit(77);
  }
}

struct LoopDevice {
  fs::path dir, image;
  std::string dev;
  LoopDevice() {
    char tmpl[] = "/tmp/tierlab-block-XXXXXX";
    dir = ::mkdtemp(tmpl);
    image = dir / "image";
    std::system(("truncate -s 16M " + image.string()).c_str());
    dev = test::shell_output("losetup -f --show " + image.string() + " 2>/dev/null");
    if (dev.rfind("/dev/loop", 0) != 0) {
      std::printf("skipped: cannot attach a loop device (losetup: %s)\n", dev.c_str());
      fs::remove_all(dir);
      std::exit(77);
    }
  }
  ~LoopDevice() {
    std::system(("losetup -d " + dev).c_str());
    fs::remove_all(dir);
  }
};

}  // namespace

TEST_CASE("block capture sees the I/Os of a dd run on a loop device", "[block]") {
  require_root();
  LoopDevice loop;
  struct stat st{};
  REQUIRE(::stat(loop.dev.c_str(), &st) == 0);
  uint32_t kdev = (major(st.st_rdev) << 20) | minor(st.st_rdev);

  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  capture::BlockCaptureOptions o;
  o.device = loop.dev;
  o.duration_ns = 60'000'000'000;  // stopped long before
  test::BackgroundBlockCapture capture(o, w);
  trace::Nanos before = now_ns();
  REQUIRE(std::system(("dd if=/dev/zero of=" + loop.dev + " oflag=direct bs=4k count=256 status=none").c_str()) == 0);
  trace::Nanos after = now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  capture::BlockCaptureStats stats = capture.stop();
  w.close();

  trace::Reader r(trace::memory_source(mem->bytes()));
  trace::Record rec;
  uint64_t writes = 0, bytes = 0;
  bool device_meta = false;
  while (r.next(rec)) {
    if (auto* m = std::get_if<trace::Meta>(&rec.body))
      if (m->key == "device" && "/dev/" + std::string(m->value) == loop.dev) device_meta = true;
    auto* b = std::get_if<trace::BlockIo>(&rec.body);
    if (!b || b->device != kdev || b->op != trace::IoOp::Write) continue;
    ++writes;
    bytes += b->length;
    // mono clock: the events fall inside the dd run; completion after issue.
    CHECK(rec.ts >= before);
    CHECK(rec.ts <= after);
    CHECK(b->complete_ns >= rec.ts);
    CHECK((b->flags & trace::kIoIncomplete) == 0);
  }
  CHECK(device_meta);
  CHECK(writes >= 256);
  CHECK(bytes == 256u * 4096u);
  CHECK(stats.lost == 0);
  // The tracing instance is gone.
  CHECK(!fs::exists("/sys/kernel/tracing/instances/tierlab-" + std::to_string(::getpid())));
}

TEST_CASE("block capture resolves devices by name, node, number and file", "[block]") {
  struct stat st{};
  if (::stat("/", &st) != 0 || !fs::exists("/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                                          std::to_string(minor(st.st_dev)))) {
    std::printf("skipped: the root file system is not on a block device\n");
    std::exit(77);
  }
  capture::BlockDevice byfile = capture::resolve_block_device("/");
  capture::BlockDevice byname = capture::resolve_block_device(byfile.name);
  capture::BlockDevice bynode = capture::resolve_block_device("/dev/" + byfile.name);
  capture::BlockDevice bynum = capture::resolve_block_device(std::to_string(byfile.dev >> 20) + ":" +
                                                             std::to_string(byfile.dev & 0xfffff));
  CHECK(byname.dev == byfile.dev);
  CHECK(bynode.dev == byfile.dev);
  CHECK(bynum.dev == byfile.dev);
  CHECK_THROWS_AS(capture::resolve_block_device("no-such-disk"), InputError);
  // The library names the value; the command names its flag (app::for_flag).
  CHECK_THROWS_WITH(capture::resolve_block_device("no-such-disk"),
                    Catch::Matchers::StartsWith("no-such-disk: "));
  CHECK_THROWS_AS(capture::resolve_block_device("999:999"), InputError);
}

TEST_CASE("block capture's checks name the bad value, not a flag", "[block]") {
  CHECK_THROWS_WITH(capture::check_pid(-5), "-5: must be a process id");
  CHECK_NOTHROW(capture::check_pid(0));
  CHECK_THROWS_WITH(capture::check_buffer_kb(0), Catch::Matchers::StartsWith("0: must be 1 to "));
  CHECK_NOTHROW(capture::check_buffer_kb(8192));
}

TEST_CASE("block tracing is checked before a trace is created: root, a tracefs, the block tracepoints", "[block]") {
  require_root();
  const std::string tracefs = capture::require_block_tracing("");
  CHECK(fs::exists(tracefs + "/events/block/block_rq_issue"));
  test::TempDir dir;
  try {
    capture::require_block_tracing(dir.path());
    FAIL("a directory that is no tracefs was taken");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()) == "tracefs: " + dir.path() + " is not a mounted tracefs");
  }
  // A tracefs-like tree without the block tracepoints.
  fs::create_directories(dir.path() + "/events/sched");
  try {
    capture::require_block_tracing(dir.path());
    FAIL("a tracefs without block tracepoints was taken");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()) == "tracefs: the kernel has no block/block_rq_issue tracepoint");
  }
}
