// tierlab report's HTML in a real browser: headless Chromium loads the file
// (no network: every fetch it would try is an error it logs), the DOM it
// builds holds the tiers table, the headroom lines and every plot, its
// console stays free of errors, and a screenshot is saved
// (report-screenshot.png in the working directory; docs/report.png is one).
#include "support/support.h"

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

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
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

  const std::string args = " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" +
                           dir.file("profile") + " --enable-logging=stderr --v=0 --virtual-time-budget=2000 ";
  const std::string url = "file://" + html;
  const std::string dom_out = dir.file("dom.html"), dom_err = dir.file("dom.err");
  int rc = std::system((chromium + args + "--dump-dom '" + url + "' >" + dom_out + " 2>" + dom_err).c_str());
  const std::string dom = slurp(dom_out), log = slurp(dom_err);
  INFO("chromium log:\n" << log);
  REQUIRE(rc == 0);
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
  CHECK(count(dom, "<svg") >= 5);
  CHECK(count(dom, "aria-label=\"TPS against load per tier\"") == 1);
  CHECK(count(dom, "aria-label=\"p99 latency against load per tier\"") == 1);
  const size_t load_plots = dom.find("aria-label=\"TPS against load per tier\"");
  REQUIRE(load_plots != std::string::npos);
  CHECK(count(dom.substr(load_plots, dom.find("</svg>", load_plots) - load_plots), "<polyline") == 3);

  const std::string shot = "report-screenshot.png";
  ::unlink(shot.c_str());
  rc = std::system((chromium + args + "--hide-scrollbars --window-size=1200,2600 --screenshot=" + shot + " '" +
                    url + "' >" + dir.file("shot.out") + " 2>&1")
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
