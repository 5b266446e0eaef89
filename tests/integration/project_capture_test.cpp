// capture run -> profile -> project end to end: the real binary against a
// throwaway PostgreSQL driven by pgbench through the capture proxy.
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

void spit(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

nlohmann::json project_json(const std::vector<std::string>& args, const std::string& out, std::string* text) {
  std::vector<std::string> a = {"project"};
  a.insert(a.end(), args.begin(), args.end());
  a.push_back("--json");
  a.push_back(out);
  auto r = test::run_tierlab(a);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  if (text) *text = r.out;
  return nlohmann::json::parse(slurp(out));
}

}  // namespace

TEST_CASE("project: capture run records transactions, samples and block I/O, profile and project read it",
          "[integration][project]") {
  auto& pg = test::shared_server();
  TempDir dir;
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "2"}, &out) == 0);
  int port = pgtmp::free_port();
  std::string trace = dir.file("run.tlt");
  std::vector<std::string> args = {"capture", "run", "--listen", "127.0.0.1:" + std::to_string(port),
                                   "--upstream", pg.host() + ":" + std::to_string(pg.port()),
                                   "--conninfo", pg.conninfo(), "--out", trace, "--duration", "7s",
                                   "--sample-interval", "200ms"};
  bool root = geteuid() == 0;
  if (root) {
    args.push_back("--device");
    args.push_back(pg.data_dir());
  }
  test::RunResult capture;
  std::thread t([&] { capture = test::run_tierlab(args); });
  REQUIRE(tierlab::test::wait_listening(port));
  int rc = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", std::to_string(port), "-c", "4", "-j", "2",
                                   "-T", "4"},
                       &out);
  t.join();
  INFO(out << capture.out << capture.err);
  REQUIRE(rc == 0);
  REQUIRE(capture.status == 0);
  CHECK(capture.out.find("transactions: ") != std::string::npos);
  if (!root) CHECK(capture.err.find("block I/O skipped") != std::string::npos);

  auto prof = test::run_tierlab({"profile", "--json", trace});
  REQUIRE(prof.status == 0);
  auto j = nlohmann::json::parse(prof.out);
  CHECK(j["transactions"].get<double>() > 100);
  CHECK(j["clients"] == 4);
  REQUIRE(j["templates"].size() >= 1);
  CHECK(j["templates"][0]["text"].get<std::string>().rfind("begin; update pgbench_accounts", 0) == 0);
  CHECK(j["templates"][0]["statements"] == 7);
  // CPU of the postmaster's tree and PostgreSQL's counters were sampled.
  REQUIRE(j["per_transaction"]["cpu_ms"].is_number());
  CHECK(j["per_transaction"]["cpu_ms"].get<double>() > 0.01);
  CHECK(j["per_transaction"]["cpu_ms"].get<double>() < 50);
  REQUIRE(j["per_transaction"]["pg_blks_hit"].is_number());
  CHECK(j["per_transaction"]["pg_blks_hit"].get<double>() > 1);
  CHECK(j["per_transaction"]["pg_wal_bytes"].get<double>() > 100);
  CHECK(j["memory_bytes"].get<double>() > 0);
  CHECK(j["shared_buffers_bytes"].get<double>() > 0);
  if (root) {
    CHECK(j["device"]["has_block_io"] == true);
    CHECK(j["device"]["write_latency"]["count"].get<double>() > 0);
  }
  auto text = test::run_tierlab({"profile", trace});
  REQUIRE(text.status == 0);
  CHECK(text.out.find("templates (") != std::string::npos);

  std::string html = dir.file("p.html"), json = dir.file("p.json");
  auto proj = test::run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k", "--clients",
                                 "1..16", "--html", html, "--json", json});
  INFO(proj.out << proj.err);
  REQUIRE(proj.status == 0);
  CHECK(proj.out.find("nvme-local") != std::string::npos);
  auto pj = nlohmann::json::parse(slurp(json));
  REQUIRE(pj["tiers"].size() == 2);
  CHECK(pj["tiers"][0]["tps"].get<double>() > 0);
  CHECK(pj["tiers"][1]["ratio"].get<double>() > 0);
  CHECK(pj["tiers"][0]["curve"].size() == 16);
  std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);
}

TEST_CASE("project: bad input is one line and exit status 2", "[integration][project]") {
  TempDir dir;
  std::string empty = dir.file("empty.tlt");
  {
    auto w = trace::open_writer(empty);
    w->write(1, 1, trace::SessionBegin{});
    w->write(2, 1, trace::Ready{'I'});
    w->close();
  }
  auto r = test::run_tierlab({"project", empty, "--tier", "nvme-local"});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("no completed transaction") != std::string::npos);
  r = test::run_tierlab({"project", empty, "--tier", "no-such-tier"});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("no-such-tier") != std::string::npos);
  r = test::run_tierlab({"project", empty, "--tier", "nvme-local", "--clients", "9..3"});
  CHECK(r.status == 2);
  r = test::run_tierlab({"project", empty, "--tier", "nvme-local", "--memory", "lots"});
  CHECK(r.status == 2);
  CHECK(r.err.find("--memory") != std::string::npos);
  r = test::run_tierlab({"profile", dir.file("missing.tlt")});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
}

// project --load and --data-growth on a real capture: a select-only pgbench
// run through `capture run` (file and block I/O recorded, so as root) on a
// server whose shared_buffers are far smaller than the data, so its reads go
// to the OS and the file-level miss-ratio curve knows the working set.
TEST_CASE("project: --load and --data-growth on a captured pgbench run", "[integration][project][capacity]") {
  test::require_root("capture run's file and block I/O recorders");
  auto opts = test::fast_server_options();
  opts.settings.push_back({"shared_buffers", "2MB"});
  pgtmp::Server pg(opts);
  TempDir dir;
  std::string out;
  // Scale 2: about 30 MB of tables and indexes, 15 times shared_buffers.
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "2"}, &out) == 0);
  int port = pgtmp::free_port();
  std::string trace = dir.file("run.tlt");
  test::RunResult capture;
  std::thread t([&] {
    capture = test::run_tierlab({"capture", "run", "--listen", "127.0.0.1:" + std::to_string(port), "--upstream",
                                 pg.host() + ":" + std::to_string(pg.port()), "--conninfo", pg.conninfo(), "--out",
                                 trace, "--duration", "7s", "--sample-interval", "200ms", "--device",
                                 pg.data_dir()});
  });
  REQUIRE(tierlab::test::wait_listening(port));
  int rc = pg.run_tool("pgbench", {"-n", "-S", "-h", "127.0.0.1", "-p", std::to_string(port), "-c", "4", "-j", "2",
                                   "-T", "4"},
                       &out);
  t.join();
  INFO(out << capture.out << capture.err);
  REQUIRE(rc == 0);
  REQUIRE(capture.status == 0);
  auto prof = test::run_tierlab({"profile", "--json", trace});
  REQUIRE(prof.status == 0);
  auto pj = nlohmann::json::parse(prof.out);
  INFO(prof.out);
  if (pj["mrc"]["source"] != "file_io")
    test::skip("the capture recorded no file I/O (syscall tracepoints missing?)");

  // The memory the target gets: well below the data, so the reads of the
  // OS cache's misses are device reads and a tier's read IOPS matter.
  const std::string memory = "12MB";

  {  // load multiples: monotone figures, a headroom line per tier, the cap tier saturating at its cap
    std::string text;
    auto base = project_json({trace, "--tier", "nvme-local", "--memory", memory}, dir.file("base.json"), nullptr);
    const double reads = base["tiers"][0]["read_iops"].get<double>();
    REQUIRE(reads > 0);
    // A tier like nvme-local with half the read IOPS it would serve today.
    const double cap = std::floor(reads / 2);
    spit(dir.file("tiers.json"),
         nlohmann::json{{"tiers", {{{"name", "half-reads"}, {"base", "nvme-local"}, {"read_iops", cap}}}}}.dump());
    auto j = project_json({trace, "--tier", "nvme-local", "--tier", "half-reads", "--tier", "rds-16k", "--tiers-file",
                           dir.file("tiers.json"), "--memory", memory, "--load", "1,1.5,2,3"},
                          dir.file("load.json"), &text);
    INFO(text);
    REQUIRE(j["loads"].size() == 4);
    CHECK(j["load_by"] == "think");
    for (size_t i = 0; i < 3; ++i) {
      const std::string name = j["tiers"][i]["tier"];
      // One headroom line for every tier.
      CHECK(text.find("  " + name + ": ") != std::string::npos);
      REQUIRE(j["tiers"][i].contains("headroom"));
      for (size_t k = 1; k < 4; ++k) {
        const auto& a = j["loads"][k - 1]["tiers"][i];
        const auto& b = j["loads"][k]["tiers"][i];
        INFO(name << " at load " << j["loads"][k]["load"]);
        CHECK(b["tps"].get<double>() >= a["tps"].get<double>() * (1 - 1e-9));
        CHECK(b["latency_avg_ms"].get<double>() >= a["latency_avg_ms"].get<double>() * (1 - 1e-9));
        CHECK(b["latency_p99_ms"].get<double>() >= a["latency_p99_ms"].get<double>() * (1 - 1e-9));
      }
    }
    // Load 1 is the plain projection.
    CHECK(j["loads"][0]["tiers"][0]["tps"].get<double>() == Approx(base["tiers"][0]["tps"].get<double>()));
    // The capped tier: already saturated today, by its read cap, and from
    // there on it serves exactly the cap.
    const auto& h = j["tiers"][1]["headroom"];
    CHECK(h["by"] == "read IOPS cap");
    REQUIRE(h["load"].is_number());
    CHECK(h["load"].get<double>() < 1);
    CHECK(h["load"].get<double>() > 0.3);
    CHECK(text.find("half-reads: saturates at ") != std::string::npos);
    CHECK(text.find("today's load already saturates it") != std::string::npos);
    for (const auto& lp : j["loads"]) {
      CHECK(lp["tiers"][1]["read_iops"].get<double>() == Approx(cap).epsilon(0.01));
      CHECK(lp["tiers"][1]["bottleneck"] == "read IOPS cap");
    }
    // Scaling clients instead: the same monotone figures.
    auto c = project_json({trace, "--tier", "nvme-local", "--memory", memory, "--load", "1,2,4", "--load-by",
                           "clients"},
                          dir.file("clients.json"), nullptr);
    CHECK(c["loads"][1]["clients"].get<int>() == 2 * c["loads"][0]["clients"].get<int>());
    CHECK(c["loads"][2]["tiers"][0]["tps"].get<double>() >= c["loads"][1]["tiers"][0]["tps"].get<double>());
    CHECK(c["loads"][1]["tiers"][0]["tps"].get<double>() >= c["loads"][0]["tiers"][0]["tps"].get<double>());
  }

  {  // data growth: reads per transaction never fall, throughput never rises, the assumption stated
    double reads = -1, tps = 1e18;
    for (const char* g : {"1", "2", "4", "8"}) {
      std::string text;
      auto j = project_json({trace, "--tier", "rds-16k", "--memory", "48MB", "--data-growth", g},
                            dir.file(std::string("g") + g + ".json"), &text);
      INFO("growth " << g << "\n" << text);
      const double r = j["per_transaction"]["device_reads"].get<double>();
      CHECK(r >= reads * (1 - 1e-9));
      CHECK(j["tiers"][0]["tps"].get<double>() <= tps * (1 + 1e-9));
      if (std::string(g) != "1") {
        CHECK(text.find(std::string("data growth ") + g + "x: ") != std::string::npos);
        CHECK(j["data_growth"].get<double>() == std::stod(g));
      }
      if (std::string(g) == "8") CHECK(r > reads);  // 6 MB of today's memory: well inside the working set
      reads = r;
      tps = j["tiers"][0]["tps"].get<double>();
    }
  }

  {  // bad values name the flag
    for (std::vector<std::string> bad : {std::vector<std::string>{"--load", "1,x"}, {"--load", "0"},
                                          {"--data-growth", "-2"}, {"--load-by", "users"}, {"--slo-p99", "fast"}}) {
      std::vector<std::string> a = {"project", trace, "--tier", "nvme-local"};
      a.insert(a.end(), bad.begin(), bad.end());
      auto r = test::run_tierlab(a);
      INFO(r.err);
      CHECK(r.status == 2);
      CHECK(test::count_lines(r.err) == 1);
      CHECK(r.err.find(bad[0]) != std::string::npos);
    }
  }
}
