// Shared helpers of the fuzz targets in tests/fuzz/.
//
// Every target defines LLVMFuzzerTestOneInput. Built with -DTIERLAB_FUZZ=ON
// (clang, -fsanitize=fuzzer) it is a libFuzzer binary; in the ordinary build
// it is linked with driver.cpp, which runs every file of the target's corpus
// through it once (a ctest test).
//
// A target fails by crashing: a sanitizer report, an uncaught exception
// (std::terminate), or check() below. Bad input must end in InputError (the
// parsers' contract); anything else escaping a parser is a finding.
#pragma once

#include "common/error.h"
#include "trace/record.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tierlab::fuzz {

// Aborts with a message: a property the target asserts does not hold.
[[noreturn]] inline void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  for (char c : detail) {  // bytes of the input may be in it: escape them
    if ((c >= 32 && c < 127) || c == '\n') std::fputc(c, stderr);
    else std::fprintf(stderr, "\\x%02x", static_cast<unsigned char>(c));
  }
  std::fputc('\n', stderr);
  std::abort();
}
inline void check(bool ok, const char* what, const std::string& detail = {}) {
  if (!ok) fail(what, detail);
}

// Consumes the input from the front: control bytes and pieces.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  bool empty() const { return p_ == end_; }
  uint8_t u8() { return p_ == end_ ? 0 : *p_++; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return u16() | (static_cast<uint32_t>(u16()) << 16); }
  // The next min(n, left()) bytes.
  std::string_view take(size_t n) {
    n = std::min(n, left());
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::string_view rest() { return take(left()); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// Every field of a record, as text: two records are equal when their dumps are.
std::string dump(const trace::Record& r);

// A trace file (header and one uncompressed chunk with valid CRCs) holding
// `payload` as the chunk's records; `records` is the count the chunk header
// claims, `end` flags it as the last chunk.
std::vector<uint8_t> trace_with_chunk(std::string_view payload, uint32_t records, bool end);

}  // namespace tierlab::fuzz

namespace tierlab::fuzz {

// Reads the trace in `bytes` (InputError ends it: bad input), writes every
// record it gave into a new trace and reads that back: the records must come
// back equal, field by field, and the rewritten trace must read cleanly.
// Calls `each` with every record read from `bytes`. Returns the count.
template <class F>
size_t trace_roundtrip(const std::vector<uint8_t>& bytes, F&& each);

}  // namespace tierlab::fuzz

#include "trace/reader.h"
#include "trace/writer.h"

#include <memory>

namespace tierlab::fuzz {

// What an importer writes: a trace in memory whose clock starts at zero.
class MemoryTrace {
 public:
  MemoryTrace() : MemoryTrace(std::make_unique<trace::MemorySink>()) {}
  trace::Writer& writer() { return w_; }
  // Closes the trace; the dump() of each of its records of `kind`.
  std::vector<std::string> close_and_dump(trace::Kind kind) {
    w_.close();
    trace::Reader r(trace::memory_source(mem_->bytes(), "imported.tlt"));
    std::vector<std::string> out;
    trace::Record rec;
    while (r.next(rec))
      if (rec.kind() == kind) out.push_back(dump(rec));
    return out;
  }
  // The closed trace's bytes.
  const std::vector<uint8_t>& bytes() const { return mem_->bytes(); }

 private:
  explicit MemoryTrace(std::unique_ptr<trace::MemorySink> sink) : mem_(sink.get()), w_(std::move(sink), options()) {}
  static trace::WriterOptions options() {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    wo.realtime_offset_ns = 0;
    return wo;
  }
  trace::MemorySink* mem_;  // owned by w_
  trace::Writer w_;
};

}  // namespace tierlab::fuzz

template <class F>
size_t tierlab::fuzz::trace_roundtrip(const std::vector<uint8_t>& bytes, F&& each) {
  std::vector<std::string> first;
  auto sink = std::make_unique<trace::MemorySink>();
  trace::MemorySink* out = sink.get();
  std::unique_ptr<trace::Writer> w;
  try {
    trace::Reader r(trace::memory_source(bytes, "fuzz.tlt"));
    trace::WriterOptions wo;
    wo.start_mono_ns = r.header().start_mono_ns;
    wo.realtime_offset_ns = r.header().realtime_offset_ns;
    wo.compression_level = bytes.empty() ? 0 : (bytes.back() & 1);
    wo.chunk_bytes = 64 + (bytes.size() % 4096);
    w = std::make_unique<trace::Writer>(std::move(sink), wo);
    trace::Record rec;
    while (r.next(rec)) {
      first.push_back(dump(rec));
      each(rec);
      w->write(rec);
    }
  } catch (const InputError&) {
    // Bad input: what was read before it is still rewritten and compared.
  }
  if (!w) return 0;
  w->close();
  trace::Reader again(trace::memory_source(out->bytes(), "rewritten.tlt"));
  trace::Record rec;
  size_t i = 0;
  while (again.next(rec)) {
    check(i < first.size(), "rewritten trace has more records than were written");
    std::string d = dump(rec);
    check(d == first[i], "record differs after a write and read",
          "record " + std::to_string(i) + "\n read:    " + first[i] + "\n reread:  " + d);
    ++i;
  }
  check(i == first.size(), "rewritten trace has fewer records than were written");
  check(again.stats().terminated, "rewritten trace has no end record");
  return i;
}
