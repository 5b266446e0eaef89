// Damaged traces: a killed writer's tail is recovered, corruption in the
// middle is an error naming the chunk and its byte offset, foreign and
// truncated headers are clear errors, newer minor versions are read.
#include "common/error.h"
#include "trace/crc32c.h"
#include "trace/format.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>

using namespace tierlab;
using namespace tierlab::trace;
using namespace tierlab::trace::testutil;

namespace {

// Record i of a deterministic stream: enough variety to cross many chunks.
Record nth(uint64_t i, std::string* scratch) {
  *scratch = "SELECT " + std::to_string(i % 97);
  switch (i % 3) {
    case 0: return Record{static_cast<Nanos>(i * 1000), 1 + i % 5, Query{*scratch}};
    case 1: return Record{static_cast<Nanos>(i * 1000), 1 + i % 5, Result{"SELECT", true, i}};
    default:
      return Record{static_cast<Nanos>(i * 1000), 0,
                    BlockIo{static_cast<Nanos>(i * 1000 + 77), 1, i * 8192, 8192, IoOp::Read, 0, 42}};
  }
}

std::vector<uint8_t> stream_bytes(uint64_t n, bool close = true) {
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  WriterOptions o;
  o.chunk_bytes = 4096;
  Writer w(std::move(sink), o);
  std::string s;
  for (uint64_t i = 0; i < n; ++i) w.write(nth(i, &s));
  if (close)
    w.close();
  else
    w.flush();
  return mem->bytes();
}

struct ChunkPos {
  uint64_t offset;
  uint32_t stored;
};

std::vector<ChunkPos> chunks_of(const std::vector<uint8_t>& b) {
  std::vector<ChunkPos> out;
  uint64_t off = fmt::get_u32(b.data() + 12);
  while (off + fmt::kChunkHeaderLen <= b.size()) {
    uint32_t stored = fmt::get_u32(b.data() + off + 8);
    out.push_back({off, stored});
    off += fmt::kChunkHeaderLen + stored;
  }
  return out;
}

std::string error_of(std::vector<uint8_t> bytes, const std::string& name = "t.tlt") {
  try {
    Reader r(memory_source(std::move(bytes), name));
    Record rec;
    while (r.next(rec)) {
    }
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Checks that records 0..n-1 of nth() come back in order; returns n.
uint64_t check_prefix(Reader& r) {
  Record rec;
  std::string s;
  uint64_t i = 0;
  while (r.next(rec)) {
    REQUIRE(canon(rec) == canon(nth(i, &s)));
    ++i;
  }
  return i;
}

}  // namespace

TEST_CASE("a flipped byte in a middle chunk names the chunk and its offset", "[trace][recovery]") {
  auto good = stream_bytes(20000);
  auto chunks = chunks_of(good);
  REQUIRE(chunks.size() > 10);
  const size_t k = chunks.size() / 2;

  auto bad = good;
  bad[chunks[k].offset + fmt::kChunkHeaderLen + chunks[k].stored / 2] ^= 0x10;
  CHECK(error_of(bad) == "t.tlt: chunk " + std::to_string(k) + " at byte " +
                             std::to_string(chunks[k].offset) + ": CRC mismatch");

  // In the chunk header: its own CRC catches it before any length is trusted.
  bad = good;
  bad[chunks[k].offset + 9] ^= 0x01;  // stored length
  CHECK(error_of(bad) == "t.tlt: chunk " + std::to_string(k) + " at byte " +
                             std::to_string(chunks[k].offset) + ": chunk header CRC mismatch");

  // Every single-byte flip anywhere in one chunk is caught.
  for (uint64_t i = 0; i < fmt::kChunkHeaderLen + chunks[1].stored; i += 7) {
    bad = good;
    bad[chunks[1].offset + i] ^= 0x80;
    REQUIRE(error_of(bad).find("t.tlt: chunk 1 at byte " + std::to_string(chunks[1].offset)) == 0);
  }
}

TEST_CASE("a complete chunk that does not decode is an error naming it", "[trace][recovery]") {
  // A valid CRC over a payload that refers to a string never defined.
  std::vector<uint8_t> b(fmt::kHeaderLen);
  std::memcpy(b.data(), fmt::kFileMagic, 8);
  fmt::put_u16(b.data() + 8, 1);
  fmt::put_u16(b.data() + 10, 0);
  fmt::put_u32(b.data() + 12, fmt::kHeaderLen);
  fmt::put_u32(b.data() + 32, crc32c(0, b.data(), 32));
  std::vector<uint8_t> payload = {static_cast<uint8_t>(Kind::Query) | fmt::kZeroDelta, 1, 10};
  uint8_t h[fmt::kChunkHeaderLen] = {};
  fmt::put_u32(h, fmt::kChunkMagic);
  fmt::put_u32(h + 8, static_cast<uint32_t>(payload.size()));
  fmt::put_u32(h + 12, static_cast<uint32_t>(payload.size()));
  fmt::put_u32(h + 16, 1);
  fmt::put_u32(h + 32, crc32c(crc32c(0, h, 32), payload.data(), payload.size()));
  fmt::put_u32(h + 36, crc32c(0, h, 36));
  b.insert(b.end(), h, h + sizeof h);
  b.insert(b.end(), payload.begin(), payload.end());
  CHECK(error_of(b) == "t.tlt: chunk 0 at byte 36: undecodable payload (string 5 not defined)");
}

TEST_CASE("foreign, empty and truncated headers are clear errors", "[trace][recovery]") {
  auto good = stream_bytes(10);
  CHECK(error_of({}) == "t.tlt: not a tierlab trace (empty file)");
  std::string text = "log_time,user_name,database_name\n2026-01-01 ...";
  CHECK(error_of(std::vector<uint8_t>(text.begin(), text.end())) ==
        "t.tlt: not a tierlab trace (no tierlab magic at byte 0)");
  CHECK(error_of(std::vector<uint8_t>(good.begin(), good.begin() + 10)) ==
        "t.tlt: truncated header (10 of 36 bytes)");
  CHECK(error_of(std::vector<uint8_t>(good.begin(), good.begin() + 20)) ==
        "t.tlt: truncated header (20 of 36 bytes)");
  CHECK(error_of(std::vector<uint8_t>(good.begin(), good.begin() + 4)) ==
        "t.tlt: truncated header (4 of 36 bytes)");
  auto bad = good;
  bad[20] ^= 1;
  CHECK(error_of(bad) == "t.tlt: header CRC mismatch");
  bad = good;
  fmt::put_u16(bad.data() + 8, 2);
  fmt::put_u16(bad.data() + 10, 0);
  CHECK(error_of(bad) == "t.tlt: unsupported trace version 2.0 (this tierlab reads 1.x)");
  // Through a file, the path is named.
  TempDir dir;
  write_file(dir.file("x.tlt"), std::vector<uint8_t>(good.begin(), good.begin() + 12));
  try {
    open_reader(dir.file("x.tlt"));
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == dir.file("x.tlt") + ": truncated header (12 of 36 bytes)");
  }
  CHECK_THROWS_AS(open_reader(dir.file("missing.tlt")), InputError);
  CHECK_THROWS_AS(open_reader(dir.path()), InputError);
}

TEST_CASE("an incomplete last chunk is a recovered tail, not an error", "[trace][recovery]") {
  auto good = stream_bytes(5000, /*close=*/false);  // unterminated: as a killed writer leaves it
  auto chunks = chunks_of(good);
  REQUIRE(chunks.size() > 3);
  const ChunkPos last = chunks.back();
  {
    Reader r(memory_source(good));
    CHECK(check_prefix(r) == 5000);
    CHECK_FALSE(r.stats().terminated);
    CHECK(r.stats().recovered_tail_bytes == 0);
  }
  uint64_t before_last = 0;
  {
    std::vector<uint8_t> head(good.begin(), good.begin() + static_cast<long>(last.offset));
    Reader r(memory_source(head));
    before_last = check_prefix(r);
  }
  for (uint64_t cut : {uint64_t{1}, uint64_t{39}, uint64_t{40}, uint64_t{41}, uint64_t{40} + last.stored - 1}) {
    INFO("cut " << cut);
    std::vector<uint8_t> b(good.begin(), good.begin() + static_cast<long>(last.offset + cut));
    Reader r(memory_source(b));
    CHECK(check_prefix(r) == before_last);
    CHECK(r.stats().recovered_tail_bytes == cut);
    CHECK_FALSE(r.stats().terminated);
    CHECK(r.stats().bytes == last.offset);
  }
}

TEST_CASE("a writer killed with SIGKILL leaves every complete chunk readable", "[trace][recovery]") {
  TempDir dir;
  std::string path = dir.file("killed.tlt");
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Writes and flushes chunks as fast as it can until killed.
    try {
      WriterOptions o;
      o.chunk_bytes = 4096;
      auto w = open_writer(path, o);
      std::string s;
      for (uint64_t i = 0;; ++i) w->write(nth(i, &s));
    } catch (...) {
    }
    _exit(3);
  }
  struct stat st {};
  for (int i = 0; i < 2000; ++i) {
    if (::stat(path.c_str(), &st) == 0 && st.st_size > 512 * 1024) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto r = open_reader(path);
  uint64_t n = check_prefix(*r);
  CHECK(n > 10000);
  CHECK_FALSE(r->stats().terminated);
  CHECK(r->stats().bytes + r->stats().recovered_tail_bytes == static_cast<uint64_t>(st.st_size));
  INFO("records " << n << ", tail " << r->stats().recovered_tail_bytes);

  // The same file cut inside its last chunk, as when the kill lands mid-write.
  auto bytes = read_file(path);
  auto chunks = chunks_of(bytes);
  REQUIRE(chunks.size() > 2);
  bytes.resize(chunks.back().offset + 17);
  Reader cut(memory_source(bytes));
  CHECK(check_prefix(cut) <= n);
  CHECK(cut.stats().recovered_tail_bytes == 17);
}

TEST_CASE("data after the end record is an error", "[trace][recovery]") {
  auto b = stream_bytes(100);
  auto chunks = chunks_of(b);
  b.push_back(0);
  CHECK(error_of(b).find("t.tlt: data after the end record at byte") == 0);
  // A whole second trace appended is refused the same way.
  auto twice = stream_bytes(100);
  auto more = stream_bytes(100);
  twice.insert(twice.end(), more.begin(), more.end());
  CHECK_FALSE(error_of(twice).empty());
}

TEST_CASE("a newer minor version with a longer header and unknown record kinds is read",
          "[trace][recovery]") {
  std::vector<uint8_t> b(44);  // 8 more header bytes than 1.0
  std::memcpy(b.data(), fmt::kFileMagic, 8);
  fmt::put_u16(b.data() + 8, 1);
  fmt::put_u16(b.data() + 10, 7);
  fmt::put_u32(b.data() + 12, 44);
  fmt::put_i64(b.data() + 16, 5000);
  fmt::put_i64(b.data() + 24, 1'700'000'000'000'000'000);
  fmt::put_i64(b.data() + 32, 0x1122334455667788);  // a field 1.0 does not know
  fmt::put_u32(b.data() + 40, crc32c(0, b.data(), 40));

  std::vector<uint8_t> pl;
  auto put = [&](std::initializer_list<uint8_t> v) { pl.insert(pl.end(), v); };
  put({fmt::kStringDef, 6, 'S', 'E', 'L', 'E', 'C', 'T'});           // string 1
  put({static_cast<uint8_t>(Kind::Result) | fmt::kZeroDelta, 3, 2, 8});  // s3 SELECT 7
  put({40, 20, 3, 4, 0xde, 0xad, 0xbe, 0xef});                        // kind 40: +10 ns, body 4 bytes
  put({40 | fmt::kZeroDelta | fmt::kSameSession, 0});                 // kind 40, empty body
  // A 1.1 kind with a field a later minor version appended: the field is skipped.
  put({static_cast<uint8_t>(Kind::Suspended) | fmt::kZeroDelta | fmt::kSameSession, 2, 0x05, 0x06});
  put({static_cast<uint8_t>(Kind::Ready) | fmt::kSameSession, 2, 'I'});  // +1 ns
  put({fmt::kEnd | fmt::kZeroDelta, 5, 1, 1});                        // 5 records, 1 string, 1 chunk
  uint8_t h[fmt::kChunkHeaderLen] = {};
  fmt::put_u32(h, fmt::kChunkMagic);
  fmt::put_u32(h + 4, fmt::kChunkEnd | (1u << 20));  // an ignorable flag of a newer minor
  fmt::put_u32(h + 8, static_cast<uint32_t>(pl.size()));
  fmt::put_u32(h + 12, static_cast<uint32_t>(pl.size()));
  fmt::put_u32(h + 16, 5);
  fmt::put_i64(h + 24, 6000);
  fmt::put_u32(h + 32, crc32c(crc32c(0, h, 32), pl.data(), pl.size()));
  fmt::put_u32(h + 36, crc32c(0, h, 36));
  b.insert(b.end(), h, h + sizeof h);
  b.insert(b.end(), pl.begin(), pl.end());

  Reader r(memory_source(b));
  CHECK(r.header().major == 1);
  CHECK(r.header().minor == 7);
  CHECK(r.header().start_mono_ns == 5000);
  CHECK(r.header().realtime_offset_ns == 1'700'000'000'000'000'000);
  auto got = read_all(r);
  REQUIRE(got.size() == 3);
  CHECK(got[0] == canon(Record{6000, 3, Result{"SELECT", true, 7}}));
  CHECK(got[1] == canon(Record{6010, 3, Suspended{}}));
  CHECK(got[2] == canon(Record{6011, 3, Ready{'I'}}));
  CHECK(r.stats().terminated);
  CHECK(r.stats().records == 5);  // the two skipped ones count as read

  // An unknown must-understand chunk flag is refused.
  fmt::put_u32(b.data() + 44 + 4, fmt::kChunkEnd | (1u << 9));
  fmt::put_u32(b.data() + 44 + 32, crc32c(crc32c(0, b.data() + 44, 32), pl.data(), pl.size()));
  fmt::put_u32(b.data() + 44 + 36, crc32c(0, b.data() + 44, 36));
  CHECK(error_of(b) == "t.tlt: chunk 0 at byte 44: unknown chunk flags");
}

TEST_CASE("damaged payloads behind a valid CRC fail cleanly, never crash", "[trace][recovery]") {
  // Chunks stored raw, so a mutation reaches the record decoder; the CRCs are
  // recomputed so that only the decoder's own checks stand in the way.
  testutil::Corpus c;
  testutil::fill_every_kind(c, 3000);
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  WriterOptions o;
  o.compression_level = 0;
  o.chunk_bytes = 2048;
  std::vector<uint8_t> good;
  {
    Writer w(std::move(sink), o);
    for (const auto& r : c.records) w.write(r);
    w.close();
    good = mem->bytes();
  }
  auto chunks = chunks_of(good);
  std::mt19937_64 rng(99);
  int errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = good;
    const ChunkPos& ch = chunks[rng() % chunks.size()];
    if (ch.stored == 0) continue;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      uint64_t at = ch.offset + fmt::kChunkHeaderLen + rng() % ch.stored;
      b[at] = static_cast<uint8_t>(rng());
    }
    uint8_t* h = b.data() + ch.offset;
    fmt::put_u32(h + 32, crc32c(crc32c(0, h, 32), h + fmt::kChunkHeaderLen, ch.stored));
    try {
      Reader r(memory_source(std::move(b)));
      Record rec;
      while (r.next(rec)) {
      }
    } catch (const InputError& e) {
      ++errors;
      REQUIRE(std::string(e.what()).find("memory: chunk ") == 0);
    }
  }
  CHECK(errors > 100);
}

TEST_CASE("a write that fails for want of space leaves a trace that reads back, and nothing after it",
          "[trace][recovery]") {
  // RLIMIT_FSIZE stands in for a full disk (EFBIG instead of ENOSPC: the
  // same short write, then an error), in a child so that the limit and the
  // ignored SIGXFSZ stay there.
  TempDir dir;
  const std::string path = dir.file("full.tlt");
  const std::string flushed_path = dir.file("flushed");
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    const rlim_t old = lim.rlim_cur;
    lim.rlim_cur = 100'000;  // not a chunk boundary: the failing chunk is written in part
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(5);
    WriterOptions o;
    o.chunk_bytes = 4096;
    o.compression_level = 0;
    auto w = open_writer(path, o);
    std::string s;
    try {
      for (uint64_t i = 0; i < 1'000'000; ++i) w->write(nth(i, &s));
      _exit(6);  // never failed
    } catch (const RuntimeError&) {
    }
    const uint64_t flushed = w->records_flushed();
    // Space comes back: the writer still must not append after the gap.
    lim.rlim_cur = old;
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int code = 0;
    try {
      w->write(nth(0, &s));
      w->close();
      code = 4;  // wrote after the failed chunk
    } catch (const RuntimeError&) {
    }
    FILE* f = std::fopen(flushed_path.c_str(), "w");
    std::fprintf(f, "%llu\n", static_cast<unsigned long long>(flushed));
    std::fclose(f);
    w.reset();  // the destructor's close must not write either
    _exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  unsigned long long flushed = 0;
  FILE* f = std::fopen(flushed_path.c_str(), "r");
  REQUIRE(f);
  REQUIRE(std::fscanf(f, "%llu", &flushed) == 1);
  std::fclose(f);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(st.st_size < 100'000);
  auto r = open_reader(path);
  CHECK(check_prefix(*r) == flushed);
  CHECK(flushed > 100);
  CHECK_FALSE(r->stats().terminated);
  // Cut back to the last whole chunk: no partial tail either.
  CHECK(r->stats().recovered_tail_bytes == 0);
  CHECK(r->stats().bytes == static_cast<uint64_t>(st.st_size));
}
