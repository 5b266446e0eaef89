// Packet decoding and TCP stream reassembly for passive capture (private to
// capture/).
//
// parse_packet() takes one captured frame of a libpcap link type and finds the
// TCP segment in it (IPv4 or IPv6). Reassembler turns segments of many
// connections into in-order byte streams per connection and direction and
// hands them to a StreamHandler:
//
//   on_open   a connection was first seen (SYN, or data of a connection that
//             was already open when the capture started: `joined`)
//   on_data   the next in-order bytes of one direction; the pointer is only
//             valid during the call (it points into the packet or the
//             reassembler's buffer: nothing is copied on the in-order path)
//   on_gap    `bytes` of one direction are missing and will never arrive
//             (a segment the capture lost). The stream continues after them.
//   on_close  the connection ended (FIN both ways, RST, evicted, or flushed
//             at the end of the capture)
//
// A connection is named by its slot (0 .. max_connections-1), stable from
// on_open to on_close, so handlers keep per-connection state in an array.
//
// Memory: every table and buffer is allocated in the constructor. Segments
// that arrive ahead of a hole are copied into fixed-size blocks from a shared
// pool, bounded per connection and direction. A hole is declared a gap when
//   - the peer acknowledges bytes beyond it (it received what we missed),
//   - it stays open longer than Options::hole_timeout_ns of packet time,
//   - the buffered bytes behind it exceed the per-direction bound or the pool
//     runs dry, or
//   - the connection closes (RST, or both FINs) or the capture ends.
// A gap is never papered over: the handler is told its size.
#pragma once

#include "trace/record.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::capture {

using trace::Nanos;

// TCP flags as on the wire.
inline constexpr uint8_t kTcpFin = 0x01;
inline constexpr uint8_t kTcpSyn = 0x02;
inline constexpr uint8_t kTcpRst = 0x04;
inline constexpr uint8_t kTcpAck = 0x10;

// One TCP segment found in a frame. Addresses are 16 bytes: IPv4 as
// IPv4-mapped IPv6 (::ffff:a.b.c.d).
struct Segment {
  uint8_t src[16] = {};
  uint8_t dst[16] = {};
  uint16_t sport = 0;
  uint16_t dport = 0;
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint8_t flags = 0;
  bool v6 = false;
  const uint8_t* payload = nullptr;
  uint32_t payload_len = 0;     // bytes present in the capture
  uint32_t payload_missing = 0; // bytes on the wire beyond the snapshot length
};

enum class ParseResult : uint8_t {
  Tcp,          // *out filled
  NotTcp,       // another protocol (ARP, UDP, ICMP, ...): ignore
  Fragment,     // an IP fragment: not reassembled, counted
  Truncated,    // headers cut short by the snapshot length or malformed
  UnknownLink,  // link type this decoder does not know
};

// Link types understood: DLT_NULL, DLT_LOOP, DLT_EN10MB (with 802.1Q/802.1ad
// tags), DLT_LINUX_SLL, DLT_LINUX_SLL2, DLT_RAW, DLT_IPV4, DLT_IPV6.
bool link_type_supported(int dlt);
ParseResult parse_packet(int dlt, const uint8_t* frame, uint32_t caplen, uint32_t wirelen,
                         Segment* out);

// "127.0.0.1:5432" / "[::1]:5432"
std::string endpoint_string(const uint8_t addr[16], uint16_t port);

enum class Dir : uint8_t { ToServer = 0, ToClient = 1 };

enum class CloseKind : uint8_t {
  Fin,       // both directions finished
  Reset,     // RST seen
  Evicted,   // the table was full: the least recently active one goes
  Flushed,   // finish() at the end of the capture
  Replaced,  // a new SYN reused the address pair
};

struct ConnInfo {
  uint8_t client[16] = {};
  uint8_t server[16] = {};
  uint16_t client_port = 0;
  uint16_t server_port = 0;
  bool v6 = false;
  bool joined = false;  // no SYN seen: the connection predates the capture
};

class StreamHandler {
 public:
  virtual ~StreamHandler() = default;
  virtual void on_open(uint32_t conn, const ConnInfo& info, Nanos ts) = 0;
  virtual void on_data(uint32_t conn, Dir dir, const uint8_t* data, size_t len, Nanos ts) = 0;
  virtual void on_gap(uint32_t conn, Dir dir, uint64_t bytes, Nanos ts) = 0;
  virtual void on_close(uint32_t conn, CloseKind how, Nanos ts) = 0;
};

struct ReassemblyStats {
  uint64_t segments = 0;        // TCP segments given to add()
  uint64_t payload_bytes = 0;   // bytes delivered in order
  uint64_t out_of_order = 0;    // segments that arrived ahead of a hole
  uint64_t retransmitted = 0;   // segments wholly seen before (dropped)
  uint64_t trimmed_bytes = 0;   // overlapping bytes trimmed off
  uint64_t gaps = 0;            // holes declared
  uint64_t gap_bytes = 0;
  uint64_t connections = 0;     // connections opened
  uint64_t joined = 0;          // of which already open at capture start
  uint64_t evicted = 0;         // connections dropped because the table was full
  // Segments that found no room to be held back, their oldest hole
  // declared a gap: the connection's direction had max_buffered_per_dir
  // held, or the pool (buffer_bytes) was used up.
  uint64_t held_per_dir_full = 0;
  uint64_t held_pool_full = 0;
  uint64_t ignored = 0;         // segments of no tracked connection (stray FIN/RST/ACK)
};

class Reassembler {
 public:
  struct Options {
    uint16_t server_port = 5432;
    uint32_t max_connections = 16384;
    size_t buffer_bytes = 32u << 20;          // pool for out-of-order segments
    size_t max_buffered_per_dir = 1u << 20;   // bound behind one hole
    Nanos hole_timeout_ns = 500'000'000;      // packet time a hole may stay open
  };

  // The handler must outlive the reassembler. Allocates everything now.
  Reassembler(const Options& opts, StreamHandler* handler);
  ~Reassembler();
  Reassembler(const Reassembler&) = delete;
  Reassembler& operator=(const Reassembler&) = delete;

  // One segment captured at `ts`. Segments of neither the server port
  // nor a tracked connection are ignored.
  void add(const Segment& seg, Nanos ts);

  // Time moved on (no packets for a while): declares holes older than the
  // timeout as gaps. Cheap when no hole is open.
  void advance(Nanos now);

  // End of capture: every hole becomes a gap and every connection is closed
  // (CloseKind::Flushed).
  void finish(Nanos now);

  const ReassemblyStats& stats() const;
  uint32_t open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierlab::capture
