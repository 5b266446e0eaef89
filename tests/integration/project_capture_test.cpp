// capture run -> profile -> project end to end: the real binary against a
// throwaway PostgreSQL driven by pgbench through the capture proxy.
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
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
