// fio iolog and blkparse importers, and the fio iolog v3 exporter.
#include "capture/import.h"

#include "common/error.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace tierlab;
namespace fs = std::filesystem;

namespace {

// Imports `text` with `fn` into an in-memory trace and returns its bytes.
template <class Fn>
std::vector<uint8_t> import_text(const std::string& text, Fn fn, capture::ImportStats* st = nullptr) {
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  std::istringstream in(text);
  auto s = fn(in, "sample.log", w);
  if (st) *st = s;
  w.close();
  return mem->bytes();
}

std::string export_v3(const std::vector<uint8_t>& bytes, const capture::FioExportOptions& o = {}) {
  trace::Reader r(trace::memory_source(bytes));
  std::ostringstream out;
  capture::write_fio_iolog_v3(r, out, o);
  return out.str();
}

std::vector<trace::BlockIo> block_ios(const std::vector<uint8_t>& bytes, std::vector<trace::Nanos>* ts = nullptr) {
  trace::Reader r(trace::memory_source(bytes));
  trace::Record rec;
  std::vector<trace::BlockIo> out;
  while (r.next(rec))
    if (auto* b = std::get_if<trace::BlockIo>(&rec.body)) {
      out.push_back(*b);
      if (ts) ts->push_back(rec.ts);
    }
  return out;
}

std::string error_of(const std::string& text, bool blkparse) {
  try {
    if (blkparse) import_text(text, capture::import_blkparse);
    else import_text(text, capture::import_fio_iolog);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("fio iolog v3 -> trace -> fio iolog v3 is byte-identical", "[import]") {
  const std::string log =
      "fio version 3 iolog\n"
      "31 /tmp/data add\n"
      "231 /tmp/data open\n"
      "237 /tmp/data read 61440 4096\n"
      "466 /tmp/data write 774144 8192\n"
      "630 /tmp/data sync 0 0\n"
      "631 /tmp/data datasync 0 0\n"
      "700 /tmp/other add\n"
      "701 /tmp/other open\n"
      "762 /tmp/other trim 491520 4096\n"
      "785 /tmp/data read 417792 4096\n"
      "5000000123 /tmp/other read 0 512\n"
      "5000000200 /tmp/other close\n"
      "5000000942 /tmp/data close\n";
  capture::ImportStats st;
  auto bytes = import_text(log, capture::import_fio_iolog, &st);
  CHECK(st.version == 3);
  CHECK(st.ios == 7);
  CHECK(st.file_actions == 6);
  CHECK(export_v3(bytes) == log);

  std::vector<trace::Nanos> ts;
  auto ios = block_ios(bytes, &ts);
  REQUIRE(ios.size() == 7);
  CHECK(ts[0] == 237'000);
  CHECK(ios[0].op == trace::IoOp::Read);
  CHECK(ios[0].offset == 61440);
  CHECK(ios[1].op == trace::IoOp::Write);
  CHECK(ios[1].length == 8192);
  CHECK(ios[2].op == trace::IoOp::Flush);
  CHECK(ios[4].op == trace::IoOp::Discard);
  CHECK(ios[4].device == 1);  // second file
}

TEST_CASE("an iolog written by fio itself round-trips", "[import]") {
  if (std::system("fio --version >/dev/null 2>&1") != 0) {
    std::printf("skipped: fio is not installed\n");
    std::exit(77);
  }
  char tmpl[] = "/tmp/tierlab-iolog-XXXXXX";
  fs::path dir = ::mkdtemp(tmpl);
  std::string cmd = "cd " + dir.string() + " && fio --name=iolog --filename=" + (dir / "data").string() +
                    " --size=1M --rw=randrw --bs=4k --ioengine=psync --fsync=7 --number_ios=200"
                    " --write_iolog=" + (dir / "log").string() + " >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream f(dir / "log");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string log = ss.str();
  REQUIRE(log.rfind("fio version 3 iolog\n", 0) == 0);
  capture::ImportStats st;
  auto bytes = import_text(log, capture::import_fio_iolog, &st);
  CHECK(st.ios >= 200);
  CHECK(export_v3(bytes) == log);
  fs::remove_all(dir);
}

TEST_CASE("fio iolog v2 import: file actions, ops and wait lines", "[import]") {
  const std::string log =
      "fio version 2 iolog\n"
      "/dev/sdb add\n"
      "/dev/sdb open\n"
      "/dev/sdb read 0 4096\n"
      "/dev/sdb wait 15 0\n"
      "/dev/sdb write 8192 4096\n"
      "\n"
      "/dev/sdb close\n";
  capture::ImportStats st;
  auto bytes = import_text(log, capture::import_fio_iolog, &st);
  CHECK(st.version == 2);
  CHECK(st.ios == 2);
  std::vector<trace::Nanos> ts;
  auto ios = block_ios(bytes, &ts);
  REQUIRE(ios.size() == 2);
  CHECK(ts[0] == 0);
  CHECK(ts[1] == 15'000'000);  // wait: milliseconds since the start, as fio replays it
  CHECK(ios[1].op == trace::IoOp::Write);
  CHECK(ios[1].offset == 8192);
  // Exported as version 3 with the same file and times in microseconds.
  std::string v3 = export_v3(bytes);
  CHECK(v3 ==
        "fio version 3 iolog\n"
        "0 /dev/sdb add\n"
        "0 /dev/sdb open\n"
        "0 /dev/sdb read 0 4096\n"
        "15000 /dev/sdb write 8192 4096\n"
        "15000 /dev/sdb close\n");
}

TEST_CASE("blkparse text import pairs issues and completions", "[import]") {
  const std::string text =
      "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n"
      "  8,0    3        2     0.000001234   697  G   W 223490 + 8 [kjournald]\n"
      "  8,0    3        3     0.000002000   697  P   N [kjournald]\n"
      "  8,0    3        4     0.000009507   120  D   W 223490 + 8 [kworker/3:1H]\n"
      "  8,0    1        1     0.000100000  4162  Q   R 1000 + 16 [postgres]\n"
      "  8,0    1        2     0.000101000  4162  D   R 1000 + 16 [postgres]\n"
      "  8,0    0        1     0.000300213     0  C   W 223490 + 8 [0]\n"
      "  8,0    0        2     0.000400000     0  C   R 1000 + 16 [0]\n"
      "  8,0    2        1     0.000500000   700  D  FN [jbd2/sda1-8]\n"
      "  8,0    2        2     0.000900000     0  C  FN 0 [0]\n"
      "  8,0    2        3     0.001000000   701  D  WFS 5000 + 8 [postgres]\n"
      "  8,0    3        5     0.002000000     0  m   N cfq697 slice expired\n"
      "\n"
      "CPU0 (8,0):\n"
      " Reads Queued:           1,        8KiB\t Writes Queued:           1,        4KiB\n";
  capture::ImportStats st;
  std::vector<trace::Nanos> ts;
  auto ios = block_ios(import_text(text, capture::import_blkparse, &st), &ts);
  CHECK(st.ios == 4);
  CHECK(st.incomplete == 1);
  REQUIRE(ios.size() == 4);
  // In issue order.
  CHECK(ts[0] == 9'507);
  CHECK(ios[0].op == trace::IoOp::Write);
  CHECK(ios[0].offset == 223490ull * 512);
  CHECK(ios[0].length == 4096);
  CHECK(ios[0].complete_ns == 300'213);
  CHECK(ios[0].pid == 697);  // the queueing process, not the kworker
  CHECK(ios[0].device == ((8u << 20) | 0));
  CHECK(ios[1].op == trace::IoOp::Read);
  CHECK(ios[1].length == 8192);
  CHECK(ios[1].complete_ns - ts[1] == 299'000);
  CHECK(ios[2].op == trace::IoOp::Flush);
  CHECK(ios[2].complete_ns == 900'000);
  CHECK(ios[3].op == trace::IoOp::Write);
  CHECK((ios[3].flags & trace::kIoFua) != 0);
  CHECK((ios[3].flags & trace::kIoSync) != 0);
  CHECK((ios[3].flags & trace::kIoIncomplete) != 0);
}

TEST_CASE("malformed input names file and line", "[import]") {
  CHECK(error_of("fio version 3 iolog\n12 /f read 0 4096\nabc /f read 0 4096\n", false) ==
        "sample.log:3: timestamp 'abc' is not a number");
  CHECK(error_of("fio version 3 iolog\n12 /f read 0\n", false) ==
        "sample.log:2: expected \"TIME FILE ACTION [OFFSET LENGTH]\"");
  CHECK(error_of("fio version 3 iolog\n12 /f fly 0 1\n", false).rfind("sample.log:2: unknown I/O action 'fly'", 0) == 0);
  CHECK(error_of("fio version 3 iolog\n12 /f wait 0 1\n", false) ==
        "sample.log:2: 'wait' is not allowed in a version 3 iolog");
  CHECK(error_of("fio version 2 iolog\n/f read x 4096\n", false) == "sample.log:2: offset 'x' is not a number");
  CHECK(error_of("rw, offset, length\n", false).rfind("sample.log:1: not a fio iolog", 0) == 0);
  CHECK(error_of("  8,0    3        1     0.000000000   697  D   W 2234x + 8 [k]\n", true) ==
        "sample.log:1: bad sector '2234x'");
  CHECK(error_of("  8,0    3        1     0.000000000   697  D   W 1 + 8 [k]\nhello there\n", true)
            .rfind("sample.log:2: expected", 0) == 0);
  CHECK(error_of("  8,0    3        1     zero   697  D   W 1 + 8 [k]\n", true) == "sample.log:1: bad time 'zero'");
  CHECK(error_of("  8,0    3        1     0.1   697  D   Q 1 + 8 [k]\n", true) == "sample.log:1: bad RWBS 'Q'");
}

TEST_CASE("times past 2^63 nanoseconds are refused, not wrapped", "[import]") {
  CHECK(error_of("fio version 3 iolog\n9223372036854776 /f read 0 4096\n", false) ==
        "sample.log:2: timestamp '9223372036854776' is too large (microseconds past 2^63 ns)");
  CHECK(error_of("fio version 2 iolog\n/f wait 9223372036855 0\n", false) ==
        "sample.log:2: wait '9223372036855' is too large (milliseconds past 2^63 ns)");
  CHECK(error_of("  8,0    3        1  49185367445937  697  D   W 1 + 8 [k]\n", true) ==
        "sample.log:1: bad time '49185367445937'");
}

TEST_CASE("captured block I/O exports as a fio iolog v3", "[import]") {
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  {
    w.write(1'000'000'000, 0, trace::BlockIo{1'000'200'000, (7u << 20) | 3, 4096, 4096, trace::IoOp::Write, 0, 42});
    w.write(1'000'000'500, 0, trace::BlockIo{1'000'100'000, (7u << 20) | 3, 0, 8192, trace::IoOp::Read, 0, 42});
    // Written in completion order, exported in issue order.
    w.write(999'999'000, 0, trace::BlockIo{1'000'300'000, (7u << 20) | 3, 12288, 512, trace::IoOp::Read, 0, 42});
    w.close();
  }
  capture::FioExportOptions o;
  o.filename = "/tmp/replay-target";
  CHECK(export_v3(mem->bytes(), o) ==
        "fio version 3 iolog\n"
        "0 /tmp/replay-target add\n"
        "0 /tmp/replay-target open\n"
        "0 /tmp/replay-target read 12288 512\n"
        "1 /tmp/replay-target write 4096 4096\n"
        "1 /tmp/replay-target read 0 8192\n"
        "1 /tmp/replay-target close\n");
}

TEST_CASE("fio iolog export for fio 3.33: trims left out and counted, a comment on the version line", "[import]") {
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::Writer w(std::move(sink));
  {
    const uint32_t dev = (7u << 20) | 3;
    w.write(1'000'000'000, 0, trace::BlockIo{1'000'100'000, dev, 4096, 4096, trace::IoOp::Write, 0, 42});
    w.write(1'000'010'000, 0, trace::BlockIo{1'000'110'000, dev, 1 << 20, 8192, trace::IoOp::Discard, 0, 42});
    // A device flush: the request's sector and size mean nothing to fio.
    w.write(1'000'020'000, 0, trace::BlockIo{1'000'120'000, dev, 77, 0, trace::IoOp::Flush, trace::kIoMeta, 42});
    w.write(1'000'030'000, 0, trace::BlockIo{1'000'130'000, dev, 0, 0, trace::IoOp::Flush, 0, 42});
    w.write(1'000'040'000, 0, trace::BlockIo{1'000'140'000, dev, 65536, 512, trace::IoOp::Read, 0, 42});
    w.close();
  }
  capture::FioExportOptions o;
  o.filename = "scratch.img";
  o.trims = false;
  o.comment = "exported";
  trace::Reader r(trace::memory_source(mem->bytes()));
  std::ostringstream out;
  capture::FioExportStats st = capture::write_fio_iolog_v3(r, out, o);
  CHECK(out.str() ==
        "fio version 3 iolog  # exported\n"
        "0 scratch.img add\n"
        "0 scratch.img open\n"
        "0 scratch.img write 4096 4096\n"
        "20 scratch.img sync 0 0\n"
        "30 scratch.img datasync 0 0\n"
        "40 scratch.img read 65536 512\n"
        "40 scratch.img close\n");
  CHECK(st.ios == 4);
  CHECK(st.trims_dropped == 1);
  CHECK(st.syncs == 2);
  CHECK(st.end == 65536 + 512);  // the dropped trim does not count
  REQUIRE(st.sources.size() == 1);
  CHECK(st.sources[0].rfind("/dev/", 0) == 0);  // the device's node, named though not used

  // The comment does not stop the export from being imported again.
  capture::ImportStats ist;
  auto again = import_text(out.str(), capture::import_fio_iolog, &ist);
  CHECK(ist.version == 3);
  CHECK(ist.ios == 4);
  CHECK(error_of("fio version 3 iologx\n", false).rfind("sample.log:1: not a fio iolog", 0) == 0);

  // An imported iolog renamed or filtered is written out afresh, one file.
  const std::string two_files =
      "fio version 3 iolog\n"
      "1 /a add\n1 /b add\n2 /a open\n2 /b open\n"
      "10 /a read 0 4096\n20 /b trim 0 4096\n30 /b write 4096 4096\n"
      "40 /a close\n40 /b close\n";
  auto bytes = import_text(two_files, capture::import_fio_iolog);
  trace::Reader r2(trace::memory_source(bytes));
  std::ostringstream out2;
  st = capture::write_fio_iolog_v3(r2, out2, o);
  CHECK(out2.str() ==
        "fio version 3 iolog  # exported\n"
        "0 scratch.img add\n"
        "0 scratch.img open\n"
        "0 scratch.img read 0 4096\n"
        "20 scratch.img write 4096 4096\n"
        "20 scratch.img close\n");
  CHECK(st.sources == std::vector<std::string>{"/a", "/b"});
  CHECK(st.trims_dropped == 1);
}
