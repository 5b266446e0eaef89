#include "tiers/tiers.h"

#include "common/error.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace tierlab;
using tiers::Catalog;

namespace {

// Expects `fn` to throw InputError whose message contains every needle.
template <typename Fn>
void require_input_error(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    FAIL("no InputError thrown");
  } catch (const InputError& e) {
    std::string msg = e.what();
    INFO(msg);
    for (const auto& n : needles) CHECK(msg.find(n) != std::string::npos);
  }
}

std::string temp_file(const std::string& text) {
  char path[] = "/tmp/tierlab_tiers_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

}  // namespace

TEST_CASE("built-in tiers load and carry the documented caps", "[tiers]") {
  Catalog c = Catalog::builtin();
  for (const char* name : {"nvme-local", "ebs-gp3", "ebs-gp3-16k", "ebs-io2-bx", "rds-16k",
                           "aurora-io-optimized"}) {
    INFO(name);
    REQUIRE(c.find(name) != nullptr);
    CHECK_NOTHROW(tiers::validate(c.get(name), name));
  }
  CHECK(c.get("ebs-gp3").total_iops == 3000);
  CHECK(c.get("ebs-gp3").bytes_per_sec == 125.0 * 1024 * 1024);
  CHECK(c.get("ebs-gp3-16k").total_iops == 16000);
  CHECK(c.get("ebs-gp3-16k").bytes_per_sec == 1000.0 * 1024 * 1024);
  CHECK(c.get("rds-16k").total_iops == 16000);
  CHECK(c.get("rds-16k").io_unit_bytes == 256 * 1024);
  CHECK(c.get("rds-16k").merge_sequential);
  CHECK(c.get("aurora-io-optimized").total_iops == 0);
  CHECK(c.get("nvme-local").total_iops == 0);
  CHECK(c.get("nvme-local").read.p50_ns >= 80000);
  CHECK(c.get("nvme-local").read.p50_ns <= 100000);
  CHECK(c.get("ebs-gp2-100g").burst.enabled());
}

TEST_CASE("a user tiers file adds a tier and can start from a built-in", "[tiers]") {
  auto path = temp_file(R"({"tiers": [
    {"name": "my-volume", "description": "test volume", "iops": 5000, "throughput_mib_s": 200,
     "io_unit_kib": 256, "merge_sequential": true, "count_flushes": true, "parallelism": 32,
     "latency": {"read": {"dist": "lognormal", "p50_us": 500, "p99_us": 1500},
                 "write": {"dist": "fixed", "p50_us": 700}}},
    {"name": "gp3-6k", "base": "ebs-gp3", "iops": 6000}
  ]})");
  Catalog c = tiers::load_catalog(path);
  std::remove(path.c_str());
  const auto& t = c.get("my-volume");
  CHECK(t.total_iops == 5000);
  CHECK(t.bytes_per_sec == 200.0 * 1024 * 1024);
  CHECK(t.read.dist == tiers::LatencyDist::Lognormal);
  CHECK(t.read.p50_ns == 500000);
  CHECK(t.read.p99_ns == 1500000);
  CHECK(t.write.dist == tiers::LatencyDist::Fixed);
  CHECK(t.write.p50_ns == 700000);
  CHECK(t.parallelism == 32);
  CHECK(t.count_flushes);
  {
    Catalog back;
    back.load_json(tiers::to_json(t), "roundtrip");
    CHECK(back.tiers()[0].count_flushes);
  }
  const auto& g = c.get("gp3-6k");
  CHECK_FALSE(g.count_flushes);  // cloud volumes count data I/Os only
  CHECK(g.total_iops == 6000);
  CHECK(g.bytes_per_sec == c.get("ebs-gp3").bytes_per_sec);
  CHECK(g.read.p50_ns == c.get("ebs-gp3").read.p50_ns);
  CHECK(c.find("nvme-local") != nullptr);  // built-ins stay
}

TEST_CASE("tiers show --json output reads back as the same tier", "[tiers]") {
  Catalog c = Catalog::builtin();
  for (const auto& t : c.tiers()) {
    Catalog back;
    back.load_json(tiers::to_json(t), "roundtrip");
    REQUIRE(back.tiers().size() == 1);
    CHECK(tiers::to_json(back.tiers()[0]) == tiers::to_json(t));
  }
}

TEST_CASE("a bad tiers file gives an error naming the file and the key", "[tiers]") {
  auto path = temp_file(R"({"tiers": [{"name": "ok", "iops": 100},
                                      {"name": "bad", "latency": {"read": {"p50_us": "fast"}}}]})");
  require_input_error([&] { tiers::load_catalog(path); },
                      {path, "tiers[1]", "latency.read.p50_us", "expected a number"});
  std::remove(path.c_str());

  Catalog c = Catalog::builtin();
  // An unknown key names the tier it is in, as docs/tiers.md shows.
  require_input_error([&] { c.load_json(R"({"tiers": [{"name": "x", "iopz": 3}]})", "t.json"); },
                      {"t.json: tiers[0] (x).iopz: unknown key (known: name, base, "});
  require_input_error([&] { c.load_json(R"({"tiers": [{"iopz": 3, "name": "y"}]})", "t.json"); },
                      {"t.json: tiers[0] (y).iopz: unknown key"});
  require_input_error([&] { c.load_json(R"([{"name": "x", "base": "nope"}])", "t.json"); },
                      {"t.json: [0] (x).base: unknown tier \"nope\""});
  require_input_error([&] { c.load_json(R"({"tiers": [{"iops": 3}]})", "t.json"); },
                      {"t.json", "tiers[0]", "name"});
  require_input_error([&] { c.load_json("{not json", "t.json"); }, {"t.json", "JSON"});
  require_input_error(
      [&] {
        c.load_json(R"([{"name": "x", "latency": {"read": {"dist": "lognormal", "p50_us": 5, "p99_us": 2}}}])",
                    "t.json");
      },
      {"t.json", "latency.read.p99_us"});
  require_input_error(
      [&] { c.load_json(R"([{"name": "x", "latency": {"write": {"dist": "lognormal", "p99_us": 2}}}])", "t.json"); },
      {"t.json", "latency.write.p50_us"});
  require_input_error([&] { c.load_json(R"([{"name": "x", "base": "ebs-gp9"}])", "t.json"); },
                      {"t.json", "base", "ebs-gp9", "ebs-gp3"});
  require_input_error([&] { c.load_json(R"([{"name": "x", "iops": -5}])", "t.json"); }, {"t.json", "iops"});
  require_input_error([&] { c.load_json(R"([{"name": "x", "count_flushes": "yes"}])", "t.json"); },
                      {"t.json", "count_flushes"});
  require_input_error([&] { tiers::load_catalog("/nonexistent/tiers.json"); },
                      {"/nonexistent/tiers.json"});
}

TEST_CASE("a number too large for a double names the file and where it is", "[tiers]") {
  Catalog c = Catalog::builtin();
  require_input_error([&] { c.load_json(R"([{"name":"x","iops":1e400}])", "big.json"); },
                      {"big.json: [0].iops: number 1e400 is out of range"});
  require_input_error(
      [&] {
        c.load_json(R"({"tiers": [{"name": "a", "iops": 1, "latency": {"read": {"p50_us": 2}}},
                                  {"name": "b", "latency": {"write": {"dist": "fixed", "p50_us": -1e999}}}]})",
                    "big.json");
      },
      {"big.json: tiers[1].latency.write.p50_us: number -1e999 is out of range"});
  require_input_error([&] { c.load_json("1e400", "big.json"); }, {"big.json: top level: number 1e400"});
  // Nothing else changed in the catalog.
  CHECK(c.find("x") == nullptr);
  CHECK(c.find("a") == nullptr);
}

TEST_CASE("an unknown tier lists the known names", "[tiers]") {
  Catalog c = Catalog::builtin();
  require_input_error([&] { c.get("ebs-gp9"); },
                      {"ebs-gp9", "nvme-local", "ebs-gp3", "ebs-gp3-16k", "ebs-io2-bx", "rds-16k",
                       "aurora-io-optimized"});
}
