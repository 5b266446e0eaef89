// `tierlab profile synth` through the CLI: the profile it writes is one
// `tierlab project` takes; bad flags exit 2.
#include "models/profile.h"
#include "models/synth.h"
#include "support/support.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

using namespace tierlab;
using namespace tierlab::models;

TEST_CASE("synth: profile synth writes a profile that project takes", "[synth][cli]") {
  test::TempDir dir;
  const std::string json = dir.file("s.json");
  auto run_cli = [](const std::vector<std::string>& args) {
    auto r = test::run_tierlab(args);
    INFO(r.out << r.err);
    return r.status;
  };
  REQUIRE(run_cli({"profile", "synth", "pgbench", "--scale", "100", "--mode", "tpcb-like", "--clients", "8",
                   "--memory", "1GiB", "--vcpus", "2", "--json", json}) == 0);
  {
    std::ifstream f(json);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    Profile p = profile_from_json(text, json);
    CHECK(p.vcpus == 2);
    CHECK(p.clients == 8);
  }
  CHECK(run_cli({"project", json, "--tier", "ebs-gp3"}) == 0);
  CHECK(run_cli({"profile", "synth", "pgbench", "--scale", "100", "--mode", "scan", "--clients", "8", "--memory",
                 "1GiB", "--vcpus", "2"}) == 2);
  CHECK(run_cli({"profile", "synth", "sysbench", "--scale", "100", "--clients", "8", "--memory", "1GiB",
                 "--vcpus", "2"}) == 2);
  CHECK(run_cli({"profile"}) == 2);
}

TEST_CASE("synth: profile synth reads a pgbench script and its -D variables", "[synth][cli]") {
  test::TempDir dir;
  const std::string script = dir.file("ro.sql");
  std::ofstream(script) << "\\set aid random_gaussian(1, :range, 10.0)\n"
                           "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n";
  auto ok = test::run_tierlab({"profile", "synth", "pgbench", "--scale", "100", "--script", script, "-D",
                               "range=5000000", "--clients", "8", "--memory", "1GiB", "--vcpus", "2"});
  INFO(ok.out << ok.err);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("random_gaussian with parameter 10") != std::string::npos);
  auto undefined = test::run_tierlab({"profile", "synth", "pgbench", "--scale", "100", "--script", script,
                                      "--clients", "8", "--memory", "1GiB", "--vcpus", "2"});
  CHECK(undefined.status == 2);
  CHECK(undefined.err.find("-D range=") != std::string::npos);
  auto bad = test::run_tierlab({"profile", "synth", "pgbench", "--scale", "100", "--script", script, "-D", "range",
                                "--clients", "8", "--memory", "1GiB", "--vcpus", "2"});
  CHECK(bad.status == 2);
  CHECK(bad.err.find("-D range: expected NAME=NUMBER") != std::string::npos);
}
