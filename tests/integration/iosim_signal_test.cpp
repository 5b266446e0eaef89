// tierlab iosim run stopped by a signal while it runs, as the real binary:
// Ctrl-C (SIGINT) or SIGTERM stops the I/O, the summary and the --json
// cover what ran, and the exit status is 128 + the signal. Needs io_uring
// (skips without it), no PostgreSQL.
#include "support/background.h"
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using tierlab::test::Background;
using tierlab::test::TempDir;

namespace {

struct Stopped {
  int status = -1;
  std::string out, err;
  nlohmann::json json;
  double seconds = 0;  // from the signal to the exit
};

// Runs `args`, sends `sig` after `after_ms`, waits for the exit.
Stopped run_and_signal(const std::vector<std::string>& args, const std::string& json_path, int sig, int after_ms,
                       const TempDir& dir) {
  std::vector<std::string> argv{TIERLAB_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  Background run(argv, dir.file("stdout"));
  std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
  auto t0 = std::chrono::steady_clock::now();
  Stopped s;
  s.status = run.stop(sig);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.out = run.out();
  s.err = run.err();
  if (s.err.find("io_uring_queue_init") != std::string::npos) tierlab::test::skip("io_uring is not available: " + s.err);
  std::ifstream f(json_path);
  if (f) s.json = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return s;
}

}  // namespace

TEST_CASE("iosim run: SIGINT or SIGTERM stops the run with its summary and JSON", "[iosim][signal]") {
  TempDir dir;
  const std::string target = dir.file("t.img"), json = dir.file("o.json");
  REQUIRE(tierlab::test::run_tierlab({"iosim", "run", "--target", target, "--size", "64m", "--ios", "1"}).status == 0);

  const int sig = GENERATE(SIGINT, SIGTERM);
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  INFO(name);
  auto s = run_and_signal({"iosim", "run", "--target", target, "--runtime", "20s", "--json", json}, json, sig, 1500,
                          dir);
  INFO("stdout: " << s.out << "\nstderr: " << s.err);
  CHECK(s.status == 128 + sig);
  CHECK(s.seconds < 5);
  // The summary of what ran, then one line saying it was stopped.
  CHECK(s.out.find("read: IOPS=") != std::string::npos);
  CHECK(s.out.find("lat percentiles (usec)") != std::string::npos);
  CHECK(tierlab::test::count_lines(s.err) == 1);
  CHECK(s.err.find("stopped by " + name) != std::string::npos);
  REQUIRE(s.json.is_object());
  CHECK(s.json["stopped"] == name);
  CHECK(s.json["ios"].get<uint64_t>() > 0);
  CHECK(s.json["read"]["ios"] == s.json["ios"]);
  CHECK(s.json["runtime_ns"].get<int64_t>() > 500'000'000);
  CHECK(s.json["runtime_ns"].get<int64_t>() < 10'000'000'000);
}

TEST_CASE("iosim run: a trace replay under a tier stops on SIGINT, even between far-apart I/Os",
          "[iosim][signal]") {
  TempDir dir;
  const std::string target = dir.file("t.img"), json = dir.file("o.json");
  {
    // 1,000 reads at 1,000/s, then one more a minute later (times in us).
    std::ofstream f(dir.file("s.iolog"));
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n";
    for (int i = 0; i < 1000; ++i) f << i * 1000 << " /x read " << (i * 7 % 512) * 4096 << " 4096\n";
    f << "60000000 /x read 0 4096\n60000001 /x close\n";
  }
  REQUIRE(tierlab::test::run_tierlab({"capture", "import", "--fio-iolog", dir.file("s.iolog"), "--out",
                                      dir.file("s.tlt")})
              .status == 0);
  REQUIRE(tierlab::test::run_tierlab({"iosim", "run", "--target", target, "--size", "4m", "--ios", "1"}).status == 0);
  auto s = run_and_signal({"iosim", "run", "--target", target, "--trace", dir.file("s.tlt"), "--tier", "ebs-gp3",
                           "--json", json},
                          json, SIGINT, 2500, dir);
  INFO("stdout: " << s.out << "\nstderr: " << s.err);
  CHECK(s.status == 128 + SIGINT);
  CHECK(s.seconds < 5);  // not the minute to the last I/O
  CHECK(s.out.find("tier=ebs-gp3") != std::string::npos);
  CHECK(s.out.find("schedule: ") != std::string::npos);
  CHECK(s.err.find("stopped by SIGINT") != std::string::npos);
  REQUIRE(s.json.is_object());
  CHECK(s.json["stopped"] == "SIGINT");
  CHECK(s.json["ios"] == 1000);
  CHECK(s.json["open_loop"] == true);
  CHECK(s.json["tier"] == "ebs-gp3");
}
