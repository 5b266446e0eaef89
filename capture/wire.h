// PostgreSQL wire protocol 3.0 decoder and session recorder.
//
// A SessionDecoder follows one client connection: it is fed the bytes of each
// direction (frontend = client to server, backend = server to client) as they
// arrive, in pieces of any size, with the time they arrived, and emits
// trace::Record values to a RecordSink. It does not care how the bytes arrive:
// the capture proxy feeds it the buffers it forwards, the packet sniffer feeds
// it reassembled TCP streams.
//
// What it records: SessionBegin (user, database, application_name, client
// address, backend pid from BackendKeyData), every request (Query, Parse, Bind
// with its parameters and formats, Execute, Describe, Close, Sync, Flush,
// CopyData/CopyDone/CopyFail), every CommandComplete as Result (tag and row
// count split: "INSERT 0 5" -> tag "INSERT", rows 5), ErrorResponse as Error,
// ReadyForQuery as Ready, CopyData/CopyDone from the server, and SessionEnd.
// Password, SASL and GSS messages ('p') are never recorded. Messages that
// carry nothing for the trace (DataRow, RowDescription, NoticeResponse, ...)
// are validated and skipped. ParameterStatus goes to the sink's
// parameter_status() hook.
//
// Validation: every message's length is checked against WireLimits (and the
// fixed lengths of fixed-size messages), every type byte against the types
// that direction may send, and parsed messages against their own structure.
// The first violation puts the decoder in the failed state: feed() returns
// false, error() says why in one line, and further input is ignored until
// the next begin()/join().
//
// Passive capture support:
//  - join() starts a session whose beginning was not seen: both directions
//    hunt for a message boundary (see below) and SessionBegin is emitted at
//    once with kSessionUnknownStartup and whatever the caller knows.
//  - gap(d, n) says n bytes of direction d are missing. If they fall inside
//    the body of the current message, the rest of that message is skipped
//    (a message that was being reassembled is dropped, not half-recorded);
//    otherwise the direction hunts. A Loss{StreamGap, n} record is emitted.
//  - Hunting: incoming bytes are buffered (at most kHuntWindow) and scanned
//    for an offset where a valid header starts and the chain of messages
//    from there validates: at least two complete valid messages, or one or
//    more that end exactly at the end of the buffered data. Bytes before the
//    accepted offset are discarded and counted in stats().hunt_discarded.
//
// Threading: a decoder is used by one thread at a time. Allocation: buffers
// grow to the largest message seen and are kept across sessions, so a
// decoder reused for many sessions does not allocate per message once warm.
#pragma once

#include "trace/record.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tierlab::capture {

enum class Direction : uint8_t {
  Frontend = 0,  // client to server
  Backend = 1,   // server to client
};

// Where decoded records go.
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  // Called for every record. The string_views and spans inside `r` point into
  // the decoder's or the caller's buffers and are valid only during the call.
  virtual void record(const trace::Record& r) = 0;
  // Called for every ParameterStatus the server sends (server_version,
  // client_encoding, ...). Same lifetime rule. Default: nothing.
  virtual void parameter_status(uint64_t /*session*/, std::string_view /*name*/,
                                std::string_view /*value*/, trace::Nanos /*ts*/) {}
};

// Memory that the decoders sharing it (every connection of a proxy or of a
// sniffer) may hold, together, for messages they reassemble beyond the
// first kFree bytes each direction keeps for itself: without it each
// connection could hold up to max_message (1 GiB). A message that would take
// the total beyond `cap` is not reassembled: it is skipped and recorded as
// a stream gap (Loss{StreamGap}) of its length, and counted in `refused`;
// the session goes on. Used from many threads at once.
struct BufferBudget {
  static constexpr uint32_t kFree = 64 * 1024;
  explicit BufferBudget(uint64_t cap_bytes) : cap(cap_bytes) {}
  // Takes n bytes if the total stays within cap.
  bool take(uint64_t n);
  void give_back(uint64_t n) { held.fetch_sub(n, std::memory_order_relaxed); }

  const uint64_t cap;
  std::atomic<uint64_t> held{0};     // bytes taken now
  std::atomic<uint64_t> refused{0};  // messages not reassembled for want of room
  std::atomic<uint64_t> refused_bytes{0};
};

struct WireLimits {
  // Largest message accepted, counting its 4-byte length (not the type byte).
  uint32_t max_message = 1u << 30;
  // Largest startup packet; PostgreSQL itself refuses more than 10000 bytes.
  uint32_t max_startup = 10000;
  // CopyData messages longer than this are recorded in the pieces they
  // arrive in rather than reassembled.
  uint32_t copy_reassemble_max = 256 * 1024;
  // The total all decoders may buffer (see BufferBudget); null: no cap but
  // max_message per message.
  BufferBudget* budget = nullptr;
};

// The first packets a client sends have no type byte: length then a code.
enum class StartupKind : uint8_t {
  Incomplete,     // fewer bytes than the packet's length so far
  Startup,        // StartupMessage, protocol 3.x
  SslRequest,
  GssEncRequest,
  Cancel,         // CancelRequest
  Invalid,        // bad length or unsupported protocol
};

struct StartupPacket {
  StartupKind kind = StartupKind::Incomplete;
  uint32_t length = 0;  // whole packet, when known (>= 4 bytes seen)
};

// Classifies the startup packet at the start of data[0, len).
StartupPacket classify_startup(const uint8_t* data, size_t len, uint32_t max_startup);

struct SessionStats {
  uint64_t records = 0;
  uint64_t statements = 0;    // Query + Execute
  uint64_t transactions = 0;  // ReadyForQuery 'I' ending a unit with statements
  uint64_t errors = 0;        // ErrorResponse
  uint64_t messages[2] = {0, 0};  // complete messages per Direction
  uint64_t bytes[2] = {0, 0};     // bytes fed per Direction
  uint64_t gap_bytes = 0;
  uint64_t hunt_discarded = 0;
};

// What the caller knows about a session joined mid-stream.
struct JoinInfo {
  std::string_view user;
  std::string_view database;
  std::string_view application_name;
  std::string_view client_addr;
  int32_t backend_pid = 0;
  uint32_t flags = 0;  // kSessionUnknownStartup is added
};

class SessionDecoder {
 public:
  static constexpr size_t kHuntWindow = 256 * 1024;

  explicit SessionDecoder(RecordSink& sink, WireLimits limits = {});
  ~SessionDecoder();
  SessionDecoder(const SessionDecoder&) = delete;
  SessionDecoder& operator=(const SessionDecoder&) = delete;

  // Starts a session seen from its first byte: the frontend's first bytes
  // are a startup packet. Nothing is recorded until a StartupMessage is seen
  // (a connection that only sends SSLRequest or CancelRequest records
  // nothing). Resets all state but keeps buffers.
  void begin(uint64_t session, std::string_view client_addr, uint32_t flags,
             trace::Nanos ts);
  // Starts a session whose startup was not seen (see the file comment).
  void join(uint64_t session, const JoinInfo& info, trace::Nanos ts);

  // Feeds bytes of direction d that arrived at ts. Returns false if the
  // decoder is (now) failed. `data` need only live during the call.
  bool feed(Direction d, const uint8_t* data, size_t len, trace::Nanos ts);

  // `bytes` of direction d are missing before the next feed(d, ...).
  void gap(Direction d, uint64_t bytes, trace::Nanos ts);

  // Ends the session: emits SessionEnd{reason} (after a SessionBegin that was
  // still pending). Does nothing if the session recorded nothing (no
  // StartupMessage seen) or already ended.
  void end(trace::EndReason reason, trace::Nanos ts);

  // Records an ErrorResponse the capture itself sent the client in the
  // server's place (the proxy's FATAL answer to a protocol error or to an
  // unreachable server) as an Error of this session, even when the decoder
  // has failed. Nothing before a StartupMessage or after end().
  void note_error(std::string_view severity, std::string_view sqlstate,
                  std::string_view message, trace::Nanos ts);

  bool failed() const { return failed_; }
  const char* error() const { return error_; }
  // True when the next byte of direction d starts a message.
  bool at_boundary(Direction d) const;
  bool started() const { return started_; }        // StartupMessage seen
  bool terminated() const { return terminated_; }  // client sent Terminate
  bool fatal_seen() const { return fatal_seen_; }  // server sent FATAL/PANIC
  bool cancel_request() const { return cancel_; }
  bool tls() const { return tls_; }
  bool ended() const { return ended_; }
  int32_t backend_pid() const { return backend_pid_; }
  uint64_t session() const { return session_; }
  const SessionStats& stats() const { return stats_; }

 private:
  enum class Mode : uint8_t {
    Header,   // reading a header (hdr_have bytes of it so far)
    Collect,  // reassembling a body into buf
    Skip,     // skipping a body
    Stream,   // recording a long CopyData body piece by piece
    Hunt,     // looking for a message boundary
    SslByte,  // backend: the one-byte answer to SSLRequest/GSSENCRequest
    Opaque,   // nothing more to decode (TLS, after CancelRequest)
  };
  struct Dir {
    Mode mode = Mode::Header;
    bool startup = false;  // frontend before StartupMessage: untyped packets
    uint8_t hdr[5] = {};
    uint8_t hdr_have = 0;
    char type = 0;
    uint32_t body_len = 0;   // body bytes (length field - 4)
    uint32_t body_have = 0;  // body bytes consumed so far
    uint64_t offset = 0;     // bytes of this direction fed so far
    uint64_t msg_offset = 0; // offset where the current message started
    std::vector<uint8_t> buf;
    uint64_t charged = 0;  // bytes of buf taken from limits_.budget
  };
  enum class Action : uint8_t { Unknown, Collect, Skip, Copy };

  bool feed_dir(Direction d, Dir& s, const uint8_t* p, size_t n, trace::Nanos ts);
  bool start_message(Direction d, Dir& s, char type, uint32_t len);
  bool deliver(Direction d, Dir& s, char type, const uint8_t* body, uint32_t len,
               trace::Nanos ts);
  bool deliver_startup(Dir& s, const uint8_t* pkt, uint32_t len, trace::Nanos ts);
  bool frontend_message(char type, const uint8_t* b, uint32_t len, trace::Nanos ts);
  bool backend_message(char type, const uint8_t* b, uint32_t len, trace::Nanos ts);
  bool hunt(Direction d, Dir& s, const uint8_t* p, size_t n, trace::Nanos ts);
  // Grows s.buf to `need` bytes for the message being reassembled; false
  // if the budget has no room (nothing changed then).
  bool grow(Dir& s, size_t need);
  // Gives back what s.buf holds beyond BufferBudget::kFree (its memory too).
  void release(Dir& s);
  Action action(Direction d, char type) const;
  // Header check without side effects: type known, length within limits and
  // right for fixed-size messages.
  bool header_ok(Direction d, char type, uint32_t len) const;
  bool fail(Direction d, const Dir& s, const char* what);
  // Records one body of kind T (built in place: no intermediate variant).
  template <class T>
  void emit(trace::Nanos ts, const T& body);
  void flush_begin();

  RecordSink& sink_;
  WireLimits limits_;
  Dir dirs_[2];
  uint64_t session_ = 0;
  bool failed_ = false;
  bool started_ = false;
  bool begin_pending_ = false;
  bool begun_ = false;
  bool ended_ = false;
  bool terminated_ = false;
  bool fatal_seen_ = false;
  bool cancel_ = false;
  bool tls_ = false;
  uint32_t flags_ = 0;
  int32_t backend_pid_ = 0;
  trace::Nanos begin_ts_ = 0;
  uint64_t unit_statements_ = 0;
  SessionStats stats_;
  // SessionBegin strings: copies owned by the decoder.
  std::vector<char> startup_;
  std::string_view user_, database_, app_, client_addr_;
  char client_addr_buf_[128] = {};
  // Scratch for Parse/Bind spans; grown, never shrunk.
  std::vector<uint32_t> param_types_;
  std::vector<trace::Param> params_;
  std::vector<int16_t> result_formats_;
  std::vector<uint8_t> hunt_scratch_;
  char error_[200] = {};
};

// Appends a PostgreSQL ErrorResponse message (severity, SQLSTATE, message) to
// out[0, cap); returns its length, or 0 if it does not fit.
size_t make_error_response(uint8_t* out, size_t cap, std::string_view severity,
                           std::string_view sqlstate, std::string_view message);

}  // namespace tierlab::capture
