// Synthetic pgbench profiles: page geometry, the LRU miss arithmetic and the
// write model against hand-computed values; the profile's JSON read back by
// `project`.
#include "models/synth.h"

#include "common/error.h"
#include "models/project.h"
#include "tiers/tiers.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace tierlab;
using namespace tierlab::models;

TEST_CASE("synth: pgbench_accounts pages and primary-key levels by scale", "[synth]") {
  // 100,000 rows at 61 per page; 367 keys per leaf, 285 per inner page.
  auto g1 = pgbench_geometry(1);
  CHECK(g1.rows == 100000);
  CHECK(g1.heap_pages == 1640);  // ceil(100000 / 61): ~13.4 MB
  REQUIRE(g1.index_levels.size() == 2);
  CHECK(g1.index_levels[1] == 273);  // ceil(100000 / 367)
  CHECK(g1.index_levels[0] == 1);
  // The 500 GB seed: 3,424,700,000 rows.
  auto g = pgbench_geometry(34247);
  CHECK(g.heap_pages == 56142623);
  REQUIRE(g.index_levels.size() == 4);
  CHECK(g.index_levels[3] == 9331608);  // ceil(3424700000 / 367)
  CHECK(g.index_levels[2] == 32743);    // ceil(9331608 / 285)
  CHECK(g.index_levels[1] == 115);
  CHECK(g.index_levels[0] == 1);
  CHECK(g.bytes() / 1e9 == Approx(536.4).epsilon(0.001));
  CHECK_THROWS_AS(pgbench_geometry(0), InputError);
}

TEST_CASE("synth: uniform references miss 1 - C/N, under LRU as in the formula", "[synth]") {
  CHECK(uniform_miss_ratio(1000, 250) == Approx(0.75));
  CHECK(uniform_miss_ratio(1000, 1000) == 0);
  CHECK(uniform_miss_ratio(1000, 5000) == 0);
  // One class: Che's approximation gives the uniform hit ratio C/N exactly.
  auto h = lru_hit_ratios({{"a", 1000, 1}}, 250);
  REQUIRE(h.size() == 1);
  CHECK(h[0] == Approx(0.25).epsilon(1e-6));
  // Everything fits: all hit.
  CHECK(lru_hit_ratios({{"a", 100, 1}, {"b", 100, 3}}, 200) == std::vector<double>{1, 1});
}

TEST_CASE("synth: two page classes share the cache by their reference rates", "[synth]") {
  // 100 pages referenced 1 per transaction and 900 referenced 1 per
  // transaction: the small class is 9x hotter per page. Cache 300 pages.
  // Hand: T solves 100(1 - e^(-T/100)) + 900(1 - e^(-T/900)) = 300;
  // T = 238.144 gives 90.758 + 209.242 = 300.000, hits 0.90758 and 0.23249.
  auto h = lru_hit_ratios({{"hot", 100, 1}, {"cold", 900, 1}}, 300);
  CHECK(h[0] == Approx(0.90758).epsilon(1e-4));
  CHECK(h[1] == Approx(0.23249).epsilon(1e-4));
  CHECK(100 * h[0] + 900 * h[1] == Approx(300).epsilon(1e-6));
}

TEST_CASE("synth: the cache the memory leaves", "[synth]") {
  // 64 GiB with shared_buffers 16 GiB: 48 GiB - 40 MiB - 256 x 1 MiB =
  // 48,856 MiB = 6,253,568 pages in the OS cache, 2,097,152 in shared_buffers.
  auto big = cache_sizes(64.0 * (1 << 30), 16.0 * (1 << 30), 256);
  CHECK(big.shared_buffers_pages == 2097152);
  CHECK(big.os_pages == 6253568);
  // A 256 MiB cgroup with shared_buffers 64 MiB and 8 clients: 256 - 64 -
  // 40 - 8 = 144 MiB = 18,432 pages of OS cache.
  auto small = cache_sizes(256.0 * (1 << 20), 64.0 * (1 << 20), 8);
  CHECK(small.shared_buffers_pages == 8192);
  CHECK(small.os_pages == 18432);
  CHECK(cache_sizes(100.0 * (1 << 20), 64.0 * (1 << 20), 8).os_pages == 0);
  CHECK_THROWS_AS(cache_sizes(1 << 30, 1 << 30, 1), InputError);
}

TEST_CASE("synth: one uniform class: the smaller of the two caches is all duplicates", "[synth]") {
  // N pages referenced uniformly: shared_buffers holds B of them, the OS
  // cache the P read from it last, which include the B; a reference misses
  // both with 1 - max(B, P) / N.
  for (auto [b, p] : std::vector<std::pair<double, double>>{{250, 400}, {400, 250}, {250, 0}}) {
    auto h = two_level_hit_ratios({{"a", 1000, 1}}, {b, p});
    INFO(b << " " << p);
    CHECK(h.shared_buffers[0] == Approx(b / 1000).epsilon(1e-6));
    CHECK(h.either[0] == Approx(std::max(b, p) / 1000).epsilon(1e-6));
  }
  // The OS cache holds every page: no device reads.
  CHECK(two_level_hit_ratios({{"a", 1000, 1}}, {250, 1000}).either[0] == 1);
}

TEST_CASE("synth: hot pages in shared_buffers leave the OS cache to colder ones", "[synth]") {
  // 100 hot and 900 cold pages, 1 reference each per transaction,
  // shared_buffers 300 pages (T1 = 238.144, hits 0.90758 and 0.23249 as
  // above), OS cache 400. A page's last read from the OS lies
  // (e^(r T1) - 1) / r - T1 before its last reference: 743.94 transactions
  // for a hot page, 34.49 for a cold one. T2 solves
  // 100 (1 - e^-((T2 - 743.94) / 100))+ + 900 (1 - e^-((T2 - 34.49) / 900)) = 400:
  // T2 = 563.49 < 743.94, so the OS cache holds cold pages only, 400 of
  // 900: the cold pages hit either cache with 1 - e^-(529.01 / 900) =
  // 0.44444 and the hot ones with shared_buffers' 0.90758. One LRU cache of
  // 700 pages would give the cold ones more (the OS cache is partly
  // shared_buffers' duplicates), one of 400 less.
  auto h = two_level_hit_ratios({{"hot", 100, 1}, {"cold", 900, 1}}, {300, 400});
  CHECK(h.shared_buffers[0] == Approx(0.90758).epsilon(1e-4));
  CHECK(h.either[0] == Approx(0.90758).epsilon(1e-4));
  CHECK(h.either[1] == Approx(0.44444).epsilon(1e-4));
  CHECK(h.either[1] < lru_hit_ratios({{"hot", 100, 1}, {"cold", 900, 1}}, 700)[1]);
  CHECK(h.either[1] > lru_hit_ratios({{"hot", 100, 1}, {"cold", 900, 1}}, 400)[1]);
}

TEST_CASE("synth: a small memory limit still caches: shared_buffers and the OS cache within it", "[synth]") {
  // Scale 20 (300 MiB of accounts heap and key) in 256 MiB, shared_buffers
  // 64 MiB, 8 clients: shared_buffers misses 1.24 of the ~2 references
  // per transaction, the OS cache (144 MiB) takes a share of them. A model
  // that set aside 512 MiB for the server would cache nothing and read
  // every leaf and heap page from the device.
  SynthOptions o;
  o.scale = 20;
  o.clients = 8;
  o.memory_bytes = 256.0 * (1 << 20);
  o.vcpus = 2;
  auto r = synth_pgbench(o, default_calibration(PgbenchMode::SelectOnly));
  CHECK(r.cache.shared_buffers_pages == 8192);  // a quarter of the memory
  CHECK(r.os_reads_per_tx == Approx(1.238).epsilon(0.01));
  CHECK(r.reads_per_tx > 0.5);
  CHECK(r.reads_per_tx < 0.8);
  CHECK(r.profile.shared_buffers_bytes == 64.0 * (1 << 20));
  o.shared_buffers_bytes = 32.0 * (1 << 20);
  auto less = synth_pgbench(o, default_calibration(PgbenchMode::SelectOnly));
  CHECK(less.os_reads_per_tx > r.os_reads_per_tx);
  CHECK(less.profile.shared_buffers_bytes == 32.0 * (1 << 20));
}

TEST_CASE("synth: reads and writes per transaction at the seed scales", "[synth]") {
  SynthOptions o;
  o.scale = 136;
  o.clients = 32;
  o.memory_bytes = 8.0 * (1 << 30);
  o.vcpus = 2;
  auto small = synth_pgbench(o, default_calibration(PgbenchMode::SelectOnly));
  CHECK(small.reads_per_tx == 0);  // 2 GB of pages in a 6 GiB OS cache
  CHECK(small.profile.reads_per_tx == 0);
  CHECK(small.profile.vcpus == 2);
  CHECK(small.profile.clients == 32);

  o.scale = 34247;
  o.clients = 256;
  o.memory_bytes = 64.0 * (1 << 30);
  o.vcpus = 16;
  o.mode = PgbenchMode::TpcbLike;
  auto big = synth_pgbench(o, default_calibration(PgbenchMode::TpcbLike));
  // Inner levels cached, leaves and heap mostly not: between 1 and 2 reads.
  CHECK(big.hit[0] == Approx(1));
  CHECK(big.reads_per_tx > 1.4);
  CHECK(big.reads_per_tx < 1.7);
  // 1.5 M transactions per checkpoint over 56 M heap and 9.3 M leaf pages:
  // nearly every dirtied page is a distinct one, written once; plus 1/61.
  CHECK(big.dirty_writes_per_tx == Approx(2 + 1.0 / 61).epsilon(0.05));
  CHECK(big.wal_bytes_per_tx > 15000);
  CHECK(big.profile.flushes_per_tx == 1);
  CHECK(big.profile.sync_writes_per_tx == 1);
}

TEST_CASE("synth: project calibrates the synthetic profile's other time to the calibration's", "[synth]") {
  SynthOptions o;
  o.scale = 1000;
  o.clients = 16;
  o.memory_bytes = 4.0 * (1 << 30);
  o.vcpus = 4;
  for (auto mode : {PgbenchMode::SelectOnly, PgbenchMode::TpcbLike}) {
    o.mode = mode;
    auto cal = default_calibration(mode);
    auto r = synth_pgbench(o, cal);
    REQUIRE(r.reads_per_tx > 0);
    Projection p = project(r.profile, {Catalog::builtin().get("ebs-gp3")}, ProjectOptions{});
    CHECK(p.other_s == Approx(cal.other_s).epsilon(1e-4));
    CHECK(p.cpu_s_per_tx == Approx(cal.cpu_s_per_tx));
    CHECK(p.reads_per_tx == Approx(r.reads_per_tx));
    CHECK(p.vcpus == 4);
    CHECK(p.clients_hi == 16);
  }
}

TEST_CASE("synth: a profile's JSON read back projects as the profile itself", "[synth]") {
  SynthOptions o;
  o.scale = 500;
  o.clients = 8;
  o.memory_bytes = 2.0 * (1 << 30);
  o.vcpus = 2;
  o.mode = PgbenchMode::TpcbLike;
  auto r = synth_pgbench(o, default_calibration(o.mode));
  Profile back = profile_from_json(profile_json(r.profile), "p.json");
  CHECK(back.reads_per_tx == Approx(r.profile.reads_per_tx));
  CHECK(back.background_writes_per_s == Approx(r.profile.background_writes_per_s));
  CHECK(back.latency.mean_s == Approx(r.profile.latency.mean_s));
  CHECK(back.has_cpu);
  CHECK(back.templates.size() == 1);
  const auto tier = Catalog::builtin().get("ebs-gp3");
  ProjectOptions po;
  po.vcpus = 2;
  auto a = project(r.profile, {tier}, po);
  auto b = project(back, {tier}, po);
  CHECK(b.tiers[0].tps == Approx(a.tiers[0].tps).epsilon(1e-6));
  CHECK_THROWS_WITH(profile_from_json("{}", "x.json"), Catch::Contains("x.json: not a profile"));
  CHECK_THROWS_WITH(profile_from_json("{", "x.json"), Catch::Contains("x.json: not JSON"));
}

TEST_CASE("synth: pgbench scripts give the lookup key's distribution", "[synth]") {
  const std::string ro = "\\set aid random_gaussian(1, :range, 10.0)\n"
                         "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n";
  auto a = parse_pgbench_script(ro, {{"scale", 100}, {"range", 1000000}}, "ro.sql");
  CHECK(a.aid.dist == KeyDist::Gaussian);
  CHECK(a.aid.lo == 1);
  CHECK(a.aid.hi == 1000000);
  CHECK(a.aid.param == 10);
  CHECK_FALSE(a.updates_accounts);
  const std::string rw = "\\set n 10 * (:scale + 1) - 5 -- comment\n"
                         "\\set aid random(1, :n)\n\\set delta random(-5000, 5000)\nBEGIN;\n"
                         "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\nEND;\n";
  auto b = parse_pgbench_script(rw, {{"scale", 100}}, "rw.sql");
  CHECK(b.aid.dist == KeyDist::Uniform);
  CHECK(b.aid.hi == 1005);  // 10 * 101 - 5
  CHECK(b.updates_accounts);
  CHECK_THROWS_WITH(parse_pgbench_script(ro, {{"scale", 100}}, "ro.sql"),
                    Catch::Contains("ro.sql:1") && Catch::Contains("-D range="));
  CHECK_THROWS_WITH(parse_pgbench_script("SELECT 1;\n", {}, "x.sql"), Catch::Contains("x.sql: no statement"));
  CHECK_THROWS_WITH(parse_pgbench_script("\\set aid random(1)\nSELECT * FROM pgbench_accounts WHERE aid = :aid;\n",
                                         {}, "y.sql"),
                    Catch::Contains("y.sql:1: random takes 2 arguments"));
}

TEST_CASE("synth: a gaussian key spreads its references as the normal law cut at param deviations", "[synth]") {
  SynthOptions o;
  o.scale = 100;
  o.clients = 4;
  o.memory_bytes = 1.0 * (1 << 30);
  o.vcpus = 2;
  o.aid = {KeyDist::Gaussian, 1, 0, 2.0};  // deviation a quarter of the range, cut at +-2
  auto r = synth_pgbench(o, default_calibration(o.mode));
  // Slices come as (leaves, heap) pairs after the inner levels; the middle
  // half of the keys (+-1 deviation) holds (Phi(1) - Phi(-1)) /
  // (Phi(2) - Phi(-2)) = 0.68269 / 0.95450 = 0.71524 of the references.
  double all = 0, middle = 0;
  int slice = 0;
  for (size_t i = 0; i < r.classes.size(); ++i) {
    if (r.classes[i].name.rfind("pkey leaves", 0) != 0) continue;
    all += r.classes[i].refs_per_tx;
    if (slice >= 250 && slice < 750) middle += r.classes[i].refs_per_tx;
    ++slice;
  }
  CHECK(slice == 1000);
  CHECK(all == Approx(1).epsilon(1e-9));
  CHECK(middle == Approx(0.71524).epsilon(1e-4));
  // The same memory misses less than with uniform keys over the same rows,
  // and less the narrower the distribution.
  o.memory_bytes = 1.0 * (1 << 30) + 100 * 1640 * 8192 / 3.0;  // a third of the heap beyond the reserve
  auto g = synth_pgbench(o, default_calibration(o.mode));
  o.aid.param = 10;
  auto g10 = synth_pgbench(o, default_calibration(o.mode));
  o.aid = {};
  auto u = synth_pgbench(o, default_calibration(o.mode));
  CHECK(u.reads_per_tx > 0.3);
  CHECK(g.reads_per_tx < u.reads_per_tx);
  CHECK(g10.reads_per_tx < g.reads_per_tx / 2);
}

TEST_CASE("synth: a capture calibrates CPU, round trips and think time", "[synth]") {
  Profile p;
  p.source = "small.tlt";
  p.transactions = 10000;
  p.duration_s = 10;
  p.tps = 1000;
  p.clients = 4;
  p.mean_clients = 4;
  p.think_time_s = 0.001;
  p.has_cpu = true;
  p.cpu_s_per_tx = 0.0005;
  p.vcpus = 2;
  p.latency = {10000, 0.0012, 0.001, 0.003};
  auto c = calibration_from(p);
  CHECK(c.source == "small.tlt");
  CHECK(c.cpu_s_per_tx == Approx(0.0005));
  CHECK(c.think_time_s == Approx(0.001));
  // "Other" is what project calibrates on the capture: here latency less
  // the CPU's time at 4 clients on 2 vCPUs.
  Projection pr = project(p, {Catalog::builtin().get("nvme-local")}, ProjectOptions{});
  CHECK(c.other_s == Approx(pr.other_s));
  CHECK(c.other_s > 0);
  CHECK(c.other_s < 0.0012 - 0.0005 + 1e-9);
  p.has_cpu = false;
  CHECK_THROWS_WITH(calibration_from(p), Catch::Contains("small.tlt: no CPU samples"));
}
