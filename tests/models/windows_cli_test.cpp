// Windows of a capture through the real binary, on synthetic traces with
// block I/O or (host-less) counters only: project's intervals, profile's
// warnings for a capture too short or unsteady to project from.
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

using tierlab::test::count_lines;
using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kS = 1000000000;

// Four sessions, each committing an UPDATE every 4 ms for `seconds`: its
// backend writes the WAL, the device flushes it in flush_us(t) µs, and the
// commit returns after the flush.
void write_trace(const std::string& path, double seconds, const std::function<int64_t(int64_t)>& flush_us) {
  namespace tr = tierlab::trace;
  auto w = tr::open_writer(path);
  w->write(0, 0, tr::Meta{"cpu.count", "2"});
  for (uint64_t s = 1; s <= 4; ++s) w->write(0, s, tr::SessionBegin{"u", "db", "app", "127.0.0.1:1", int32_t(100 + s), 0});
  const int64_t end = static_cast<int64_t>(seconds * kS);
  int64_t last = 0;
  for (int64_t t0 = kS / 1000; t0 < end; t0 += 4000 * kUs)
    for (uint64_t s = 1; s <= 4; ++s) {
      int64_t t = t0 + static_cast<int64_t>(s) * 1000 * kUs;
      int64_t fl = flush_us(t) * kUs;
      w->write(t, s, tr::Query{"UPDATE t SET v = v + 1 WHERE id = 1"});
      w->write(t + 100 * kUs, 0,
               tr::BlockIo{t + 200 * kUs, 1, static_cast<uint64_t>(t) * 8192 % (1u << 30), 8192, tr::IoOp::Write, 0,
                           int32_t(100 + s)});
      w->write(t + 200 * kUs, 0, tr::BlockIo{t + 200 * kUs + fl, 1, 0, 0, tr::IoOp::Flush, 0, 0});
      w->write(t + 300 * kUs + fl, s, tr::Ready{'I'});
      last = t + 300 * kUs + fl;
    }
  for (uint64_t s = 1; s <= 4; ++s) w->write(last + kS / 1000, s, tr::SessionEnd{});
  w->close();
}

}  // namespace

TEST_CASE("project: each figure carries its range over the capture's windows", "[project][cli][windows]") {
  TempDir dir;
  std::string trace = dir.file("steady.tlt");
  write_trace(trace, 12, [](int64_t) { return 200; });

  auto prof = run_tierlab({"profile", trace});
  INFO(prof.out << prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.find("steadiness over 4 windows of 3.0 s: TPS ") != std::string::npos);
  CHECK(prof.out.find("warning:") == std::string::npos);

  auto r = run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("in brackets: lowest\u2013highest of the capture's 4 windows of 3.0 s each") != std::string::npos);
  CHECK(r.out.find("x (") != std::string::npos);

  auto j = run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k", "--json", "-"});
  REQUIRE(j.status == 0);
  auto pj = nlohmann::json::parse(j.out);
  CHECK(pj["windows"]["count"] == 4);
  for (const auto& t : pj["tiers"]) {
    double lo = t["windows"]["tps"][0], hi = t["windows"]["tps"][1], tps = t["tps"];
    CHECK(lo > 0);
    CHECK(lo <= hi);
    // A steady capture: every window projects close to the whole.
    CHECK(lo > 0.9 * tps);
    CHECK(hi < 1.1 * tps);
  }

  // --windows 1: no interval.
  auto one = run_tierlab({"project", trace, "--tier", "nvme-local", "--windows", "1", "--json", "-"});
  REQUIRE(one.status == 0);
  CHECK(nlohmann::json::parse(one.out)["windows"]["count"] == 0);
  CHECK(nlohmann::json::parse(one.out)["tiers"][0].count("windows") == 0);
}

TEST_CASE("profile: a capture whose device flush time moves is unsteady, and project's range shows it",
          "[project][cli][windows]") {
  TempDir dir;
  std::string trace = dir.file("unsteady.tlt");
  // The device flushes in 150 µs for the first half, 780 µs after.
  write_trace(trace, 12, [](int64_t t) { return t < 6 * kS ? 150 : 780; });

  auto prof = run_tierlab({"profile", trace});
  INFO(prof.out << prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.find("warning: unsteady capture: WAL flush latency 0.150\u20130.780 ms over 4 windows") !=
        std::string::npos);
  auto pj = nlohmann::json::parse(run_tierlab({"profile", trace, "--json"}).out);
  CHECK(pj["steadiness"]["unsteady"] == true);
  CHECK(pj["steadiness"]["windows"] == 4);

  auto j = run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k", "--json", "-"});
  INFO(j.err);
  REQUIRE(j.status == 0);
  auto p = nlohmann::json::parse(j.out);
  double lo = p["tiers"][1]["windows"]["ratio"][0], hi = p["tiers"][1]["windows"]["ratio"][1];
  CHECK(hi > lo * 1.05);
  bool warned = false;
  for (const auto& n : p["notes"]) warned |= n.get<std::string>().find("unsteady capture: WAL flush latency") == 0;
  CHECK(warned);
}

TEST_CASE("profile: a capture too short to project from is called so and --windows too many is refused",
          "[project][cli][windows]") {
  TempDir dir;
  std::string trace = dir.file("short.tlt");
  write_trace(trace, 3.7, [](int64_t) { return 200; });

  auto prof = run_tierlab({"profile", trace});
  INFO(prof.out << prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.find("warning: capture too short to project from: 3.7 s") != std::string::npos);

  auto r = run_tierlab({"project", trace, "--tier", "nvme-local"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("note: capture too short to project from: 3.7 s") != std::string::npos);
  CHECK(r.out.find("in brackets") == std::string::npos);

  auto bad = run_tierlab({"project", trace, "--tier", "nvme-local", "--windows", "4"});
  INFO(bad.out << bad.err);
  CHECK(bad.status == 2);
  CHECK(bad.out.empty());
  CHECK(count_lines(bad.err) == 1);
  CHECK(bad.err.find("--windows: ") != std::string::npos);
}

TEST_CASE("project: a profile JSON has no windows and no note about them", "[project][cli][windows]") {
  TempDir dir;
  std::string json = dir.file("synth.json");
  auto synth = run_tierlab({"profile", "synth", "pgbench", "--scale", "136", "--mode", "select-only", "--clients", "32",
                            "--memory", "8GiB", "--vcpus", "2", "--json", json});
  INFO(synth.out << synth.err);
  REQUIRE(synth.status == 0);

  auto proj = run_tierlab({"project", json, "--tier", "nvme-local"});
  INFO(proj.out << proj.err);
  REQUIRE(proj.status == 0);
  CHECK(proj.out.find("too short") == std::string::npos);
  CHECK(proj.out.find("windows") == std::string::npos);

  auto asked = run_tierlab({"project", json, "--tier", "nvme-local", "--windows", "4"});
  CHECK(asked.status == 2);
  CHECK(count_lines(asked.err) == 1);
  CHECK(asked.err.find("--windows") != std::string::npos);
  CHECK(asked.err.find("is a profile, not a trace") != std::string::npos);
}

TEST_CASE("profile: a host-less capture's reads per transaction are compared across its windows",
          "[profile][cli][windows][counters]") {
  // Four sessions each running a SELECT every 4 ms (1,000 tps) for 12 s,
  // no block I/O: pg_stat_database's blks_read sampled once a second, one
  // read per transaction for 6 s, then four.
  namespace tr = tierlab::trace;
  TempDir dir;
  const std::string trace = dir.file("hostless.tlt");
  {
    auto w = tr::open_writer(trace);
    w->write(0, 0, tr::Meta{"cpu.count", "2"});
    for (uint64_t s = 1; s <= 4; ++s) w->write(0, s, tr::SessionBegin{"u", "db", "app", "127.0.0.1:1", 0, 0});
    double blks = 0;
    for (int64_t sec = 0; sec <= 12; ++sec) {
      w->write(sec * kS, 0, tr::Sample{"pg.blks_read", blks});
      if (sec == 12) break;
      blks += sec < 6 ? 1000 : 4000;
      for (int64_t t0 = sec * kS + kS / 1000; t0 < (sec + 1) * kS; t0 += 4000 * kUs)
        for (uint64_t s = 1; s <= 4; ++s) {
          const int64_t t = t0 + static_cast<int64_t>(s) * 500 * kUs;
          w->write(t, s, tr::Query{"SELECT v FROM t WHERE id = 1"});
          w->write(t + 300 * kUs, s, tr::Ready{'I'});
        }
    }
    for (uint64_t s = 1; s <= 4; ++s) w->write(12 * kS + kS / 1000, s, tr::SessionEnd{});
    w->close();
  }
  auto prof = run_tierlab({"profile", trace});
  INFO(prof.out << prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.find("device (from counters)") != std::string::npos);
  CHECK(prof.out.find("steadiness over 4 windows of 3.0 s: ") != std::string::npos);
  CHECK(prof.out.find(", device reads per transaction ") != std::string::npos);
  CHECK(prof.out.find("warning: unsteady capture: device reads per transaction") != std::string::npos);
}
