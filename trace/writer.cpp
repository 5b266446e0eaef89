#include "trace/writer.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/fd.h"
#include "trace/crc32c.h"
#include "trace/fields.h"
#include "trace/format.h"

#include <zstd.h>

#include <cassert>
#include <cerrno>
#include <charconv>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace tierlab::trace {

using namespace fmt;

// --- sinks -------------------------------------------------------------------

void MemorySink::append(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), p, p + len);
}

namespace {

class FileSink : public Sink {
 public:
  explicit FileSink(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (fd_ < 0) throw InputError(errno_message(path + ": cannot create trace", errno));
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      int err = errno;
      ::close(fd_);
      throw InputError(errno_message(path + ": stat", err));
    }
    // A device or a FIFO (/dev/null, a pipe to another program) is written
    // as it is: its mode is the system's, and it has nothing to sync.
    regular_ = S_ISREG(st.st_mode);
    // A regular file may have existed with a wider mode: traces hold SQL and
    // parameter values.
    if (regular_ && ::fchmod(fd_, 0600) != 0) {
      int err = errno;
      ::close(fd_);
      throw InputError(errno_message(path + ": chmod 0600", err));
    }
  }
  ~FileSink() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // One write() per call in the normal case. A failed append (a full disk)
  // cuts a regular file back to where it began, so the file ends after the
  // last whole append; the sink then refuses everything (the same error),
  // so nothing can follow a gap.
  void append(const void* data, size_t len) override {
    if (!error_.empty()) throw RuntimeError(error_);
    if (int err = write_all(fd_, data, len)) {
      if (regular_) (void)::ftruncate(fd_, static_cast<off_t>(size_));
      error_ = errno_message(path_ + ": write", err);
      throw RuntimeError(error_);
    }
    size_ += len;
  }

  void sync() override {
    if (!error_.empty()) throw RuntimeError(error_);
    if (regular_ && ::fdatasync(fd_) != 0) throw RuntimeError(errno_message(path_ + ": fdatasync", errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool regular_ = true;
  uint64_t size_ = 0;   // bytes appended
  std::string error_;   // the failed append's error; "" while none failed
};

// Byte equality; short strings compared inline.
inline bool same_bytes(const char* a, const char* b, size_t n) {
  if (n > 16) return std::memcmp(a, b, n) == 0;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// Strings interned file-wide: id 0 is "", ids 1.. are given in order of first
// use. Open addressing over string bytes kept in an arena; lookups and hits
// never allocate.
class InternTable {
 public:
  InternTable() : slots_(1024) {}

  // Returns the id of `s`, or 0 if it is not interned. A string never
  // interned (most statement texts with literals in them) is usually turned
  // away by the filter, without touching the slot table: a random slot is a
  // cache miss per string while the capture shares its CPU with the traffic.
  uint32_t find(std::string_view s, uint64_t h) const {
    if (!maybe_interned(h)) return 0;
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& sl = slots_[i];
      if (sl.id == 0) return 0;
      if (sl.hash == h && sl.len == s.size() && same_bytes(sl.p, s.data(), s.size()))
        return sl.id;
    }
  }

  bool has_room(size_t len) const {
    return len <= kMaxInternLen && count_ < kMaxInternCount && bytes_ + len <= kMaxInternBytes;
  }

  // True if a string of hash `h` was offered before (it is worth interning),
  // else remembers it. A fixed table of fingerprints: a collision interns a
  // string early, an overwritten entry interns it later; neither is wrong.
  // Statement texts with literals in them (simple-protocol workloads) are
  // mostly seen once: they stay inline, and out of writer and reader memory.
  bool seen_before(uint64_t h) {
    uint32_t fp = static_cast<uint32_t>(h >> 32) | 1;
    uint32_t& e = seen_[(h >> 20) & (kSeen - 1)];
    if (e == fp) return true;
    e = fp;
    return false;
  }

  uint32_t insert(std::string_view s, uint64_t h) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    uint32_t id = static_cast<uint32_t>(++count_);
    place(Slot{h, store(s), static_cast<uint32_t>(s.size()), id});
    mark(h);
    bytes_ += s.size();
    return id;
  }

  size_t count() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    const char* p = nullptr;
    uint32_t len = 0;
    uint32_t id = 0;  // 0: empty slot
  };

  void place(const Slot& s) {
    size_t mask = slots_.size() - 1;
    size_t i = s.hash & mask;
    while (slots_[i].id != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    filter_.assign(slots_.size() * kFilterBitsPerSlot / 64, 0);
    for (const Slot& s : old)
      if (s.id != 0) {
        place(s);
        mark(s.hash);
      }
  }

  // One bit per interned hash, in a bitmap of 16 bits per slot (the table is
  // at most half full, so at most 1 in 32 bits is set): bits independent of
  // the slot index.
  size_t filter_bit(uint64_t h) const { return (h >> 40) & (filter_.size() * 64 - 1); }
  bool maybe_interned(uint64_t h) const {
    size_t b = filter_bit(h);
    return (filter_[b >> 6] >> (b & 63)) & 1;
  }
  void mark(uint64_t h) {
    size_t b = filter_bit(h);
    filter_[b >> 6] |= uint64_t{1} << (b & 63);
  }

  const char* store(std::string_view s) {
    if (s.empty()) return "";
    if (block_used_ + s.size() > block_cap_) {
      block_cap_ = std::max<size_t>(64 * 1024, s.size());
      blocks_.push_back(std::make_unique<char[]>(block_cap_));
      block_used_ = 0;
    }
    char* p = blocks_.back().get() + block_used_;
    std::memcpy(p, s.data(), s.size());
    block_used_ += s.size();
    return p;
  }

  // Small enough to stay in cache: a string repeated within the last few
  // thousand distinct strings is caught.
  static constexpr size_t kSeen = 1 << 12;
  static constexpr size_t kFilterBitsPerSlot = 16;
  std::vector<Slot> slots_;
  std::vector<uint64_t> filter_ = std::vector<uint64_t>(1024 * kFilterBitsPerSlot / 64);
  std::vector<uint32_t> seen_ = std::vector<uint32_t>(kSeen);
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t block_used_ = 0, block_cap_ = 0;
  size_t count_ = 0, bytes_ = 0;
};

// A string as written in a record: a varint (even: interned id << 1; odd:
// length << 1 | 1 with the bytes following inline).
struct StrRef {
  uint64_t v = 0;
  std::string_view inline_bytes;
};

// "123", "-7", "0": canonical decimal int64 text, stored as a zigzag varint.
bool canonical_int(std::string_view s, int64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  if (s[i] == '0' && (s.size() > i + 1 || i == 1)) return false;  // "01", "-0"
  if (s.size() - i < 19) {  // at most 18 digits: no overflow possible
    int64_t v = 0;
    for (size_t k = i; k < s.size(); ++k) {
      if (s[k] < '0' || s[k] > '9') return false;
      v = v * 10 + (s[k] - '0');
    }
    out = i ? -v : v;
    return true;
  }
  for (size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Hash of an interned string's bytes, for the in-memory table only (never
// stored). Short strings (statement names, command tags) are the common case:
// eight bytes at a time, one multiply each.
inline uint64_t str_hash(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  h = (h ^ v) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

// Upper bound of the encoded size of one string field, definition included.
constexpr size_t str_bound(std::string_view s) { return s.size() * 2 + 3 * kMaxVarint; }

}  // namespace

void check_compression_level(int level) {
  if (level < kMinCompressionLevel || level > kMaxCompressionLevel)
    throw InputError(std::to_string(level) + ": must be " + std::to_string(kMinCompressionLevel) + " to " +
                     std::to_string(kMaxCompressionLevel) + " (0 writes the trace uncompressed)");
}

std::unique_ptr<Sink> file_sink(const std::string& path) { return std::make_unique<FileSink>(path); }

namespace {
Nanos realtime_now() { return clock_ns(CLOCK_REALTIME); }
}  // namespace

// --- writer --------------------------------------------------------------------

struct Writer::Impl {
  std::unique_ptr<Sink> sink;
  WriterOptions opts;
  ZSTD_CCtx* cctx = nullptr;
  InternTable strings;

  // Uncompressed payload of the open chunk: buf[0, used).
  std::vector<uint8_t> buf;
  size_t used = 0;
  // Header + stored payload of the chunk being written out.
  std::vector<uint8_t> out;

  uint32_t chunk_records = 0;
  Nanos chunk_first_ts = 0;
  uint64_t chunks = 0;
  uint64_t records = 0;  // in the file, BlockQueued included (the End record's count)
  uint64_t written = 0;  // given to write()
  uint64_t flushed = 0;  // of them, in chunks the sink took
  uint64_t bytes = 0;
  bool closed = false;

  DeltaState dstate;  // reset at every chunk start

  void reset_chunk_state() {
    chunk_records = 0;
    dstate.reset();
  }

  uint8_t* ensure(size_t n) {
    if (buf.size() < used + n) buf.resize(std::max(used + n, buf.size() * 2));
    return buf.data() + used;
  }

  // A string's first use is written inline; from its second use on it is
  // interned if there is room (its definition record is emitted at the
  // current position), else it stays inline.
  StrRef ref(uint8_t*& p, std::string_view s) {
    if (s.empty()) return {0, {}};
    uint64_t h = str_hash(s);
    if (uint32_t id = strings.find(s, h)) return {uint64_t{id} << 1, {}};
    if (!strings.has_room(s.size()) || !strings.seen_before(h))
      return {(uint64_t{s.size()} << 1) | 1, s};
    uint32_t id = strings.insert(s, h);
    *p++ = kStringDef;
    p = put_varint(p, s.size());
    std::memcpy(p, s.data(), s.size());
    p += s.size();
    return {uint64_t{id} << 1, {}};
  }

  static uint8_t* put_ref(uint8_t* p, const StrRef& r) {
    p = put_varint(p, r.v);
    if (r.v & 1) {
      std::memcpy(p, r.inline_bytes.data(), r.inline_bytes.size());
      p += r.inline_bytes.size();
    }
    return p;
  }

  // Upper bound of the encoded size of a value as the trace stores it,
  // string definitions included.
  template <class M>
  static size_t value_bound(const M& v, Wire wire) {
    if constexpr (std::is_same_v<M, std::string_view>)
      return wire == Wire::Bytes ? kMaxVarint + v.size() : str_bound(v);
    else if constexpr (std::is_same_v<M, std::span<const Param>>) {
      size_t n = kMaxVarint;
      for (const Param& pa : v) n += 3 * kMaxVarint + pa.value.size();
      return n;
    } else if constexpr (is_span_v<M>)
      return kMaxVarint * (1 + v.size());
    else if constexpr (std::is_same_v<M, char> || std::is_same_v<M, bool>)
      return 1;
    else if constexpr (std::is_same_v<M, double>)
      return 1 + kMaxVarint;
    else
      return kMaxVarint;
  }

  // Upper bound of the encoded size of a record body, string definitions
  // included (the kind byte, time delta and session come on top): its
  // fields', and never below two varints. The bound decides where a chunk
  // ends, so it is part of what makes the same records the same bytes.
  template <class T>
  static size_t body_bound(const T& b) {
    if constexpr (std::is_same_v<T, BlockIo>) {
      return 3 + 5 * kMaxVarint + 2 + 2 * kMaxVarint;  // BlockQueued included
    } else if constexpr (std::is_same_v<T, FileIo>) {
      return str_bound(b.file) + 5 * kMaxVarint;
    } else if constexpr (std::is_same_v<T, Result>) {
      return str_bound(b.tag) + kMaxVarint;
    } else {
      size_t n = 0;
      for_each_field<T>([&](const auto& f) { n += value_bound(f.get(b), f.wire); });
      return std::max<size_t>(n, 2 * kMaxVarint);
    }
  }

  void write(const Record& r) {
    if (closed) throw RuntimeError("trace writer: write after close");
    // One dispatch on the kind; everything below is straight-line code for it.
    std::visit([&](const auto& b) { write_body(r, b); }, r.body);
  }

  template <class T>
  void write_body(const Record& r, const T& b) {
    size_t need = 1 + 2 * kMaxVarint + body_bound(b);
    if (used > 0 && used + need > opts.chunk_bytes) flush_chunk(false);
    uint8_t* const start = ensure(need);
    uint8_t* p = start;
    if (chunk_records == 0) {
      chunk_first_ts = r.ts;
      dstate.prev_ts = r.ts;
    }
    const uint8_t code = static_cast<uint8_t>(r.body.index());
    (void)b;

    // Interned strings first, in field order: their definitions precede
    // the record. (A Bind offers its statement before its portal, as the
    // writer always has: the order decides the strings' ids.)
    StrRef refs[std::max<size_t>(1, string_field_count<T>())];
    size_t nref = 0;
    auto offer = [&](std::string_view v) { refs[nref++] = ref(p, v); };
    if constexpr (std::is_same_v<T, Bind>) {
      offer(b.statement);
      offer(b.portal);
      std::swap(refs[0], refs[1]);
    } else {
      for_each_field<T>([&](const auto& f) {
        if constexpr (std::is_same_v<typename std::decay_t<decltype(f)>::Type, std::string_view>)
          if (f.wire == Wire::Auto) offer(f.get(b));
      });
    }

    if constexpr (std::is_same_v<T, BlockIo>) {
      if (b.queued_ns != 0) p = put_queued(p, b.queued_ns);
    }

    // Kind byte, timestamp delta, session.
    uint8_t* kind_at = p++;
    uint8_t kind = code;
    int64_t delta = static_cast<int64_t>(static_cast<uint64_t>(r.ts) - static_cast<uint64_t>(dstate.prev_ts));
    if (delta == 0)
      kind |= kZeroDelta;
    else
      p = put_varint(p, zigzag(delta));
    dstate.prev_ts = r.ts;
    if (has_session(code)) {
      if (dstate.have_session && r.session == dstate.prev_session) {
        kind |= kSameSession;
      } else {
        p = put_varint(p, r.session);
        dstate.prev_session = r.session;
        dstate.have_session = true;
      }
    }
    *kind_at = kind;

    if constexpr (std::is_same_v<T, BlockIo>) {
      p = put_block(p, r.ts, b, *kind_at);
    } else if constexpr (std::is_same_v<T, FileIo>) {
      p = put_varint(p, static_cast<uint64_t>(b.op) | (uint64_t{b.flags} << 2));
      p = put_varint(p, zigzag(static_cast<int64_t>(b.pid) - dstate.fio_pid));
      dstate.fio_pid = b.pid;
      p = put_ref(p, refs[0]);
      p = put_varint(p, zigzag(static_cast<int64_t>(b.offset - dstate.fio_end)));
      p = put_varint(p, b.length);
      dstate.fio_end = b.offset + b.length;
      p = put_varint(p, zigzag(b.latency_ns));
    } else if constexpr (std::is_same_v<T, Result>) {
      p = put_ref(p, refs[0]);
      p = put_varint(p, b.has_rows ? b.rows + 1 : 0);
    } else if constexpr (static_cast<uint8_t>(kind_of<T>()) >= kFirstExtension) {
      static_assert(std::is_empty_v<T>, "a 1.1 kind with fields writes its body length first");
      *p++ = 0;  // body length: the 1.1 kinds have no fields
    } else {
      size_t next_ref = 0;
      for_each_field<T>([&](const auto& f) { p = put_value(p, f.get(b), f.wire, refs, next_ref); });
    }

    // Invariant: the bound covered everything written.
    assert(static_cast<size_t>(p - start) <= need);
    used += static_cast<size_t>(p - start);
    ++chunk_records;
    ++records;
    ++written;
    if (used >= opts.chunk_bytes) flush_chunk(false);
  }

  // A field by its type (trace/fields.h); strings take the next of the
  // references the interning pass made.
  template <class M>
  static uint8_t* put_value(uint8_t* p, const M& v, Wire wire, const StrRef* refs, size_t& next_ref) {
    if constexpr (std::is_same_v<M, std::string_view>) {
      if (wire == Wire::Bytes) {
        p = put_varint(p, v.size());
        std::memcpy(p, v.data(), v.size());
        return p + v.size();
      }
      return put_ref(p, refs[next_ref++]);
    } else if constexpr (std::is_same_v<M, std::span<const Param>>) {
      p = put_varint(p, v.size());
      for (const Param& pa : v) p = put_param(p, pa);
      return p;
    } else if constexpr (is_span_v<M>) {
      p = put_varint(p, v.size());
      for (auto e : v) p = put_value(p, e, wire, refs, next_ref);
      return p;
    } else if constexpr (std::is_same_v<M, char>) {
      *p++ = static_cast<uint8_t>(v);
      return p;
    } else if constexpr (std::is_enum_v<M>) {
      return put_varint(p, static_cast<uint64_t>(v));
    } else if constexpr (std::is_same_v<M, double>) {
      // Range first: converting a double outside int64_t's range is undefined.
      if (v >= -9007199254740992.0 && v <= 9007199254740992.0 &&
          v == static_cast<double>(static_cast<int64_t>(v)) && !(v == 0 && std::signbit(v))) {
        *p++ = 1;
        return put_varint(p, zigzag(static_cast<int64_t>(v)));
      }
      *p++ = 0;
      std::memcpy(p, &v, 8);
      return p + 8;
    } else if constexpr (std::is_signed_v<M>) {
      return put_varint(p, zigzag(v));
    } else {
      static_assert(std::is_unsigned_v<M>, "a field type the trace file has no coding for");
      return put_varint(p, v);
    }
  }

  // The BlockQueued record before a BlockIo (format 1.2): kind byte,
  // timestamp delta to the queue time, session 0 (a session kind, as every
  // length-prefixed code), body length 0. A record of the chunk and the
  // file, not one given to write().
  uint8_t* put_queued(uint8_t* p, Nanos queued) {
    uint8_t* kind_at = p++;
    uint8_t kind = kBlockQueued;
    int64_t delta = static_cast<int64_t>(static_cast<uint64_t>(queued) - static_cast<uint64_t>(dstate.prev_ts));
    if (delta == 0)
      kind |= kZeroDelta;
    else
      p = put_varint(p, zigzag(delta));
    dstate.prev_ts = queued;
    if (dstate.have_session && dstate.prev_session == 0) {
      kind |= kSameSession;
    } else {
      p = put_varint(p, 0);
      dstate.prev_session = 0;
      dstate.have_session = true;
    }
    *kind_at = kind;
    *p++ = 0;  // body length
    ++chunk_records;
    ++records;
    return p;
  }

  static uint8_t* put_param(uint8_t* p, const Param& pa) {
    int64_t iv;
    if (pa.is_null) {
      uint8_t tag = pa.format == 0 ? kParamNullText : pa.format == 1 ? kParamNullBinary : kParamNullOther;
      p = put_varint(p, tag);
      if (tag == kParamNullOther) p = put_varint(p, zigzag(pa.format));
      return p;
    }
    if (pa.format == 0 && canonical_int(pa.value, iv)) {
      p = put_varint(p, kParamTextInt);
      return put_varint(p, zigzag(iv));
    }
    if (pa.format == 0 || pa.format == 1) {
      p = put_varint(p, (uint64_t{pa.value.size()} << 3) | (pa.format == 0 ? kParamText : kParamBinary));
    } else {
      p = put_varint(p, (uint64_t{pa.value.size()} << 3) | kParamOther);
      p = put_varint(p, zigzag(pa.format));
    }
    std::memcpy(p, pa.value.data(), pa.value.size());
    return p + pa.value.size();
  }

  // Returns the end; sets kBioExt in `kind` when the extension byte is used.
  uint8_t* put_block(uint8_t* p, Nanos ts, const BlockIo& b, uint8_t& kind) {
    uint8_t* h_at = p++;
    const unsigned op = static_cast<uint8_t>(b.op) & kBioOpMask;
    uint8_t h = static_cast<uint8_t>(op);
    uint8_t ext = 0;
    uint8_t* ext_at = p;
    if (b.flags != dstate.bio_flags[op] || b.device != dstate.bio_dev || b.length != dstate.bio_len[op]) {
      kind |= kBioExt;
      ++p;
      if (b.flags != dstate.bio_flags[op]) {
        ext |= kBioNewFlags;
        *p++ = b.flags;
        dstate.bio_flags[op] = b.flags;
      }
      if (b.device != dstate.bio_dev) {
        ext |= kBioNewDevice;
        p = put_varint(p, b.device);
        dstate.bio_dev = b.device;
      }
      if (b.length != dstate.bio_len[op]) {
        ext |= kBioNewLength;
        p = put_varint(p, b.length);
        dstate.bio_len[op] = b.length;
      }
      *ext_at = ext;
    }
    int32_t last_pid = dstate.bio_pids.front();
    int slot = dstate.bio_pids.touch(b.pid);
    if (slot < 0) {
      h |= kBioPidNew << kBioPidShift;
      p = put_varint(p, zigzag(static_cast<int64_t>(b.pid) - last_pid));
    } else {
      h |= static_cast<uint8_t>(slot << kBioPidShift);
    }
    int64_t delta = static_cast<int64_t>(b.offset - dstate.bio_end);
    unsigned shift = 0;
    if (delta % 4096 == 0) {
      h |= 2 << kBioUnitShift;
      shift = 12;
    } else if (delta % 512 == 0) {
      h |= 1 << kBioUnitShift;
      shift = 9;
    }
    p = put_varint(p, zigzag(delta >> shift));
    dstate.bio_end = b.offset + b.length;
    p = put_varint(p, zigzag(static_cast<int64_t>(static_cast<uint64_t>(b.complete_ns) -
                                                  static_cast<uint64_t>(ts))));
    *h_at = h;
    return p;
  }

  void flush_chunk(bool end) {
    if (used == 0 && !end) return;
    if (end) {
      // End record: counts, so a reader can tell a complete trace.
      uint8_t* p = ensure(1 + 3 * kMaxVarint);
      if (chunk_records == 0) {
        chunk_first_ts = dstate.prev_ts;
      }
      *p++ = kEnd | kZeroDelta;
      p = put_varint(p, records);
      p = put_varint(p, strings.count());
      p = put_varint(p, chunks + 1);
      used = static_cast<size_t>(p - buf.data());
    }
    size_t cap = kChunkHeaderLen + ZSTD_compressBound(used);
    if (out.size() < cap) out.resize(cap);
    uint8_t* hdr = out.data();
    uint8_t* payload = hdr + kChunkHeaderLen;
    uint32_t flags = end ? kChunkEnd : 0;
    size_t stored = used;
    bool compressed = false;
    if (opts.compression_level != 0) {
      size_t n = ZSTD_compressCCtx(cctx, payload, cap - kChunkHeaderLen, buf.data(), used,
                                   opts.compression_level);
      if (!ZSTD_isError(n) && n < used) {
        stored = n;
        compressed = true;
        flags |= kChunkZstd;
      }
    }
    if (!compressed) std::memcpy(payload, buf.data(), used);
    put_u32(hdr + 0, kChunkMagic);
    put_u32(hdr + 4, flags);
    put_u32(hdr + 8, static_cast<uint32_t>(stored));
    put_u32(hdr + 12, static_cast<uint32_t>(used));
    put_u32(hdr + 16, chunk_records);
    put_u32(hdr + 20, 0);
    put_i64(hdr + 24, chunk_first_ts);
    put_u32(hdr + 32, crc32c(crc32c(0, hdr, 32), payload, stored));
    put_u32(hdr + 36, crc32c(0, hdr, 36));
    // One append, hence one write(): a writer killed at any moment leaves
    // every earlier chunk intact.
    sink->append(hdr, kChunkHeaderLen + stored);
    bytes += kChunkHeaderLen + stored;
    flushed += chunk_records;
    ++chunks;
    used = 0;
    reset_chunk_state();
  }
};

Writer::Writer(std::unique_ptr<Sink> sink, WriterOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->sink = std::move(sink);
  if (opts.chunk_bytes < 1024) opts.chunk_bytes = 1024;
  if (opts.chunk_bytes > kMaxRawLen / 2) opts.chunk_bytes = kMaxRawLen / 2;
  impl_->opts = opts;
  impl_->buf.resize(opts.chunk_bytes + 64 * 1024);
  impl_->out.resize(kChunkHeaderLen + ZSTD_compressBound(impl_->buf.size()));
  if (opts.compression_level != 0) {
    impl_->cctx = ZSTD_createCCtx();
    if (!impl_->cctx) throw RuntimeError("zstd: cannot create a compression context");
  }

  Nanos mono = opts.start_mono_ns ? *opts.start_mono_ns : now_ns();
  Nanos offset;
  if (opts.realtime_offset_ns) {
    offset = *opts.realtime_offset_ns;
  } else {
    Nanos m0 = now_ns();
    Nanos rt = realtime_now();
    Nanos m1 = now_ns();
    offset = rt - (m0 + (m1 - m0) / 2);
  }
  uint8_t h[kHeaderLen];
  std::memcpy(h, kFileMagic, 8);
  put_u16(h + 8, kMajor);
  put_u16(h + 10, kMinor);
  put_u32(h + 12, kHeaderLen);
  put_i64(h + 16, mono);
  put_i64(h + 24, offset);
  put_u32(h + 32, crc32c(0, h, 32));
  impl_->sink->append(h, sizeof h);
  impl_->bytes = sizeof h;
}

Writer::~Writer() {
  try {
    if (impl_ && !impl_->closed) close();
  } catch (...) {
  }
  if (impl_ && impl_->cctx) ZSTD_freeCCtx(impl_->cctx);
}

void Writer::write(const Record& r) { impl_->write(r); }

void Writer::flush() {
  if (impl_->closed) return;
  impl_->flush_chunk(false);
}

void Writer::close() {
  if (impl_->closed) return;
  impl_->closed = true;
  impl_->flush_chunk(true);
  impl_->sink->sync();
}

uint64_t Writer::records_written() const { return impl_->written; }
uint64_t Writer::records_flushed() const { return impl_->flushed; }
uint64_t Writer::bytes_written() const { return impl_->bytes; }

std::unique_ptr<Writer> open_writer(const std::string& path, WriterOptions opts) {
  return std::make_unique<Writer>(file_sink(path), opts);
}

}  // namespace tierlab::trace
