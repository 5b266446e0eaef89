// Writing a tierlab trace.
//
// A trace is a header followed by chunks; each chunk holds many records,
// is compressed and carries a CRC32C, and is written with one write() so a
// writer killed at any moment leaves every earlier chunk readable. close()
// writes the end record; a trace without it is "unterminated" but readable.
//
// Writer is single-threaded: one thread owns it (capture feeds it through a
// queue). write() does not allocate in steady state except when a new string
// is interned.
#pragma once

#include "trace/record.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tierlab::trace {

// Where the bytes go. Tests use MemorySink.
class Sink {
 public:
  virtual ~Sink() = default;
  // Appends all of `data` or throws RuntimeError. A file sink whose append
  // failed holds only the earlier appends and refuses later ones.
  virtual void append(const void* data, size_t len) = 0;
  // Makes appended bytes durable (fdatasync for files). Default: nothing.
  virtual void sync() {}
};

// A file created with mode 0600 (traces hold SQL and parameter values; an
// existing regular file is narrowed to 0600). A device or FIFO (/dev/null, a
// named pipe) is written as it is, its mode left alone and sync() a no-op.
// Throws InputError if the path cannot be created.
std::unique_ptr<Sink> file_sink(const std::string& path);

class MemorySink : public Sink {
 public:
  void append(const void* data, size_t len) override;
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// zstd levels a trace can be written at; 0 stores chunks uncompressed.
constexpr int kMinCompressionLevel = -100;
constexpr int kMaxCompressionLevel = 22;

// Throws InputError unless `level` is in range; the message starts with the
// level ("23: must be -100 to 22 (0 writes the trace uncompressed)").
void check_compression_level(int level);

struct WriterOptions {
  size_t chunk_bytes = 256 * 1024;  // uncompressed bytes per chunk
  int compression_level = 1;        // zstd level (negative: fast levels); 0 stores chunks raw
  // Clock origin and realtime offset for the header (importers of logs
  // recorded elsewhere set them); unset: taken when the Writer is created.
  std::optional<Nanos> start_mono_ns;
  std::optional<Nanos> realtime_offset_ns;
};

class Writer {
 public:
  // Writes the header at once. Clock origin and realtime offset are taken
  // now unless given.
  explicit Writer(std::unique_ptr<Sink> sink, WriterOptions opts = {});
  ~Writer();  // closes if not closed; never throws
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void write(const Record& r);
  // Convenience for write({ts, session, body}).
  void write(Nanos ts, uint64_t session, const Body& body) {
    write(Record{ts, session, body});
  }

  // Ends the current chunk and writes it out (no fsync).
  void flush();
  // Flushes, writes the end record and syncs. Further writes throw.
  void close();

  // Records given to write(), and of them those in chunks the sink took
  // (the rest are in the chunk being filled). After the sink failed (a
  // full disk) the trace holds records_flushed() records.
  uint64_t records_written() const;
  uint64_t records_flushed() const;
  uint64_t bytes_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience: Writer on file_sink(path).
std::unique_ptr<Writer> open_writer(const std::string& path, WriterOptions opts = {});

}  // namespace tierlab::trace
