// The HTML report on a hand-built projection: charts scaled to the data,
// coinciding curves kept apart, a latency chart beside the throughput one,
// a table that does not wrap, the notes.
#include "models/project.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

using namespace tierlab::models;

namespace {

// Two tiers with the same curve, 1..32 clients, up to 5,500 tps.
Projection two_alike() {
  Projection p;
  p.source = "synthetic.tlt";
  p.clients_lo = 1;
  p.clients_hi = 32;
  p.vcpus = p.capture_vcpus = 2;
  for (const char* name : {"ebs-gp3", "ebs-gp2-100g"}) {
    TierProjection t;
    t.tier = name;
    t.clients = 32;
    for (int n = 1; n <= 32; ++n) t.curve.push_back({n, 5500.0 * n / 32, 0.0005 + 0.0001 * n});
    t.tps = 5500;
    t.latency_s = 0.0037;
    t.busiest = "cpu";
    t.busiest_utilisation = 0.36;
    t.split = {0.001, 0.002, 0.0007, 0.001};
    p.tiers.push_back(t);
  }
  p.windows = 4;
  p.window_s = 3;
  p.tiers[0].tps_range = {5000, 6000};
  p.notes = {"unsteady capture: WAL flush latency 0.150-0.780 ms over 4 windows"};
  return p;
}

size_t count_in_html(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("html: charts fit the data, coinciding curves differ, latency beside throughput, notes",
          "[project][html]") {
  Profile profile;
  profile.transactions = 12000;
  const std::string h = projection_html(two_alike(), profile);
  // Throughput and latency, each against clients.
  CHECK(h.find("aria-label=\"TPS against clients per tier\"") != std::string::npos);
  CHECK(h.find("aria-label=\"Mean latency against clients per tier\"") != std::string::npos);
  // The y axis ends at 6000 for 5,500 tps, not 10,000; the x axis at the
  // last client count (32), not 50.
  CHECK(h.find(">6000</text>") != std::string::npos);
  CHECK(h.find(">10000</text>") == std::string::npos);
  CHECK(h.find(">50</text>") == std::string::npos);
  CHECK(h.find(">40</text>") == std::string::npos);
  // The two curves coincide: the second is dashed and has its own markers.
  CHECK(count_in_html(h, "<polyline") == 4);
  CHECK(count_in_html(h, "stroke-dasharray=\"8 4\"") >= 2);  // both charts (and the legend)
  CHECK(h.find("<rect x=") != std::string::npos);
  // The table does not wrap; the windows' range, the busiest resource, the
  // bottleneck and the time split are in it.
  CHECK(h.find("white-space:nowrap") != std::string::npos);
  CHECK(h.find("5000.0\u20136000.0") != std::string::npos);
  CHECK(h.find("<td>cpu 36%</td><td>none</td>") != std::string::npos);
  CHECK(h.find("storage wait 54%, cpu 27%, other 19%") != std::string::npos);
  CHECK(h.find("<h3>Notes</h3>") != std::string::npos);
  CHECK(h.find("unsteady capture: WAL flush latency") != std::string::npos);
}

TEST_CASE("html: loads give TPS and p99 against load, the headroom lines and the load table", "[project][html]") {
  Profile profile;
  profile.source = "captured.tlt";
  profile.transactions = 12000;
  Projection p = two_alike();
  p.captured_tps = 5000;
  p.load_by = "think";
  p.tiers[0].headroom = 1.7;
  p.tiers[0].headroom_by = "IOPS cap";
  p.tiers[1].headroom = 4.9;
  p.tiers[1].headroom_by = "cpu";
  for (double load : {1.0, 2.0, 3.0}) {
    LoadPoint lp;
    lp.load = load;
    lp.clients = 32;
    for (int i = 0; i < 2; ++i) {
      LoadTier t;
      t.tps = 5500 * std::min(load, 1.7 + 3.2 * i);
      t.p99_s = 0.004 * load;
      if (load > 1.7 && i == 0) t.bottleneck = "IOPS cap", t.bottleneck_utilisation = 1;
      lp.tiers.push_back(t);
    }
    p.loads.push_back(lp);
  }
  const std::string h = projection_html(p, profile);
  CHECK(count_in_html(h, "aria-label=\"TPS against load per tier\"") == 1);
  CHECK(count_in_html(h, "aria-label=\"p99 latency against load per tier\"") == 1);
  CHECK(count_in_html(h, "<polyline") == 8);  // two tiers in each of four charts
  CHECK(h.find("<li>ebs-gp3: saturates at 1.7x today's load (IOPS cap)") != std::string::npos);
  CHECK(h.find("<li>ebs-gp2-100g: saturates at 4.9x today's load (cpu)") != std::string::npos);
  CHECK(h.find("<td>IOPS cap 100%</td>") != std::string::npos);
  CHECK(h.find(">3x</text>") != std::string::npos);  // the load axis
  // Against the capture: 5,500 projected tps / 5,000 measured.
  CHECK(h.find("<td>1.10x</td>") != std::string::npos);
  // Without loads or headroom, no capacity section.
  CHECK(projection_html(two_alike(), profile).find("Capacity: load and headroom") == std::string::npos);
}
