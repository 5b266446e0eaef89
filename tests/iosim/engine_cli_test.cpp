// tierlab iosim run through the binary: flags, output and JSON keys.
#include "support/support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

  // A trace without --size on a target that is missing or empty: the
  // engine names the target, the command the flag that mends it.
  r = run_tierlab({"iosim", "run", "--target", dir.file("absent"), "--trace", dir.file("s.tlt")});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: " + dir.file("absent") + ": does not exist (give --size to create it)\n");
  { std::ofstream empty(dir.file("empty")); }
  r = run_tierlab({"iosim", "run", "--target", dir.file("empty"), "--trace", dir.file("s.tlt")});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: " + dir.file("empty") + ": is empty (give --size)\n");

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
  // The engine's request slots: the message names the flag.
  for (const char* depth : {"0", "65537"}) {
    r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--iodepth", depth});
    CHECK(r.status == 2);
    CHECK(tierlab::test::count_lines(r.err) == 1);
    CHECK(r.err == std::string("tierlab: --iodepth ") + depth + ": must be 1 to 65536\n");
  }
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

TEST_CASE("cli: iosim run lays out a new file and says so", "[engine][cli][layout]") {
  // /var/tmp: the root file system, with FIEMAP (a tmpfs /tmp has none).
  char tmpl[] = "/var/tmp/tierlab-cli-layout-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dir = tmpl;
  struct Rm {
    std::string d;
    ~Rm() { std::filesystem::remove_all(d); }
  } rm{dir};
  const std::string f = dir + "/new.img";
  auto r = run_tierlab({"iosim", "run", "--target", f, "--size", "4m", "--rw", "randread", "--bs", "4k", "--direct",
                        "--ios", "200", "--json", dir + "/o.json"});
  require_io_uring_cli(r);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.find("tierlab: iosim run: laying out " + f + ": 4.0 MiB") != std::string::npos);
  CHECK(r.out.find("laid out before the run: 4.0 MiB written") != std::string::npos);
  std::ifstream jf(dir + "/o.json");
  auto j = nlohmann::json::parse(jf);
  CHECK(j["laid_out_bytes"] == 4 << 20);
  // filefrag (e2fsprogs) reads FIEMAP: no extent is left "unwritten".
  std::string frag = tierlab::test::shell_output("filefrag -v " + f + " 2>&1");
  INFO(frag);
  if (frag.find("FIEMAP failed") == std::string::npos && !frag.empty()) {
    CHECK(frag.find("unwritten") == std::string::npos);
    CHECK(frag.find(" found") != std::string::npos);
  }
  // Laid out once: the next run says nothing about it.
  r = run_tierlab({"iosim", "run", "--target", f, "--rw", "randread", "--ios", "10"});
  REQUIRE(r.status == 0);
  CHECK(r.err.find("laying out") == std::string::npos);
}

TEST_CASE("cli: iosim run --direct checks the alignment before the run", "[engine][cli]") {
  TempDir dir;
  // 3000 is a multiple of no logical block size: refused before any I/O, naming --bs.
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--bs", "3000", "--direct",
                        "--ios", "100"});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.rfind("tierlab: --bs 3000: not a multiple of ", 0) == 0);
  CHECK(r.err.find("direct I/O alignment of " + dir.file("data")) != std::string::npos);
  CHECK(r.out.empty());
  // Without --direct any size goes.
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--bs", "3000", "--ios", "100"});
  require_io_uring_cli(r);
  CHECK(r.status == 0);
  // A trace's unaligned I/O, likewise.
  {
    std::ofstream f(dir.file("u.iolog"));
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n10 /x read 0 4096\n20 /x read 1000 3000\n30 /x close\n";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir.file("u.iolog"), "--out", dir.file("u.tlt")}).status ==
          0);
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--trace", dir.file("u.tlt"), "--direct"});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find("--direct: " + dir.file("u.tlt") + " has a read of 3000 bytes at offset 1000") !=
        std::string::npos);
}

TEST_CASE("cli: iosim run says in words what wrapped and skipped I/Os are", "[engine][cli]") {
  TempDir dir;
  {
    std::ofstream f(dir.file("w.iolog"));
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n10 /x read 0 4096\n"
         "20 /x read 104857600 4096\n30 /x trim 0 4096\n40 /x read 209715200 4096\n50 /x close\n";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir.file("w.iolog"), "--out", dir.file("w.tlt")}).status ==
          0);
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "1m", "--trace", dir.file("w.tlt")});
  require_io_uring_cli(r);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("wrapped=") == std::string::npos);
  CHECK(r.out.find("skipped=") == std::string::npos);
  CHECK(r.out.find("  wrapped: 2 I/Os started beyond the end of the target (1.0 MiB) and were moved into it") !=
        std::string::npos);
  CHECK(r.out.find("  skipped: 1 I/Os were not issued: trims (discards) and zero-length requests") !=
        std::string::npos);
}

TEST_CASE("cli: iosim run -P prints progress lines on stderr", "[engine][cli]") {
  TempDir dir;
  auto r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "--size", "4m", "--runtime", "1200ms", "-P",
                        "0.25", "--json", "-"});
  require_io_uring_cli(r);
  INFO(r.err);
  REQUIRE(r.status == 0);
  size_t lines = 0;
  for (size_t p = 0; (p = r.err.find("progress: ", p)) != std::string::npos; ++p) ++lines;
  CHECK(lines >= 3);
  CHECK(r.err.find(" IOPS, ") != std::string::npos);
  CHECK(r.err.find(" MiB/s, lat ") != std::string::npos);
  CHECK(nlohmann::json::parse(r.out)["ios"].get<uint64_t>() > 0);  // stdout keeps the JSON alone
  // Not a terminal and no -P: no progress lines; -P 0: none either.
  for (std::vector<std::string> extra : {std::vector<std::string>{}, std::vector<std::string>{"-P", "0"}}) {
    std::vector<std::string> args{"iosim", "run", "--target", dir.file("data"), "--runtime", "600ms"};
    args.insert(args.end(), extra.begin(), extra.end());
    r = run_tierlab(args);
    REQUIRE(r.status == 0);
    CHECK(r.err.find("progress: ") == std::string::npos);
  }
  r = run_tierlab({"iosim", "run", "--target", dir.file("data"), "-P", "-1"});
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  // On a terminal (script(1) gives the run a pseudo-terminal): a line every second by default.
  if (std::system("command -v script >/dev/null 2>&1") == 0) {
    std::string out = tierlab::test::shell_output("script -qec '" + std::string(TIERLAB_BINARY) +
                                                  " iosim run --target " + dir.file("data") +
                                                  " --runtime 2500ms' /dev/null");
    INFO(out);
    size_t n = 0;
    for (size_t p = 0; (p = out.find("progress: ", p)) != std::string::npos; ++p) ++n;
    CHECK(n >= 1);  // at 1 s and 2 s, unless the machine is too busy to wake the printer
    CHECK(n <= 2);
  }
}
