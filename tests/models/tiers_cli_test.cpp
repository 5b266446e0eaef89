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

TEST_CASE("tierlab tiers show prints every figure of a tier, and list the flush counting", "[tiers][cli]") {
  // A tier, and variants of it that each change one figure the models use:
  // `tiers show` and `tiers show --json` must tell each one from the first.
  tierlab::test::TempDir dir;
  std::string f = dir.file("tiers.json");
  const std::vector<std::string> changes = {
      R"("iops": 2000)", R"("read_iops": 500)", R"("write_iops": 500)", R"("throughput_mib_s": 7)",
      R"("bucket_ms": 5)", R"("io_unit_kib": 128)", R"("merge_sequential": false)",
      R"("count_flushes": true)", R"("parallelism": 8)",
      R"("latency": {"read": {"p50_us": 150}})", R"("latency": {"read": {"p99_us": 900}})",
      R"("latency": {"read": {"dist": "exponential"}})", R"("latency": {"write": {"p50_us": 150}})",
      R"("latency": {"flush": {"p50_us": 150}})", R"("burst": {"credits": 200})",
      R"("burst": {"burst_iops": 4000})", R"("burst": {"refill_iops": 400})"};
  std::string text = R"({"tiers": [{"name": "v0", "iops": 1000, "io_unit_kib": 256, "merge_sequential": true,
      "parallelism": 4, "burst": {"credits": 100, "burst_iops": 3000, "refill_iops": 300},
      "latency": {"read": {"dist": "lognormal", "p50_us": 100, "p99_us": 400},
                  "write": {"dist": "lognormal", "p50_us": 100, "p99_us": 400},
                  "flush": {"dist": "lognormal", "p50_us": 100, "p99_us": 400}}})";
  for (size_t i = 0; i < changes.size(); ++i)
    text += ",\n{\"name\": \"v" + std::to_string(i + 1) + "\", \"base\": \"v0\", " + changes[i] + "}";
  std::ofstream(f) << text << "]}";
  auto body = [&](const std::string& name, bool json) {
    std::vector<std::string> args = {"tiers", "show", name, "--tiers-file", f};
    if (json) args.push_back("--json");
    auto r = run_tierlab(args);
    INFO(r.err);
    REQUIRE(r.status == 0);
    // Everything past the tier's own name.
    auto cut = r.out.find(json ? "\"description\"" : "\n");
    return r.out.substr(cut);
  };
  const std::string text0 = body("v0", false), json0 = body("v0", true);
  for (size_t i = 0; i < changes.size(); ++i) {
    INFO(changes[i]);
    CHECK(body("v" + std::to_string(i + 1), false) != text0);
    CHECK(body("v" + std::to_string(i + 1), true) != json0);
  }
  CHECK(text0.find("count_flushes false") != std::string::npos);
  CHECK(json0.find("\"count_flushes\": false") != std::string::npos);

  // The list's COUNTING column: how each tier counts I/Os, flushes included.
  auto l = run_tierlab({"tiers", "list", "--tiers-file", f});
  REQUIRE(l.status == 0);
  auto line = [&](const std::string& name) {
    auto at = l.out.find("\n" + name + " ");
    REQUIRE(at != std::string::npos);
    return l.out.substr(at + 1, l.out.find('\n', at + 1) - at - 1);
  };
  CHECK(line("v0").find(" 256KiB+merge ") != std::string::npos);
  CHECK(line("v8").find(" 256KiB+merge+flush ") != std::string::npos);
  CHECK(line("nvme-local").find(" 1/io ") != std::string::npos);
  CHECK(l.out.find("FLUSH p50/p99us") != std::string::npos);
}
