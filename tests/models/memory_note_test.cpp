// What project says when --memory asks for less than the capture had and
// the trace has only block-level references: the note names what exists.
#include "models/project.h"

#include "common/error.h"

#include <catch2/catch.hpp>

using namespace tierlab;
using namespace tierlab::models;

TEST_CASE("project: less memory with a block-level curve names no command that does not exist",
          "[project][memory]") {
  Profile p;
  p.source = "synthetic";
  p.transactions = 1000;
  p.duration_s = 10;
  p.tps = 100;
  p.clients = 1;
  p.mean_clients = 1;
  p.has_block_io = true;
  p.reads_per_tx = 2;
  p.native_read = {2000, 0.0002, 0.0002, 0.0004};
  p.latency = {1000, 0.01, 0.01, 0.02};
  p.memory_bytes = 1024.0 * 1024 * 1024;
  p.mrc.source = "block_io";
  p.mrc.points = {{0, 1.0}, {1024.0 * 1024 * 1024, 0.5}};
  Tier t;
  t.name = "x";
  t.read = {LatencyDist::Fixed, 200000, 0};
  t.write = t.read;
  t.flush = t.read;
  ProjectOptions o;
  o.memory_bytes = 512.0 * 1024 * 1024;
  auto pr = project(p, {t}, o);
  CHECK(pr.read_factor == 1.0);
  std::string note;
  for (const auto& n : pr.notes)
    if (n.find("less memory than at capture") != std::string::npos) note = n;
  REQUIRE_FALSE(note.empty());
  // No capture records file I/O: the note must not send the user to do so.
  CHECK(note.find("record file I/O") == std::string::npos);
  CHECK(note.find("no tierlab capture records") != std::string::npos);

  // Without any curve, the error names the commands that record block I/O.
  p.mrc = {};
  try {
    project(p, {t}, o);
    FAIL("no curve: --memory cannot be projected");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("tierlab capture run --device") != std::string::npos);
  }
}
