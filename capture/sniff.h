// Passive capture of PostgreSQL traffic from network packets.
//
// `tierlab capture sniff` reads packets from a live interface (libpcap on a
// TPACKET_V3 ring, kernel BPF filter on the server's port and address) or
// from a pcap/pcapng file, reassembles each TCP connection to the server
// port, and feeds both directions to the same protocol decoder and session
// recorder as the capture proxy. Nothing sits in the path of the traffic.
//
// What cannot be seen is counted and recorded, never skipped silently:
//   - kernel packet drops          -> trace::Loss{PacketDrop}
//   - bytes missing from a stream  -> trace::Loss{StreamGap} in that session;
//                                     the decoder resynchronises at the next
//                                     message boundary it can validate
//   - TLS/GSS-encrypted sessions   -> SessionBegin with kSessionTls and
//                                     trace::Loss{Unsupported}
//   - sessions open before the capture started are joined mid-stream
//     (kSessionUnknownStartup); user and database come from --session-map.
//
// Timestamps are the packets' own (kernel CLOCK_REALTIME), converted to the
// trace's CLOCK_MONOTONIC base with the realtime offset measured when the
// trace is opened, so block I/O captured at the same time lines up.
#pragma once

#include "trace/record.h"

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::capture {

struct SniffOptions {
  std::string interface;  // live capture on this interface ("lo", "eth0", "any")
  std::string pcap_file;  // or read this pcap/pcapng file
  std::string out;        // trace file to write
  uint16_t port = 5432;   // the server's TCP port
  std::string host;       // the server's address; empty: any
  double duration_s = 0;  // live: stop after this long; 0 = until SIGINT/SIGTERM
  int snaplen = 262144;   // bytes captured per packet
  // The kernel ring. The tap writes each packet into the next frame of it,
  // so a ring that fits in the CPU's cache stays warm, while one of tens of
  // megabytes streams through memory and evicts the server's and clients'
  // data on every pass: on pgbench -S over loopback 8 MiB kept 6% more
  // transactions per second than 64 MiB (16 interleaved rounds) with no
  // drops; that is about half a second of that traffic. Drops are counted
  // and reported; a busier link wants a larger ring.
  uint64_t buffer_bytes = 8ull << 20;
  // zstd level of the trace's chunks: -100 to 22, negative levels being
  // zstd's fast ones; 0 stores them raw. The default -3 takes a tenth less
  // capture CPU than level 1 on pgbench traffic for a fifth more file; 0 a
  // tenth to a sixth less than -3, for two to three and a half times its file.
  int compression_level = -3;
  std::string session_map;  // file naming user/database of joined sessions
  uint32_t max_connections = 16384;
  uint64_t reassembly_bytes = 64ull << 20;  // out-of-order segment pool
  // What the protocol decoders of every connection may hold together for
  // messages they reassemble (capture/wire.h BufferBudget); a larger
  // message is recorded as a stream gap and counted.
  uint64_t decoder_memory = 1ull << 30;
  double hole_timeout_s = 0.5;  // packet time a stream hole may stay open
  // Connections from these client endpoints are not captured (a tool's own
  // connection to the server, such as capture run's counter sampler).
  struct Client {
    std::string addr;  // IPv4 or IPv6 address
    uint16_t port = 0;
  };
  std::vector<Client> ignore_clients;
  // Meta records written at the start after the sniffer's own (the
  // server's settings, read by the caller).
  std::vector<std::pair<std::string, std::string>> meta;
  // When set, the packets and their bytes captured so far, updated after
  // every batch the kernel hands over, for a status line on another thread.
  std::atomic<uint64_t>* live_packets = nullptr;
  std::atomic<uint64_t>* live_bytes = nullptr;
};

struct SniffSummary {
  uint64_t packets = 0;        // frames read
  uint64_t bytes = 0;          // frame bytes on the wire
  uint64_t tcp_payload = 0;    // bytes delivered in order to the decoder
  uint64_t kernel_drops = 0;   // pcap_stats ps_drop (ring full)
  uint64_t if_drops = 0;       // pcap_stats ps_ifdrop (interface)
  uint64_t not_tcp = 0;        // frames of other protocols
  uint64_t fragments = 0;      // IP fragments (not reassembled)
  uint64_t malformed = 0;      // frames with truncated or broken headers
  uint64_t sessions = 0;       // PostgreSQL sessions recorded
  uint64_t joined = 0;         // of which joined mid-stream
  uint64_t tls_sessions = 0;   // encrypted, not decodable
  uint64_t cancel_requests = 0;
  uint64_t statements = 0;     // Query + Execute
  uint64_t transactions = 0;
  uint64_t errors = 0;         // ErrorResponse
  uint64_t gaps = 0;           // stream holes
  uint64_t gap_bytes = 0;
  uint64_t out_of_order = 0;   // segments reordered
  uint64_t retransmitted = 0;
  uint64_t decode_failures = 0;  // sessions whose stream stopped validating
  uint64_t hunt_discarded = 0;   // bytes skipped while resynchronising
  // Caps on memory that hostile or unusual traffic reached (each a count
  // of times): connections dropped from a full table (--max-connections),
  // segments with no room to be held behind a hole in their connection
  // (1/64 of the pool, at least 256 KiB) or in the whole pool
  // (--reassembly-buffer); the holes became stream gaps.
  uint64_t evicted = 0;
  uint64_t held_per_connection_full = 0;
  uint64_t held_pool_full = 0;
  uint64_t decoder_refused = 0;  // messages not reassembled: decoder_memory full
  uint64_t records = 0;        // trace records in the file
  double seconds = 0;          // capture time (packet time for files)
  // When the trace could not take more (a full disk): why, when (seconds
  // into the capture) and the records decoded after its last whole chunk,
  // which are not in it. Decoding goes on to the end, only counting.
  std::string recording_error;
  double recording_stopped_s = 0;
  uint64_t lost_records = 0;
  uint64_t buffer_bytes = 0;   // live: the kernel ring asked for
};

// One line of a --session-map file: who a joined session belongs to.
struct SessionMapEntry {
  std::string addr;  // client address; empty: any
  uint16_t port = 0; // client port; 0: any
  std::string user;
  std::string database;
  std::string application_name;
};

// Parses a session map. Format, one entry per line, '#' starts a comment:
//
//   CLIENT USER DATABASE [APPLICATION_NAME]
//
// CLIENT is ADDR:PORT, [IPV6]:PORT, ADDR (any port) or :PORT (any address).
// A session joined mid-stream takes the first entry that matches its client
// endpoint. Throws InputError naming the file and line.
std::vector<SessionMapEntry> parse_session_map(const std::string& text, const std::string& name);

// Throws, for options run_sniff() would refuse, SettingError naming the
// member and its value ("max_connections": "0: must be 1 to 65536"), or
// InputError starting with `who` (the subcommand) for a combination;
// callers that do other work first (capture run) check before it.
void check_sniff_options(const SniffOptions& opts, const std::string& who);

// Runs a capture until the file ends, --duration passes or stop_sniff() is
// called. Prints "capturing on ..." to `log` once packets can flow, and
// warnings. A trace that cannot take more (a full disk) stops recording:
// one "RECORDING STOPPED" line to `log`, the file cut back to its last
// whole chunk, the capture going on and the summary's recording_error set. Throws InputError for bad options or files, RuntimeError when
// libpcap cannot open the interface.
SniffSummary run_sniff(const SniffOptions& opts, std::ostream& log);

// Asks a running run_sniff() to stop; safe to call from a signal handler.
void stop_sniff();

// The summary as the CLI prints it, several lines.
void print_summary(const SniffSummary& s, bool live, std::ostream& out);

// When the kernel dropped packets: one line saying what the drops cost and
// that a larger --buffer-size would help; empty otherwise.
std::string drop_advice(const SniffSummary& s);

}  // namespace tierlab::capture
