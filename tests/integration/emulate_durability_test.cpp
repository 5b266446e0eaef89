// What a PostgreSQL on an emulated tier keeps when the emulator is killed:
// every commit pgbench saw acknowledged. Needs root, /dev/fuse, loop
// devices, mkfs.ext4 and the PostgreSQL 15 binaries (skips without them).
#include "support/background.h"
#include "support/support.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

using tierlab::test::Background;
using tierlab::test::TempDir;

namespace {

const char* kBin = "/usr/lib/postgresql/15/bin";

std::string start_emulator(std::unique_ptr<Background>& run, const TempDir& dir, const std::string& out) {
  run = std::make_unique<Background>(
      std::vector<std::string>{TIERLAB_BINARY, "iosim", "emulate", "--tier", "quick", "--tiers-file",
                               dir.file("tiers.json"), "--image", dir.file("img"), "--size", "256M"},
      out);
  INFO(run->err());
  REQUIRE(run->wait_for("SIGINT or SIGTERM detaches it\n"));
  std::string dev = tierlab::test::shell_output("cat " + out);
  while (!dev.empty() && dev.back() == '\n') dev.pop_back();
  REQUIRE(dev.rfind("/dev/loop", 0) == 0);
  return dev;
}

}  // namespace

TEST_CASE("iosim emulate: a SIGKILL of the emulator under PostgreSQL loses no acknowledged commit",
          "[iosim][emulate][durability]") {
  tierlab::test::require_root("iosim emulate under PostgreSQL (FUSE mount, loop device)");
  if (::access("/dev/fuse", R_OK | W_OK) != 0) tierlab::test::skip("/dev/fuse is missing: no FUSE");
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) tierlab::test::skip("/dev/loop-control is missing");
  if (tierlab::test::shell_output("command -v mkfs.ext4").empty()) tierlab::test::skip("mkfs.ext4 is missing");
  if (::access((std::string(kBin) + "/postgres").c_str(), X_OK) != 0) tierlab::test::skip("no PostgreSQL 15");
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  std::ofstream(dir.file("tiers.json")) << R"({"name": "quick", "latency": {
      "read": {"dist": "fixed", "p50_us": 200}, "write": {"dist": "fixed", "p50_us": 200},
      "flush": {"dist": "fixed", "p50_us": 500}}})";
  const std::string mnt = dir.file("mnt"), data = mnt + "/data", port = std::to_string(20000 + ::getpid() % 20000);
  const std::string pg = "runuser -u postgres -- " + std::string(kBin);
  const std::string logs = dir.file("logs");  // the server's logs and socket, off the emulated device
  const std::string pgopts = "-o \"-p " + port + " -k " + logs + " -c listen_addresses=''\"";
  const std::string psql = std::string(kBin) + "/psql -h " + logs + " -p " + port + " -U postgres -Atc ";
  ::mkdir(mnt.c_str(), 0755);
  ::mkdir(logs.c_str(), 0755);
  tierlab::test::shell_output("chown postgres " + logs);

  std::unique_ptr<Background> emu;
  // Whatever fails, the server stops and the file system is unmounted
  // before the emulator goes (and the temp dir with them).
  struct Cleanup {
    std::string cmd;
    ~Cleanup() { tierlab::test::shell_output(cmd); }
  } cleanup{pg + "/pg_ctl -D " + data + " -m immediate stop >/dev/null 2>&1; for i in $(seq 50); do umount " + mnt +
            " 2>/dev/null && break; mountpoint -q " + mnt + " || break; sleep 0.2; done; mountpoint -q " + mnt +
            " && umount -l " + mnt + "; true"};
  const std::string dev = start_emulator(emu, dir, dir.file("dev1"));
  const std::string setup = tierlab::test::shell_output(
      "set -e; mkfs.ext4 -q -F " + dev + "; mount " + dev + " " + mnt + "; mkdir " + data + "; chown postgres " +
      data + "; " + pg + "/initdb -D " + data + " -A trust -U postgres >/dev/null; " + pg + "/pg_ctl -D " + data +
      " -w -l " + logs + "/pg.log" + " " + pgopts + " start >/dev/null; head -1 " + data + "/postmaster.pid; " +
      kBin + "/pgbench -q -h " + logs + " -p " + port + " -U postgres -i -s 1 postgres 2>/dev/null; echo ok");
  INFO("setup: " << setup << tierlab::test::shell_output("cat " + logs + "/pg.log"));
  REQUIRE(setup.find("ok") != std::string::npos);
  const std::string pm = setup.substr(0, setup.find('\n'));

  // tpcb-like, 4 clients; the emulator is killed under it.
  Background bench({"/bin/sh", "-c",
                    std::string(kBin) + "/pgbench -h " + logs + " -p " + port +
                        " -U postgres -c 4 -T 30 postgres >" + dir.file("bench.out") + " 2>&1"},
                   dir.file("bench.sh.out"));
  std::this_thread::sleep_for(std::chrono::seconds(3));
  emu->stop(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  bench.stop(0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = tierlab::test::shell_output("cat " + dir.file("bench.out"));
  INFO("pgbench: " << out);
  CHECK(secs < 20);  // the server failed its I/O and pgbench ended: nothing hung
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("number of transactions actually processed: (\\d+)")));
  const long acked = std::stol(m[1]);
  CHECK(acked > 0);

  // The server is gone or going (it cannot write); the file system is
  // unmounted, the device goes with it.
  tierlab::test::shell_output("kill -9 " + pm + " 2>/dev/null; for i in $(seq 100); do kill -0 " + pm +
                              " 2>/dev/null || break; sleep 0.1; done; for i in $(seq 50); do umount " + mnt +
                              " 2>/dev/null && break; sleep 0.2; done; mountpoint -q " + mnt + " && umount -l " + mnt);

  // A new emulator on the same image: the file system and the server recover.
  const std::string dev2 = start_emulator(emu, dir, dir.file("dev2"));
  const std::string count = tierlab::test::shell_output(
      "set -e; mount " + dev2 + " " + mnt + "; rm -f " + data + "/postmaster.pid; " + pg + "/pg_ctl -D " + data +
      " -w -l " + logs + "/pg2.log" + " " + pgopts + " start >/dev/null; " + psql +
      "'select count(*) from pgbench_history'");
  INFO("recovered: " << count << tierlab::test::shell_output("cat " + logs + "/pg2.log"));
  REQUIRE(std::regex_search(count, m, std::regex("^(\\d+)")));
  CHECK(std::stol(m[1]) >= acked);  // every acknowledged commit is there (in-flight ones may be too)
  tierlab::test::shell_output(cleanup.cmd);  // the server stops, the file system goes: the device is free
  CHECK(emu->stop(SIGTERM) == 0);
}
