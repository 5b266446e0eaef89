// tierlab project through the real binary, on a small synthetic trace: what
// a proxy-only capture gives (transactions, no CPU samples, no block I/O).
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

using tierlab::test::count_lines;
using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

constexpr int64_t kProjectMs = 1000000;

// Four sessions, each running 200 autocommit SELECTs of 1 ms with 0.5 ms
// between them.
void write_proxy_trace(const std::string& path) {
  auto w = tierlab::trace::open_writer(path);
  for (uint64_t s = 1; s <= 4; ++s)
    w->write(0, s, tierlab::trace::SessionBegin{"u", "db", "app", "127.0.0.1:1", int32_t(100 + s), 0});
  for (int i = 0; i < 200; ++i)
    for (uint64_t s = 1; s <= 4; ++s) {
      int64_t t = kProjectMs + i * (3 * kProjectMs / 2) + static_cast<int64_t>(s) * 1000;
      w->write(t, s, tierlab::trace::Query{"SELECT 1"});
      w->write(t + kProjectMs, s, tierlab::trace::Ready{'I'});
    }
  for (uint64_t s = 1; s <= 4; ++s) w->write(400 * kProjectMs, s, tierlab::trace::SessionEnd{});
  w->close();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("project: without CPU samples profile and project both put the CPU's time in other",
          "[project][cli]") {
  TempDir dir;
  std::string trace = dir.file("proxy.tlt");
  write_proxy_trace(trace);

  auto prof = run_tierlab({"profile", trace});
  INFO(prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.find("cpu: not sampled") != std::string::npos);
  CHECK(prof.out.find("CPU time per transaction is unknown") != std::string::npos);
  CHECK(prof.out.find("estimated") == std::string::npos);

  auto r = run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "ebs-gp3"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cpu not sampled (in other)") != std::string::npos);
  // No device I/O: the tiers cannot differ, and the second line says so.
  CHECK(r.out.find("trace: " + trace + "\nevery tier is the same by construction: the trace has no device I/O") == 0);
  CHECK(r.out.find("cpu 0.000 ms") == std::string::npos);
  CHECK(r.out.find("its time is in 'other'") != std::string::npos);
  // Nothing the network serves has any demand: the clients set the pace,
  // not a CPU that is not modelled.
  CHECK(r.out.find(" cpu 0%") == std::string::npos);
  CHECK(r.out.find(" -                      none\n") != std::string::npos);

  auto j = run_tierlab({"project", trace, "--tier", "nvme-local", "--json", "-"});
  REQUIRE(j.status == 0);
  auto pj = nlohmann::json::parse(j.out);
  CHECK(pj["per_transaction"]["cpu_ms"].is_null());
  CHECK(pj["tiers"][0]["time_ms"]["cpu"].is_null());
  CHECK(pj["per_transaction"]["other_ms"].get<double>() > 0.9);
  CHECK(pj["tiers"][0]["bottleneck"].is_null());
  CHECK(pj["tiers"][0]["busiest"].is_null());
  CHECK(pj["same_on_every_tier"].get<std::string>().rfind("every tier is the same by construction", 0) == 0);
}

TEST_CASE("project: --json - and --html - write to stdout, and output paths are checked first",
          "[project][cli]") {
  TempDir dir;
  std::string trace = dir.file("proxy.tlt");
  write_proxy_trace(trace);
  // Run in the directory where a file named "-" would land.
  char here[4096];
  REQUIRE(::getcwd(here, sizeof here) != nullptr);
  REQUIRE(::chdir(dir.path().c_str()) == 0);
  struct Back {
    const char* to;
    ~Back() { (void)!::chdir(to); }
  } back{here};

  auto j = run_tierlab({"project", trace, "--tier", "nvme-local", "--json", "-"});
  INFO(j.err);
  REQUIRE(j.status == 0);
  auto pj = nlohmann::json::parse(j.out);  // stdout is the JSON alone
  CHECK(pj["tiers"][0]["tier"] == "nvme-local");
  CHECK_FALSE(exists("-"));

  std::string json = dir.file("p.json");
  auto h = run_tierlab({"project", trace, "--tier", "nvme-local", "--html", "-", "--json", json});
  REQUIRE(h.status == 0);
  CHECK(h.out.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(nlohmann::json::parse(slurp(json))["tiers"][0]["tier"] == "nvme-local");
  CHECK_FALSE(exists("-"));

  auto both = run_tierlab({"project", trace, "--tier", "nvme-local", "--html", "-", "--json", "-"});
  CHECK(both.status == 2);
  CHECK(count_lines(both.err) == 1);

  // A path that cannot be written fails before anything is computed or
  // printed: one line naming the option and the path, status 2.
  for (const char* opt : {"--json", "--html"}) {
    std::string bad = dir.file("no/such/dir/out");
    auto r = run_tierlab({"project", trace, "--tier", "nvme-local", opt, bad});
    INFO(opt << ": " << r.out << r.err);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(std::string(opt) + " " + bad) != std::string::npos);
  }
  // The trace is read after the outputs are created; a bad trace leaves no
  // empty output behind.
  std::string out = dir.file("never.json");
  auto m = run_tierlab({"project", dir.file("missing.tlt"), "--tier", "nvme-local", "--json", out});
  CHECK(m.status == 2);
  CHECK_FALSE(exists(out));
}

TEST_CASE("project: 0 for --vcpus, --memory or --capture-memory is refused, naming the flag",
          "[project][cli]") {
  TempDir dir;
  std::string trace = dir.file("proxy.tlt");
  write_proxy_trace(trace);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--vcpus", "0"}, {"--vcpus", "-3"}, {"--memory", "0"}, {"--memory", "0GB"}, {"--capture-memory", "0"}};
  for (const auto& [flag, value] : bad) {
    auto r = run_tierlab({"project", trace, "--tier", "nvme-local", flag, value});
    INFO(flag << " " << value << ": " << r.out << r.err);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(flag + ":") != std::string::npos);
  }
  // Left out, each is as captured.
  auto ok = run_tierlab({"project", trace, "--tier", "nvme-local", "--vcpus", "2"});
  CHECK(ok.status == 0);
}

TEST_CASE("project: the options the model checks are refused naming their flags, the model's message after them",
          "[project][cli]") {
  TempDir dir;
  std::string trace = dir.file("proxy.tlt");
  write_proxy_trace(trace);
  // The proxy trace has no page references and no recorded memory.
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> bad = {
      {{"--data-growth", "2"}, {"tierlab: --data-growth cannot be projected: ", "proxy.tlt has no page references"}},
      {{"--memory", "1GiB", "--capture-memory", "2GiB"},
       {"tierlab: --memory cannot be projected: ", "proxy.tlt has no page references"}}};
  for (const auto& [flags, want] : bad) {
    std::vector<std::string> args = {"project", trace, "--tier", "nvme-local"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_tierlab(args);
    INFO(flags[0] << ": [" << r.out << "] [" << r.err << "]");
    CHECK(r.status == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.rfind(want[0], 0) == 0);
    CHECK(r.err.find(want[1]) != std::string::npos);
  }
}
