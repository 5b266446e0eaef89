// capture import and trace export --format fio-iolog through the tierlab binary.
#include "support/support.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

TEST_CASE("cli: fio iolog v3 -> capture import -> trace export --format fio-iolog", "[import][cli]") {
  TempDir dir;
  const std::string log =
      "fio version 3 iolog\n"
      "12 /data/file add\n"
      "40 /data/file open\n"
      "41 /data/file read 4096 4096\n"
      "299 /data/file write 0 65536\n"
      "300 /data/file datasync 0 0\n"
      "1000 /data/file close\n";
  {
    std::ofstream f(dir.file("in.iolog"));
    f << log;
  }
  auto imp = run_tierlab({"capture", "import", "--fio-iolog", dir.file("in.iolog"), "--out", dir.file("t.tlt")});
  REQUIRE(imp.status == 0);
  CHECK(imp.out.find("3 I/Os") != std::string::npos);
  // Named for the target given, as a fresh iolog: times from the first I/O.
  auto exp = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog", "--fio-file",
                          dir.file("scratch")});
  INFO(exp.err);
  REQUIRE(exp.status == 0);
  const std::string s = dir.file("scratch");
  CHECK(exp.out == "fio version 3 iolog\n0 " + s + " add\n0 " + s + " open\n0 " + s + " read 4096 4096\n258 " + s +
                       " write 0 65536\n259 " + s + " datasync 0 0\n259 " + s + " close\n");
  CHECK(exp.err == "tierlab: fio-iolog: 3 I/Os name " + s + " (the trace's /data/file); it needs at least 65536 bytes "
                   "(64.0 KiB)\n");
}

TEST_CASE("cli: trace export --format fio-iolog names a placeholder, never the captured device", "[import][cli]") {
  TempDir dir;
  {
    std::ofstream f(dir.file("in.iolog"));
    f << "fio version 3 iolog\n0 /dev/sda add\n0 /dev/sda open\n5 /dev/sda write 0 4096\n"
         "6 /dev/sda trim 4096 4096\n7 /dev/sda trim 8192 4096\n8 /dev/sda read 8192 4096\n9 /dev/sda close\n";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir.file("in.iolog"), "--out", dir.file("t.tlt")}).status ==
          0);
  auto r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("/dev/sda") == std::string::npos);
  CHECK(r.out.find(" trim ") == std::string::npos);
  CHECK(r.out.rfind("fio version 3 iolog  # tierlab: I/O names the placeholder tierlab-replay.img, not the captured "
                    "device",
                    0) == 0);
  CHECK(r.out.find("\n0 tierlab-replay.img write 0 4096\n3 tierlab-replay.img read 8192 4096\n") != std::string::npos);
  CHECK(r.err ==
        "tierlab: fio-iolog: 2 I/Os name the placeholder tierlab-replay.img, not the trace's /dev/sda; replay them on "
        "a scratch file of at least 12288 bytes (12.0 KiB) with fio --read_iolog=FILE --replay_redirect=PATH, or "
        "export with --fio-file PATH\n"
        "tierlab: fio-iolog: 2 trims left out: fio 3.33 refuses trim lines (\"bad ddir: 2\")\n");

  // The valid formats are listed for one that is not.
  r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "xml"});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: --format xml: unknown export format (known: jsonl, csv, fio-iolog)\n");
  r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "csv", "--fio-file", dir.file("x")});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: --fio-file: only used with --format fio-iolog\n");
}

TEST_CASE("cli: trace export refuses a --fio-file that holds the mounted root file system", "[import][cli]") {
  TempDir dir;
  {
    std::ofstream f(dir.file("in.iolog"));
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n5 /x write 0 4096\n9 /x close\n";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir.file("in.iolog"), "--out", dir.file("t.tlt")}).status ==
          0);
  // The device under / and, if that is a partition, its whole disk.
  struct stat st{};
  REQUIRE(::stat("/", &st) == 0);
  const std::string sys = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  std::string name = tierlab::test::shell_output("sed -n 's/^DEVNAME=//p' " + sys + "/uevent 2>/dev/null");
  struct stat node{};
  if (name.empty() || ::stat(("/dev/" + name).c_str(), &node) != 0 || !S_ISBLK(node.st_mode))
    tierlab::test::skip("the root file system is not on a block device with a node in /dev (" + sys + ")");
  std::vector<std::string> devices{"/dev/" + name};
  std::string disk = tierlab::test::shell_output("test -e " + sys + "/partition && sed -n 's/^DEVNAME=//p' " + sys +
                                                 "/../uevent");
  if (!disk.empty()) devices.push_back("/dev/" + disk);
  for (const auto& dev : devices) {
    INFO(dev);
    auto r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog", "--fio-file", dev, "--out",
                          dir.file("out.iolog")});
    CHECK(r.status == 2);
    CHECK(tierlab::test::count_lines(r.err) == 1);
    CHECK(r.err.rfind("tierlab: --fio-file " + dev + ": ", 0) == 0);
    CHECK(r.err.find(" is mounted on /") != std::string::npos);
    CHECK(r.err.find("--allow-device") != std::string::npos);
    CHECK(!std::ifstream(dir.file("out.iolog")).good());  // refused before --out is created
    // --allow-device: the user says so; only the iolog is written, never the device.
    r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog", "--fio-file", dev,
                     "--allow-device"});
    CHECK(r.status == 0);
    CHECK(r.out.find("0 " + dev + " write 0 4096\n") != std::string::npos);
  }
  // A file on that file system is fine.
  auto r = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog", "--fio-file", dir.file("img")});
  CHECK(r.status == 0);
}

TEST_CASE("cli: capture import reports a malformed line with file and line, exit 2", "[import][cli]") {
  TempDir dir;
  {
    std::ofstream f(dir.file("bad.iolog"));
    f << "fio version 3 iolog\n1 /f add\n2 /f read 0 x\n";
  }
  auto r = run_tierlab({"capture", "import", "--fio-iolog", dir.file("bad.iolog"), "--out", dir.file("t.tlt")});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: " + dir.file("bad.iolog") + ":3: length 'x' is not a number\n");
}

TEST_CASE("cli: capture block without root is one clear error", "[block][cli]") {
  TempDir dir;
  tierlab::test::RunResult r;
  if (::geteuid() == 0) {
    // Run the binary as an unprivileged user.
    if (std::system("command -v setpriv >/dev/null 2>&1") != 0)
      tierlab::test::skip("running as root and setpriv is missing: cannot drop privileges");
    std::string cmd = "setpriv --reuid=65534 --regid=65534 --clear-groups " + std::string(TIERLAB_BINARY) +
                      " capture block --device / --out /tmp/never-written.tlt --duration 1s 2>" +
                      dir.file("err") + "; echo $?";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p);
    char buf[32] = {0};
    REQUIRE(fgets(buf, sizeof buf, p));
    ::pclose(p);
    r.status = std::atoi(buf);
    std::ifstream f(dir.file("err"));
    std::stringstream ss;
    ss << f.rdbuf();
    r.err = ss.str();
  } else {
    r = run_tierlab({"capture", "block", "--device", "/", "--out", dir.file("b.tlt"), "--duration", "1s"});
  }
  CHECK(r.status == 1);
  CHECK(r.err.find("needs root") != std::string::npos);
  CHECK(tierlab::test::count_lines(r.err) == 1);
}

TEST_CASE("cli: capture import --cloudwatch reads the aws CLI's JSON, and a wrong file is one line, exit 2",
          "[import][cli][cloudwatch]") {
  TempDir dir;
  const std::string example = std::string(TIERLAB_SOURCE_DIR) + "/tests/data/cloudwatch-rds-example.json";
  auto imp = run_tierlab({"capture", "import", "--cloudwatch", example, "--vcpus", "4", "--memory", "16GiB", "--out",
                          dir.file("cw.tlt")});
  INFO(imp.err);
  REQUIRE(imp.status == 0);
  CHECK(imp.out.find("9 metrics (9 the models use), 135 datapoints from 2026-11-24T14:15:00Z to "
                     "2026-11-24T14:29:00Z, period 60 s; vcpus 4, memory 16.0 GiB") != std::string::npos);
  auto info = run_tierlab({"trace", "info", dir.file("cw.tlt")});
  CHECK(info.out.find("started:               2026-11-24 14:15:00.000000 UTC") != std::string::npos);

  // Not get-metric-data's output: one line naming the file, exit 2, and an
  // existing --out left as it was.
  {
    std::ofstream f(dir.file("stats.json"));
    f << R"({"Label": "ReadIOPS", "Datapoints": [{"Timestamp": "2026-11-24T14:00:00Z", "Average": 3.0}]})";
  }
  auto bad = run_tierlab({"capture", "import", "--cloudwatch", dir.file("stats.json"), "--out", dir.file("cw.tlt")});
  CHECK(bad.status == 2);
  CHECK(bad.err == "tierlab: " + dir.file("stats.json") +
                       ": no MetricDataResults array: not the output of aws cloudwatch get-metric-data\n");
  CHECK(run_tierlab({"trace", "info", dir.file("cw.tlt")}).status == 0);
  auto flag = run_tierlab({"capture", "import", "--blkparse", example, "--vcpus", "2", "--out", dir.file("x.tlt")});
  CHECK(flag.status == 2);
  CHECK(flag.err == "tierlab: capture import: --vcpus and --memory go with --cloudwatch\n");
}
