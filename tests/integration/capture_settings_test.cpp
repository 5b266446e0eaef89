// Every capture records the server's durability settings (Meta
// "setting.NAME"), and profile and project say first when commits did not
// wait for the device.
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>


#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

namespace {

std::map<std::string, std::string> settings_of(const std::string& path) {
  std::map<std::string, std::string> out;
  auto r = trace::open_reader(path);
  trace::Record rec;
  while (r->next(rec))
    if (auto* m = std::get_if<trace::Meta>(&rec.body))
      if (m->key.substr(0, 8) == "setting.") out[std::string(m->key.substr(8))] = std::string(m->value);
  return out;
}

void check_durability_settings(const std::map<std::string, std::string>& s) {
  for (const char* name : {"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "commit_delay",
                           "checkpoint_timeout", "max_wal_size", "shared_buffers"}) {
    INFO(name);
    CHECK(s.count(name) == 1);
  }
  // The test server runs with fsync off (test::fast_server_options()).
  CHECK(s.count("fsync") == 1);
  if (s.count("fsync")) CHECK(s.at("fsync") == "off");
  if (s.count("synchronous_commit")) CHECK(s.at("synchronous_commit") == "on");
}

}  // namespace

TEST_CASE("capture proxy records the server's durability settings", "[integration][capture][durability][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  const int port = pgtmp::free_port();
  const std::string trace = dir.file("proxy.tlt");
  test::RunResult cap;
  std::thread t([&] {
    cap = test::run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:" + std::to_string(port), "--upstream",
                             pg.host() + ":" + std::to_string(pg.port()), "--conninfo", pg.conninfo(), "--out",
                             trace, "--duration", "2s"});
  });
  REQUIRE(tierlab::test::wait_listening(port));
  std::string out;
  pg.run_tool("psql", {"-h", "127.0.0.1", "-p", std::to_string(port), "-Atc", "select 1"}, &out);
  t.join();
  INFO(cap.out << cap.err << out);
  REQUIRE(cap.status == 0);
  check_durability_settings(settings_of(trace));
}

TEST_CASE("capture proxy says in one line when it cannot read the settings, and goes on",
          "[integration][capture][durability][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("proxy.tlt");
  auto cap = test::run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream",
                                pg.host() + ":" + std::to_string(pg.port()), "--conninfo",
                                "host=127.0.0.1 port=1 connect_timeout=2", "--out", trace, "--duration", "1s"});
  INFO(cap.out << cap.err);
  CHECK(cap.status == 0);
  CHECK(cap.err.find("durability settings not recorded: ") != std::string::npos);
  CHECK(settings_of(trace).empty());
}

TEST_CASE("capture sniff records the server's durability settings", "[integration][capture][durability][parallel]") {
  test::require_root("capture sniff on lo");
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("sniff.tlt");
  auto cap = test::run_tierlab({"capture", "sniff", "--interface", "lo", "--port", std::to_string(pg.port()),
                                "--host", "127.0.0.1", "--conninfo", pg.conninfo(), "--out", trace, "--duration",
                                "1s"});
  INFO(cap.out << cap.err);
  REQUIRE(cap.status == 0);
  check_durability_settings(settings_of(trace));
}

TEST_CASE("run as root without --conninfo, a capture asks the server as postgres, not as root",
          "[integration][capture][durability][parallel]") {
  test::require_root("capture sniff on lo, as root");
  auto& pg = test::shared_server();
  TempDir dir;
  const std::string trace = dir.file("sniff-root.tlt");
  // As the README has it: --host and --port only.
  auto cap = test::run_tierlab({"capture", "sniff", "--interface", "lo", "--port", std::to_string(pg.port()),
                                "--host", "127.0.0.1", "--out", trace, "--duration", "1s"});
  INFO(cap.out << cap.err);
  REQUIRE(cap.status == 0);
  CHECK(cap.err.find("role \"root\"") == std::string::npos);
  check_durability_settings(settings_of(trace));
}

TEST_CASE("capture run records the durability settings, and profile and project say first that fsync was off",
          "[integration][capture][durability][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1"}, &out) == 0);
  const int port = pgtmp::free_port();
  const std::string trace = dir.file("run.tlt");
  std::vector<std::string> args = {"capture", "run", "--listen", "127.0.0.1:" + std::to_string(port),
                                   "--upstream", pg.host() + ":" + std::to_string(pg.port()), "--conninfo",
                                   pg.conninfo(), "--out", trace, "--duration", "3s", "--sample-interval", "200ms"};
  const bool root = geteuid() == 0;
  if (root) {
    args.push_back("--device");
    args.push_back(pg.data_dir());
  }
  test::RunResult cap;
  std::thread t([&] { cap = test::run_tierlab(args); });
  REQUIRE(tierlab::test::wait_listening(port));
  int rc = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", std::to_string(port), "-c", "2", "-T", "1"}, &out);
  t.join();
  INFO(cap.out << cap.err << out);
  REQUIRE(rc == 0);
  REQUIRE(cap.status == 0);
  check_durability_settings(settings_of(trace));
  // Sampling moments and counter values are told apart.
  CHECK(cap.out.find(" sampling rounds (every 200ms), ") != std::string::npos);
  CHECK(cap.out.find(" counter values in all") != std::string::npos);
  // Block I/O of the server's processes only; others' are counted.
  if (root) CHECK(cap.out.find(" I/Os of other processes counted, not recorded") != std::string::npos);

  auto prof = test::run_tierlab({"profile", trace});
  INFO(prof.out << prof.err);
  REQUIRE(prof.status == 0);
  CHECK(prof.out.rfind("WARNING: fsync=off at capture: commits did not wait for the device", 0) == 0);
  auto pj = test::run_tierlab({"profile", "--json", trace});
  REQUIRE(pj.status == 0);
  auto j = nlohmann::json::parse(pj.out);
  CHECK(j["commit_durability_warning"].get<std::string>().rfind("fsync=off at capture", 0) == 0);
  CHECK(j["settings"]["fsync"] == "off");

  auto proj = test::run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k", "--json", "-"});
  INFO(proj.out << proj.err);
  REQUIRE(proj.status == 0);
  auto jj = nlohmann::json::parse(proj.out);
  CHECK(jj["commit_durability_warning"].get<std::string>().find("commit latency on other tiers is not projected") !=
        std::string::npos);
  auto text = test::run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "rds-16k"});
  REQUIRE(text.status == 0);
  CHECK(text.out.rfind("WARNING: fsync=off at capture", 0) == 0);
}
