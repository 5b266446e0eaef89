// tierlab tiers list|show through the real binary.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

using tierlab::test::run_tierlab;

TEST_CASE("tierlab tiers show rds-16k --json prints the tier as JSON", "[tiers][cli]") {
  auto r = run_tierlab({"tiers", "show", "rds-16k", "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["name"] == "rds-16k");
  CHECK(j["iops"] == 16000);
  CHECK(j["io_unit_kib"] == 256);
  CHECK(j["merge_sequential"] == true);
  CHECK(j["latency"]["read"]["dist"] == "lognormal");
  CHECK(j["latency"]["read"]["p50_us"].get<double>() > 0);
}

TEST_CASE("tierlab tiers list shows built-ins and a tiers file's tiers", "[tiers][cli]") {
  tierlab::test::TempDir dir;
  std::string f = dir.file("tiers.json");
  std::ofstream(f) << R"({"tiers": [{"name": "lab-san", "description": "the lab SAN", "iops": 20000,
                           "latency": {"read": {"dist": "fixed", "p50_us": 300}}}]})";
  auto r = run_tierlab({"tiers", "list", "--tiers-file", f});
  INFO(r.err);
  REQUIRE(r.status == 0);
  for (const char* name : {"nvme-local", "ebs-gp3", "ebs-gp3-16k", "ebs-io2-bx", "rds-16k",
                           "aurora-io-optimized", "lab-san"})
    CHECK(r.out.find(name) != std::string::npos);
  auto s = run_tierlab({"tiers", "show", "lab-san", "--tiers-file", f});
  CHECK(s.status == 0);
  CHECK(s.out.find("20000") != std::string::npos);
}

TEST_CASE("tierlab tiers: bad input is one line and exit status 2", "[tiers][cli]") {
  auto r = run_tierlab({"tiers", "show", "ebs-gp9"});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find("ebs-gp9") != std::string::npos);
  CHECK(r.err.find("rds-16k") != std::string::npos);

  tierlab::test::TempDir dir;
  std::string f = dir.file("bad.json");
  std::ofstream(f) << R"({"tiers": [{"name": "x", "throughput_mib_s": "fast"}]})";
  auto b = run_tierlab({"tiers", "list", "--tiers-file", f});
  CHECK(b.status == 2);
  CHECK(tierlab::test::count_lines(b.err) == 1);
  CHECK(b.err.find(f) != std::string::npos);
  CHECK(b.err.find("throughput_mib_s") != std::string::npos);
}

TEST_CASE("tierlab tiers: a number too large for a double is one line naming the file, exit status 2",
          "[tiers][cli]") {
  tierlab::test::TempDir dir;
  std::string f = dir.file("big.json");
  std::ofstream(f) << R"([{"name":"x","iops":1e400}])";
  for (std::vector<std::string> args :
       {std::vector<std::string>{"tiers", "list", "--tiers-file", f},
        {"tiers", "show", "x", "--tiers-file", f},
        {"iosim", "simulate", "--tier", "x", "--tiers-file", f, "--ios", "10"},
        {"project", dir.file("no.tlt"), "--tier", "x", "--tiers-file", f}}) {
    auto r = run_tierlab(args);
    INFO(args[0] << " " << args[1] << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(tierlab::test::count_lines(r.err) == 1);
    CHECK(r.err == "tierlab: " + f + ": [0].iops: number 1e400 is out of range\n");
  }
}
