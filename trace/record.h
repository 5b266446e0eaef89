// Records of a tierlab trace (.tlt), as the writer takes them and the reader
// returns them. The bytes on disk are private to trace/ and documented in
// docs/trace-format.md.
//
// Ownership: every std::string_view and std::span inside a Record returned by
// Reader::next() points into the reader's buffers and stays valid until the
// next call to next() (interned strings: until the reader is destroyed).
// Records given to Writer::write() are copied (or interned) before it returns.
#pragma once

#include "common/clock.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <variant>

namespace tierlab::trace {

// Time is Nanos (common/clock.h) of CLOCK_MONOTONIC; sizes and offsets are
// bytes.
using tierlab::Nanos;

// --- session (wire protocol) records --------------------------------------

// How a session ended.
enum class EndReason : uint8_t {
  Clean = 0,         // client sent Terminate
  ClientAbort = 1,   // client vanished without Terminate
  ServerClosed = 2,  // upstream closed or died
  ProtocolError = 3, // malformed or oversized message; session closed
  CaptureEnd = 4,    // capture stopped while the session was open
  Unknown = 5,       // passive capture lost sight of it
};

// SessionBegin.flags
inline constexpr uint32_t kSessionUnknownStartup = 1u << 0;  // joined mid-stream
inline constexpr uint32_t kSessionUnixSocket = 1u << 1;
inline constexpr uint32_t kSessionTls = 1u << 2;  // encrypted, not decodable

struct SessionBegin {
  std::string_view user;
  std::string_view database;
  std::string_view application_name;
  std::string_view client_addr;  // "127.0.0.1:54321", "unix", "" if unknown
  int32_t backend_pid = 0;       // from BackendKeyData; 0 if unknown
  uint32_t flags = 0;
};

struct SessionEnd {
  EndReason reason = EndReason::Clean;
};

// Simple-protocol Query message.
struct Query {
  std::string_view sql;
};

// Parse: statement name ("" = unnamed), SQL and parameter type OIDs.
struct Parse {
  std::string_view statement;
  std::string_view sql;
  std::span<const uint32_t> param_types;
};

// One Bind parameter. format 0 = text, 1 = binary.
struct Param {
  int16_t format = 0;
  bool is_null = false;
  std::string_view value;
};

struct Bind {
  std::string_view portal;
  std::string_view statement;
  std::span<const Param> params;            // format already resolved per param
  std::span<const int16_t> result_formats;  // as sent
};

struct Execute {
  std::string_view portal;
  uint32_t max_rows = 0;  // 0 = all
};

// Describe and Close: target 'S' (statement) or 'P' (portal).
struct Describe {
  char target = 'S';
  std::string_view name;
};

struct Close {
  char target = 'S';
  std::string_view name;
};

struct Sync {};
struct Flush {};

enum class CopyDir : uint8_t { In = 0, Out = 1 };

// COPY payload, in the chunks the wire carried.
struct CopyData {
  CopyDir dir = CopyDir::In;
  std::string_view data;
};

struct CopyDone {
  CopyDir dir = CopyDir::In;
};

struct CopyFail {
  std::string_view message;
};

// CommandComplete: the tag without its counts ("INSERT", "SELECT", "BEGIN")
// and the row count when the tag carries one.
struct Result {
  std::string_view tag;
  bool has_rows = false;
  uint64_t rows = 0;
};

// ErrorResponse (or a FATAL at startup).
struct Error {
  std::string_view sqlstate;  // five characters, e.g. "23505"
  std::string_view severity;  // "ERROR", "FATAL", "PANIC"
  std::string_view message;
};

// ReadyForQuery: 'I' idle, 'T' in transaction, 'E' failed transaction.
struct Ready {
  char status = 'I';
};

// The answers to an Execute or a Query that are neither CommandComplete nor
// ErrorResponse (trace format 1.1): PortalSuspended, an Execute that reached
// its row limit with rows left in the portal; EmptyQueryResponse, an empty
// statement.
struct Suspended {};
struct EmptyQuery {};

// --- storage records ---------------------------------------------------------

enum class IoOp : uint8_t { Read = 0, Write = 1, Flush = 2, Discard = 3 };

// BlockIo.flags / FileIo.flags
inline constexpr uint8_t kIoSync = 1u << 0;
inline constexpr uint8_t kIoMeta = 1u << 1;
inline constexpr uint8_t kIoFua = 1u << 2;
inline constexpr uint8_t kIoIncomplete = 1u << 3;  // completion never seen

// One block-layer request; the record's ts is the issue time.
struct BlockIo {
  Nanos complete_ns = 0;  // absolute CLOCK_MONOTONIC completion time
  uint32_t device = 0;    // dev_t as (major << 20 | minor), like the kernel
  uint64_t offset = 0;
  uint32_t length = 0;
  IoOp op = IoOp::Read;
  uint8_t flags = 0;
  int32_t pid = 0;
  // Absolute CLOCK_MONOTONIC time the earliest bio of the request was
  // queued to the block layer, at or before the issue (trace format 1.2);
  // 0 when unknown (older traces, importers, a bio not seen). Issue minus
  // this is the time the request waited in the block layer: the I/O
  // scheduler, plugging, and a cgroup IOPS limit where the capture saw the
  // bio's submission (capture/block.h).
  Nanos queued_ns = 0;
};

// One file-level I/O system call; the record's ts is its entry.
struct FileIo {
  int32_t pid = 0;
  std::string_view file;  // path, or "fd:N" when the path is unknown
  uint64_t offset = 0;
  uint32_t length = 0;
  IoOp op = IoOp::Read;
  uint8_t flags = 0;
  Nanos latency_ns = 0;
};

// A periodic sample: "cpu.user_ns", "pg.blks_read", "pg.wal_bytes", ...
struct Sample {
  std::string_view name;
  double value = 0;
};

// Key-value metadata: "server_version", "setting.shared_buffers", "device".
struct Meta {
  std::string_view key;
  std::string_view value;
};

// Something the capture could not record, counted rather than lost silently.
enum class LossKind : uint8_t {
  QueueOverflow = 0,  // records dropped by --on-overflow drop
  PacketDrop = 1,     // packets the kernel dropped
  StreamGap = 2,      // bytes missing in a reassembled TCP stream
  EventsLost = 3,     // tracefs events lost
  Unsupported = 4,    // traffic seen but not decodable (TLS, ...)
};

struct Loss {
  LossKind what = LossKind::QueueOverflow;
  uint64_t count = 0;
};

using Body = std::variant<SessionBegin, SessionEnd, Query, Parse, Bind, Execute,
                          Describe, Close, Sync, Flush, CopyData, CopyDone,
                          CopyFail, Result, Error, Ready, BlockIo, FileIo,
                          Sample, Meta, Loss,
                          // format 1.1: length-prefixed kinds
                          Suspended, EmptyQuery>;

// The variant index is the record kind.
enum class Kind : uint8_t {
  SessionBegin, SessionEnd, Query, Parse, Bind, Execute, Describe, Close, Sync,
  Flush, CopyData, CopyDone, CopyFail, Result, Error, Ready, BlockIo, FileIo,
  Sample, Meta, Loss,
  Suspended, EmptyQuery,
  Count_
};

struct Record {
  Nanos ts = 0;          // CLOCK_MONOTONIC
  uint64_t session = 0;  // 0 for records outside a session (block I/O, samples)
  Body body;

  Kind kind() const { return static_cast<Kind>(body.index()); }
};

// Stable lower-case name of a kind ("session_begin", "block_io", ...).
std::string_view kind_name(Kind k);

// Splits a CommandComplete tag as the capture records it and the replay
// reads it: "INSERT 0 5" -> {"INSERT", true, 5}, "SELECT 3" -> {"SELECT",
// true, 3}, "CREATE TABLE" -> {"CREATE TABLE", false, 0}.
Result split_command_tag(std::string_view tag);
std::string_view op_name(IoOp op);

}  // namespace tierlab::trace
