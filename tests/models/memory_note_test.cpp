// What project says and does when --memory asks for less than the capture
// had: with only block-level references the note names the command that
// records file I/O; with file-level ones the reads the smaller cache misses
// are added.
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
  // capture run records the server's file reads: the note names it.
  CHECK(note.find("no tierlab capture records") == std::string::npos);
  CHECK(note.find("`tierlab capture run` as root") != std::string::npos);

  // Without any curve, the error names the commands that record block I/O.
  p.mrc = {};
  try {
    project(p, {t}, o);
    FAIL("no curve: --memory cannot be projected");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("`tierlab capture run` on the data's device") != std::string::npos);
    CHECK(std::string(e.what()).find("record the server's file I/O: `tierlab capture run` as root") !=
          std::string::npos);
  }
}

TEST_CASE("project: less memory with a file-level curve adds the reads the smaller cache misses",
          "[project][memory]") {
  // Everything the capture read was in the OS cache (no device reads), but
  // the file reads below shared_buffers say what a smaller cache misses.
  Profile p;
  p.source = "synthetic";
  p.transactions = 1000;
  p.duration_s = 10;
  p.tps = 100;
  p.clients = 1;
  p.mean_clients = 1;
  p.has_block_io = true;
  p.reads_per_tx = 0;
  p.native_read = {2000, 0.0002, 0.0002, 0.0004};
  p.latency = {1000, 0.01, 0.01, 0.02};
  const double mib = 1024.0 * 1024;
  p.memory_bytes = 1024 * mib;
  p.shared_buffers_bytes = 16 * mib;
  p.mrc.source = "file_io";
  p.mrc.references = 4000;  // 4 page references per transaction
  p.mrc.points = {{0, 1.0}, {64 * mib, 0.5}, {128 * mib, 0.1}, {2048 * mib, 0.1}};
  Tier t;
  t.name = "x";
  t.read = {LatencyDist::Fixed, 200000, 0};
  t.write = t.read;
  t.flush = t.read;
  ProjectOptions o;
  auto same = project(p, {t}, o);
  CHECK(same.reads_per_tx == 0);
  o.memory_bytes = 80 * mib;  // cache 64 MiB: miss ratio 0.5 instead of 0.1
  auto less = project(p, {t}, o);
  CHECK(less.reads_per_tx == Approx(4 * (0.5 - 0.1)));
  REQUIRE(less.tiers.size() == 1);
  CHECK(less.tiers[0].tps < same.tiers[0].tps);
  bool noted = false;
  for (const auto& n : less.notes) noted = noted || n.find("more device reads per transaction") != std::string::npos;
  CHECK(noted);
}
