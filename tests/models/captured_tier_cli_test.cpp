// tierlab project --captured-on / --captured-iops-cap through the real binary.
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <string>

using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

namespace {

constexpr int64_t kCapturedMs = 1000000;

// Two sessions of 1 ms autocommit SELECTs, each reading one block that
// waited 0.5 ms before its issue.
void write_captured_trace(const std::string& path) {
  namespace t = tierlab::trace;
  auto w = t::open_writer(path);
  for (uint64_t s = 1; s <= 2; ++s) w->write(0, s, t::SessionBegin{"u", "db", "app", "", int32_t(100 + s), 0});
  for (int i = 0; i < 300; ++i)
    for (uint64_t s = 1; s <= 2; ++s) {
      int64_t at = kCapturedMs + i * 2 * kCapturedMs + static_cast<int64_t>(s) * 1000;
      w->write(at, s, t::Query{"SELECT 1"});
      w->write(at + kCapturedMs / 2, 0,
               t::BlockIo{at + kCapturedMs * 3 / 4, 0x00fe00000, uint64_t(i) * 8192, 8192, t::IoOp::Read, 0,
                          int32_t(100 + s), at + 1});
      w->write(at + kCapturedMs, s, t::Ready{'I'});
    }
  w->close();
}

}  // namespace

TEST_CASE("project: --captured-on names a tier of the catalog, or one of the two flags", "[project][cli]") {
  TempDir dir;
  std::string trace = dir.file("t.tlt");
  write_captured_trace(trace);

  auto ok = run_tierlab({"project", trace, "--tier", "nvme-local", "--captured-on", "nvme-local"});
  INFO(ok.out << ok.err);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("capture's own tier: nvme-local (known)") != std::string::npos);

  auto assumed = run_tierlab({"project", trace, "--tier", "nvme-local"});
  CHECK(assumed.status == 0);
  CHECK(assumed.out.find("capture's own tier: assumed uncapped") != std::string::npos);
  CHECK(assumed.out.find("queued before issue 0.500 ms per transaction, kept on every tier") != std::string::npos);

  auto prof = run_tierlab({"profile", trace});
  CHECK(prof.out.find("queued before issue: read mean 0.500 ms") != std::string::npos);

  auto bad = run_tierlab({"project", trace, "--tier", "nvme-local", "--captured-on", "no-such-tier"});
  CHECK(bad.status == 2);
  CHECK(bad.err.find("--captured-on no-such-tier: no such tier") != std::string::npos);

  auto both = run_tierlab(
      {"project", trace, "--tier", "nvme-local", "--captured-on", "nvme-local", "--captured-iops-cap", "1000"});
  CHECK(both.status == 2);
  CHECK(both.err.find("--captured-on and --captured-iops-cap: give one of them") != std::string::npos);

  auto cap = run_tierlab({"project", trace, "--tier", "nvme-local", "--captured-iops-cap", "1000"});
  CHECK(cap.status == 0);
  CHECK(cap.out.find("capture's own tier: 1000 IOPS (known)") != std::string::npos);
}
