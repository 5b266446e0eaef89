// The emulator's pure parts: when a tier is faster than the disk under it,
// and measuring that disk (a real file, O_DIRECT, no root).
#include "iosim/emulate.h"

#include "support/support.h"

#include <catch2/catch.hpp>

#include <dirent.h>

#include <string>

using namespace tierlab;
using namespace tierlab::iosim;

namespace {

tiers::Tier tier(int64_t read_p50_ns, double iops) {
  tiers::Tier t;
  t.name = "t";
  t.read = t.write = t.flush = {tiers::LatencyDist::Fixed, read_p50_ns, 0};
  t.total_iops = iops;
  return t;
}

int entries(const std::string& dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
    ::closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("faster_than_disk: a tier's read p50 against the disk's plus the round trip", "[emulate]") {
  const DiskFigures disk{100'000, 20'000};
  CHECK(faster_than_disk(tier(2'000'000, 0), disk, 80'000) == "");
  CHECK(faster_than_disk(tier(180'000, 0), disk, 80'000) == "");
  const std::string w = faster_than_disk(tier(150'000, 0), disk, 80'000);
  CHECK(w ==
        "tier faster than the disk: t reads at a p50 of 150 us, the image's disk and the emulator's round trip take "
        "180 us (measured at start); those I/Os run at the machine's speed");
}

TEST_CASE("faster_than_disk: the tightest IOPS cap against the disk's rate at QD 32", "[emulate]") {
  const DiskFigures disk{100'000, 20'000};
  CHECK(faster_than_disk(tier(2'000'000, 16'000), disk, 0) == "");
  CHECK(faster_than_disk(tier(2'000'000, 0), disk, 0) == "");  // no cap: nothing to hold
  auto t = tier(2'000'000, 64'000);
  CHECK(faster_than_disk(t, disk, 0).find("t caps reads at 64000 IOPS, the image's disk delivers 20000 at queue "
                                          "depth 32") != std::string::npos);
  t.read_iops = 10'000;  // reads are held to the tighter cap
  CHECK(faster_than_disk(t, disk, 0) == "");
  // Both at once, in one line.
  const std::string w = faster_than_disk(tier(50'000, 64'000), disk, 0);
  CHECK(w.find("t reads at a p50 of 50 us") != std::string::npos);
  CHECK(w.find("; it caps reads at 64000 IOPS") != std::string::npos);
  CHECK(w.find('\n') == std::string::npos);
}

TEST_CASE("faster_than_disk: nothing measured, nothing said", "[emulate]") {
  CHECK(faster_than_disk(tier(0, 1e9), DiskFigures{}, 0) == "");
}

TEST_CASE("measure_disk: a real read p50 and rate, and nothing left behind", "[emulate]") {
  test::TempDir dir;
  std::string why;
  const DiskFigures d = measure_disk(dir.path(), &why);
  INFO(why);
  if (d.read_p50_ns == 0 && why.find("O_DIRECT") != std::string::npos) test::skip("no O_DIRECT here: " + why);
  CHECK(why == "");
  CHECK(d.read_p50_ns > 0);
  CHECK(d.read_p50_ns < 1'000'000'000);
  CHECK(d.read_iops > 0);
  CHECK(entries(dir.path()) == 0);
  CHECK(measure_disk(dir.file("missing"), &why).read_iops == 0);
  CHECK(why.find("disk probe: creating a file in " + dir.file("missing")) == 0);
}
