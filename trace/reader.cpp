#include "trace/reader.h"

#include "common/error.h"
#include "trace/crc32c.h"
#include "trace/fields.h"
#include "trace/format.h"

#include <zstd.h>

#include <cerrno>
#include <charconv>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <cstring>
#include <unordered_map>

namespace tierlab::trace {

using namespace fmt;

// --- sources -------------------------------------------------------------------

namespace {

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(errno_message(path, errno));
    struct stat st;
    if (::fstat(fd_, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd_);
      throw InputError(path + ": is a directory, not a trace file");
    }
  }
  ~FileSource() override { ::close(fd_); }

  size_t read(void* buf, size_t len) override {
    for (;;) {
      ssize_t n = ::read(fd_, buf, len);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) throw RuntimeError(errno_message(path_ + ": read", errno));
    }
  }
  std::string name() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

class MemorySource : public Source {
 public:
  MemorySource(std::vector<uint8_t> bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {}
  size_t read(void* buf, size_t len) override {
    size_t n = std::min(len, bytes_.size() - pos_);
    if (n == 0) return 0;
    std::memcpy(buf, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  std::string name() const override { return name_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
  std::string name_;
};

// Interned strings of the reader; views stay valid until it is destroyed.
class StringArena {
 public:
  std::string_view add(const uint8_t* p, size_t n) {
    if (n == 0) return {};
    if (used_ + n > cap_) {
      cap_ = std::max<size_t>(64 * 1024, n);
      blocks_.push_back(std::make_unique<char[]>(cap_));
      used_ = 0;
    }
    char* dst = blocks_.back().get() + used_;
    std::memcpy(dst, p, n);
    used_ += n;
    return {dst, n};
  }

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t used_ = 0, cap_ = 0;
};

}  // namespace

std::unique_ptr<Source> file_source(const std::string& path) {
  return std::make_unique<FileSource>(path);
}

std::unique_ptr<Source> memory_source(std::vector<uint8_t> bytes, std::string name) {
  return std::make_unique<MemorySource>(std::move(bytes), std::move(name));
}

// --- reader --------------------------------------------------------------------

struct Reader::Impl {
  std::unique_ptr<Source> src;
  std::string name;
  Header header;
  ReadStats stats;
  ZSTD_DCtx* dctx = nullptr;

  uint64_t pos = 0;  // file offset of the next unread byte
  std::vector<uint8_t> stored, raw;

  // The current chunk.
  const uint8_t* p = nullptr;
  const uint8_t* end = nullptr;
  uint64_t chunk_index = 0;  // of the current chunk, from 0
  uint64_t chunk_offset = 0;
  uint32_t chunk_expected = 0;
  uint32_t chunk_seen = 0;
  bool chunk_is_end = false;
  bool in_chunk = false;
  bool done = false;
  uint64_t pending_def_bytes = 0;
  uint64_t file_records = 0;  // records in the file, BlockQueued included
  // The time of a BlockQueued record, for the BlockIo right after it.
  Nanos pending_queued = 0;

  DeltaState dstate;  // reset at every chunk start

  std::vector<std::string_view> strings{std::string_view{}};  // id 0 = ""
  StringArena arena;

  // Scratch behind the spans of the last record.
  std::tuple<std::vector<uint32_t>, std::vector<int16_t>> spans;
  std::vector<Param> params;
  std::vector<char> digits;

  ~Impl() {
    if (dctx) ZSTD_freeDCtx(dctx);
  }

  size_t read_full(void* buf, size_t len) {
    size_t got = 0;
    auto* b = static_cast<uint8_t*>(buf);
    while (got < len) {
      size_t n = src->read(b + got, len - got);
      if (n == 0) break;
      got += n;
    }
    pos += got;
    return got;
  }

  [[noreturn]] void corrupt(const std::string& why) const {
    throw InputError(name + ": chunk " + std::to_string(chunk_index) + " at byte " +
                     std::to_string(chunk_offset) + ": " + why);
  }

  void read_header() {
    uint8_t pre[kHeaderPrefix];
    size_t n = read_full(pre, sizeof pre);
    if (n == 0) throw InputError(name + ": not a tierlab trace (empty file)");
    if (std::memcmp(pre, kFileMagic, std::min<size_t>(n, 8)) != 0)
      throw InputError(name + ": not a tierlab trace (no tierlab magic at byte 0)");
    if (n < kHeaderPrefix)
      throw InputError(name + ": truncated header (" + std::to_string(n) + " of " +
                       std::to_string(kHeaderLen) + " bytes)");
    header.major = get_u16(pre + 8);
    header.minor = get_u16(pre + 10);
    uint32_t hlen = get_u32(pre + 12);
    if (header.major != kMajor)
      throw InputError(name + ": unsupported trace version " + std::to_string(header.major) + "." +
                       std::to_string(header.minor) + " (this tierlab reads 1.x)");
    if (hlen < kHeaderLen || hlen > kMaxHeaderLen)
      throw InputError(name + ": not a tierlab trace (header length " + std::to_string(hlen) + ")");
    std::vector<uint8_t> h(hlen);
    std::memcpy(h.data(), pre, kHeaderPrefix);
    n = read_full(h.data() + kHeaderPrefix, hlen - kHeaderPrefix);
    if (n < hlen - kHeaderPrefix)
      throw InputError(name + ": truncated header (" + std::to_string(kHeaderPrefix + n) + " of " +
                       std::to_string(hlen) + " bytes)");
    if (crc32c(0, h.data(), hlen - 4) != get_u32(h.data() + hlen - 4))
      throw InputError(name + ": header CRC mismatch");
    header.start_mono_ns = get_i64(h.data() + 16);
    header.realtime_offset_ns = get_i64(h.data() + 24);
    stats.bytes = hlen;
  }

  void reset_chunk_state() {
    dstate.reset();
    chunk_seen = 0;
    pending_queued = 0;
  }

  // Reads a chunk's stored bytes into `stored`, growing it as they arrive
  // rather than by the length the header claims: a damaged or hostile header
  // (up to 2 GiB) costs no more memory than the file holds. Returns the
  // bytes read (fewer than len at end of input).
  size_t read_stored(uint32_t len) {
    constexpr size_t kStep = 16u << 20;
    size_t have = 0;
    while (have < len) {
      size_t want = std::min<size_t>(len - have, kStep);
      if (stored.size() < have + want) stored.resize(have + want);
      size_t got = read_full(stored.data() + have, want);
      have += got;
      if (got < want) break;
    }
    return have;
  }

  // Loads the next chunk; false at end of input (clean, or an incomplete
  // last chunk, which is counted in recovered_tail_bytes).
  bool load_chunk() {
    if (done) return false;
    uint8_t hdr[kChunkHeaderLen];
    uint64_t at = pos;
    size_t n = read_full(hdr, sizeof hdr);
    if (stats.terminated) {
      done = true;
      if (n > 0)
        throw InputError(name + ": data after the end record at byte " + std::to_string(at));
      return false;
    }
    if (n < kChunkHeaderLen) {
      stats.recovered_tail_bytes = n;
      done = true;
      return false;
    }
    chunk_index = stats.chunks;
    chunk_offset = at;
    if (get_u32(hdr) != kChunkMagic) corrupt("no chunk magic");
    if (crc32c(0, hdr, 36) != get_u32(hdr + 36)) corrupt("chunk header CRC mismatch");
    uint32_t flags = get_u32(hdr + 4);
    uint32_t stored_len = get_u32(hdr + 8);
    uint32_t raw_len = get_u32(hdr + 12);
    chunk_expected = get_u32(hdr + 16);
    Nanos first_ts = get_i64(hdr + 24);
    if (flags & kChunkMustUnderstand & ~kChunkKnownFlags) corrupt("unknown chunk flags");
    bool zstd = flags & kChunkZstd;
    if (raw_len > kMaxRawLen || (!zstd && stored_len != raw_len) ||
        (zstd && stored_len > ZSTD_compressBound(raw_len)))
      corrupt("impossible chunk lengths");
    n = read_stored(stored_len);
    if (n < stored_len) {
      stats.recovered_tail_bytes = kChunkHeaderLen + n;
      done = true;
      return false;
    }
    uint32_t crc = crc32c(crc32c(0, hdr, 32), stored.data(), stored_len);
    if (crc != get_u32(hdr + 32)) corrupt("CRC mismatch");
    if (zstd) {
      if (raw.size() < raw_len) raw.resize(raw_len);
      size_t r = ZSTD_decompressDCtx(dctx, raw.data(), raw_len, stored.data(), stored_len);
      if (ZSTD_isError(r)) corrupt(std::string("undecodable payload (zstd: ") + ZSTD_getErrorName(r) + ")");
      if (r != raw_len) corrupt("undecodable payload (size differs from the chunk header)");
      p = raw.data();
    } else {
      p = stored.data();
    }
    end = p + raw_len;
    chunk_is_end = flags & kChunkEnd;
    in_chunk = true;
    ++stats.chunks;
    stats.bytes += kChunkHeaderLen + stored_len;
    reset_chunk_state();
    dstate.prev_ts = first_ts;
    return true;
  }

  // --- decoding primitives (bounds-checked) --------------------------------
  uint64_t varint() {
    if (p < end && *p < 0x80) return *p++;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      if (p == end) corrupt("undecodable payload (record cut short)");
      uint8_t b = *p++;
      v |= uint64_t{b & 0x7fu} << shift;
      if (b < 0x80) return v;
    }
    corrupt("undecodable payload (varint too long)");
  }
  uint8_t byte() {
    if (p == end) corrupt("undecodable payload (record cut short)");
    return *p++;
  }
  std::string_view bytes(uint64_t n) {
    if (n > static_cast<uint64_t>(end - p)) corrupt("undecodable payload (length past the chunk end)");
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  std::string_view str() {
    uint64_t v = varint();
    if (v & 1) return bytes(v >> 1);
    uint64_t id = v >> 1;
    if (id >= strings.size()) corrupt("undecodable payload (string " + std::to_string(id) + " not defined)");
    return strings[id];
  }
  uint64_t count_field() {
    uint64_t n = varint();
    // Every element takes at least one byte: a larger count is corrupt and
    // must not size a buffer.
    if (n > static_cast<uint64_t>(end - p)) corrupt("undecodable payload (count past the chunk end)");
    return n;
  }

  Param param(char*& digits_at) {
    uint64_t h = varint();
    Param pa;
    switch (h & 7) {
      case kParamText: pa.format = 0; pa.value = bytes(h >> 3); break;
      case kParamBinary: pa.format = 1; pa.value = bytes(h >> 3); break;
      case kParamNullText: pa.format = 0; pa.is_null = true; break;
      case kParamNullBinary: pa.format = 1; pa.is_null = true; break;
      case kParamTextInt: {
        int64_t v = unzigzag(varint());
        auto [e, ec] = std::to_chars(digits_at, digits_at + 24, v);
        (void)ec;
        pa.value = std::string_view(digits_at, static_cast<size_t>(e - digits_at));
        digits_at = e;
        break;
      }
      case kParamOther:
        pa.format = static_cast<int16_t>(unzigzag(varint()));
        pa.value = bytes(h >> 3);
        break;
      case kParamNullOther:
        pa.format = static_cast<int16_t>(unzigzag(varint()));
        pa.is_null = true;
        break;
      default: corrupt("undecodable payload (parameter tag " + std::to_string(h & 7) + ")");
    }
    return pa;
  }

  void block(uint8_t kb, Nanos ts, BlockIo& b) {
    uint8_t h = byte();
    const unsigned op = h & kBioOpMask;
    b.op = static_cast<IoOp>(op);
    if (kb & kBioExt) {
      uint8_t ext = byte();
      if (ext & ~kBioExtKnown) corrupt("undecodable payload (block I/O extension bits)");
      if (ext & kBioNewFlags) dstate.bio_flags[op] = byte();
      if (ext & kBioNewDevice) dstate.bio_dev = static_cast<uint32_t>(varint());
      if (ext & kBioNewLength) dstate.bio_len[op] = static_cast<uint32_t>(varint());
    }
    int slot = (h & kBioPidMask) >> kBioPidShift;
    if (slot == kBioPidNew) {
      int32_t pid = static_cast<int32_t>(dstate.bio_pids.front() + unzigzag(varint()));
      dstate.bio_pids.touch(pid);
    } else {
      dstate.bio_pids.take(slot);
    }
    unsigned unit = (h & kBioUnitMask) >> kBioUnitShift;
    if (unit == 3) corrupt("undecodable payload (block offset unit)");
    unsigned shift = unit == 2 ? 12 : unit == 1 ? 9 : 0;
    int64_t delta = unzigzag(varint());
    b.offset = dstate.bio_end + (static_cast<uint64_t>(delta) << shift);
    b.flags = dstate.bio_flags[op];
    b.device = dstate.bio_dev;
    b.pid = dstate.bio_pids.front();
    b.length = dstate.bio_len[op];
    dstate.bio_end = b.offset + b.length;
    b.complete_ns = static_cast<Nanos>(static_cast<uint64_t>(ts) + static_cast<uint64_t>(unzigzag(varint())));
  }

  void end_record() {
    uint64_t records = varint();
    uint64_t nstrings = varint();
    uint64_t chunks = varint();
    if (!chunk_is_end) corrupt("end record in a chunk not flagged as the last");
    if (p != end) corrupt("records after the end record");
    if (records != file_records || nstrings + 1 != strings.size() || chunks != stats.chunks)
      corrupt("end record counts (" + std::to_string(records) + " records, " +
              std::to_string(chunks) + " chunks) differ from the trace (" +
              std::to_string(file_records) + " records, " + std::to_string(stats.chunks) +
              " chunks)");
    stats.terminated = true;
  }

  bool next(Record& out) {
    for (;;) {
      if (p == end) {
        if (in_chunk) {
          if (chunk_seen != chunk_expected)
            corrupt("record count " + std::to_string(chunk_seen) + " differs from the chunk header (" +
                    std::to_string(chunk_expected) + ")");
          if (chunk_is_end && !stats.terminated) corrupt("last chunk without an end record");
          in_chunk = false;
        }
        if (!load_chunk()) return false;
        continue;
      }
      const uint8_t* rec = p;
      uint8_t kb = *p++;
      uint8_t code = kb & kCodeMask;
      if (code == kStringDef) {
        std::string_view s = bytes(varint());
        if (s.empty()) corrupt("undecodable payload (empty string definition)");
        strings.push_back(arena.add(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
        pending_def_bytes += static_cast<uint64_t>(p - rec);
        continue;
      }
      if (!(kb & kZeroDelta)) dstate.prev_ts = static_cast<Nanos>(static_cast<uint64_t>(dstate.prev_ts) + static_cast<uint64_t>(unzigzag(varint())));
      if (code == kEnd) {
        end_record();
        continue;
      }
      uint64_t session = 0;
      if (has_session(code)) {
        if (kb & kSameSession) {
          if (!dstate.have_session) corrupt("undecodable payload (no previous session)");
        } else {
          dstate.prev_session = varint();
          dstate.have_session = true;
        }
        session = dstate.prev_session;
      } else if ((kb & kSameSession) && code != static_cast<uint8_t>(Kind::BlockIo)) {
        corrupt("undecodable payload (session flag on a storage record)");
      }
      if (code >= kFirstExtension && code <= kLastExtension) {
        // Length-prefixed kinds. The 1.1 kinds have no fields: what their
        // body holds was appended by a later minor version. A kind of a
        // later minor version is skipped whole.
        bytes(varint());
        if (code == kBlockQueued) {
          // Its time goes to the BlockIo right after it; its bytes count
          // as that record's.
          ++file_records;
          ++chunk_seen;
          pending_queued = dstate.prev_ts;
          pending_def_bytes += static_cast<uint64_t>(p - rec);
          continue;
        }
        if (code >= static_cast<uint8_t>(Kind::Count_)) {
          ++stats.records;
          ++file_records;
          ++chunk_seen;
          pending_def_bytes = 0;
          pending_queued = 0;
          continue;
        }
      }
      if (code >= static_cast<uint8_t>(Kind::Count_))
        corrupt("undecodable payload (unknown record kind " + std::to_string(code) + ")");
      decode(kb, code, out);
      out.ts = dstate.prev_ts;
      out.session = session;
      if (code == static_cast<uint8_t>(Kind::BlockIo)) std::get<BlockIo>(out.body).queued_ns = pending_queued;
      pending_queued = 0;
      ++stats.records;
      ++file_records;
      ++chunk_seen;
      ++stats.kind_records[code];
      stats.kind_bytes[code] += static_cast<uint64_t>(p - rec) + pending_def_bytes;
      pending_def_bytes = 0;
      return true;
    }
  }

  // A field by its type (trace/fields.h), as the writer's put_value()
  // stores it.
  template <class M>
  void get_value(M& v, Wire wire) {
    if constexpr (std::is_same_v<M, std::string_view>) {
      v = wire == Wire::Bytes ? bytes(varint()) : str();
    } else if constexpr (std::is_same_v<M, std::span<const Param>>) {
      size_t n = count_field();
      if (params.size() < n) params.resize(n);
      if (digits.size() < n * 24) digits.resize(n * 24);
      char* digits_at = digits.data();
      for (size_t i = 0; i < n; ++i) params[i] = param(digits_at);
      v = M(params.data(), n);
    } else if constexpr (is_span_v<M>) {
      using E = std::remove_cv_t<typename M::element_type>;
      std::vector<E>& scratch = std::get<std::vector<E>>(spans);
      size_t n = count_field();
      if (scratch.size() < n) scratch.resize(n);
      for (size_t i = 0; i < n; ++i) get_value(scratch[i], wire);
      v = M(scratch.data(), n);
    } else if constexpr (std::is_same_v<M, char>) {
      v = static_cast<char>(byte());
    } else if constexpr (std::is_enum_v<M>) {
      // A value of a newer writer reads as the enum's catch-all last value.
      v = static_cast<M>(std::min<uint64_t>(varint(), static_cast<uint64_t>(enum_max<M>())));
    } else if constexpr (std::is_same_v<M, double>) {
      uint8_t tag = byte();
      if (tag == 1) {
        v = static_cast<double>(unzigzag(varint()));
      } else if (tag == 0) {
        std::string_view raw8 = bytes(8);
        std::memcpy(&v, raw8.data(), 8);
      } else {
        corrupt("undecodable payload (sample value tag)");
      }
    } else if constexpr (std::is_signed_v<M>) {
      v = static_cast<M>(unzigzag(varint()));
    } else {
      v = static_cast<M>(varint());
    }
  }

  template <class T>
  void decode_kind(uint8_t kb, Record& out) {
    auto& b = out.body.emplace<T>();
    (void)kb;
    if constexpr (std::is_same_v<T, BlockIo>) {
      block(kb, dstate.prev_ts, b);
    } else if constexpr (std::is_same_v<T, FileIo>) {
      uint64_t of = varint();
      b.op = static_cast<IoOp>(of & 3);
      b.flags = static_cast<uint8_t>(of >> 2);
      dstate.fio_pid = static_cast<int32_t>(dstate.fio_pid + unzigzag(varint()));
      b.pid = dstate.fio_pid;
      b.file = str();
      b.offset = dstate.fio_end + static_cast<uint64_t>(unzigzag(varint()));
      b.length = static_cast<uint32_t>(varint());
      dstate.fio_end = b.offset + b.length;
      b.latency_ns = unzigzag(varint());
    } else if constexpr (std::is_same_v<T, Result>) {
      b.tag = str();
      uint64_t r = varint();
      b.has_rows = r != 0;
      b.rows = r ? r - 1 : 0;
    } else if constexpr (static_cast<uint8_t>(kind_of<T>()) >= kFirstExtension) {
      // The 1.1 kinds have no fields; their body was read by its length.
      static_assert(std::is_empty_v<T>);
    } else {
      for_each_field<T>([&](const auto& f) { get_value(f.get(b), f.wire); });
    }
  }

  // One decoder per kind, generated from the Body variant.
  using Decoder = void (Impl::*)(uint8_t, Record&);
  template <size_t... I>
  static constexpr std::array<Decoder, sizeof...(I)> decoders(std::index_sequence<I...>) {
    return {&Impl::decode_kind<std::variant_alternative_t<I, Body>>...};
  }

  void decode(uint8_t kb, uint8_t code, Record& out) {
    static constexpr auto table = decoders(std::make_index_sequence<std::variant_size_v<Body>>{});
    (this->*table[code])(kb, out);
  }
};

Reader::Reader(std::unique_ptr<Source> src) : impl_(std::make_unique<Impl>()) {
  impl_->name = src->name();
  impl_->src = std::move(src);
  impl_->dctx = ZSTD_createDCtx();
  if (!impl_->dctx) throw RuntimeError("zstd: cannot create a decompression context");
  impl_->read_header();
}

Reader::~Reader() = default;

const Header& Reader::header() const { return impl_->header; }
bool Reader::next(Record& out) { return impl_->next(out); }
const ReadStats& Reader::stats() const { return impl_->stats; }

std::unique_ptr<Reader> open_reader(const std::string& path) {
  return std::make_unique<Reader>(file_source(path));
}

// --- summary -------------------------------------------------------------------

Summary summarize(Reader& reader) {
  Summary s;
  // Per session: a statement ran since its last 'I'. Dense ids index a
  // vector; sparse ones fall back to a map.
  std::vector<uint8_t> dense;
  std::unordered_map<uint64_t, uint8_t> sparse;
  constexpr uint64_t kDenseLimit = 1u << 24;
  auto state = [&](uint64_t session) -> uint8_t& {
    if (session < kDenseLimit) {
      if (session >= dense.size()) dense.resize(std::max<size_t>(session + 1, dense.size() * 2));
      return dense[session];
    }
    return sparse[session];
  };

  Record r;
  bool first = true;
  while (reader.next(r)) {
    ++s.records;
    if (first) {
      s.first_ts = s.last_ts = r.ts;
      first = false;
    }
    s.first_ts = std::min(s.first_ts, r.ts);
    s.last_ts = std::max(s.last_ts, r.ts);
    switch (r.kind()) {
      case Kind::SessionBegin: ++s.sessions; break;
      case Kind::Query:
      case Kind::Execute:
        ++s.statements;
        state(r.session) = 1;
        break;
      case Kind::Ready:
        if (std::get<Ready>(r.body).status == 'I') {
          uint8_t& st = state(r.session);
          if (st) ++s.transactions;
          st = 0;
        }
        break;
      case Kind::Error: ++s.errors; break;
      case Kind::BlockIo: ++s.block_ios; break;
      case Kind::FileIo: ++s.file_ios; break;
      case Kind::Sample: ++s.samples; break;
      case Kind::Loss: s.lost += std::get<Loss>(r.body).count; break;
      default: break;
    }
  }
  s.duration_ns = s.last_ts - s.first_ts;
  s.read = reader.stats();
  return s;
}

}  // namespace tierlab::trace
