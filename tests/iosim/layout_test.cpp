// Laying a target file out before a run, on a real file system: the files
// live under /var/tmp (on the root file system), not /tmp, which may be a
// tmpfs (no FIEMAP, no device under it).
#include "iosim/engine.h"

#include "common/error.h"

#include <catch2/catch.hpp>
#include <liburing.h>

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace tierlab;
using namespace tierlab::iosim;

namespace {

struct VarTmpDir {
  fs::path path;
  VarTmpDir() {
    char tmpl[] = "/var/tmp/tierlab-layout-XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    path = tmpl;
  }
  ~VarTmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const char* name) const { return (path / name).string(); }
};

// The extents of `path` as FIEMAP reports them (written by hand here, not
// through the engine's reader). Skips the test where FIEMAP is missing.
std::vector<fiemap_extent> extents(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  constexpr unsigned kMax = 4096;
  std::vector<uint8_t> mem(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(mem.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  int err = errno;
  ::close(fd);
  if (rc != 0 && (err == EOPNOTSUPP || err == ENOTTY)) {
    std::printf("skipped: no FIEMAP on the file system of %s\n", path.c_str());
    std::exit(77);
  }
  REQUIRE(rc == 0);
  REQUIRE(fm->fm_mapped_extents < kMax);
  return std::vector<fiemap_extent>(fm->fm_extents, fm->fm_extents + fm->fm_mapped_extents);
}

// What of [0, size) is neither a hole nor unwritten, per extents().
uint64_t written_bytes(const std::string& path, uint64_t size) {
  uint64_t n = 0;
  for (const auto& e : extents(path)) {
    if (e.fe_flags & FIEMAP_EXTENT_UNWRITTEN) continue;
    uint64_t a = e.fe_logical, b = std::min<uint64_t>(e.fe_logical + e.fe_length, size);
    if (b > a) n += b - a;
  }
  return n;
}

void skip_without_io_uring() {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    std::printf("skipped: io_uring is not available here (io_uring_queue_init: %s)\n", std::strerror(-rc));
    std::exit(77);
  }
  io_uring_queue_exit(&ring);
}

void write_at(int fd, uint64_t off, uint64_t len) {
  std::vector<uint8_t> buf(len, 0x5a);
  REQUIRE(::pwrite(fd, buf.data(), len, off_t(off)) == ssize_t(len));
}

}  // namespace

TEST_CASE("layout: unwritten_ranges finds holes and unwritten extents", "[engine][layout]") {
  VarTmpDir dir;
  const std::string f = dir.file("mixed");
  constexpr uint64_t K64 = 64 << 10;
  int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  // data | hole | data | unwritten (posix_fallocate) | hole at the end
  write_at(fd, 0, K64);
  write_at(fd, 2 * K64, K64);
  REQUIRE(posix_fallocate(fd, 3 * K64, K64) == 0);
  REQUIRE(::ftruncate(fd, 5 * K64) == 0);
  extents(f);  // skips without FIEMAP
  auto r = unwritten_ranges(fd, 5 * K64);
  REQUIRE(r.size() == 2);
  CHECK(r[0].offset == K64);
  CHECK(r[0].length == K64);
  CHECK(r[1].offset == 3 * K64);
  CHECK(r[1].length == 2 * K64);
  // Only the first --size bytes count.
  r = unwritten_ranges(fd, K64);
  CHECK(r.empty());
  ::close(fd);

  // Writing them out leaves nothing unwritten, and the data is not zeros.
  fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
  auto todo = unwritten_ranges(fd, 5 * K64);
  ::close(fd);
  CHECK(lay_out(f, todo, 7) == 3 * K64);
  CHECK(written_bytes(f, 5 * K64) == 5 * K64);
  fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<uint8_t> got(4096), want(4096);
  REQUIRE(::pread(fd, got.data(), got.size(), off_t(3 * K64)) == 4096);
  fill_pattern(want.data(), 3 * K64, 4096, 7);
  CHECK(got == want);
  CHECK(std::count(got.begin(), got.end(), 0) < 64);
  // The data written before is left as it was.
  REQUIRE(::pread(fd, got.data(), got.size(), off_t(2 * K64)) == 4096);
  CHECK(std::count(got.begin(), got.end(), 0x5a) == 4096);
  CHECK(unwritten_ranges(fd, 5 * K64).empty());
  ::close(fd);
}

TEST_CASE("layout: a run on a new file reads from the device: no hole or unwritten extent is left",
          "[engine][layout]") {
  skip_without_io_uring();
  VarTmpDir dir;
  for (bool direct : {true, false}) {
    const std::string f = dir.file(direct ? "new-direct.img" : "new.img");
    constexpr uint64_t kSize = 8 << 20;
    EngineOptions o;
    o.target = f;
    o.size = kSize;
    o.direct = direct;
    o.iodepth = 8;
    o.max_block = 4096;
    o.read_only = true;  // reads only, as randread: the file is created and laid out all the same
    std::string told;
    uint64_t told_bytes = 0;
    o.on_layout = [&](const std::string& t, uint64_t b) {
      told = t;
      told_bytes = b;
    };
    VectorSource reads({TimedIo{0, 0, 4096, IoOp::Read, 0}, TimedIo{0, kSize - 4096, 4096, IoOp::Read, 0}});
    EngineResult r = run_engine(o, reads);
    INFO(f);
    CHECK(r.ios == 2);
    CHECK(told == f);
    CHECK(told_bytes == kSize);
    CHECK(r.laid_out_bytes == kSize);
    CHECK(written_bytes(f, kSize) == kSize);
    for (const auto& e : extents(f)) CHECK((e.fe_flags & FIEMAP_EXTENT_UNWRITTEN) == 0);

    // A second run finds nothing to lay out.
    told.clear();
    VectorSource again({TimedIo{0, 0, 4096, IoOp::Read, 0}});
    r = run_engine(o, again);
    CHECK(told.empty());
    CHECK(r.laid_out_bytes == 0);
  }

  // A file someone else preallocated (posix_fallocate, as earlier runs did)
  // and grown past its end: both parts are laid out.
  const std::string f = dir.file("prealloc.img");
  int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(posix_fallocate(fd, 0, 4 << 20) == 0);
  ::close(fd);
  REQUIRE(written_bytes(f, 4 << 20) == 0);
  EngineOptions o;
  o.target = f;
  o.size = 6 << 20;
  o.iodepth = 4;
  o.max_block = 4096;
  VectorSource one({TimedIo{0, 0, 4096, IoOp::Read, 0}});
  EngineResult r = run_engine(o, one);
  CHECK(r.laid_out_bytes == 6 << 20);
  CHECK(written_bytes(f, 6 << 20) == 6 << 20);
}

TEST_CASE("layout: direct I/O alignment comes from the target", "[engine][layout]") {
  VarTmpDir dir;
  const std::string f = dir.file("a");
  uint64_t before = direct_io_alignment(f);  // not created yet: its directory's device
  int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  ::close(fd);
  uint64_t a = direct_io_alignment(f);
  CHECK(a >= 512);
  CHECK((a & (a - 1)) == 0);
  CHECK(before == a);
}

TEST_CASE("layout: a stop request ends the layout between writes", "[engine][layout]") {
  VarTmpDir dir;
  const std::string f = dir.file("stopped");
  int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 32 << 20) == 0);
  extents(f);  // skips without FIEMAP
  auto todo = unwritten_ranges(fd, 32 << 20);
  ::close(fd);
  std::atomic<int> stop{2};  // SIGINT, before the first write
  CHECK(lay_out(f, todo, 1, &stop) == 0);
  CHECK(written_bytes(f, 32 << 20) == 0);
  stop = 0;
  CHECK(lay_out(f, todo, 1, &stop) == 32 << 20);
  CHECK(written_bytes(f, 32 << 20) == 32 << 20);
}
