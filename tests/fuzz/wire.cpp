// The PostgreSQL protocol decoder the proxy and the sniffer share.
//
// First byte, bit 0:
//   0  pieces: the rest is a sequence of [control][len][bytes]: control bit 0
//      the direction, bits 1-3 what to do (feed a piece of up to 255 or
//      65535 bytes, a gap, a note_error, end and begin again); the seeds
//      hold one message per piece. Bit 1 of the first byte: join() instead
//      of begin().
//   1  streams: [u16 frontend length][frontend bytes][backend bytes], fed
//      once whole and once split at points the last byte seeds; both runs
//      must record the same records and fail alike (begin() mode: no
//      hunting, and every CopyData reassembled, so the split cannot matter).
//
// Limits: a message's body is buffered whole, up to WireLimits::max_message
// (1 GiB by default, as PostgreSQL allows), allocated when its header
// arrives. The targets lower it to 1 MiB so that -malloc_limit_mb finds any
// allocation that is not bounded by it; the pieces mode also lowers
// copy_reassemble_max so that long CopyData is recorded piece by piece.
#include "fuzz.h"

#include "capture/wire.h"

#include <string>

namespace {

using namespace tierlab;
using capture::Direction;

struct Sink : capture::RecordSink {
  std::vector<std::string> records;
  void record(const trace::Record& r) override { records.push_back(fuzz::dump(r)); }
  void parameter_status(uint64_t, std::string_view name, std::string_view value,
                        trace::Nanos) override {
    records.push_back("ps " + std::string(name) + "=" + std::string(value));
  }
};

constexpr uint32_t kMaxMessage = 1u << 20;

void pieces(fuzz::Bytes& in, bool join) {
  Sink sink;
  capture::WireLimits limits;
  limits.max_message = kMaxMessage;
  limits.copy_reassemble_max = 64;
  capture::SessionDecoder dec(sink, limits);
  trace::Nanos ts = 1;
  auto start = [&] {
    if (join) {
      capture::JoinInfo info;
      info.user = "u";
      info.database = "d";
      dec.join(7, info, ts);
    } else {
      dec.begin(7, "127.0.0.1:1", 0, ts);
    }
  };
  start();
  while (!in.empty()) {
    uint8_t c = in.u8();
    Direction d = (c & 1) ? Direction::Backend : Direction::Frontend;
    ++ts;
    switch ((c >> 1) & 7) {
      case 0: case 1: case 2: case 3: {
        auto s = in.take(in.u8());
        dec.feed(d, reinterpret_cast<const uint8_t*>(s.data()), s.size(), ts);
        break;
      }
      case 4: {
        auto s = in.take(in.u16());
        dec.feed(d, reinterpret_cast<const uint8_t*>(s.data()), s.size(), ts);
        break;
      }
      case 5:
        dec.gap(d, in.u16(), ts);
        break;
      case 6:
        dec.note_error("FATAL", "08P01", "fuzz", ts);
        break;
      case 7:
        dec.end(trace::EndReason::Clean, ts);
        start();
        break;
    }
    fuzz::check(!dec.failed() || dec.error()[0] != 0, "a failed decoder says why");
  }
  dec.end(trace::EndReason::Clean, ts);
}

struct Run {
  std::vector<std::string> records;
  bool failed = false;
  std::string error;
};

Run stream(std::string_view fe, std::string_view be, uint32_t seed) {
  Sink sink;
  capture::WireLimits limits;
  limits.max_message = kMaxMessage;
  limits.copy_reassemble_max = kMaxMessage;
  capture::SessionDecoder dec(sink, limits);
  dec.begin(7, "127.0.0.1:1", 0, 1);
  auto feed = [&](Direction d, std::string_view s) {
    while (!s.empty()) {
      size_t n = s.size();
      if (seed) {
        seed = seed * 1103515245u + 12345u;
        n = std::min<size_t>(n, 1 + ((seed >> 16) % 64));
      }
      dec.feed(d, reinterpret_cast<const uint8_t*>(s.data()), n, 1);
      s.remove_prefix(n);
    }
  };
  feed(Direction::Frontend, fe);
  feed(Direction::Backend, be);
  dec.end(trace::EndReason::Clean, 1);
  return {std::move(sink.records), dec.failed(), dec.failed() ? dec.error() : ""};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  uint8_t mode = in.u8();
  if (!(mode & 1)) {
    pieces(in, mode & 2);
    return 0;
  }
  uint16_t fe_len = in.u16();
  auto fe = in.take(fe_len);
  auto be = in.rest();
  uint32_t seed = 1u + (size ? data[size - 1] : 0);
  Run whole = stream(fe, be, 0);
  Run split = stream(fe, be, seed);
  fuzz::check(whole.failed == split.failed, "decoding fails alike however the bytes are split",
              "whole: " + whole.error + "\nsplit: " + split.error);
  if (whole.records.size() != split.records.size()) {
    std::string d = "whole:\n";
    for (const auto& r : whole.records) d += "  " + r + "\n";
    d += "split:\n";
    for (const auto& r : split.records) d += "  " + r + "\n";
    fuzz::fail("the same number of records however the bytes are split", d);
  }
  for (size_t i = 0; i < whole.records.size(); ++i)
    fuzz::check(whole.records[i] == split.records[i], "the same records however the bytes are split",
                "whole: " + whole.records[i] + "\nsplit: " + split.records[i]);
  return 0;
}
