// tierlab report's HTML in a real browser: headless Chromium loads the file
// (no network: every fetch it would try is an error it logs), the DOM it
// builds holds every section's plots (the capture, a real replay against a
// real PostgreSQL, the projection, the miss-ratio curve), the tiers table
// and the headroom lines, its console stays free of errors, and a
// screenshot is saved (report-screenshot.png in the working directory;
// docs/report.png is one).
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

// $CHROMIUM, else the first of Debian's and Google's names on the PATH; ""
// when there is none.
std::string find_chromium() {
  if (const char* c = std::getenv("CHROMIUM"); c && *c) return c;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
    std::string path = test::shell_output(std::string("command -v ") + name + " 2>/dev/null");
    if (!path.empty()) return path;
  }
  return "";
}

size_t count_in_page(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The <svg> element labelled `aria` in `dom`, "" when there is none.
std::string plot(const std::string& dom, const std::string& aria) {
  const size_t at = dom.find("aria-label=\"" + aria + "\"");
  if (at == std::string::npos) return "";
  const size_t end = dom.find("</svg>", at);
  return end == std::string::npos ? "" : dom.substr(at, end - at);
}

const std::string kArgs = " --headless --no-sandbox --disable-gpu --no-first-run --enable-logging=stderr --v=0 "
                          "--virtual-time-budget=2000 ";

// Chromium's DOM of `html` (after loading it) and its log; fails the test
// when it does not run.
std::pair<std::string, std::string> load_in_chromium(const std::string& chromium, const TempDir& dir,
                                                     const std::string& html) {
  const std::string dom_out = dir.file("dom.html"), dom_err = dir.file("dom.err");
  int rc = std::system((chromium + kArgs + "--user-data-dir=" + dir.file("profile") + " --dump-dom 'file://" + html +
                        "' >" + dom_out + " 2>" + dom_err)
                           .c_str());
  INFO("chromium log:\n" << slurp(dom_err));
  REQUIRE(rc == 0);
  return {slurp(dom_out), slurp(dom_err)};
}

// A capture as `capture run` records one: four sessions of pgbench-like
// transactions for 6 s (a prepared UPDATE, a SELECT, a table the replay
// target lacks every 40th), each reading pages of a 4,000-page table
// (some pages far more than others) and committing with a WAL write and
// flush, the device slower in the middle second.
// Returns the number of statements on the missing table.
uint64_t write_capture(const std::string& path) {
  namespace tr = tierlab::trace;
  constexpr int64_t kUs = 1000, kS = 1000000000;
  auto w = tr::open_writer(path);
  w->write(0, 0, tr::Meta{"cpu.count", "2"});
  w->write(0, 0, tr::Meta{"memory.bytes", "64MB"});
  w->write(0, 0, tr::Meta{"setting.shared_buffers", "16MB"});
  const std::string user = tierlab::test::shared_server().superuser();
  for (uint64_t s = 1; s <= 4; ++s) {
    w->write(kS / 1000, s, tr::SessionBegin{user, "postgres", "report-test", "127.0.0.1:1", int32_t(100 + s), 0});
    w->write(kS / 1000, s, tr::Ready{'I'});
    w->write(kS / 1000, s, tr::Parse{"upd", "UPDATE tierlab_report SET v = v + 1 WHERE id = $1", {}});
    w->write(kS / 1000, s, tr::Sync{});
    w->write(kS / 1000 + 100 * kUs, s, tr::Ready{'I'});
  }
  uint64_t n = 0, rng = 42, missing_n = 0;
  int64_t last = 0;
  for (int64_t t0 = 2 * kS / 1000; t0 < 6 * kS; t0 += 4000 * kUs)
    for (uint64_t s = 1; s <= 4; ++s, ++n) {
      int64_t t = t0 + static_cast<int64_t>(s) * 900 * kUs;
      const int64_t dev = (t > 3 * kS && t < 4 * kS ? 600 : 150) * kUs;
      // A read of one page: the first 400 pages nine times in ten.
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t page = (rng >> 33) % 10 == 0 ? (rng >> 20) % 4000 : (rng >> 24) % 400;
      const bool missing = n % 40 == 0;
      missing_n += missing;
      const std::string sql = missing ? "SELECT v FROM tierlab_report_missing WHERE id = 1"
                                      : "SELECT v FROM tierlab_report WHERE id = " + std::to_string(n % 100);
      w->write(t, s, tr::Query{sql});
      w->write(t + 50 * kUs, 0, tr::BlockIo{t + 50 * kUs + dev, 1, page * 8192, 8192, tr::IoOp::Read, 0, int32_t(100 + s)});
      t += 100 * kUs + dev;
      w->write(t, s, tr::Result{"SELECT", true, 1});
      w->write(t, s, tr::Ready{'I'});
      t += 200 * kUs;
      std::vector<tr::Param> params = {{0, false, std::to_string(n % 100)}};
      w->write(t, s, tr::Bind{"", "upd", params, {}});
      w->write(t, s, tr::Execute{"", 0});
      w->write(t, s, tr::Sync{});
      w->write(t + 50 * kUs, 0, tr::BlockIo{t + 50 * kUs + dev, 1, (1u << 30) + n * 8192, 8192, tr::IoOp::Write, 0, int32_t(100 + s)});
      w->write(t + 60 * kUs + dev, 0, tr::BlockIo{t + 60 * kUs + 2 * dev, 1, 0, 0, tr::IoOp::Flush, 0, int32_t(100 + s)});
      t += 100 * kUs + 2 * dev;
      w->write(t, s, tr::Result{"UPDATE", true, 1});
      w->write(t, s, tr::Ready{'I'});
      last = std::max(last, t);
    }
  for (uint64_t s = 1; s <= 4; ++s) w->write(last + kS / 1000, s, tr::SessionEnd{});
  w->close();
  return missing_n;
}

}  // namespace

TEST_CASE("report: the HTML report opens in headless Chromium with every plot and no console error",
          "[integration][report]") {
  const std::string chromium = find_chromium();
  if (chromium.empty()) test::skip("no Chromium (Debian's chromium package; or set CHROMIUM)");
  TempDir dir;
  const std::string profile = dir.file("synth.json"), html = dir.file("report.html");
  auto synth = test::run_tierlab({"profile", "synth", "pgbench", "--scale", "1000", "--mode", "select-only",
                                  "--clients", "16", "--memory", "4GiB", "--vcpus", "4", "--json", profile});
  INFO(synth.out << synth.err);
  REQUIRE(synth.status == 0);
  auto report = test::run_tierlab({"report", profile, "--tier", "nvme-local", "--tier", "rds-16k", "--tier",
                                   "ebs-gp3", "--load", "1,2,4,8", "--html", html});
  INFO(report.out << report.err);
  REQUIRE(report.status == 0);
  CHECK(report.out.find("headroom") != std::string::npos);  // the terminal view too
  const std::string page = slurp(html);
  // Self-contained: nothing to fetch, nothing to run.
  CHECK(page.find("<script") == std::string::npos);
  CHECK(!std::regex_search(page, std::regex(R"((src|href)\s*=\s*"?(https?:)?//)")));
  CHECK(page.find("@import") == std::string::npos);

  const auto [dom, log] = load_in_chromium(chromium, dir, html);
  INFO("chromium log:\n" << log);
  REQUIRE(dom.find("</html>") != std::string::npos);
  // Console messages and failed loads are logged as CONSOLE(...) or
  // "Failed to load resource"; none of them may appear.
  CHECK(log.find("CONSOLE") == std::string::npos);
  CHECK(log.find("Failed to load") == std::string::npos);
  CHECK(log.find("Uncaught") == std::string::npos);
  // The tiers table, one row per tier, and the headroom line of each.
  for (const char* tier : {"nvme-local", "rds-16k", "ebs-gp3"}) {
    INFO(tier);
    CHECK(dom.find("<tr><td>" + std::string(tier) + "</td>") != std::string::npos);
    CHECK(std::regex_search(dom, std::regex("<li>" + std::string(tier) + ": (saturates at|does not saturate)")));
  }
  CHECK(dom.find("vs capture") != std::string::npos);
  CHECK(dom.find("p99 ms est.") != std::string::npos);
  // Plots: TPS and mean latency against clients, TPS and p99 against load,
  // the time split; each load plot holds a line per tier.
  CHECK(count_in_page(dom, "<svg") >= 5);
  CHECK(count_in_page(dom, "aria-label=\"TPS against load per tier\"") == 1);
  CHECK(count_in_page(dom, "aria-label=\"p99 latency against load per tier\"") == 1);
  const size_t load_plots = dom.find("aria-label=\"TPS against load per tier\"");
  REQUIRE(load_plots != std::string::npos);
  CHECK(count_in_page(dom.substr(load_plots, dom.find("</svg>", load_plots) - load_plots), "<polyline") == 3);

}

TEST_CASE("report: a capture, its replay, the projection and the miss-ratio curve in headless Chromium, every "
          "section's plots drawn, no console error, a screenshot",
          "[integration][report]") {
  const std::string chromium = find_chromium();
  if (chromium.empty()) test::skip("no Chromium (Debian's chromium package; or set CHROMIUM)");
  auto& pg = test::shared_server();
  pg.sql("DROP TABLE IF EXISTS tierlab_report");
  pg.sql("CREATE TABLE tierlab_report (id int PRIMARY KEY, v int)");
  pg.sql("INSERT INTO tierlab_report SELECT g, 0 FROM generate_series(0, 99) g");
  TempDir dir;
  const std::string trace = dir.file("capture.tlt"), replay = dir.file("replay.json"), html = dir.file("report.html");
  const uint64_t missing = write_capture(trace);
  REQUIRE(missing == 150);
  // A real replay of it: the missing table's statements fail there.
  auto r = test::run_tierlab(
      {"replay", trace, "--db", pg.conninfo(), "--max-speed", "--max-divergence", "100%", "--json", replay});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto report = test::run_tierlab({"report", trace, "--replay", replay, "--tier", "nvme-local", "--tier", "rds-16k",
                                   "--load", "1,2,4", "--memory", "48MiB", "--html", html},
                                  std::nullopt, {"COLUMNS=100"});
  INFO(report.out << report.err);
  REQUIRE(report.status == 0);
  // The terminal view: the headroom lines and, 100 columns wide, the plot.
  CHECK(report.out.find("  nvme-local: saturates at") != std::string::npos);
  CHECK(report.out.find("tps against load (a nvme-local, b rds-16k") != std::string::npos);
  const std::string page = slurp(html);
  CHECK(page.find("<script") == std::string::npos);
  CHECK(!std::regex_search(page, std::regex(R"((src|href)\s*=\s*"?(https?:)?//)")));

  const auto [dom, log] = load_in_chromium(chromium, dir, html);
  INFO("chromium log:\n" << log);
  REQUIRE(dom.find("</html>") != std::string::npos);
  CHECK(log.find("CONSOLE") == std::string::npos);
  CHECK(log.find("Failed to load") == std::string::npos);
  CHECK(log.find("Uncaught") == std::string::npos);
  // Every section, and in each its plots with something drawn in them.
  for (const char* id : {"capture", "replay-1", "projection", "mrc"}) {
    INFO(id);
    CHECK(dom.find(std::string("id=\"") + id + "\"") != std::string::npos);
  }
  struct Plot {
    const char* aria;
    const char* mark;  // what a drawn series is made of
    size_t at_least;
  };
  const Plot plots[] = {
      {"Transactions and statements per second over time", "<polyline", 2},
      {"Time by statement template", "<rect", 3},
      {"Block I/O requests per second over time", "<polyline", 2},
      {"Block I/O latency over time", "<polyline", 2},
      {"Mean latency per statement template, capture and replay", "<rect", 6},
      {"TPS against clients per tier", "<polyline", 2},
      {"TPS against load per tier", "<polyline", 2},
      {"p99 latency against load per tier", "<polyline", 2},
      {"Where a transaction's time goes, per tier", "<rect", 2},
      {"Miss ratio against cache size", "<polyline", 1},
  };
  for (const auto& p : plots) {
    INFO(p.aria);
    CHECK(count_in_page(plot(dom, p.aria), p.mark) >= p.at_least);
  }
  // The capture's templates with their counts; the replay's errors: the
  // missing table's statements, that succeeded at capture.
  CHECK(dom.find("select v from tierlab_report where id=?") != std::string::npos);
  CHECK(dom.find("update tierlab_report set v=v+? where id=?") != std::string::npos);
  CHECK(dom.find("<td>42P01</td><td>150</td>") != std::string::npos);
  CHECK(dom.find("<tr><td>failed, succeeded at capture</td><td>150</td></tr>") != std::string::npos);
  for (const char* tier : {"nvme-local", "rds-16k"})
    CHECK(std::regex_search(dom, std::regex("<li>" + std::string(tier) + ": (saturates at|does not saturate)")));

  const std::string shot = "report-screenshot.png";
  ::unlink(shot.c_str());
  int rc = std::system((chromium + kArgs + "--user-data-dir=" + dir.file("profile") +
                        " --hide-scrollbars --window-size=1200,4750 --screenshot=" + shot + " 'file://" + html +
                        "' >" + dir.file("shot.out") + " 2>&1")
                           .c_str());
  INFO(slurp(dir.file("shot.out")));
  REQUIRE(rc == 0);
  std::ifstream png(shot, std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  CHECK(std::string(magic + 1, 3) == "PNG");
  png.seekg(0, std::ios::end);
  CHECK(png.tellg() > 20000);  // a page with plots, not a blank one
}
