// Writer -> Reader round trips: every record kind and field survives, in
// memory and through a file, compressed or not, across chunk boundaries.
#include "trace/crc32c.h"
#include "trace/format.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <random>

using namespace tierlab::trace;
using namespace tierlab::trace::testutil;

namespace {

std::vector<uint8_t> write_memory(const std::vector<Record>& recs, WriterOptions opts,
                                  bool close = true) {
  auto sink = std::make_unique<MemorySink>();
  MemorySink* raw = sink.get();
  Writer w(std::move(sink), opts);
  for (const auto& r : recs) w.write(r);
  if (close)
    w.close();
  else
    w.flush();
  return raw->bytes();  // copied while the writer (owning the sink) lives
}

}  // namespace

TEST_CASE("crc32c matches known vectors in hardware and software", "[trace][crc]") {
  const std::string check = "123456789";
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  // RFC 3720 B.4 and the usual check value.
  CHECK(crc32c_sw(0, check.data(), check.size()) == 0xE3069283u);
  CHECK(crc32c_sw(0, zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c_sw(0, ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c_sw(0, inc.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c_sw(0, "", 0) == 0u);
  // Extending in pieces equals one pass.
  CHECK(crc32c_sw(crc32c_sw(0, check.data(), 4), check.data() + 4, 5) == 0xE3069283u);
  if (!crc32c_hw_available()) {
    WARN("this CPU has no SSE4.2: only the software CRC32C was checked");
    return;
  }
  CHECK(crc32c_hw(0, check.data(), check.size()) == 0xE3069283u);
  CHECK(crc32c_hw(0, zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c_hw(0, ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c_hw(0, inc.data(), 32) == 0x46DD794Eu);
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(4096);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 1000, 4000})
      REQUIRE(crc32c_hw(0x1234, buf.data() + off, len) == crc32c_sw(0x1234, buf.data() + off, len));
}

TEST_CASE("every record kind round trips with all its fields", "[trace]") {
  Corpus c;
  fill_every_kind(c, 300 * 1024);  // COPY data bigger than a chunk
  std::vector<std::string> want;
  for (const auto& r : c.records) want.push_back(canon(r));

  for (int level : {0, 1, 3, -3}) {
    for (size_t chunk : {size_t{1024}, size_t{64 * 1024}, size_t{256 * 1024}}) {
      INFO("level " << level << " chunk " << chunk);
      WriterOptions o;
      o.compression_level = level;
      o.chunk_bytes = chunk;
      auto bytes = write_memory(c.records, o);
      Reader r(memory_source(bytes));
      auto got = read_all(r);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) REQUIRE(got[i] == want[i]);
      CHECK(r.stats().terminated);
      CHECK(r.stats().recovered_tail_bytes == 0);
      CHECK(r.stats().records == want.size());
      CHECK(r.stats().bytes == bytes.size());
      CHECK(r.stats().chunks > 1);
      CHECK(r.header().major == 1);
      CHECK(r.header().minor == 2);
    }
  }
}

TEST_CASE("a trace written by format 1.1 still reads: its block I/O has no queue time", "[trace]") {
  // Written by `capture import --blkparse` before format 1.2.
  auto r = open_reader(std::string(TIERLAB_SOURCE_DIR) + "/tests/data/trace-1.1-block-io.tlt");
  CHECK(r->header().minor == 1);
  auto got = read_all(*r);
  REQUIRE(got.size() == 3);
  CHECK(got[0] == "110000 s0 block_io 400000 8388608 1048576 8192 read 0 697 q0");
  CHECK(got[1] == "1020000 s0 block_io 1900000 8388608 2097152 4096 write 1 698 q0");
  CHECK(got[2] == "2000000 s0 block_io 2250000 8388608 511705088 8192 read 0 697 q0");
  CHECK(r->stats().terminated);
  CHECK(r->stats().records == 3);
}

TEST_CASE("the BlockQueued example of docs/trace-format.md is what the writer emits", "[trace]") {
  WriterOptions o;
  o.compression_level = 0;
  o.start_mono_ns = 0;
  o.realtime_offset_ns = 0;
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  Writer w(std::move(sink), o);
  w.write(Record{1'000'000, 0, BlockIo{1'250'000, (8u << 20) | 16, 1ull << 30, 8192, IoOp::Read, 0, 4242, 960'000}});
  w.close();
  CHECK(w.records_written() == 1);
  const auto& bytes = mem->bytes();
  std::vector<uint8_t> payload(bytes.begin() + 36 + 40, bytes.end());
  std::vector<uint8_t> want = {
      0x3d, 0xff, 0xf0, 0x04, 0x00, 0x00,  // BlockQueued: -40 us, session 0, body length 0
      0x90, 0x80, 0xf1, 0x04,              // BlockIo with extension byte, +40 us
      0xf8, 0x03,                          // read, unit 4096, new pid; new device and length
      0x90, 0x80, 0x80, 0x04, 0x80, 0x40,  // device 8:16, length 8192
      0xa4, 0x42,                          // pid +4242
      0x80, 0x80, 0x20,                    // offset 1 GiB / 4096
      0xa0, 0xc2, 0x1e,                    // latency 250 us
      0x7f, 2, 0, 1};                      // End: 2 records, 0 strings, 1 chunk
  CHECK(payload == want);
  CHECK(fmt::get_u32(bytes.data() + 36 + 16) == 2);  // the chunk counts both records

  Reader r(memory_source(bytes));
  auto got = read_all(r);
  REQUIRE(got.size() == 1);
  CHECK(got[0] == "1000000 s0 block_io 1250000 8388624 1073741824 8192 read 0 4242 q960000");
  CHECK(r.stats().records == 1);
  CHECK(r.stats().terminated);

}

TEST_CASE("header keeps the clock origin and realtime offset", "[trace]") {
  WriterOptions o;
  o.start_mono_ns = 123456789;
  o.realtime_offset_ns = -42;
  auto bytes = write_memory({}, o);
  Reader r(memory_source(bytes));
  CHECK(r.header().start_mono_ns == 123456789);
  CHECK(r.header().realtime_offset_ns == -42);
  Record rec;
  CHECK_FALSE(r.next(rec));
  CHECK(r.stats().terminated);

  // Taken from the clocks when not given.
  Nanos before = tierlab::now_ns();
  auto now_bytes = write_memory({}, WriterOptions{});
  Reader r2(memory_source(now_bytes));
  CHECK(r2.header().start_mono_ns >= before);
  CHECK(r2.header().start_mono_ns <= tierlab::now_ns());
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  Nanos real = Nanos{rt.tv_sec} * 1000000000 + rt.tv_nsec;
  CHECK(std::llabs(real - (tierlab::now_ns() + r2.header().realtime_offset_ns)) < 1000000000);
}

TEST_CASE("a file trace round trips and is created mode 0600", "[trace]") {
  TempDir dir;
  std::string path = dir.file("t.tlt");
  // An existing file with a wider mode is narrowed.
  write_file(path, {1, 2, 3});
  ::chmod(path.c_str(), 0644);
  Corpus c;
  fill_every_kind(c, 1000);
  {
    auto w = open_writer(path);
    for (const auto& r : c.records) w->write(r);
    w->close();
    CHECK(w->records_written() == c.records.size());
    struct stat st;
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(w->bytes_written() == static_cast<uint64_t>(st.st_size));
  }
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto r = open_reader(path);
  auto got = read_all(*r);
  REQUIRE(got.size() == c.records.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == canon(c.records[i]));
}

TEST_CASE("a statement repeated a million times is stored twice: inline, then interned", "[trace]") {
  const std::string sql = "SELECT abalance FROM pgbench_accounts WHERE aid = 12345 AND something_long = 'x'";
  WriterOptions o;
  o.compression_level = 0;  // measure the encoding, not zstd
  auto sink = std::make_unique<MemorySink>();
  MemorySink* raw = sink.get();
  Writer w(std::move(sink), o);
  for (int i = 0; i < 1000000; ++i) w.write(Nanos{i} * 1000, 1 + i % 8, Query{sql});
  w.close();
  // kind + delta + session + string id: 5 bytes, and the text twice (inline
  // at its first use, defined at its second).
  CHECK(raw->bytes().size() < 1000000 * 6);
  Reader r(memory_source(raw->bytes()));
  Record rec;
  uint64_t n = 0;
  while (r.next(rec)) {
    if (std::get<Query>(rec.body).sql != sql) FAIL("statement text differs at record " << n);
    ++n;
  }
  CHECK(n == 1000000);
  CHECK(r.stats().kind_bytes[static_cast<size_t>(Kind::Query)] < 1000000 * 6);
}

TEST_CASE("summarize counts sessions, statements, transactions and storage", "[trace]") {
  std::vector<Record> recs;
  auto add = [&](Nanos ts, uint64_t s, Body b) { recs.push_back(Record{ts, s, b}); };
  add(100, 1, SessionBegin{"u", "d", "a", "unix", 1, 0});
  add(110, 2, SessionBegin{"u", "d", "a", "unix", 2, 0});
  add(120, 1, Ready{'I'});          // after startup: no statement, no transaction
  add(130, 1, Query{"BEGIN"});
  add(131, 1, Ready{'T'});
  add(140, 2, Execute{"", 0});      // interleaved second session
  add(150, 1, Query{"INSERT"});
  add(151, 1, Error{"23505", "ERROR", "dup"});
  add(152, 1, Ready{'E'});
  add(160, 1, Query{"ROLLBACK"});
  add(161, 1, Ready{'I'});          // transaction 1 (session 1)
  add(162, 2, Ready{'I'});          // transaction 2 (session 2)
  add(163, 2, Ready{'I'});          // nothing ran: not a transaction
  add(90, 0, BlockIo{200, 1, 0, 8192, IoOp::Read, 0, 1});  // earlier ts: slightly out of order
  add(170, 0, FileIo{1, "f", 0, 1, IoOp::Read, 0, 5});
  add(171, 0, Sample{"x", 1});
  add(172, 3, Loss{LossKind::PacketDrop, 5});
  add(173, 0, Loss{LossKind::EventsLost, 2});
  add(1'000'090, 1, SessionEnd{EndReason::Clean});
  auto bytes = write_memory(recs, WriterOptions{});
  Reader r(memory_source(bytes));
  Summary s = summarize(r);
  CHECK(s.records == recs.size());
  CHECK(s.sessions == 2);
  CHECK(s.statements == 4);
  CHECK(s.transactions == 2);
  CHECK(s.errors == 1);
  CHECK(s.block_ios == 1);
  CHECK(s.file_ios == 1);
  CHECK(s.samples == 1);
  CHECK(s.lost == 7);
  CHECK(s.first_ts == 90);
  CHECK(s.last_ts == 1'000'090);
  CHECK(s.duration_ns == 1'000'000);
  CHECK(s.read.terminated);
  CHECK(s.read.kind_records[static_cast<size_t>(Kind::Ready)] == 6);
}

TEST_CASE("ten million records round trip through a file", "[trace][big]") {
  TempDir dir;
  std::string path = dir.file("big.tlt");
  const uint64_t n = 10'000'000;
  auto mix = [](uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; };
  uint64_t want = 0xcbf29ce484222325ull, got = want;
  std::mt19937_64 rng(1);
  char digits[24];
  {
    auto w = open_writer(path);
    Param prm;
    Nanos t = 0;
    for (uint64_t i = 0; i < n; ++i) {
      t += static_cast<Nanos>(rng() % 100000);
      uint64_t sess = 1 + rng() % 8;
      uint64_t v = rng();
      Record rec{t, sess, Sync{}};
      switch (i % 4) {
        case 0: {
          auto len = std::snprintf(digits, sizeof digits, "%llu", static_cast<unsigned long long>(v % 1000000));
          prm.value = std::string_view(digits, static_cast<size_t>(len));
          rec.body = Bind{"", "P0_1", std::span<const Param>(&prm, 1), {}};
          want = mix(want, v % 1000000);
          break;
        }
        case 1: rec.body = Execute{"", 0}; break;
        case 2: rec.body = Result{"SELECT", true, v % 3}; want = mix(want, v % 3); break;
        case 3:
          rec.session = 0;
          rec.body = BlockIo{t + static_cast<Nanos>(v % 1000000), 1, (v % (1ull << 24)) * 8192, 8192,
                             v & 1 ? IoOp::Write : IoOp::Read, 0, 100};
          want = mix(want, (v % (1ull << 24)) * 8192);
          break;
      }
      want = mix(mix(want, static_cast<uint64_t>(t)), rec.session);
      w->write(rec);
    }
    w->close();
  }
  auto r = open_reader(path);
  Record rec;
  uint64_t count = 0;
  while (r->next(rec)) {
    switch (count % 4) {
      case 0: {
        auto v = std::get<Bind>(rec.body).params[0].value;
        got = mix(got, std::stoull(std::string(v)));
        break;
      }
      case 2: got = mix(got, std::get<Result>(rec.body).rows); break;
      case 3: got = mix(got, std::get<BlockIo>(rec.body).offset); break;
    }
    got = mix(mix(got, static_cast<uint64_t>(rec.ts)), rec.session);
    ++count;
  }
  CHECK(count == n);
  CHECK(got == want);
  CHECK(r->stats().terminated);
}

TEST_CASE("the worked example of docs/trace-format.md is what the writer emits", "[trace]") {
  WriterOptions o;
  o.compression_level = 0;
  o.start_mono_ns = 0;
  o.realtime_offset_ns = 0;
  auto bytes = write_memory({Record{1000, 5, Query{"a"}}, Record{1000, 5, Result{"SELECT", true, 1}},
                             Record{1000, 5, Query{"a"}}, Record{81000, 3, Result{"SELECT", true, 1}},
                             Record{81000, 3, Ready{'I'}}},
                            o);
  // header 36, chunk header 40, then the payload.
  std::vector<uint8_t> payload(bytes.begin() + 36 + 40, bytes.end());
  std::vector<uint8_t> want = {
      0x42, 5, 3, 'a',                        // Query, Z, session 5, inline "a" (first use)
      0xcd, 0x0d, 'S', 'E', 'L', 'E', 'C', 'T', 0x02,  // Result, Z and S, inline "SELECT", rows 1
      0x3e, 1, 'a',                           // second use: StringDef 1 "a"
      0xc2, 2,                                // Query, Z and S, string 1
      0x3e, 6, 'S', 'E', 'L', 'E', 'C', 'T',  // StringDef 2 "SELECT"
      0x0d, 0x80, 0xe2, 0x09, 0x03, 0x04, 0x02,  // Result, +80 us, session 3, string 2, rows 1
      0xcf, 0x49,                             // Ready 'I', Z and S
      0x7f, 5, 2, 1};                         // End: 5 records, 2 strings, 1 chunk
  CHECK(payload == want);
  CHECK(bytes[36 + 4] == 2);  // flags: END, stored raw
}
