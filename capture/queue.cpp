#include "capture/queue_impl.h"

#include "common/error.h"
#include "common/realtime.h"
#include "trace/fields.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <ctime>
#include <type_traits>

namespace tierlab::capture::detail {
namespace {

template <typename T>
inline uint8_t* put(uint8_t* p, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(p, &v, sizeof v);
  return p + sizeof v;
}
inline uint8_t* put_str(uint8_t* p, std::string_view s) {
  p = put<uint32_t>(p, static_cast<uint32_t>(s.size()));
  if (!s.empty()) std::memcpy(p, s.data(), s.size());
  return p + s.size();
}
inline size_t str_size(std::string_view s) { return 4 + s.size(); }

constexpr size_t kHead = 1 + 8 + 8;  // kind, ts, session

inline size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

void sleep_ns(long ns) {
  timespec t{0, ns};
  nanosleep(&t, nullptr);
}

// The record codec, derived from trace/fields.h: each field in its list's
// order, by type. Strings are a u32 length and the bytes; spans a u32 count
// and the elements (plain values copied at once, described structs field by
// field); everything else its bytes.

template <class M>
size_t value_size(const M& v);

// A kind whose fields are all numbers (BlockIo, Loss, ...) is copied whole.
template <class T>
constexpr bool all_scalar() {
  return std::apply(
      [](const auto&... f) {
        return (... && (std::is_arithmetic_v<typename std::decay_t<decltype(f)>::Type> ||
                        std::is_enum_v<typename std::decay_t<decltype(f)>::Type>));
      },
      trace::Fields<T>::list) &&
         !std::is_empty_v<T> && std::is_trivially_copyable_v<T>;
}

template <class T>
size_t struct_size(const T& b) {
  if constexpr (all_scalar<T>()) return sizeof(T);
  size_t n = 0;
  trace::for_each_field<T>([&](const auto& f) { n += value_size(f.get(b)); });
  return n;
}

template <class M>
size_t value_size(const M& v) {
  if constexpr (std::is_same_v<M, std::string_view>) {
    return str_size(v);
  } else if constexpr (trace::is_span_v<M>) {
    using E = std::remove_cv_t<typename M::element_type>;
    if constexpr (std::is_arithmetic_v<E>) {
      return 4 + sizeof(E) * v.size();
    } else {
      size_t n = 4;
      for (const E& e : v) n += struct_size(e);
      return n;
    }
  } else {
    static_assert(std::is_trivially_copyable_v<M>);
    return sizeof(M);
  }
}

template <class M>
uint8_t* put_value(uint8_t* p, const M& v);

template <class T>
uint8_t* put_struct(uint8_t* p, const T& b) {
  if constexpr (all_scalar<T>()) return put<T>(p, b);
  trace::for_each_field<T>([&](const auto& f) { p = put_value(p, f.get(b)); });
  return p;
}

template <class M>
uint8_t* put_value(uint8_t* p, const M& v) {
  if constexpr (std::is_same_v<M, std::string_view>) {
    return put_str(p, v);
  } else if constexpr (trace::is_span_v<M>) {
    using E = std::remove_cv_t<typename M::element_type>;
    p = put<uint32_t>(p, static_cast<uint32_t>(v.size()));
    if constexpr (std::is_arithmetic_v<E>) {
      if (!v.empty()) std::memcpy(p, v.data(), sizeof(E) * v.size());
      return p + sizeof(E) * v.size();
    } else {
      for (const E& e : v) p = put_struct(p, e);
      return p;
    }
  } else {
    return put<M>(p, v);
  }
}

}  // namespace

size_t encoded_size(const trace::Record& r) {
  return kHead + std::visit([](const auto& b) { return struct_size(b); }, r.body);
}

uint8_t* encode(const trace::Record& r, uint8_t* p) {
  p = put<uint8_t>(p, static_cast<uint8_t>(r.body.index()));
  p = put<int64_t>(p, r.ts);
  p = put<uint64_t>(p, r.session);
  return std::visit([p](const auto& b) { return put_struct(p, b); }, r.body);
}

template <class T>
void RecordDecoder::get_struct(In& in, T& b) {
  if constexpr (all_scalar<T>()) {
    b = in.get<T>();
    return;
  }
  trace::for_each_field<T>([&](const auto& f) { get_value(in, f.get(b)); });
}

template <class M>
void RecordDecoder::get_value(In& in, M& v) {
  if constexpr (std::is_same_v<M, std::string_view>) {
    v = in.str();
  } else if constexpr (trace::is_span_v<M>) {
    using E = std::remove_cv_t<typename M::element_type>;
    uint32_t n = in.get<uint32_t>();
    // Every element takes at least one byte: a larger count is not a record
    // encode() wrote and must not size a buffer.
    if (!in.ok || static_cast<size_t>(in.end - in.p) < n) {
      in.ok = false;
      return;
    }
    auto& scratch = std::get<std::vector<E>>(scratch_);
    if (scratch.size() < n) scratch.resize(n);
    if constexpr (std::is_arithmetic_v<E>) {
      if (static_cast<size_t>(in.end - in.p) < sizeof(E) * n) {
        in.ok = false;
        return;
      }
      if (n) std::memcpy(scratch.data(), in.p, sizeof(E) * n);
      in.p += sizeof(E) * n;
    } else {
      for (uint32_t i = 0; i < n; ++i) get_struct(in, scratch[i]);
    }
    v = M(scratch.data(), n);
  } else {
    v = in.get<M>();
  }
}

template <class T>
void RecordDecoder::get_kind(In& in, trace::Record& out) {
  get_struct(in, out.body.emplace<T>());
}

// One decoder per kind, generated from the Body variant.
template <size_t... I>
constexpr auto RecordDecoder::kind_decoders(std::index_sequence<I...>) {
  using Fn = void (RecordDecoder::*)(In&, trace::Record&);
  return std::array<Fn, sizeof...(I)>{&RecordDecoder::get_kind<std::variant_alternative_t<I, trace::Body>>...};
}

bool RecordDecoder::decode(const uint8_t* data, size_t len, trace::Record& out) {
  In in{data, data + len};
  uint8_t kind = in.get<uint8_t>();
  out.ts = in.get<int64_t>();
  out.session = in.get<uint64_t>();
  if (!in.ok || kind >= static_cast<uint8_t>(trace::Kind::Count_)) return false;
  static constexpr auto table = kind_decoders(std::make_index_sequence<std::variant_size_v<trace::Body>>{});
  (this->*table[kind])(in, out);
  return in.ok && in.p == in.end;
}

// --- ByteRing ----------------------------------------------------------------

ByteRing::ByteRing(size_t capacity, size_t hot) {
  cap_ = 4096;
  while (cap_ < capacity) cap_ <<= 1;
  mask_ = cap_ - 1;
  hot_ = std::clamp<size_t>(hot, 4096, cap_);
  buf_.reset(new uint8_t[cap_]);
}

uint8_t* ByteRing::reserve(size_t n) {
  assert(n <= max_entry());
  const size_t need = round8(4 + n);
  uint64_t tail = tail_.load(std::memory_order_relaxed);
  size_t idx = tail & mask_;
  size_t contiguous = cap_ - idx;
  size_t skip = contiguous < need ? contiguous : 0;
  if (!skip && idx >= hot_ && idx < 2 * hot_ && need <= idx) {
    // Past the hot part with everything consumed: back to the start. (With
    // entries still unconsumed the producer goes on through the buffer, so
    // a consumer that has fallen behind keeps the whole capacity; and it
    // stops looking once another `hot` bytes on, rather than reading the
    // consumer's position for every entry while the consumer is busy.)
    if (head_cache_ != tail) head_cache_ = head_.load(std::memory_order_acquire);
    if (head_cache_ == tail) skip = contiguous;
  }
  if (tail + skip + need - head_cache_ > cap_) {
    head_cache_ = head_.load(std::memory_order_acquire);
    if (tail + skip + need - head_cache_ > cap_) return nullptr;
  }
  if (skip) {
    // Invariant: entries start 8-aligned, so at least 8 bytes remain here.
    uint32_t wrap = kWrap;
    std::memcpy(buf_.get() + idx, &wrap, 4);
    tail += skip;
    idx = 0;
  }
  uint32_t len = static_cast<uint32_t>(n);
  std::memcpy(buf_.get() + idx, &len, 4);
  pending_tail_ = tail + need;
  return buf_.get() + idx + 4;
}

void ByteRing::commit() { tail_.store(pending_tail_, std::memory_order_release); }

const uint8_t* ByteRing::peek(size_t* len) {
  uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    if (head == tail_cache_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (head == tail_cache_) return nullptr;
    }
    size_t idx = head & mask_;
    uint32_t n;
    std::memcpy(&n, buf_.get() + idx, 4);
    if (n == kWrap) {
      head += cap_ - idx;
      head_.store(head, std::memory_order_release);
      continue;
    }
    *len = n;
    peek_next_ = head + round8(4 + n);
    return buf_.get() + idx + 4;
  }
}

void ByteRing::pop() { head_.store(peek_next_, std::memory_order_release); }

bool ByteRing::empty() const {
  return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
}

// --- Recorder ------------------------------------------------------------------

namespace {
// Entry tags: a record inline, or a pointer to a heap copy of one that is
// too large for the ring.
constexpr uint8_t kInline = 0;
constexpr uint8_t kHeap = 1;
}  // namespace

Recorder::Recorder(std::unique_ptr<trace::Writer> writer, size_t producers, size_t ring_bytes,
                   bool drop_on_overflow)
    : writer_(std::move(writer)), drop_(drop_on_overflow) {
  for (size_t i = 0; i < producers; ++i) {
    rings_.push_back(std::make_unique<ByteRing>(ring_bytes));
    auto p = std::make_unique<Producer>();
    p->rec_ = this;
    p->ring_ = rings_.back().get();
    producers_.push_back(std::move(p));
  }
}

Recorder::~Recorder() {
  try {
    stop();
  } catch (...) {
  }
}

void Recorder::meta(std::string_view key, std::string_view value) {
  writer_->write(now_ns(), 0, trace::Meta{key, value});
}

void Recorder::start() { thread_ = std::thread([this] { run(); }); }

void Recorder::Producer::record(const trace::Record& r) {
  const size_t n = encoded_size(r);
  ByteRing& ring = *ring_;
  if (n + 1 <= ring.max_entry()) {
    uint8_t* p = ring.reserve(n + 1);
    if (!p) {
      if (rec_->drop_ || rec_->failed()) {
        rec_->dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      // Back-pressure: this event loop waits for the writer.
      ++waits_;
      while (!(p = ring.reserve(n + 1))) {
        if (rec_->failed()) {
          rec_->dropped_.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        sleep_ns(20'000);
      }
    }
    *p = kInline;
    uint8_t* end = encode(r, p + 1);
    (void)end;
    assert(static_cast<size_t>(end - p) == n + 1);
    ring.commit();
    return;
  }
  // Outsized record (a huge query or COPY chunk): a heap copy, passed by pointer.
  auto* heap = new std::vector<uint8_t>(n);
  encode(r, heap->data());
  uint8_t* p;
  while (!(p = ring.reserve(1 + sizeof heap))) {
    if (rec_->drop_ || rec_->failed()) {
      delete heap;
      rec_->dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ++waits_;
    sleep_ns(20'000);
  }
  *p = kHeap;
  std::memcpy(p + 1, &heap, sizeof heap);
  ring.commit();
}

void Recorder::Producer::parameter_status(uint64_t, std::string_view name, std::string_view value,
                                          trace::Nanos ts) {
  if (name != "server_version") return;
  if (rec_->server_version_seen_.exchange(true)) return;
  record(trace::Record{ts, 0, trace::Meta{"server_version", value}});
}

size_t Recorder::drain(ByteRing& ring, size_t max) {
  size_t done = 0;
  size_t len;
  trace::Record r;
  while (done < max) {
    const uint8_t* p = ring.peek(&len);
    if (!p) break;
    if (p[0] == kHeap) {
      std::vector<uint8_t>* heap;
      std::memcpy(&heap, p + 1, sizeof heap);
      std::unique_ptr<std::vector<uint8_t>> own(heap);
      if (!decoder_.decode(heap->data(), heap->size(), r))
        throw RuntimeError("capture queue: undecodable record");
      write(r);
    } else {
      if (!decoder_.decode(p + 1, len - 1, r))
        throw RuntimeError("capture queue: undecodable record");
      write(r);
    }
    ring.pop();
    ++done;
  }
  return done;
}

void Recorder::write_loss() {
  uint64_t d = dropped_.load(std::memory_order_relaxed);
  if (d > dropped_written_) {
    write(trace::Record{now_ns(), 0, trace::Loss{trace::LossKind::QueueOverflow, d - dropped_written_}});
    dropped_written_ = d;
  }
}

void Recorder::write(const trace::Record& r) {
  if (!stopped_.load(std::memory_order_relaxed)) {
    try {
      writer_->write(r);
      return;
    } catch (const RuntimeError& e) {
      stop_recording(e);
    }
  }
  lost_.fetch_add(1, std::memory_order_relaxed);
}

void Recorder::flush() {
  if (stopped_.load(std::memory_order_relaxed)) return;
  try {
    writer_->flush();
  } catch (const RuntimeError& e) {
    stop_recording(e);
  }
}

void Recorder::stop_recording(const RuntimeError& e) {
  // The sink refuses every later append (trace/writer.h): the trace ends
  // with the last chunk written; the records of the chunk that failed are lost.
  stop_error_ = e.what();
  stopped_at_ = now_ns();
  lost_.fetch_add(writer_->records_written() - writer_->records_flushed(), std::memory_order_relaxed);
  stopped_.store(true, std::memory_order_release);
}

void Recorder::run() {
  // Off the forwarding path: the rings wait a few milliseconds rather than
  // have this thread preempt an event loop or a server backend when it wakes.
  run_as_batch_thread();
  constexpr trace::Nanos kFlushEvery = 100'000'000;  // 100 ms
  trace::Nanos last_flush = now_ns();
  bool dirty = false;
  int idle = 0;  // consecutive rounds without records
  try {
    for (;;) {
      const bool stopping = stop_.load(std::memory_order_acquire);
      size_t n = 0;
      for (auto& ring : rings_) n += drain(*ring, 4096);
      write_loss();
      if (n) dirty = true;
      trace::Nanos now = now_ns();
      if (dirty && now - last_flush >= kFlushEvery) {
        flush();
        last_flush = now;
        dirty = false;
      }
      if (n == 0 && stopping) break;  // every ring was empty after stop was seen
      // Work in batches: wake every 5 ms unless the rings are filling
      // faster than that, so the writer does not wake (two context
      // switches, on cores the event loops and the server need) for a
      // trickle of records. The rings hold far more than 5 ms of records.
      // An idle capture (no record for 100 rounds) polls every 10 ms.
      idle = n == 0 ? idle + 1 : 0;
      if (n < 1024) sleep_ns(idle > 100 ? 10'000'000 : 5'000'000);
    }
  } catch (...) {
    error_ = std::current_exception();
    failed_.store(true);
  }
}

void Recorder::stop() {
  if (closed_) return;
  closed_ = true;
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  // Without a thread (never started), drain here.
  for (auto& ring : rings_) drain(*ring, SIZE_MAX);
  write_loss();
  if (stopped_.load()) return;  // the trace ends where writing failed
  try {
    writer_->close();
  } catch (const RuntimeError& e) {
    stop_recording(e);
  }
}

RecorderStats Recorder::stats() const {
  RecorderStats s;
  s.records_written = recording_stopped() ? writer_->records_flushed() : writer_->records_written();
  s.lost = lost_.load();
  s.dropped = dropped_.load();
  for (const auto& p : producers_) s.waits += p->waits_;
  return s;
}

}  // namespace tierlab::capture::detail
