// tierlab project through the real binary, on a small synthetic trace: what
// a proxy-only capture gives (transactions, no CPU samples, no block I/O).
#include "support/support.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

namespace {

constexpr int64_t kMs = 1000000;

// Four sessions, each running 200 autocommit SELECTs of 1 ms with 0.5 ms
// between them.
void write_proxy_trace(const std::string& path) {
  auto w = tierlab::trace::open_writer(path);
  for (uint64_t s = 1; s <= 4; ++s)
    w->write(0, s, tierlab::trace::SessionBegin{"u", "db", "app", "127.0.0.1:1", int32_t(100 + s), 0});
  for (int i = 0; i < 200; ++i)
    for (uint64_t s = 1; s <= 4; ++s) {
      int64_t t = kMs + i * (3 * kMs / 2) + static_cast<int64_t>(s) * 1000;
      w->write(t, s, tierlab::trace::Query{"SELECT 1"});
      w->write(t + kMs, s, tierlab::trace::Ready{'I'});
    }
  for (uint64_t s = 1; s <= 4; ++s) w->write(400 * kMs, s, tierlab::trace::SessionEnd{});
  w->close();
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
  CHECK(prof.out.find("project counts it in 'other', not as a resource") != std::string::npos);
  CHECK(prof.out.find("estimated") == std::string::npos);

  auto r = run_tierlab({"project", trace, "--tier", "nvme-local", "--tier", "ebs-gp3"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cpu not sampled (in other)") != std::string::npos);
  CHECK(r.out.find("cpu 0.000 ms") == std::string::npos);
  CHECK(r.out.find("its time is in 'other'") != std::string::npos);
  // Nothing the network serves has any demand: the clients set the pace,
  // not a CPU that is not modelled.
  CHECK(r.out.find(" cpu 0%") == std::string::npos);
  CHECK(r.out.find("  clients\n") != std::string::npos);

  std::string json = dir.file("p.json");
  auto j = run_tierlab({"project", trace, "--tier", "nvme-local", "--json", json});
  REQUIRE(j.status == 0);
  auto pj = nlohmann::json::parse(std::ifstream(json));
  CHECK(pj["per_transaction"]["cpu_ms"].is_null());
  CHECK(pj["tiers"][0]["time_ms"]["cpu"].is_null());
  CHECK(pj["per_transaction"]["other_ms"].get<double>() > 0.9);
  CHECK(pj["tiers"][0]["bottleneck"] == "clients");
}
