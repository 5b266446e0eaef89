// Reading a tierlab trace, and summarising one.
//
// The reader accepts every minor version of major version 1 (unknown record
// kinds of a newer minor version are skipped by their length). At end of
// input it stops after the last complete chunk: a chunk cut short by a killed
// writer is reported in stats().recovered_tail_bytes, not as an error.
// A complete chunk that fails its CRC or does not decode throws InputError
// naming the file, the chunk number and its byte offset.
#pragma once

#include "trace/record.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::trace {

// Where the bytes come from. Tests use memory_source.
class Source {
 public:
  virtual ~Source() = default;
  // Reads up to len bytes; returns 0 at end of input. Throws RuntimeError.
  virtual size_t read(void* buf, size_t len) = 0;
  // Name used in error messages (the path).
  virtual std::string name() const = 0;
};

std::unique_ptr<Source> file_source(const std::string& path);  // InputError if missing
std::unique_ptr<Source> memory_source(std::vector<uint8_t> bytes, std::string name = "memory");

struct Header {
  uint16_t major = 0;
  uint16_t minor = 0;
  Nanos start_mono_ns = 0;     // CLOCK_MONOTONIC when the trace was opened
  Nanos realtime_offset_ns = 0;  // CLOCK_REALTIME - CLOCK_MONOTONIC then
};

struct ReadStats {
  uint64_t chunks = 0;
  uint64_t records = 0;  // records read (a BlockQueued, part of the BlockIo after it, is not one)
  uint64_t bytes = 0;               // bytes of complete chunks and header
  uint64_t recovered_tail_bytes = 0;  // bytes of an incomplete last chunk
  bool terminated = false;          // the end record was seen
  // Encoded bytes per record kind (uncompressed), for `trace info`.
  std::array<uint64_t, static_cast<size_t>(Kind::Count_)> kind_bytes{};
  std::array<uint64_t, static_cast<size_t>(Kind::Count_)> kind_records{};
};

class Reader {
 public:
  // Reads and checks the header; throws InputError if it is missing,
  // truncated, of another format or of an unsupported major version.
  explicit Reader(std::unique_ptr<Source> src);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const Header& header() const;

  // Next record; false at end of input. See the file comment for ownership.
  bool next(Record& out);

  const ReadStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Reader> open_reader(const std::string& path);

// What `tierlab trace info` prints.
struct Summary {
  uint64_t records = 0;
  uint64_t sessions = 0;
  uint64_t statements = 0;    // Query + Execute
  uint64_t transactions = 0;  // ReadyForQuery 'I' closing a unit with statements
  uint64_t errors = 0;
  uint64_t block_ios = 0;
  uint64_t file_ios = 0;
  uint64_t samples = 0;
  uint64_t lost = 0;          // sum of Loss counts
  Nanos first_ts = 0;
  Nanos last_ts = 0;
  Nanos duration_ns = 0;
  ReadStats read;
};

// Reads the whole trace. Throws like Reader.
Summary summarize(Reader& reader);

}  // namespace tierlab::trace
