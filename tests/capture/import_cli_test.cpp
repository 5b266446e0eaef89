// capture import and trace export --format fio-iolog through the tierlab binary.
#include "support/support.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

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
  auto exp = run_tierlab({"trace", "export", dir.file("t.tlt"), "--format", "fio-iolog"});
  REQUIRE(exp.status == 0);
  CHECK(exp.out == log);
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
