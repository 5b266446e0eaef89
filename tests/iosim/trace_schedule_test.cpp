// Which records of a trace iosim run --trace replays: its block I/O, or its
// file I/O when it has none (capture run records both).
#include "iosim/engine.h"
#include "support/support.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

using namespace tierlab;

namespace {

std::vector<iosim::TimedIo> schedule_of(const std::string& path) {
  auto r = trace::open_reader(path);
  return iosim::load_trace_schedule(*r);
}

}  // namespace

TEST_CASE("iosim trace schedule: block I/O when the trace has it, else file I/O", "[iosim][trace]") {
  test::TempDir dir;
  trace::FileIo f;
  f.pid = 7;
  f.file = "base/5/16396";
  f.length = 8192;
  f.latency_ns = 1000;
  trace::BlockIo b;
  b.length = 4096;
  b.offset = 1 << 20;
  b.op = trace::IoOp::Write;
  {
    auto w = trace::open_writer(dir.file("both.tlt"));
    w->write(1000, 0, f);
    w->write(2000, 0, b);
    f.offset = 8192;
    w->write(3000, 0, f);
    b.complete_ns = 5000;
    w->write(4000, 0, b);
    w->close();
  }
  auto both = schedule_of(dir.file("both.tlt"));
  REQUIRE(both.size() == 2);
  CHECK(both[0].length == 4096);
  CHECK(both[0].at == 0);
  CHECK(both[1].at == 2000);
  {
    auto w = trace::open_writer(dir.file("files.tlt"));
    w->write(1000, 0, f);
    w->write(1500, 0, f);
    w->close();
  }
  auto files = schedule_of(dir.file("files.tlt"));
  REQUIRE(files.size() == 2);
  CHECK(files[0].length == 8192);
  CHECK(files[1].at == 500);
}
