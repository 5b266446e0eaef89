// tierlab iosim simulate through the real binary.
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

using tierlab::test::run_tierlab;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace

TEST_CASE("iosim simulate: closed loop, side by side, JSON keys", "[sim][cli]") {
  tierlab::test::TempDir dir;
  std::string out = dir.file("sim.json");
  auto r = run_tierlab({"iosim", "simulate", "--rw", "randrw", "--bs", "4k", "--iodepth", "32", "--size",
                        "1g", "--rwmixread", "70", "--runtime", "2s", "--tier", "nvme-local", "--tier",
                        "ebs-gp3", "--tier", "rds-16k", "--json", out});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("IOPS") != std::string::npos);
  CHECK(r.out.find("clat p99") != std::string::npos);
  CHECK(r.out.find("ebs-gp3") != std::string::npos);
  auto j = read_json(out);
  REQUIRE(j["tiers"].size() == 3);
  for (const auto& t : j["tiers"]) {
    for (const char* k : {"tier", "iops", "bw_bytes", "lat_ns", "throttled_ns", "mean_queue_depth", "qd_series"})
      CHECK(t.contains(k));
    for (const char* k : {"p50", "p90", "p99", "p999", "max"}) CHECK(t["lat_ns"].contains(k));
    CHECK(t["read"]["ios"].get<uint64_t>() > t["write"]["ios"].get<uint64_t>());
  }
  CHECK(j["tiers"][0]["tier"] == "nvme-local");
  CHECK(j["tiers"][1]["iops"].get<double>() == Approx(3000).epsilon(0.01));
  CHECK(j["tiers"][2]["iops"].get<double>() == Approx(16000).epsilon(0.01));
  CHECK(j["tiers"][1]["throttled_ns"].get<int64_t>() > 1'900'000'000);
  CHECK(j["tiers"][0]["throttled_ns"].get<int64_t>() == 0);

  // Same seed, same numbers; JSON on stdout with --json -.
  auto a = run_tierlab({"iosim", "simulate", "--ios", "50000", "--iodepth", "8", "--tier", "ebs-gp3-16k",
                        "--seed", "9", "--json", "-"});
  auto b = run_tierlab({"iosim", "simulate", "--ios", "50000", "--iodepth", "8", "--tier", "ebs-gp3-16k",
                        "--seed", "9", "--json", "-"});
  REQUIRE(a.status == 0);
  CHECK(a.out == b.out);
  CHECK(nlohmann::json::parse(a.out)["tiers"][0]["ios"] == 50000);
}

TEST_CASE("iosim simulate: open loop from a trace's block I/O", "[sim][cli]") {
  tierlab::test::TempDir dir;
  std::string trace = dir.file("io.tlt");
  {
    auto w = tierlab::trace::open_writer(trace);
    for (int i = 0; i < 10000; ++i) {
      tierlab::trace::BlockIo b;
      const int64_t issue = 5'000'000'000 + static_cast<int64_t>(i) * 200'000;  // 5,000 IOPS
      b.complete_ns = issue + 150'000;
      b.offset = static_cast<uint64_t>(i) * 7 * 1048576;
      b.length = 8192;
      b.op = i % 4 == 0 ? tierlab::trace::IoOp::Write : tierlab::trace::IoOp::Read;
      w->write(issue, 0, b);
    }
    w->close();
  }
  std::string out = dir.file("sim.json");
  auto r = run_tierlab({"iosim", "simulate", "--trace", trace, "--tier", "ebs-gp3", "--tier", "nvme-local",
                        "--json", out});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("behind") != std::string::npos);
  auto j = read_json(out);
  auto gp3 = j["tiers"][0], nvme = j["tiers"][1];
  CHECK(gp3["ios"] == 10000);
  CHECK(gp3["iops"].get<double>() == Approx(3000).epsilon(0.02));
  CHECK(gp3["behind_ns"]["end"].get<int64_t>() > 1'000'000'000);  // 2 s of I/O takes ~3.3 s
  CHECK(nvme["iops"].get<double>() == Approx(5000).epsilon(0.02));
  CHECK(nvme["behind_ns"]["end"].get<int64_t>() < 1'000'000);

  auto f = run_tierlab({"iosim", "simulate", "--trace", trace, "--records", "file", "--tier", "ebs-gp3"});
  CHECK(f.status == 2);
  CHECK(tierlab::test::count_lines(f.err) == 1);
  CHECK(f.err.find("10000 block_io") != std::string::npos);
}

TEST_CASE("iosim simulate: bad input is one line and exit status 2", "[sim][cli]") {
  for (std::vector<std::string> args : {
           std::vector<std::string>{"iosim", "simulate", "--tier", "ebs-gp9"},
           {"iosim", "simulate", "--bs", "4q", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--rw", "sideways", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--runtime", "ten", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--size", "1k", "--bs", "4k", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--trace", "/nonexistent.tlt", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--trace", "/nonexistent.tlt", "--rw", "read", "--tier", "ebs-gp3"},
           // Not a closed loop in disguise, nor a 10 s run.
           {"iosim", "simulate", "--rate-iops", "-5", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--rate-iops", "0", "--tier", "ebs-gp3"},
           {"iosim", "simulate", "--runtime", "0", "--tier", "ebs-gp3"},
       }) {
    auto r = run_tierlab(args);
    INFO(args[2] << " " << args[3] << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(tierlab::test::count_lines(r.err) == 1);
  }
}

TEST_CASE("iosim simulate: a bad pattern value is named with its flag", "[sim][cli]") {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  for (const Case& c : std::vector<Case>{
           {{"--rw", "sideways"},
            "tierlab: --rw sideways: unknown pattern (known: randread, randwrite, read, write, randrw, readwrite)\n"},
           {{"--size", "1k", "--bs", "4k"}, "tierlab: --size 1024 bytes: must hold at least one block (4096 bytes)\n"},
           {{"--bs", "0"}, "tierlab: --bs 0: must be at least 1 byte\n"},
       }) {
    std::vector<std::string> args{"iosim", "simulate", "--tier", "ebs-gp3"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = run_tierlab(args);
    INFO(c.args[0]);
    CHECK(r.status == 2);
    CHECK(r.err == c.err);
  }
}

TEST_CASE("iosim simulate: an open loop above capacity holds iodepth and counts the waits", "[sim][cli]") {
  auto r = run_tierlab({"iosim", "simulate", "--rate-iops", "1e12", "--runtime", "1s", "--tier", "ebs-gp3",
                        "--json", "-"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto t = nlohmann::json::parse(r.out)["tiers"][0];
  CHECK(t["max_queue_depth"] == 32);  // iosim run's default --iodepth
  CHECK(t["iops"].get<double>() == Approx(3000).epsilon(0.02));
  CHECK(t["slot_waits"].get<uint64_t>() > 2900);
  CHECK(t["late_issues"]["ios"].get<uint64_t>() > 2900);
  for (const char* k : {"p50", "p99", "max"}) CHECK(t["issue_lag_ns"].contains(k));

  r = run_tierlab({"iosim", "simulate", "--rate-iops", "1e12", "--runtime", "1s", "--iodepth", "4", "--tier",
                   "ebs-gp3", "--json", "-"});
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["workload"]["iodepth"] == 4);
  CHECK(j["tiers"][0]["max_queue_depth"] == 4);
}
