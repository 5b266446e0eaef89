// Private to capture/: moving records from event-loop threads to the one
// thread that owns the trace::Writer.
//
// Records hold string_views into buffers the event loop reuses at once, so
// they are copied, compactly encoded, into a single-producer single-consumer
// byte ring per event-loop thread. The writer thread decodes them back into
// trace::Record values (views into the ring, valid until it pops them) and
// hands them to trace::Writer, which copies them.
#pragma once

#include "capture/wire.h"
#include "common/error.h"
#include "trace/record.h"
#include "trace/writer.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace tierlab::capture::detail {

// --- record codec ----------------------------------------------------------
// Host byte order; the bytes never leave the process.

// Bytes encode() writes for r.
size_t encoded_size(const trace::Record& r);
// Writes encoded_size(r) bytes at out; returns the end.
uint8_t* encode(const trace::Record& r, uint8_t* out);

// Decodes what encode() wrote. Spans in the record point into `in` or into
// this object's scratch arrays (valid until the next decode()).
class RecordDecoder {
 public:
  // Returns false if the bytes are not a record encode() wrote.
  bool decode(const uint8_t* in, size_t len, trace::Record& out);

 private:
  // Bounds-checked reading of an entry.
  struct In {
    const uint8_t* p;
    const uint8_t* end;
    bool ok = true;
    template <typename T>
    T get() {
      T v{};
      if (static_cast<size_t>(end - p) < sizeof v) {
        ok = false;
        return v;
      }
      std::memcpy(&v, p, sizeof v);
      p += sizeof v;
      return v;
    }
    std::string_view str() {
      uint32_t n = get<uint32_t>();
      if (!ok || static_cast<size_t>(end - p) < n) {
        ok = false;
        return {};
      }
      std::string_view s(reinterpret_cast<const char*>(p), n);
      p += n;
      return s;
    }
  };
  template <class T>
  void get_struct(In& in, T& b);
  template <class M>
  void get_value(In& in, M& v);
  template <class T>
  void get_kind(In& in, trace::Record& out);
  template <size_t... I>
  static constexpr auto kind_decoders(std::index_sequence<I...>);

  // Behind the spans of the last record, one vector per element type.
  std::tuple<std::vector<uint32_t>, std::vector<trace::Param>, std::vector<int16_t>> scratch_;
};

// --- SPSC byte ring ----------------------------------------------------------
// Entries are [u32 length][payload] rounded up to 8 bytes, contiguous in
// memory (a wrap marker skips the unusable tail of the buffer).
//
// The producer goes back to the start of the buffer as soon as it is past
// `hot` bytes (and not yet past twice that) with everything consumed,
// rather than only at the end of the buffer: while the consumer keeps up,
// records cycle through the first `hot` bytes, which stay in the CPUs'
// caches, instead of streaming through the whole capacity (a cold miss on
// every line, for the producer and the consumer, and the kernel's socket
// data they evict). A consumer that falls behind still has the whole
// capacity; one that stops right after such a wrap has at least `hot`
// bytes until it passes the wrap.
class ByteRing {
 public:
  static constexpr size_t kDefaultHot = 256 * 1024;
  // capacity rounded up to a power of two; hot at most the capacity.
  explicit ByteRing(size_t capacity, size_t hot = kDefaultHot);
  ByteRing(const ByteRing&) = delete;
  ByteRing& operator=(const ByteRing&) = delete;

  // Largest payload reserve() accepts.
  size_t max_entry() const { return cap_ / 4; }

  // Producer: room for a payload of n bytes (n <= max_entry()), or nullptr
  // if the consumer has not freed enough yet. commit() publishes it.
  uint8_t* reserve(size_t n);
  void commit();

  // Consumer: the oldest entry (payload and its length) or nullptr if none.
  // pop() releases it.
  const uint8_t* peek(size_t* len);
  void pop();
  bool empty() const;

 private:
  static constexpr uint32_t kWrap = 0xffffffffu;
  std::unique_ptr<uint8_t[]> buf_;
  size_t cap_;
  size_t mask_;
  alignas(64) std::atomic<uint64_t> head_{0};  // consumer position
  alignas(64) std::atomic<uint64_t> tail_{0};  // producer position
  // Producer-private.
  alignas(64) uint64_t head_cache_ = 0;
  uint64_t pending_tail_ = 0;
  size_t hot_;
  // Consumer-private.
  alignas(64) uint64_t tail_cache_ = 0;
  uint64_t peek_next_ = 0;
};

// --- the recorder: rings + writer thread ---------------------------------------

struct RecorderStats {
  uint64_t records_written = 0;  // in the trace, including Meta and Loss
  uint64_t dropped = 0;          // records dropped on queue overflow
  uint64_t waits = 0;            // times a producer waited for room
  // After the trace could not be written (recording_stopped()): records
  // given to the writer but not in the trace, and records taken from the
  // rings afterwards and thrown away.
  uint64_t lost = 0;
};

class Recorder {
 public:
  // One ring of ring_bytes per producer. drop_on_overflow: drop and count
  // records when a ring is full instead of waiting.
  Recorder(std::unique_ptr<trace::Writer> writer, size_t producers, size_t ring_bytes,
           bool drop_on_overflow);
  ~Recorder();  // stops the writer thread if running

  // Before start(): writes a Meta record directly.
  void meta(std::string_view key, std::string_view value);
  void start();
  // Drains every ring, writes the loss record if any, closes the trace.
  // Rethrows a failure of the writer thread.
  void stop();

  // The sink for producer thread i (one thread per sink).
  class Producer : public RecordSink {
   public:
    void record(const trace::Record& r) override;
    void parameter_status(uint64_t session, std::string_view name, std::string_view value,
                          trace::Nanos ts) override;

   private:
    friend class Recorder;
    Recorder* rec_ = nullptr;
    ByteRing* ring_ = nullptr;
    uint64_t waits_ = 0;
  };
  Producer& producer(size_t i) { return *producers_[i]; }

  RecorderStats stats() const;
  // True once the writer thread has failed (the error is rethrown by stop()).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // True once writing the trace failed (a full disk, an I/O error): the
  // writer thread goes on emptying the rings, so producers never wait, and
  // counts what it throws away (stats().lost); the trace keeps every chunk
  // written before, and stop() neither writes nor throws for it.
  bool recording_stopped() const { return stopped_.load(std::memory_order_acquire); }
  // The write's error ("PATH: write: No space left on device") and when it
  // happened (now_ns()); valid once recording_stopped().
  const std::string& stop_error() const { return stop_error_; }
  trace::Nanos stopped_at() const { return stopped_at_; }

 private:
  void run();
  size_t drain(ByteRing& ring, size_t max);
  void write_loss();
  // writer_->write / flush, or once the trace could not be written, count.
  void write(const trace::Record& r);
  void flush();
  void stop_recording(const RuntimeError& e);

  std::unique_ptr<trace::Writer> writer_;
  std::vector<std::unique_ptr<ByteRing>> rings_;
  std::vector<std::unique_ptr<Producer>> producers_;
  bool drop_;
  RecordDecoder decoder_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> server_version_seen_{false};
  std::atomic<uint64_t> dropped_{0};
  uint64_t dropped_written_ = 0;
  std::atomic<bool> stopped_{false};
  std::string stop_error_;          // written before stopped_ is set
  trace::Nanos stopped_at_ = 0;
  std::atomic<uint64_t> lost_{0};
  std::exception_ptr error_;
  bool closed_ = false;
};

}  // namespace tierlab::capture::detail
