// On-disk constants and primitive encodings of trace format v1, shared by the
// writer and the reader. Private to trace/; the spec is docs/trace-format.md.
#pragma once

#include "trace/record.h"

#include <bit>
#include <cstdint>
#include <cstring>

namespace tierlab::trace::fmt {

static_assert(std::endian::native == std::endian::little,
              "the trace format is little-endian; add byte swaps for this host");

// --- file header -------------------------------------------------------------
inline constexpr uint8_t kFileMagic[8] = {0x89, 'T', 'L', 'T', '\r', '\n', 0x1a, '\n'};
inline constexpr uint16_t kMajor = 1;
inline constexpr uint16_t kMinor = 2;  // 1.1: Suspended, EmptyQuery; 1.2: BlockQueued
// magic(8) major(2) minor(2) header_len(4) start_mono(8) realtime_offset(8) crc(4)
inline constexpr uint32_t kHeaderLen = 36;
inline constexpr uint32_t kHeaderPrefix = 16;  // magic..header_len
inline constexpr uint32_t kMaxHeaderLen = 64 * 1024;

// --- chunk header ------------------------------------------------------------
inline constexpr uint32_t kChunkMagic = 0x4b434c54;  // "TLCK" in file order
// magic(4) flags(4) stored_len(4) raw_len(4) records(4) reserved(4)
// first_ts(8) payload_crc(4) header_crc(4)
inline constexpr uint32_t kChunkHeaderLen = 40;
inline constexpr uint32_t kChunkZstd = 1u << 0;  // payload is one zstd frame
inline constexpr uint32_t kChunkEnd = 1u << 1;   // holds the End record; last chunk
// Flag bits 0-15 must be understood by a reader; 16-31 may be ignored.
inline constexpr uint32_t kChunkKnownFlags = kChunkZstd | kChunkEnd;
inline constexpr uint32_t kChunkMustUnderstand = 0xffffu;
inline constexpr uint32_t kMaxRawLen = 1u << 31;  // 2 GiB: above any protocol message

// --- record codes --------------------------------------------------------------
// Kind byte: bits 0-5 code, bit 6 "timestamp delta is zero (omitted)",
// bit 7 "same session as the previous session record in this chunk (omitted)".
inline constexpr uint8_t kCodeMask = 0x3f;
inline constexpr uint8_t kZeroDelta = 0x40;
inline constexpr uint8_t kSameSession = 0x80;
inline constexpr uint8_t kFirstExtension = 21;  // 21..61: length-prefixed, skippable
static_assert(static_cast<uint8_t>(Kind::Suspended) == kFirstExtension);
inline constexpr uint8_t kLastExtension = 61;
// BlockQueued (1.2): a length-prefixed record (session 0, empty body) whose
// timestamp is when the bios of the BlockIo that follows it were queued.
// Not a record kind of its own: the reader gives its time to that BlockIo
// as queued_ns. The last extension code, so that new kinds keep taking
// codes from 23 on.
inline constexpr uint8_t kBlockQueued = 61;
static_assert(static_cast<uint8_t>(Kind::Count_) < kBlockQueued);
inline constexpr uint8_t kStringDef = 62;
inline constexpr uint8_t kEnd = 63;

// Storage records carry no session.
inline constexpr bool has_session(uint8_t code) {
  return code != static_cast<uint8_t>(Kind::BlockIo) &&
         code != static_cast<uint8_t>(Kind::FileIo) &&
         code != static_cast<uint8_t>(Kind::Sample) &&
         code != static_cast<uint8_t>(Kind::Meta);
}

// Param header tag (low 3 bits of the param header varint; length above).
enum ParamTag : uint8_t {
  kParamText = 0,
  kParamBinary = 1,
  kParamNullText = 2,
  kParamNullBinary = 3,
  kParamTextInt = 4,  // text that is a canonical decimal int64: zigzag varint
  kParamOther = 5,    // other format code: zigzag format, then length, bytes
  kParamNullOther = 6,
};

// BlockIo: bit 7 of the kind byte says an extension byte follows the header
// byte. Header byte: bits 0-1 op, 2-3 offset unit (0 bytes, 1 = 512,
// 2 = 4096), 4-7 pid slot (0-14: index in the recent-pid list, 15: a new pid
// follows).
inline constexpr uint8_t kBioExt = 0x80;  // in the kind byte
inline constexpr uint8_t kBioOpMask = 0x03;
inline constexpr uint8_t kBioUnitShift = 2;
inline constexpr uint8_t kBioUnitMask = 0x0c;
inline constexpr uint8_t kBioPidShift = 4;
inline constexpr uint8_t kBioPidMask = 0xf0;
inline constexpr uint8_t kBioPidNew = 15;
inline constexpr int kRecentPids = 15;
// BlockIo extension byte.
inline constexpr uint8_t kBioNewLength = 0x01;
inline constexpr uint8_t kBioNewDevice = 0x02;
inline constexpr uint8_t kBioNewFlags = 0x04;
inline constexpr uint8_t kBioExtKnown = 0x07;

// Move-to-front list of the most recent block I/O pids.
struct RecentPids {
  int32_t pid[kRecentPids] = {};
  // Index of `p`, or -1. Moves it to the front either way (inserting it).
  int touch(int32_t p) {
    int i = 0;
    while (i < kRecentPids && pid[i] != p) ++i;
    int found = i < kRecentPids ? i : -1;
    if (found < 0) i = kRecentPids - 1;
    for (; i > 0; --i) pid[i] = pid[i - 1];
    pid[0] = p;
    return found;
  }
  int32_t front() const { return pid[0]; }
  // The pid at slot `i`, moved to the front.
  int32_t take(int i) {
    int32_t p = pid[i];
    for (; i > 0; --i) pid[i] = pid[i - 1];
    pid[0] = p;
    return p;
  }
  void reset() { *this = RecentPids{}; }
};

// Delta-coding state, reset at every chunk start. The writer and the reader
// keep one each and must update it identically.
struct DeltaState {
  Nanos prev_ts = 0;
  uint64_t prev_session = 0;
  bool have_session = false;
  uint64_t bio_end = 0;
  uint32_t bio_dev = 0;
  RecentPids bio_pids;
  uint32_t bio_len[4] = {};   // per block I/O op
  uint8_t bio_flags[4] = {};  // per block I/O op
  uint64_t fio_end = 0;
  int32_t fio_pid = 0;

  void reset() { *this = DeltaState{}; }
};

// Interned-string table bounds; past them strings are written inline.
inline constexpr size_t kMaxInternLen = 64 * 1024;
inline constexpr size_t kMaxInternBytes = 64u << 20;
inline constexpr size_t kMaxInternCount = 1u << 22;

// --- primitives ----------------------------------------------------------------
inline void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void put_i64(uint8_t* p, int64_t v) { std::memcpy(p, &v, 8); }
inline uint16_t get_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t get_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline int64_t get_i64(const uint8_t* p) { int64_t v; std::memcpy(&v, p, 8); return v; }

inline uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// LEB128; at most 10 bytes. Returns the new end.
inline uint8_t* put_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}
inline constexpr size_t kMaxVarint = 10;

}  // namespace tierlab::trace::fmt
