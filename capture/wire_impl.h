// Private to capture/: what the wire decoder's files (capture/wire.cpp:
// the session, framing, gaps and hunting; capture/wire_messages.cpp: each
// message's fields) share: the protocol's request codes, big-endian reads,
// the bounds-checked cursor over one message body, and emitting a record.
#pragma once

#include "capture/wire.h"

#include <cstring>

namespace tierlab::capture {
namespace wire_impl {

constexpr uint32_t kProtocol3 = 196608;  // 3.0
constexpr uint32_t kSslCode = 80877103;
constexpr uint32_t kGssEncCode = 80877104;
constexpr uint32_t kCancelCode = 80877102;

inline uint32_t rd32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
inline uint16_t rd16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }

inline size_t idx(Direction d) { return static_cast<size_t>(d); }

inline const char* dir_name(Direction d) { return d == Direction::Frontend ? "client" : "server"; }

// Bounds-checked reading of one message body.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  const char* problem = nullptr;

  bool ok() const { return problem == nullptr; }
  size_t left() const { return static_cast<size_t>(end - p); }
  bool need(size_t n) {
    if (problem) return false;
    if (left() < n) {
      problem = "message body ends early";
      return false;
    }
    return true;
  }
  std::string_view cstr() {
    if (problem) return {};
    // Most strings here are short (statement and portal names, tags): a
    // plain scan of the first bytes beats a library call.
    const uint8_t* zz = p;
    const uint8_t* stop = left() > 16 ? p + 16 : end;
    while (zz < stop && *zz) ++zz;
    if (zz == stop) {
      const void* z = zz < end ? std::memchr(zz, 0, static_cast<size_t>(end - zz)) : nullptr;
      if (!z) {
        problem = "string without terminating NUL";
        return {};
      }
      zz = static_cast<const uint8_t*>(z);
    }
    std::string_view s(reinterpret_cast<const char*>(p), static_cast<size_t>(zz - p));
    p = zz + 1;
    return s;
  }
  uint8_t u8() {
    if (!need(1)) return 0;
    return *p++;
  }
  int16_t i16() {
    if (!need(2)) return 0;
    int16_t v = static_cast<int16_t>(rd16(p));
    p += 2;
    return v;
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = rd32(p);
    p += 4;
    return v;
  }
  std::string_view bytes(size_t n) {
    if (!need(n)) return {};
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  bool finish() {
    if (problem) return false;
    if (p != end) {
      problem = "trailing bytes after the message's fields";
      return false;
    }
    return true;
  }
};

}  // namespace wire_impl

template <class T>
void SessionDecoder::emit(trace::Nanos ts, const T& body) {
  if (!begun_) {
    if (!begin_pending_) {
      // Something to record before any StartupMessage: say so in the begin.
      begin_pending_ = true;
      flags_ |= trace::kSessionUnknownStartup;
      begin_ts_ = ts;
    }
    flush_begin();
  }
  trace::Record r{ts, session_, body};
  sink_.record(r);
  ++stats_.records;
}

}  // namespace tierlab::capture
