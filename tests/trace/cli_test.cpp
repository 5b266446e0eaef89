// tierlab trace info|dump|export, run as the real binary.
#include "support/support.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

using namespace tierlab;
using namespace tierlab::trace;
using tierlab::test::run_tierlab;

namespace {

// A closed trace of every record kind (COPY data without line breaks, so
// that every output format has one line per record).
std::string write_every_kind(const std::string& path, bool close = true) {
  testutil::Corpus c;
  testutil::fill_every_kind(c, 0);
  auto w = open_writer(path);
  for (const auto& r : c.records) w->write(r);
  if (close) {
    w->close();
  } else {
    w->flush();
    // Leave it unterminated, as a killed writer does: copy the bytes now.
    auto bytes = testutil::read_file(path);
    testutil::write_file(path + ".unterminated", bytes);
  }
  return path;
}

size_t records_in(const std::string& path) {
  auto r = open_reader(path);
  Record rec;
  size_t n = 0;
  while (r->next(rec)) ++n;
  return n;
}

void require_one_line_error(const test::RunResult& r, const std::string& contains) {
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.rfind("tierlab: ", 0) == 0);
  CHECK(r.err.find(contains) != std::string::npos);
  CHECK(r.out.empty());
}

}  // namespace

TEST_CASE("trace info on a bad file prints one line and exits 2", "[trace][cli]") {
  test::TempDir dir;
  std::string good = write_every_kind(dir.file("good.tlt"));
  auto bytes = testutil::read_file(good);

  testutil::write_file(dir.file("short.tlt"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + 9));
  require_one_line_error(run_tierlab({"trace", "info", dir.file("short.tlt")}),
                         dir.file("short.tlt") + ": truncated header (9 of 36 bytes)");

  std::string csv = "2026-01-01 00:00:00 UTC,\"postgres\"\n";
  testutil::write_file(dir.file("log.csv"), std::vector<uint8_t>(csv.begin(), csv.end()));
  require_one_line_error(run_tierlab({"trace", "info", dir.file("log.csv")}), "not a tierlab trace");

  testutil::write_file(dir.file("empty.tlt"), {});
  require_one_line_error(run_tierlab({"trace", "info", "--json", dir.file("empty.tlt")}),
                         "not a tierlab trace (empty file)");

  require_one_line_error(run_tierlab({"trace", "info", dir.file("missing.tlt")}), "missing.tlt");

  // A flipped byte in the middle: the chunk and its offset are named.
  auto bad = bytes;
  bad[36 + 40 + 5] ^= 0x40;
  testutil::write_file(dir.file("flipped.tlt"), bad);
  require_one_line_error(run_tierlab({"trace", "info", dir.file("flipped.tlt")}),
                         dir.file("flipped.tlt") + ": chunk 0 at byte 36: CRC mismatch");

  require_one_line_error(run_tierlab({"trace", "info"}), "FILE");
  require_one_line_error(run_tierlab({"trace", "export", good, "--format", "xml"}), "xml");
}

TEST_CASE("trace info --json has the counts and bytes per kind", "[trace][cli]") {
  test::TempDir dir;
  std::string path = write_every_kind(dir.file("t.tlt"));
  auto r = run_tierlab({"trace", "info", path, "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"sessions", "statements", "transactions", "errors", "block_ios", "file_ios", "samples",
                        "lost", "records", "duration_ns", "recovered_tail_bytes", "terminated", "bytes", "kinds"})
    CHECK(j.contains(k));
  CHECK(j["sessions"] == 2);
  CHECK(j["statements"] == 4);
  CHECK(j["errors"] == 2);
  CHECK(j["block_ios"] == 10);
  CHECK(j["file_ios"] == 3);
  CHECK(j["samples"] == 6);
  CHECK(j["lost"] == 17);
  CHECK(j["records"] == records_in(path));
  CHECK(j["terminated"] == true);
  CHECK(j["recovered_tail_bytes"] == 0);
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(j["bytes"] == static_cast<uint64_t>(st.st_size));
  CHECK(j["kinds"].size() == static_cast<size_t>(Kind::Count_));
  CHECK(j["kinds"]["bind"]["records"] == 2);
  CHECK(j["kinds"]["bind"]["bytes"].get<uint64_t>() > 0);

  auto t = run_tierlab({"trace", "info", path});
  REQUIRE(t.status == 0);
  CHECK(t.out.find("sessions:") != std::string::npos);
  CHECK(t.out.find("terminated:            yes") != std::string::npos);
  CHECK(t.out.find("block_io") != std::string::npos);
}

TEST_CASE("trace info reports a recovered tail and an unterminated trace", "[trace][cli]") {
  test::TempDir dir;
  write_every_kind(dir.file("t.tlt"), /*close=*/false);
  std::string path = dir.file("t.tlt.unterminated");
  auto bytes = testutil::read_file(path);
  // Half a chunk more, as a writer killed mid-write leaves.
  bytes.insert(bytes.end(), bytes.begin() + 36, bytes.begin() + 36 + 60);
  testutil::write_file(path, bytes);
  auto r = run_tierlab({"trace", "info", path, "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["recovered_tail_bytes"] == 60);
  CHECK(j["terminated"] == false);
  auto t = run_tierlab({"trace", "info", path});
  CHECK(t.out.find("recovered tail:        60 bytes") != std::string::npos);
  CHECK(t.out.find("terminated:            no") != std::string::npos);
}

TEST_CASE("trace dump prints one line per record", "[trace][cli]") {
  test::TempDir dir;
  std::string path = write_every_kind(dir.file("t.tlt"));
  auto r = run_tierlab({"trace", "dump", path});
  REQUIRE(r.status == 0);
  CHECK(test::count_lines(r.out) == records_in(path));
  CHECK(r.out.find(" s=1 bind portal=\"portal\" stmt=\"P0_1\" params=[text:'42', NULL, binary:x'0001ff807a7a'") !=
        std::string::npos);
  CHECK(r.out.find("block_io read dev=8:16 offset=68719476736 len=8192 latency_us=249.9 pid=4242 flags=sync") !=
        std::string::npos);
}

TEST_CASE("trace export writes every record as jsonl or csv", "[trace][cli]") {
  test::TempDir dir;
  std::string path = write_every_kind(dir.file("t.tlt"));
  const size_t n = records_in(path);

  auto r = run_tierlab({"trace", "export", path, "--format", "jsonl"});
  REQUIRE(r.status == 0);
  std::istringstream in(r.out);
  std::string line;
  size_t lines = 0;
  std::set<std::string> kinds;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    CHECK(j.contains("ts_ns"));
    CHECK(j.contains("session"));
    kinds.insert(j["kind"].get<std::string>());
    if (j["kind"] == "bind" && j["statement"] == "P0_1") {
      CHECK(j["params"][0]["value"] == "42");
      CHECK(j["params"][1]["value"].is_null());
      CHECK(j["params"][2]["value_hex"] == "0001ff807a7a");
    }
    ++lines;
  }
  CHECK(lines == n);
  CHECK(kinds.size() == static_cast<size_t>(Kind::Count_));

  std::string out = dir.file("out.csv");
  auto c = run_tierlab({"trace", "export", path, "--format", "csv", "--out", out});
  REQUIRE(c.status == 0);
  CHECK(c.out.empty());
  auto csv = testutil::read_file(out);
  std::string text(csv.begin(), csv.end());
  CHECK(text.rfind("ts_ns,session,kind,name,detail,extra,text,n1,n2,n3,n4\n", 0) == 0);
  CHECK(test::count_lines(text) == n + 1 + 2);  // header; the COPY row "1\tone\n2\ttwo\n" spans 3 lines
  CHECK(text.find(",0,block_io,8:16,read,sync,,68719476736,8192,249900,4242\n") != std::string::npos);
  struct stat st;
  REQUIRE(::stat(out.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto help = run_tierlab({"trace", "export", "--help"});
  CHECK(help.out.find("csv columns: ts_ns,session,kind") != std::string::npos);
}

TEST_CASE("trace info, dump and export report a full stdout in one line, exit 1", "[trace][cli]") {
  test::TempDir dir;
  const std::string path = write_every_kind(dir.file("t.tlt"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info"}, {"info", "--json"}, {"dump"}, {"export", "--format", "jsonl"}}) {
    std::string cmd = std::string(TIERLAB_BINARY) + " trace";
    for (const auto& a : args) cmd += " " + a;
    cmd += " " + path + " >/dev/full 2>" + dir.file("err") + "; echo $?";
    INFO(cmd);
    std::string status = test::shell_output(cmd);
    std::ifstream f(dir.file("err"));
    std::stringstream err;
    err << f.rdbuf();
    CHECK(status == "1");
    CHECK(err.str() == "tierlab: stdout: write: No space left on device\n");
  }
}
