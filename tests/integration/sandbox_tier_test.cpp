// tierlab sandbox --tier: the throwaway PostgreSQL on ext4 on an emulated
// device. Needs root, /dev/fuse, loop devices and mkfs.ext4 (skips without
// them) and the PostgreSQL binaries.
#include "support/support.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <utility>
#include <vector>
#include <regex>
#include <string>

using tierlab::test::TempDir;

TEST_CASE("sandbox --tier: commits wait for the tier's flushes, and everything is removed", "[sandbox][emulate]") {
  tierlab::test::require_root("sandbox --tier (FUSE mount, loop device)");
  if (::access("/dev/fuse", R_OK | W_OK) != 0) tierlab::test::skip("/dev/fuse is missing: no FUSE");
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) tierlab::test::skip("/dev/loop-control is missing");
  if (tierlab::test::shell_output("command -v mkfs.ext4").empty()) tierlab::test::skip("mkfs.ext4 is missing");
  TempDir dir;
  std::ofstream(dir.file("tiers.json")) << R"({"name": "flush20ms", "latency": {
      "read": {"dist": "fixed", "p50_us": 100}, "write": {"dist": "fixed", "p50_us": 100},
      "flush": {"dist": "fixed", "p50_us": 20000}}})";
  // Ten transactions, each committed on its own: with fsync on, each commit
  // waits for a WAL flush, which the tier takes 20 ms to complete.
  // (psql -f runs each statement as its own transaction.)
  std::ofstream(dir.file("commits.sql")) <<
      "create table x (i int);\n"
      "do $$ declare t0 timestamptz := clock_timestamp(); begin "
      "for i in 1..10 loop insert into x values (i); commit; end loop; "
      "raise notice 'commit_ms=%', round(extract(epoch from clock_timestamp() - t0) * 1000); end $$;\n";
  const std::string out = dir.file("psql.out");
  const bool fsync = GENERATE(true, false);
  INFO("fsync " << fsync);
  auto r = tierlab::test::run_tierlab(
      {"sandbox", "--tier", "flush20ms", "--tiers-file", dir.file("tiers.json"), "--tier-size", "256M", "--set",
       std::string("fsync=") + (fsync ? "on" : "off"), "--", "sh", "-c",
       "psql -At -f " + dir.file("commits.sql") + " >" + out + " 2>&1 && findmnt -no SOURCE -T \"$TIERLAB_PG_DATA_DIR\" >>" + out});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  INFO("psql: " << text);
  REQUIRE(r.status == 0);
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex("commit_ms=(\\d+)")));
  const int ms = std::stoi(m[1]);
  if (fsync) CHECK(ms >= 10 * 20);
  else CHECK(ms < 10 * 20);  // no flush asked: the tier's flush time is not seen
  REQUIRE(std::regex_search(text, m, std::regex("(/dev/loop\\d+)")));
  const std::string dev = m[1];
  CHECK(r.err.find("the server's files are on " + dev + ", ext4, emulating flush20ms") != std::string::npos);
  REQUIRE(std::regex_search(r.err, m, std::regex("flush (\\d+); ")));
  if (fsync) CHECK(std::stoi(m[1]) >= 10);
  // Gone: the file system, the loop device, the image.
  CHECK(::access(("/sys/block/" + dev.substr(5) + "/loop").c_str(), F_OK) != 0);
  CHECK(tierlab::test::shell_output("grep -c '^" + dev + " ' /proc/mounts") == "0");
}

TEST_CASE("sandbox --memory: the server runs in a memory cgroup of that limit, tierlab outside it",
          "[sandbox][emulate]") {
  tierlab::test::require_root("sandbox --memory (cgroup)");
  if (::access("/sys/fs/cgroup/memory/memory.limit_in_bytes", F_OK) != 0)
    tierlab::test::skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory");
  TempDir dir;
  const std::string out = dir.file("out");
  // Lines: the postmaster's group, a backend's group, tierlab's group, the limit.
  const std::string script =
      "g() { sed -n 's/^[0-9]*:memory://p' /proc/$1/cgroup; }; "
      "pm=$(g $TIERLAB_PG_POSTMASTER_PID); g $TIERLAB_PG_POSTMASTER_PID >" + out + "; "
      "psql -Atc \"select pg_read_file('/proc/' || pg_backend_pid() || '/cgroup')\" | sed -n 's/^[0-9]*:memory://p' >>" +
      out + "; g $PPID >>" + out + "; cat /sys/fs/cgroup/memory$pm/memory.limit_in_bytes >>" + out;
  auto r = tierlab::test::run_tierlab({"sandbox", "--memory", "128M", "--", "sh", "-c", script});
  INFO("stderr: " << r.err);
  std::ifstream f(out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  INFO("lines: " << lines.size());
  REQUIRE(r.status == 0);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].find("/tierlab-sandbox-") != std::string::npos);
  CHECK(lines[1] == lines[0]);  // a backend, forked by the postmaster
  CHECK(lines[2] != lines[0]);  // tierlab (and an emulator in it) stays outside
  CHECK(lines[3] == std::to_string(128u << 20));
  CHECK(::access(("/sys/fs/cgroup/memory" + lines[0]).c_str(), F_OK) != 0);  // removed
}

TEST_CASE("sandbox: bad --memory and --tier-size fail in one line before anything starts", "[sandbox][emulate]") {
  for (const auto& c : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--memory", "1q"}, "--memory"},
           {{"--memory", "1M"}, "--memory 1M: must be at least 32M"},
           {{"--tier", "nvme-local", "--tier-size", "1M"}, "--tier-size 1M: must be at least 64M"},
           {{"--tier", "nvme-local", "--memory", "1M"}, "--memory 1M"},
           {{"--tier", "no-such-tier"}, "unknown tier"},
       }) {
    std::vector<std::string> args{"sandbox"};
    args.insert(args.end(), c.first.begin(), c.first.end());
    args.insert(args.end(), {"--", "true"});
    auto r = tierlab::test::run_tierlab(args);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(r.err.find(c.second) != std::string::npos);
    CHECK(tierlab::test::count_lines(r.err) == 1);  // nothing emulated, mounted or started first
  }
}
