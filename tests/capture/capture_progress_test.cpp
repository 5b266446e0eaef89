// -P SEC on the capture commands: a status line on stderr every SEC seconds
// of a capture, as replay and iosim run print; none with -P 0 (nor by
// default when stderr is not a terminal, as here).
#include "support/support.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

size_t progress_lines(const std::string& err) {
  size_t n = 0;
  for (size_t p = 0; (p = err.find("progress: ", p)) != std::string::npos; ++p)
    if (p == 0 || err[p - 1] == '\n') ++n;
  return n;
}

// Runs `args` + "--out FILE --duration 2500ms" with -P 1, with -P 0 and
// without -P; checks the lines and returns the first run's stderr.
std::string check_progress(std::vector<std::string> args, const TempDir& dir) {
  args.insert(args.end(), {"--out", dir.file("p.tlt"), "--duration", "2500ms"});
  auto with = args, none = args;
  with.insert(with.end(), {"-P", "1"});
  none.insert(none.end(), {"-P", "0"});
  auto a = test::run_tierlab(with);
  INFO(a.out << a.err);
  REQUIRE(a.status == 0);
  CHECK(progress_lines(a.err) >= 1);
  CHECK(a.err.find("progress: 1.0 s, ") != std::string::npos);
  auto b = test::run_tierlab(none);
  INFO(b.out << b.err);
  REQUIRE(b.status == 0);
  CHECK(progress_lines(b.err) == 0);
  auto c = test::run_tierlab(args);
  REQUIRE(c.status == 0);
  CHECK(progress_lines(c.err) == 0);  // stderr is not a terminal
  return a.err;
}

}  // namespace

TEST_CASE("capture proxy -P prints a status line every SEC seconds", "[capture][progress]") {
  TempDir dir;
  auto err = check_progress({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"}, dir);
  CHECK(err.find(" connections, ") != std::string::npos);
  CHECK(err.find(" MB/s to the server, ") != std::string::npos);
}

TEST_CASE("capture run -P prints a status line every SEC seconds", "[capture][progress]") {
  TempDir dir;
  auto err = check_progress({"capture", "run", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"}, dir);
  CHECK(err.find(" MB/s to clients") != std::string::npos);
}

TEST_CASE("capture block -P prints a status line every SEC seconds", "[capture][progress][block]") {
  test::require_root("capture block");
  TempDir dir;
  auto err = check_progress({"capture", "block", "--device", dir.path()}, dir);
  CHECK(err.find(" I/Os per second recorded") != std::string::npos);
}

TEST_CASE("capture sniff -P prints a status line every SEC seconds", "[capture][progress][sniff]") {
  test::require_root("capture sniff on lo");
  TempDir dir;
  auto err = check_progress({"capture", "sniff", "--interface", "lo", "--port", "1"}, dir);
  CHECK(err.find(" packets/s, ") != std::string::npos);
}
