// trace::merge_on_wall_clock: traces recorded apart joined on one clock.
#include "trace/merge.h"

#include "common/error.h"
#include "trace_test_util.h"

#include <catch2/catch.hpp>

#include <fstream>

using namespace tierlab;
using namespace tierlab::trace;

namespace {

constexpr Nanos kS = 1'000'000'000;

void write_trace(const std::string& path, Nanos start_mono, Nanos realtime_offset, const std::vector<Record>& recs) {
  WriterOptions wo;
  wo.start_mono_ns = start_mono;
  wo.realtime_offset_ns = realtime_offset;
  auto w = open_writer(path, wo);
  for (const auto& r : recs) w->write(r);
  w->close();
}

}  // namespace

TEST_CASE("trace merge: a capture and metrics of the same window join on their wall clocks", "[trace][merge]") {
  testutil::TempDir dir;
  // A capture: monotonic clock at 500 s when the wall clock read 1,000,000 s
  // (offset 999,500 s); two sessions, a block I/O.
  const Nanos off_a = 999'500 * kS;
  write_trace(dir.file("a.tlt"), 500 * kS, off_a,
              {{501 * kS, 1, SessionBegin{"u", "d", "app", "127.0.0.1:1", 42, 0}},
               {502 * kS, 1, Query{"select 1"}},
               {502 * kS + 5, 2, SessionBegin{"u", "d", "app", "127.0.0.1:2", 43, 0}},
               {503 * kS, 0, BlockIo{503 * kS + 1000, 1, 0, 8192, IoOp::Read, 0, 42, 503 * kS - 10}},
               {504 * kS, 1, Ready{'I'}}});
  // Metrics imported elsewhere: clock 0 at the wall-clock 1,000,002 s.
  const Nanos off_b = 1'000'002 * kS;
  write_trace(dir.file("b.tlt"), 0, off_b,
              {{0, 0, Meta{"provider", "cloudwatch"}},
               {0, 0, Sample{"provider.read_iops", 3000}},
               {1 * kS, 0, Sample{"provider.read_iops", 2990}}});
  // A third capture whose sessions are numbered from 1 too.
  write_trace(dir.file("c.tlt"), 0, off_a, {{501 * kS + 1, 1, SessionBegin{"v", "d", "app", "", 7, 0}}});

  auto res = merge_on_wall_clock({dir.file("a.tlt"), dir.file("b.tlt"), dir.file("c.tlt")}, dir.file("m.tlt"));
  CHECK(res.records == 9);
  REQUIRE(res.inputs.size() == 3);
  CHECK(res.inputs[1].shift_ns == off_b - off_a);
  CHECK(res.inputs[2].session_base == 2);
  CHECK(res.inputs[1].first_wall_ns == off_b);
  CHECK(res.overlap);

  auto r = open_reader(dir.file("m.tlt"));
  CHECK(r->header().realtime_offset_ns == off_a);
  CHECK(r->header().start_mono_ns == 500 * kS);
  std::vector<std::string> seen;
  Record rec;
  Nanos prev = 0;
  while (r->next(rec)) {
    CHECK(rec.ts >= prev);
    prev = rec.ts;
    char line[200];
    if (auto* s = std::get_if<Sample>(&rec.body)) {
      // Shown on the wall clock, which the merge must keep.
      std::snprintf(line, sizeof line, "sample %g at wall %lld", s->value,
                    static_cast<long long>((rec.ts + off_a) / kS));
    } else if (auto* b = std::get_if<BlockIo>(&rec.body)) {
      std::snprintf(line, sizeof line, "block latency %lld queued %lld", static_cast<long long>(b->complete_ns - rec.ts),
                    static_cast<long long>(rec.ts - b->queued_ns));
    } else if (auto* sb = std::get_if<SessionBegin>(&rec.body)) {
      std::snprintf(line, sizeof line, "begin %s session %llu", std::string(sb->user).c_str(),
                    static_cast<unsigned long long>(rec.session));
    } else {
      std::snprintf(line, sizeof line, "%s session %llu at %lld", std::string(kind_name(rec.kind())).c_str(),
                    static_cast<unsigned long long>(rec.session), static_cast<long long>(rec.ts / kS));
    }
    seen.push_back(line);
  }
  const std::vector<std::string> want = {
      "begin u session 1",            // 501 s
      "begin v session 3",            // 501 s + 1 ns: c's session 1 after a's two
      "query session 1 at 502",       //
      "meta session 0 at 502",        // b's start: wall 1,000,002 s = 502 s on a's clock
      "sample 3000 at wall 1000002",  //
      "begin u session 2",            // 502 s + 5 ns
      "sample 2990 at wall 1000003",  // 503 s
      "block latency 1000 queued 10",  // 503 s: its completion and queue time move with it
      "ready session 1 at 504",
  };
  // Records of one instant may come in either input's order: compared as
  // sets, beside the time order checked above.
  std::vector<std::string> a = seen, b = want;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  CHECK(a == b);
}

TEST_CASE("trace merge: traces of different windows merge, and say they do not overlap", "[trace][merge]") {
  testutil::TempDir dir;
  write_trace(dir.file("a.tlt"), 0, 1000 * kS, {{0, 1, Query{"select 1"}}, {kS, 1, Ready{'I'}}});
  write_trace(dir.file("b.tlt"), 0, 5000 * kS, {{0, 0, Sample{"provider.read_iops", 1}}});
  auto res = merge_on_wall_clock({dir.file("a.tlt"), dir.file("b.tlt")}, dir.file("m.tlt"));
  CHECK_FALSE(res.overlap);
  CHECK(res.records == 3);
}

TEST_CASE("trace merge: a file that is not a trace is one line naming it", "[trace][merge]") {
  testutil::TempDir dir;
  write_trace(dir.file("a.tlt"), 0, 0, {{0, 1, Query{"select 1"}}});
  {
    std::ofstream f(dir.file("b.json"));
    f << "{}";
  }
  try {
    merge_on_wall_clock({dir.file("a.tlt"), dir.file("b.json")}, dir.file("m.tlt"));
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == dir.file("b.json") + ": not a tierlab trace (no tierlab magic at byte 0)");
  }
}
