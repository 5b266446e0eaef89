#include "capture/queue_impl.h"

#include "common/error.h"
#include "common/realtime.h"

#include <algorithm>
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

constexpr size_t kHead = 1 + 8 + 8;  // kind, ts, session

inline size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

void sleep_ns(long ns) {
  timespec t{0, ns};
  nanosleep(&t, nullptr);
}

}  // namespace

size_t encoded_size(const trace::Record& r) {
  return kHead + std::visit(
                     [](const auto& b) -> size_t {
                       using T = std::decay_t<decltype(b)>;
                       if constexpr (std::is_same_v<T, trace::SessionBegin>)
                         return str_size(b.user) + str_size(b.database) +
                                str_size(b.application_name) + str_size(b.client_addr) + 8;
                       else if constexpr (std::is_same_v<T, trace::SessionEnd>) return 1;
                       else if constexpr (std::is_same_v<T, trace::Query>) return str_size(b.sql);
                       else if constexpr (std::is_same_v<T, trace::Parse>)
                         return str_size(b.statement) + str_size(b.sql) + 4 + 4 * b.param_types.size();
                       else if constexpr (std::is_same_v<T, trace::Bind>) {
                         size_t n = str_size(b.portal) + str_size(b.statement) + 4;
                         for (const auto& p : b.params) n += 3 + str_size(p.value);
                         return n + 4 + 2 * b.result_formats.size();
                       } else if constexpr (std::is_same_v<T, trace::Execute>)
                         return str_size(b.portal) + 4;
                       else if constexpr (std::is_same_v<T, trace::Describe> ||
                                          std::is_same_v<T, trace::Close>)
                         return 1 + str_size(b.name);
                       else if constexpr (std::is_empty_v<T>)  // Sync, Flush, Suspended, ...
                         return 0;
                       else if constexpr (std::is_same_v<T, trace::CopyData>)
                         return 1 + str_size(b.data);
                       else if constexpr (std::is_same_v<T, trace::CopyDone>) return 1;
                       else if constexpr (std::is_same_v<T, trace::CopyFail>)
                         return str_size(b.message);
                       else if constexpr (std::is_same_v<T, trace::Result>)
                         return str_size(b.tag) + 1 + 8;
                       else if constexpr (std::is_same_v<T, trace::Error>)
                         return str_size(b.sqlstate) + str_size(b.severity) + str_size(b.message);
                       else if constexpr (std::is_same_v<T, trace::Ready>) return 1;
                       else if constexpr (std::is_same_v<T, trace::Meta>)
                         return str_size(b.key) + str_size(b.value);
                       else if constexpr (std::is_same_v<T, trace::Loss>) return 1 + 8;
                       else if constexpr (std::is_same_v<T, trace::Sample>)
                         return str_size(b.name) + 8;
                       else return sizeof(T);  // BlockIo, FileIo: not produced by capture proxy
                     },
                     r.body);
}

uint8_t* encode(const trace::Record& r, uint8_t* p) {
  p = put<uint8_t>(p, static_cast<uint8_t>(r.body.index()));
  p = put<int64_t>(p, r.ts);
  p = put<uint64_t>(p, r.session);
  return std::visit(
      [p](const auto& b) mutable -> uint8_t* {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, trace::SessionBegin>) {
          p = put_str(p, b.user);
          p = put_str(p, b.database);
          p = put_str(p, b.application_name);
          p = put_str(p, b.client_addr);
          p = put<int32_t>(p, b.backend_pid);
          p = put<uint32_t>(p, b.flags);
        } else if constexpr (std::is_same_v<T, trace::SessionEnd>) {
          p = put<uint8_t>(p, static_cast<uint8_t>(b.reason));
        } else if constexpr (std::is_same_v<T, trace::Query>) {
          p = put_str(p, b.sql);
        } else if constexpr (std::is_same_v<T, trace::Parse>) {
          p = put_str(p, b.statement);
          p = put_str(p, b.sql);
          p = put<uint32_t>(p, static_cast<uint32_t>(b.param_types.size()));
          if (!b.param_types.empty()) std::memcpy(p, b.param_types.data(), 4 * b.param_types.size());
          p += 4 * b.param_types.size();
        } else if constexpr (std::is_same_v<T, trace::Bind>) {
          p = put_str(p, b.portal);
          p = put_str(p, b.statement);
          p = put<uint32_t>(p, static_cast<uint32_t>(b.params.size()));
          for (const auto& prm : b.params) {
            p = put<int16_t>(p, prm.format);
            p = put<uint8_t>(p, prm.is_null ? 1 : 0);
            p = put_str(p, prm.value);
          }
          p = put<uint32_t>(p, static_cast<uint32_t>(b.result_formats.size()));
          if (!b.result_formats.empty())
            std::memcpy(p, b.result_formats.data(), 2 * b.result_formats.size());
          p += 2 * b.result_formats.size();
        } else if constexpr (std::is_same_v<T, trace::Execute>) {
          p = put_str(p, b.portal);
          p = put<uint32_t>(p, b.max_rows);
        } else if constexpr (std::is_same_v<T, trace::Describe> || std::is_same_v<T, trace::Close>) {
          p = put<char>(p, b.target);
          p = put_str(p, b.name);
        } else if constexpr (std::is_empty_v<T>) {
        } else if constexpr (std::is_same_v<T, trace::CopyData>) {
          p = put<uint8_t>(p, static_cast<uint8_t>(b.dir));
          p = put_str(p, b.data);
        } else if constexpr (std::is_same_v<T, trace::CopyDone>) {
          p = put<uint8_t>(p, static_cast<uint8_t>(b.dir));
        } else if constexpr (std::is_same_v<T, trace::CopyFail>) {
          p = put_str(p, b.message);
        } else if constexpr (std::is_same_v<T, trace::Result>) {
          p = put_str(p, b.tag);
          p = put<uint8_t>(p, b.has_rows ? 1 : 0);
          p = put<uint64_t>(p, b.rows);
        } else if constexpr (std::is_same_v<T, trace::Error>) {
          p = put_str(p, b.sqlstate);
          p = put_str(p, b.severity);
          p = put_str(p, b.message);
        } else if constexpr (std::is_same_v<T, trace::Ready>) {
          p = put<char>(p, b.status);
        } else if constexpr (std::is_same_v<T, trace::Meta>) {
          p = put_str(p, b.key);
          p = put_str(p, b.value);
        } else if constexpr (std::is_same_v<T, trace::Loss>) {
          p = put<uint8_t>(p, static_cast<uint8_t>(b.what));
          p = put<uint64_t>(p, b.count);
        } else if constexpr (std::is_same_v<T, trace::Sample>) {
          p = put_str(p, b.name);
          p = put<double>(p, b.value);
        } else {
          std::memcpy(p, &b, sizeof(T));  // trivially copyable, no views
          p += sizeof(T);
        }
        return p;
      },
      r.body);
}

bool RecordDecoder::decode(const uint8_t* data, size_t len, trace::Record& out) {
  In in{data, data + len};
  uint8_t kind = in.get<uint8_t>();
  out.ts = in.get<int64_t>();
  out.session = in.get<uint64_t>();
  if (!in.ok) return false;
  switch (static_cast<trace::Kind>(kind)) {
    case trace::Kind::SessionBegin: {
      trace::SessionBegin b;
      b.user = in.str();
      b.database = in.str();
      b.application_name = in.str();
      b.client_addr = in.str();
      b.backend_pid = in.get<int32_t>();
      b.flags = in.get<uint32_t>();
      out.body = b;
      break;
    }
    case trace::Kind::SessionEnd:
      out.body = trace::SessionEnd{static_cast<trace::EndReason>(in.get<uint8_t>())};
      break;
    case trace::Kind::Query:
      out.body = trace::Query{in.str()};
      break;
    case trace::Kind::Parse: {
      trace::Parse b;
      b.statement = in.str();
      b.sql = in.str();
      uint32_t n = in.get<uint32_t>();
      if (!in.ok || static_cast<size_t>(in.end - in.p) < 4ull * n) return false;
      if (types_.size() < n) types_.resize(n);
      std::memcpy(types_.data(), in.p, 4ull * n);
      in.p += 4ull * n;
      b.param_types = std::span<const uint32_t>(types_.data(), n);
      out.body = b;
      break;
    }
    case trace::Kind::Bind: {
      trace::Bind b;
      b.portal = in.str();
      b.statement = in.str();
      uint32_t n = in.get<uint32_t>();
      if (!in.ok || static_cast<size_t>(in.end - in.p) < 7ull * n) return false;
      if (params_.size() < n) params_.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        params_[i].format = in.get<int16_t>();
        params_[i].is_null = in.get<uint8_t>() != 0;
        params_[i].value = in.str();
      }
      uint32_t nf = in.get<uint32_t>();
      if (!in.ok || static_cast<size_t>(in.end - in.p) < 2ull * nf) return false;
      if (formats_.size() < nf) formats_.resize(nf);
      std::memcpy(formats_.data(), in.p, 2ull * nf);
      in.p += 2ull * nf;
      b.params = std::span<const trace::Param>(params_.data(), n);
      b.result_formats = std::span<const int16_t>(formats_.data(), nf);
      out.body = b;
      break;
    }
    case trace::Kind::Execute: {
      trace::Execute b;
      b.portal = in.str();
      b.max_rows = in.get<uint32_t>();
      out.body = b;
      break;
    }
    case trace::Kind::Describe: {
      trace::Describe b;
      b.target = in.get<char>();
      b.name = in.str();
      out.body = b;
      break;
    }
    case trace::Kind::Close: {
      trace::Close b;
      b.target = in.get<char>();
      b.name = in.str();
      out.body = b;
      break;
    }
    case trace::Kind::Sync: out.body = trace::Sync{}; break;
    case trace::Kind::Flush: out.body = trace::Flush{}; break;
    case trace::Kind::Suspended: out.body = trace::Suspended{}; break;
    case trace::Kind::EmptyQuery: out.body = trace::EmptyQuery{}; break;
    case trace::Kind::CopyData: {
      trace::CopyData b;
      b.dir = static_cast<trace::CopyDir>(in.get<uint8_t>());
      b.data = in.str();
      out.body = b;
      break;
    }
    case trace::Kind::CopyDone:
      out.body = trace::CopyDone{static_cast<trace::CopyDir>(in.get<uint8_t>())};
      break;
    case trace::Kind::CopyFail: out.body = trace::CopyFail{in.str()}; break;
    case trace::Kind::Result: {
      trace::Result b;
      b.tag = in.str();
      b.has_rows = in.get<uint8_t>() != 0;
      b.rows = in.get<uint64_t>();
      out.body = b;
      break;
    }
    case trace::Kind::Error: {
      trace::Error b;
      b.sqlstate = in.str();
      b.severity = in.str();
      b.message = in.str();
      out.body = b;
      break;
    }
    case trace::Kind::Ready: out.body = trace::Ready{in.get<char>()}; break;
    case trace::Kind::Meta: {
      trace::Meta b;
      b.key = in.str();
      b.value = in.str();
      out.body = b;
      break;
    }
    case trace::Kind::Loss: {
      trace::Loss b;
      b.what = static_cast<trace::LossKind>(in.get<uint8_t>());
      b.count = in.get<uint64_t>();
      out.body = b;
      break;
    }
    case trace::Kind::Sample: {
      trace::Sample b;
      b.name = in.str();
      b.value = in.get<double>();
      out.body = b;
      break;
    }
    case trace::Kind::BlockIo: out.body = in.get<trace::BlockIo>(); break;
    case trace::Kind::FileIo: {
      // Holds a view: never encoded by capture; refuse rather than misread.
      return false;
    }
    default:
      return false;
  }
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
  writer_->write(trace::monotonic_now(), 0, trace::Meta{key, value});
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
      writer_->write(r);
    } else {
      if (!decoder_.decode(p + 1, len - 1, r))
        throw RuntimeError("capture queue: undecodable record");
      writer_->write(r);
    }
    ring.pop();
    ++done;
  }
  return done;
}

void Recorder::write_loss() {
  uint64_t d = dropped_.load(std::memory_order_relaxed);
  if (d > dropped_written_) {
    writer_->write(trace::monotonic_now(), 0,
                   trace::Loss{trace::LossKind::QueueOverflow, d - dropped_written_});
    dropped_written_ = d;
  }
}

void Recorder::run() {
  // Off the forwarding path: the rings wait a few milliseconds rather than
  // have this thread preempt an event loop or a server backend when it wakes.
  run_as_batch_thread();
  constexpr trace::Nanos kFlushEvery = 100'000'000;  // 100 ms
  trace::Nanos last_flush = trace::monotonic_now();
  bool dirty = false;
  int idle = 0;  // consecutive rounds without records
  try {
    for (;;) {
      const bool stopping = stop_.load(std::memory_order_acquire);
      size_t n = 0;
      for (auto& ring : rings_) n += drain(*ring, 4096);
      write_loss();
      if (n) dirty = true;
      trace::Nanos now = trace::monotonic_now();
      if (dirty && now - last_flush >= kFlushEvery) {
        writer_->flush();
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
  writer_->close();
}

RecorderStats Recorder::stats() const {
  RecorderStats s;
  s.records_written = writer_->records_written();
  s.dropped = dropped_.load();
  for (const auto& p : producers_) s.waits += p->waits_;
  return s;
}

}  // namespace tierlab::capture::detail
