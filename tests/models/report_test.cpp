// The report (models/report.h): the capture's timeline from a trace file
// (statements paired with their answers, buckets, block I/O), the page's
// sections chosen by its input, and the terminal's text plot of TPS
// against load.
#include "models/capacity.h"
#include "models/report.h"
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

using namespace tierlab;
using namespace tierlab::models;

namespace {

constexpr int64_t kReportMs = 1000000;

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Session 1: a simple Query every 100 ms for 1 s (3 ms each), the fourth
// one failing. Session 2: a prepared statement executed twice (5 ms each),
// a portal's Execute answered by PortalSuspended. Block reads of 0.2 ms in
// the first half second, writes of 1 ms in the second.
void write_report_trace(const std::string& path) {
  namespace tr = trace;
  auto w = tr::open_writer(path);
  w->write(0, 1, tr::SessionBegin{"u", "db", "app", "", 101, 0});
  w->write(0, 2, tr::SessionBegin{"u", "db", "app", "", 102, 0});
  for (int i = 0; i < 10; ++i) {
    int64_t t = i * 100 * kReportMs;
    w->write(t, 1, tr::Query{"SELECT * FROM t WHERE id = " + std::to_string(i)});
    if (i == 3)
      w->write(t + 3 * kReportMs, 1, tr::Error{"42P01", "ERROR", "no"});
    else
      w->write(t + 3 * kReportMs, 1, tr::Result{"SELECT", true, 1});
    w->write(t + 3 * kReportMs, 1, tr::Ready{'I'});
    w->write(t + kReportMs, 0,
             tr::BlockIo{t + (i < 5 ? kReportMs + kReportMs / 5 : 2 * kReportMs), 1, 8192u * static_cast<uint64_t>(i), 8192,
                         i < 5 ? tr::IoOp::Read : tr::IoOp::Write, 0, 101});
  }
  w->write(10 * kReportMs, 2, tr::Parse{"s1", "UPDATE t SET v = $1 WHERE id = $2", {}});
  w->write(10 * kReportMs, 2, tr::Sync{});
  w->write(11 * kReportMs, 2, tr::Ready{'I'});
  for (int i = 0; i < 2; ++i) {
    int64_t t = (20 + i * 400) * kReportMs;
    w->write(t, 2, tr::Bind{"p", "s1", {}, {}});
    w->write(t, 2, tr::Execute{"p", 0});
    w->write(t, 2, tr::Sync{});
    w->write(t + 5 * kReportMs, 2, i == 0 ? tr::Body{tr::Result{"UPDATE", true, 1}} : tr::Body{tr::Suspended{}});
    w->write(t + 5 * kReportMs, 2, tr::Ready{'I'});
  }
  w->write(1000 * kReportMs, 1, tr::SessionEnd{});
  w->write(1000 * kReportMs, 2, tr::SessionEnd{});
  w->close();
}

}  // namespace

TEST_CASE("report: the capture's timeline pairs each statement with its answer and buckets rates and block I/O",
          "[report]") {
  test::TempDir dir;
  const std::string path = dir.file("t.tlt");
  write_report_trace(path);
  const CaptureTimeline c = capture_timeline(path);
  REQUIRE(c.statements.size() == 2);
  // By total time: ten SELECTs of 3 ms, then two UPDATEs of 5 ms.
  CHECK(c.statements[0].sql == "select * from t where id=?");
  CHECK(c.statements[0].count == 10);
  CHECK(c.statements[0].errors == 1);
  CHECK(c.statements[0].total_s == Approx(0.030));
  CHECK(c.statements[1].sql == "update t set v=? where id=?");
  CHECK(c.statements[1].count == 2);
  CHECK(c.statements[1].total_s == Approx(0.010));
  CHECK(c.statement_count == 12);
  CHECK(c.bucket_s == Approx(0.1));
  REQUIRE(c.buckets.size() == 10);
  double tx = 0, st = 0, er = 0, rd = 0, wr = 0, rl = 0, wl = 0;
  for (const auto& b : c.buckets) {
    tx += b.transactions, st += b.statements, er += b.errors;
    rd += b.reads, wr += b.writes, rl += b.read_latency_s, wl += b.write_latency_s;
  }
  CHECK(tx == 12);  // the Parse's Sync is no transaction
  CHECK(st == 12);
  CHECK(er == 1);
  CHECK(c.buckets[3].errors == 1);
  CHECK(c.has_block_io);
  CHECK(rd == 5);
  CHECK(wr == 5);
  CHECK(rl / rd == Approx(0.0002));
  CHECK(wl / wr == Approx(0.001));
  CHECK(c.buckets[0].reads == 1);
  CHECK(c.buckets[9].writes == 1);
}

TEST_CASE("report: a long capture's buckets merge and widen, keeping every count", "[report]") {
  test::TempDir dir;
  const std::string path = dir.file("long.tlt");
  {
    namespace tr = trace;
    auto w = tr::open_writer(path);
    w->write(0, 1, tr::SessionBegin{"u", "db", "app", "", 101, 0});
    // One statement a second for 1,000 s: 10,000 buckets of 0.1 s.
    for (int i = 0; i < 1000; ++i) {
      int64_t t = int64_t(i) * 1000 * kReportMs;
      w->write(t, 1, tr::Query{"SELECT 1"});
      w->write(t + kReportMs, 1, tr::Result{"SELECT", true, 1});
      w->write(t + kReportMs, 1, tr::Ready{'I'});
    }
    w->close();
  }
  const CaptureTimeline c = capture_timeline(path);
  CHECK(c.buckets.size() <= kMaxTimelineBuckets);
  CHECK(c.bucket_s == Approx(0.4));  // 0.1 doubled twice: 2,500 buckets
  double st = 0;
  for (const auto& b : c.buckets) st += b.statements;
  CHECK(st == 1000);
  CHECK(c.buckets[0].statements == 1);
  CHECK(c.buckets[1].statements == 0);
  CHECK(c.buckets[2500 - 3].statements == 1);  // 999 s / 0.4 s = bucket 2497
}

TEST_CASE("report: each view holds its sections and their plots", "[report]") {
  test::TempDir dir;
  const std::string path = dir.file("t.tlt");
  write_report_trace(path);
  const Profile profile = profile_file(path);
  const CaptureTimeline capture = capture_timeline(path);
  ReportInput in;
  in.profile = &profile;
  in.capture = &capture;
  in.profile_section = true;
  ReplayView r;
  r.source = "replay.json";
  r.speed = "max";
  r.errors = 3;
  r.divergence_new_errors = 3;
  r.errors_by_sqlstate = {{"42P01", 3}};
  r.first_errors = {{"42P01", "relation \"t\" does not exist"}};
  r.templates = {{"select * from t where id=?", 10, 10, 3.0, 1.5}, {"update t set v=? where id=?", 2, 2, 5, 6}};
  in.replays = {r};
  const std::string h = report_html(in);
  for (const char* id : {"id=\"capture\"", "id=\"replay-1\"", "id=\"profile\"", "id=\"mrc\""}) {
    INFO(id);
    CHECK(count(h, id) == 1);
  }
  CHECK(h.find("id=\"projection\"") == std::string::npos);
  CHECK(count(h, "aria-label=\"Transactions and statements per second over time\"") == 1);
  CHECK(count(h, "aria-label=\"Block I/O requests per second over time\"") == 1);
  CHECK(count(h, "aria-label=\"Block I/O latency over time\"") == 1);
  CHECK(count(h, "aria-label=\"Time by statement template\"") == 1);
  CHECK(count(h, "aria-label=\"Mean latency per statement template, capture and replay\"") == 1);
  CHECK(count(h, "aria-label=\"Miss ratio against cache size\"") == 1);
  CHECK(h.find("<td>42P01</td><td>3</td><td class=\"left\">relation &quot;t&quot; does not exist</td>") !=
        std::string::npos);
  // The errors series appears because the capture had an error.
  CHECK(h.find("<title>errors/s</title>") != std::string::npos);
  // Read latency is a gap where no read was issued: its line is one run of
  // five buckets, the writes' another.
  const size_t lat = h.find("aria-label=\"Block I/O latency over time\"");
  const std::string lat_svg = h.substr(lat, h.find("</svg>", lat) - lat);
  CHECK(count(lat_svg, "<polyline") == 2);
  // A profile without a miss-ratio curve says why, with no plot.
  Profile synth = profile;
  synth.source = "synth:pgbench";
  synth.mrc = {};
  in.profile = &synth;
  in.capture = nullptr;
  in.replays.clear();
  const std::string s = report_html(in);
  CHECK(s.find("has no miss-ratio curve") != std::string::npos);
  CHECK(s.find("aria-label=\"Miss ratio against cache size\"") == std::string::npos);
  CHECK(s.find("id=\"capture\"") == std::string::npos);
}

TEST_CASE("report: the terminal plots TPS against load per tier where it is wide enough", "[report][capacity]") {
  Projection p;
  p.load_by = "think";
  for (const char* name : {"fast", "capped"}) {
    TierProjection t;
    t.tier = name;
    p.tiers.push_back(t);
  }
  p.tiers[0].headroom = 4.9, p.tiers[0].headroom_by = "cpu";
  p.tiers[1].headroom = 1.7, p.tiers[1].headroom_by = "read IOPS cap";
  for (double load : {1.0, 2.0, 4.0}) {
    LoadPoint lp;
    lp.load = load;
    lp.clients = 8;
    LoadTier a, b;
    a.tps = 1000 * load;
    b.tps = 1000 * std::min(load, 1.7);
    lp.tiers = {a, b};
    p.loads.push_back(lp);
  }
  std::ostringstream wide, narrow;
  print_capacity(wide, p, 100);
  print_capacity(narrow, p, 30);
  const std::string w = wide.str();
  CHECK(w.find("  fast: saturates at 4.9x today's load (cpu)") != std::string::npos);
  CHECK(w.find("  capped: saturates at 1.7x today's load (read IOPS cap)") != std::string::npos);
  REQUIRE(w.find("tps against load (a fast, b capped; * several):") != std::string::npos);
  // Eight rows from 4000 down to 0, the two tiers' letters on them, the
  // load axis from 1x to 4x.
  CHECK(w.find("     4000 |") != std::string::npos);
  CHECK(w.find("        0 |") != std::string::npos);
  CHECK(w.find("1x") != std::string::npos);
  CHECK(w.find("4x  load") != std::string::npos);
  const std::string plot = w.substr(w.find("tps against load"));
  CHECK(count(plot, "a") >= 3);
  CHECK(count(plot, "b") >= 2);
  // Too narrow: the headroom lines, no plot.
  CHECK(narrow.str().find("  capped: saturates at") != std::string::npos);
  CHECK(narrow.str().find("tps against load") == std::string::npos);
}

TEST_CASE("report: project --html and profile --html are views of the report, and report without --tier",
          "[report][cli]") {
  test::TempDir dir;
  const std::string path = dir.file("t.tlt"), html = dir.file("r.html");
  write_report_trace(path);
  auto has = [](const std::string& page, const char* id) {
    return page.find(std::string("id=\"") + id + "\"") != std::string::npos;
  };
  auto r = test::run_tierlab({"profile", path, "--html", html});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("transactions: 12 (") != std::string::npos);  // the text profile too
  std::string page = test::slurp(html);
  CHECK(has(page, "capture"));
  CHECK(has(page, "profile"));
  CHECK(has(page, "mrc"));
  CHECK(!has(page, "projection"));

  r = test::run_tierlab({"project", path, "--tier", "nvme-local", "--html", html});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  page = test::slurp(html);
  CHECK(has(page, "projection"));
  CHECK(has(page, "mrc"));
  CHECK(!has(page, "capture"));

  r = test::run_tierlab({"report", path, "--html", html});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  page = test::slurp(html);
  CHECK(has(page, "capture"));
  CHECK(has(page, "profile"));
  CHECK(!has(page, "projection"));

  r = test::run_tierlab({"report", path, "--load", "1,2", "--html", html});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: report: --load: needs a projection: give --tier\n");
  r = test::run_tierlab({"report", path, "--memory", "1G", "--html", html});
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: report: --memory: needs a projection: give --tier\n");
  r = test::run_tierlab({"report", path, "--replay", dir.file("none.json"), "--html", html});
  CHECK(r.status == 2);
  CHECK(r.err.find("--replay") != std::string::npos);
  // Not a replay's report: named, with the field.
  const std::string bad = dir.file("bad.json");
  { std::ofstream(bad) << "{\"sessions\": 1}\n"; }
  r = test::run_tierlab({"report", path, "--replay", bad, "--html", html});
  CHECK(r.status == 2);
  CHECK(r.err.rfind("tierlab: " + bad + ": ", 0) == 0);
}
