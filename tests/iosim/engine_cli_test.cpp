// tierlab iosim run through the binary: flags, output and JSON keys.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

namespace {
void require_io_uring_cli(const tierlab::test::RunResult& r) {
  if (r.status != 0 && r.err.find("io_uring_queue_init") != std::string::npos)
    tierlab::test::skip("io_uring is not available: " + r.err);
}
}  // namespace

TEST_CASE("cli: iosim run writes, verifies and reports fio-like and JSON", "[engine][cli]") {
  TempDir dir;
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--rw", "randrw", "--bs", "8k",
                        "--iodepth", "8", "--ios", "600", "--verify", "--json", dir.file("out.json")});
  require_io_uring_cli(r);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("read: IOPS=") != std::string::npos);
  CHECK(r.out.find("write: IOPS=") != std::string::npos);
  CHECK(r.out.find("lat percentiles (usec)") != std::string::npos);
  CHECK(r.out.find("verify:") != std::string::npos);
  std::ifstream f(dir.file("out.json"));
  auto j = nlohmann::json::parse(f);
  CHECK(j["ios"] == 600);
  for (const char* k : {"iops", "bw_bytes", "tier", "short_ios", "eagain", "eintr", "lat_ns"}) CHECK(j.contains(k));
  for (const char* k : {"p50", "p90", "p99", "p999", "max"}) CHECK(j["lat_ns"].contains(k));
  CHECK(j["tier"] == "");
  CHECK(j["verified_bytes"].get<uint64_t>() > 0);
}

TEST_CASE("cli: iosim run replays a trace open loop under a tier", "[engine][cli]") {
  TempDir dir;
  {
    std::ofstream f(dir.file("s.iolog"));
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n";
    for (int i = 0; i < 400; ++i) f << i * 500 << " /x read " << (i * 7 % 512) * 4096 << " 4096\n";
    f << "200000 /x close\n";
    std::ofstream t(dir.file("tiers.json"));
    t << R"({"tiers": [{"name": "slow-disk", "description": "1 ms reads", "iops": 0,
             "latency": {"read": {"dist": "fixed", "p50_us": 1000}, "write": {"dist": "fixed", "p50_us": 1000},
                         "flush": {"dist": "fixed", "p50_us": 1000}}}]})";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir.file("s.iolog"), "--out", dir.file("s.tlt")}).status == 0);
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--trace", dir.file("s.tlt"),
                        "--tier", "slow-disk", "--tiers-file", dir.file("tiers.json"), "--json", "-"});
  require_io_uring_cli(r);
  INFO(r.err);
  REQUIRE(r.status == 0);
  // --json -: the JSON alone on stdout, as iosim simulate writes it.
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["ios"] == 400);
  CHECK(j["tier"] == "slow-disk");
  CHECK(j["open_loop"] == true);
  CHECK(j["lat_ns"]["min"].get<int64_t>() >= 1'000'000);
  CHECK(j["schedule_ns"] == 399 * 500'000);
  for (const char* k : {"p50", "p99", "max"}) CHECK(j["issue_lag_ns"].contains(k));
  CHECK(j["stopped"] == "");
  // Held as root, not otherwise; either way the run says which.
  REQUIRE(j.contains("cpu_latency_held"));
  CHECK(r.out.find("cpu wake-up latency: ") == std::string::npos);

  // --no-pm-qos leaves the CPU wake-up latency alone; --iodepth-batch 0
  // submits everything ready at once: the same I/Os either way.
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--trace", dir.file("s.tlt"), "--no-pm-qos",
                   "--iodepth-batch", "0", "--json", dir.file("o.json")});
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::ifstream f(dir.file("o.json"));
  j = nlohmann::json::parse(f);
  CHECK(j["ios"] == 400);
  CHECK(j["cpu_latency_held"] == false);
  CHECK(r.out.find("cpu wake-up latency: not held (--no-pm-qos)") != std::string::npos);
  // The trace gives each I/O's op and size: pattern flags are refused, not ignored.
  for (const char* flag : {"--rw", "--bs", "--rwmixread"}) {
    r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--trace", dir.file("s.tlt"), flag,
                     std::string(flag) == "--rw" ? "write" : std::string(flag) == "--bs" ? "1m" : "10"});
    CHECK(r.status == 2);
    CHECK(tierlab::test::count_lines(r.err) == 1);
    CHECK(r.err.find(std::string("--trace excludes ") + flag) != std::string::npos);
  }
}

TEST_CASE("cli: iosim run rejects bad input with one line and exit 2", "[engine][cli]") {
  TempDir dir;
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--tier", "no-such-tier"});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  r = run_tierlab({"iosim", "run", "--target", dir.file("absent")});
  CHECK(r.status == 2);
  CHECK(r.err.find("does not exist (give --size") != std::string::npos);
  // The real reason first, with or without --size.
  for (std::string size : {"", "4m"}) {
    for (const std::string& target : {dir.path(), std::string("/dev/null")}) {
      std::vector<std::string> args{"iosim", "run", "--target", target, "--ios", "10"};
      if (!size.empty()) args.insert(args.end(), {"--size", size});
      r = run_tierlab(args);
      INFO(target << " --size " << size << ": " << r.err);
      CHECK(r.status == 2);
      CHECK(tierlab::test::count_lines(r.err) == 1);
      CHECK(r.err.find(target + ": not a regular file or block device") != std::string::npos);
    }
  }
  { std::ofstream empty(dir.file("empty")); }
  r = run_tierlab({"iosim", "run", "--target", dir.file("empty")});
  CHECK(r.status == 2);
  CHECK(r.err.find("empty: is empty (give --size)") != std::string::npos);
  // 0 is not a size or a run time to use.
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "0"});
  CHECK(r.status == 2);
  CHECK(r.err.find("--size: must be above 0") != std::string::npos);
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--runtime", "0"});
  CHECK(r.status == 2);
  CHECK(r.err.find("--runtime: '0' must be longer than 0") != std::string::npos);
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4q"});
  CHECK(r.status == 2);
  // A --json path that cannot be written fails before any I/O runs.
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--ios", "100", "--json",
                   dir.file("no/such/dir/out.json")});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find("--json " + dir.file("no/such/dir/out.json") + ": No such file or directory") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE("cli: iosim run --json - writes the JSON alone on stdout", "[engine][cli]") {
  TempDir dir;
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--ios", "300", "--json", "-"});
  require_io_uring_cli(r);
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);  // throws on any text around it
  CHECK(j["ios"] == 300);
  CHECK(j["stopped"] == "");
}
