// Packet decoding and TCP reassembly fed from pcap-like records: reordered,
// overlapping, retransmitted and truncated segments of a few connections,
// through a small table and pool so eviction and pool exhaustion are
// reachable. The handler checks the callbacks' contract: a slot is opened
// before data, gaps or close reach it, and closed once.
//
// Input: a sequence of records [link u8][time step u16][extra wire bytes u8]
// [caplen u16][frame]; link picks one of the supported link types.
#include "fuzz.h"

#include "capture/tcp_reassembly.h"

namespace {

using namespace tierlab;
using namespace tierlab::capture;

constexpr uint32_t kSlots = 4;
constexpr int kLinks[] = {0, 1, 12, 14, 101, 108, 113, 228, 229, 276};

struct Handler : StreamHandler {
  bool open[kSlots] = {};
  uint64_t data = 0;
  void on_open(uint32_t conn, const ConnInfo&, Nanos) override {
    fuzz::check(conn < kSlots, "slot within max_connections");
    fuzz::check(!open[conn], "on_open of an open slot");
    open[conn] = true;
  }
  void on_data(uint32_t conn, Dir, const uint8_t* p, size_t len, Nanos) override {
    fuzz::check(conn < kSlots && open[conn], "on_data of a slot not open");
    fuzz::check(len > 0, "on_data with no bytes");
    for (size_t i = 0; i < len; ++i) data += p[i];  // every byte must be readable
  }
  void on_gap(uint32_t conn, Dir, uint64_t bytes, Nanos) override {
    fuzz::check(conn < kSlots && open[conn], "on_gap of a slot not open");
    fuzz::check(bytes > 0, "on_gap of no bytes");
  }
  void on_close(uint32_t conn, CloseKind, Nanos) override {
    fuzz::check(conn < kSlots && open[conn], "on_close of a slot not open");
    open[conn] = false;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  Handler h;
  Reassembler::Options o;
  o.max_connections = kSlots;
  o.buffer_bytes = 16 * 1024;
  o.max_buffered_per_dir = 4 * 1024;
  o.hole_timeout_ns = 1000;
  Nanos ts = 0;
  {
    Reassembler r(o, &h);
    while (!in.empty()) {
      int dlt = kLinks[in.u8() % std::size(kLinks)];
      uint16_t step = in.u16();
      uint8_t extra = in.u8();
      uint16_t caplen = in.u16();
      auto frame = in.take(caplen);
      ts += step;
      Segment seg;
      auto res = parse_packet(dlt, reinterpret_cast<const uint8_t*>(frame.data()),
                              static_cast<uint32_t>(frame.size()),
                              static_cast<uint32_t>(frame.size()) + extra, &seg);
      if (res == ParseResult::Tcp) {
        fuzz::check(seg.payload_len <= frame.size(), "payload within the frame");
        if (seg.payload_len)
          fuzz::check(seg.payload >= reinterpret_cast<const uint8_t*>(frame.data()) &&
                          seg.payload + seg.payload_len <=
                              reinterpret_cast<const uint8_t*>(frame.data()) + frame.size(),
                      "payload inside the frame");
        r.add(seg, ts);
      }
      if (step & 0x8000) r.advance(ts);
    }
    r.finish(ts + 1);
    for (bool b : h.open) fuzz::check(!b, "finish() closes every connection");
    fuzz::check(r.open_connections() == 0, "no connection open after finish()");
  }
  return 0;
}
