// Writes the generated seeds of the fuzz corpora (tests/fuzz/corpus/): trace
// files and chunks, protocol conversations, packet records and a pcap, all
// built with tierlab's own writer and the tests' message and frame builders.
// Usage: fuzz_make_seeds CORPUS_DIR. The text seeds (iologs, blkparse, tiers)
// are kept as files; these are regenerated when the formats change.
#include "fuzz.h"

#include "capture/sniff_frames.h"
#include "capture/wire_builder.h"

#include <filesystem>
#include <fstream>
#include <iostream>

// wire_builder.h's LineSink (unused here) names this; the tests define it in
// their own binary.
std::string wiretest::describe(const tierlab::trace::Record& r) { return tierlab::fuzz::dump(r); }

namespace {

using namespace tierlab;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

fs::path root;

void save(const std::string& target, const std::string& name, const Bytes& b) {
  fs::create_directories(root / target);
  std::ofstream f(root / target / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + (root / target / name).string());
}

// A session as the trace records it: simple and extended queries, COPY, an
// error, and storage records.
std::vector<trace::Record> session_records() {
  static const uint32_t types[] = {23, 25};
  static const trace::Param params[] = {{0, false, "42"}, {1, false, std::string_view("\0\0\0\1", 4)},
                                        {0, true, ""}};
  static const int16_t formats[] = {0, 1};
  std::vector<trace::Record> v;
  trace::Nanos t = 1000;
  auto add = [&](uint64_t s, trace::Body b) { v.push_back({t, s, b}); t += 1500; };
  add(1, trace::SessionBegin{"alice", "bench", "psql", "127.0.0.1:5000", 4242, 0});
  add(1, trace::Query{"BEGIN"});
  add(1, trace::Result{"BEGIN", false, 0});
  add(1, trace::Ready{'T'});
  add(1, trace::Parse{"s1", "SELECT $1::int, $2::text", types});
  add(1, trace::Bind{"", "s1", std::span(params, 2), formats});
  add(1, trace::Describe{'P', ""});
  add(1, trace::Execute{"", 0});
  add(1, trace::Sync{});
  add(1, trace::Result{"SELECT", true, 1});
  add(1, trace::Ready{'T'});
  add(1, trace::Bind{"p", "s1", std::span(params + 1, 2), {}});
  add(1, trace::Execute{"p", 10});
  add(1, trace::Flush{});
  add(1, trace::Suspended{});
  add(1, trace::Close{'S', "s1"});
  add(1, trace::Sync{});
  add(1, trace::Ready{'T'});
  add(1, trace::Query{"COPY t FROM STDIN"});
  add(1, trace::CopyData{trace::CopyDir::In, "1\tone\n2\ttwo\n"});
  add(1, trace::CopyDone{trace::CopyDir::In});
  add(1, trace::Result{"COPY", true, 2});
  add(1, trace::Ready{'T'});
  add(1, trace::Query{"SELECT 1/0"});
  add(1, trace::Error{"22012", "ERROR", "division by zero"});
  add(1, trace::Ready{'E'});
  add(1, trace::Query{""});
  add(1, trace::EmptyQuery{});
  add(1, trace::Query{"COPY t FROM STDIN"});
  add(1, trace::CopyFail{"client gave up"});
  add(1, trace::Error{"57014", "ERROR", "COPY from stdin failed"});
  add(1, trace::Ready{'E'});
  add(1, trace::Query{"ROLLBACK"});
  add(1, trace::Result{"ROLLBACK", false, 0});
  add(1, trace::Ready{'I'});
  add(2, trace::SessionBegin{"bob", "bench", "", "unix", 0, trace::kSessionUnknownStartup});
  add(2, trace::Query{"COPY t TO STDOUT"});
  add(2, trace::CopyData{trace::CopyDir::Out, "1\tone\n"});
  add(2, trace::CopyDone{trace::CopyDir::Out});
  add(2, trace::Result{"COPY", true, 1});
  add(2, trace::Ready{'I'});
  add(0, trace::BlockIo{t + 500, (8u << 20) | 0, 8192, 4096, trace::IoOp::Write, trace::kIoSync, 77});
  add(0, trace::FileIo{77, "base/5/16384", 0, 8192, trace::IoOp::Read, 0, 12000});
  add(0, trace::Sample{"pg.blks_read", 12.5});
  add(0, trace::Meta{"server_version", "15.5"});
  add(0, trace::Loss{trace::LossKind::StreamGap, 100});
  add(2, trace::SessionEnd{trace::EndReason::ClientAbort});
  add(1, trace::Query{"SELECT 2"});
  add(1, trace::Result{"SELECT", true, 1});
  add(1, trace::Ready{'I'});
  add(1, trace::SessionEnd{trace::EndReason::Clean});
  return v;
}

Bytes write_trace(const std::vector<trace::Record>& recs, int level, size_t chunk_bytes) {
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::WriterOptions o;
  o.start_mono_ns = 1000;
  o.realtime_offset_ns = 1'700'000'000'000'000'000;
  o.compression_level = level;
  o.chunk_bytes = chunk_bytes;
  trace::Writer w(std::move(sink), o);
  for (const auto& r : recs) w.write(r);
  w.close();
  return mem->bytes();  // the writer owns the sink: copy before it goes
}

// The first chunk's payload of an uncompressed trace, prefixed with the
// control byte trace_chunk and replay_plan read (record count, end flag).
Bytes first_chunk(const Bytes& trace) {
  const size_t h = 36;
  uint32_t flags, raw, count;
  std::memcpy(&flags, trace.data() + h + 4, 4);
  std::memcpy(&raw, trace.data() + h + 12, 4);
  std::memcpy(&count, trace.data() + h + 16, 4);
  if (count > 0x7f) throw std::runtime_error("seed chunk holds too many records");
  Bytes b{static_cast<uint8_t>(count | ((flags & 2) ? 0x80 : 0))};  // 2: the last chunk
  b.insert(b.end(), trace.begin() + h + 40, trace.begin() + h + 40 + raw);
  return b;
}

void traces() {
  auto recs = session_records();
  save("trace_reader", "session-zstd", write_trace(recs, 1, 256 * 1024));
  save("trace_reader", "session-raw-small-chunks", write_trace(recs, 0, 200));
  save("trace_reader", "empty", write_trace({}, 1, 256 * 1024));
  auto raw = write_trace(recs, 0, 256 * 1024);
  save("trace_chunk", "session", first_chunk(raw));
  save("replay_plan", "session", first_chunk(raw));
  std::vector<trace::Record> half(recs.begin(), recs.begin() + 35);
  save("replay_plan", "session-cut", first_chunk(write_trace(half, 0, 256 * 1024)));
}

// Wire pieces: [control][len][bytes] per message, control bit 0 = backend.
struct Pieces {
  Bytes b;
  explicit Pieces(uint8_t mode) : b{mode} {}
  Pieces& fe(const Bytes& m) { return put(0, m); }
  Pieces& be(const Bytes& m) { return put(1, m); }
  Pieces& put(uint8_t dir, const Bytes& m) {
    if (m.size() <= 255) {
      b.push_back(dir);
      b.push_back(static_cast<uint8_t>(m.size()));
    } else {
      b.push_back(static_cast<uint8_t>(dir | (4 << 1)));
      b.push_back(static_cast<uint8_t>(m.size()));
      b.push_back(static_cast<uint8_t>(m.size() >> 8));
    }
    b.insert(b.end(), m.begin(), m.end());
    return *this;
  }
};

using wiretest::Msg;

std::vector<std::pair<uint8_t, Bytes>> conversation() {
  std::vector<std::pair<uint8_t, Bytes>> v;
  auto fe = [&](Bytes m) { v.push_back({0, std::move(m)}); };
  auto be = [&](Bytes m) { v.push_back({1, std::move(m)}); };
  fe(wiretest::startup("alice", "bench", "psql"));
  be(wiretest::auth_ok());
  be(wiretest::param_status("server_version", "15.5"));
  be(wiretest::key_data(4242));
  be(wiretest::ready('I'));
  fe(wiretest::query("SELECT 1"));
  be(Msg('T').i16(1).str("x").i32(0).i16(0).i32(23).i16(4).i32(-1).i16(0));
  be(Msg('D').i16(1).i32(1).raw("1"));
  be(wiretest::complete("SELECT 1"));
  be(wiretest::ready('I'));
  fe(Msg('P').str("s1").str("SELECT $1::int").i16(1).i32(23));
  fe(Msg('B').str("").str("s1").i16(1).i16(0).i16(1).i32(2).raw("42").i16(1).i16(0));
  fe(Msg('D').u8('P').str(""));
  fe(Msg('E').str("").i32(0));
  fe(wiretest::sync_msg());
  be(Msg('1'));
  be(Msg('2'));
  be(Msg('D').i16(1).i32(2).raw("42"));
  be(wiretest::complete("SELECT 1"));
  be(wiretest::ready('I'));
  fe(wiretest::query("COPY t FROM STDIN"));
  be(Msg('G').u8(0).i16(1).i16(0));
  fe(Msg('d').raw("1\tone\n"));
  fe(Msg('c'));
  be(wiretest::complete("COPY 1"));
  be(wiretest::ready('I'));
  fe(wiretest::query("COPY t TO STDOUT"));
  be(Msg('H').u8(0).i16(1).i16(0));
  be(Msg('d').raw("1\tone\n"));
  be(Msg('c'));
  be(wiretest::complete("COPY 1"));
  be(wiretest::ready('I'));
  fe(wiretest::query("SELECT 1/0"));
  be(wiretest::error("ERROR", "22012", "division by zero"));
  be(wiretest::ready('I'));
  fe(Msg('C').u8('S').str("s1"));
  fe(wiretest::terminate());
  return v;
}

void wire() {
  auto conv = conversation();
  Pieces begin(0), join(2);
  Bytes fe, be;
  for (const auto& [d, m] : conv) {
    begin.put(d, m);
    if (&m != &conv.front().second) join.put(d, m);
    (d ? be : fe).insert((d ? be : fe).end(), m.begin(), m.end());
  }
  save("wire", "session-pieces", begin.b);
  save("wire", "session-joined", join.b);
  Bytes s{1, static_cast<uint8_t>(fe.size()), static_cast<uint8_t>(fe.size() >> 8)};
  s.insert(s.end(), fe.begin(), fe.end());
  s.insert(s.end(), be.begin(), be.end());
  save("wire", "session-streams", s);
  Pieces ssl(0);
  ssl.fe(wiretest::ssl_request()).be({'N'}).fe(wiretest::startup("u", "d")).be(wiretest::auth_ok());
  save("wire", "ssl-refused", ssl.b);
}

// Packet records for tcp_reassembly: [link][step u16][extra][caplen u16][frame].
void packets() {
  using test::Conversation;
  using test::FrameSpec;
  auto record = [](Bytes& out, uint8_t link, const Bytes& frame) {
    out.push_back(link);
    out.push_back(100);
    out.push_back(0);
    out.push_back(0);
    out.push_back(static_cast<uint8_t>(frame.size()));
    out.push_back(static_cast<uint8_t>(frame.size() >> 8));
    out.insert(out.end(), frame.begin(), frame.end());
  };
  auto conv = conversation();
  auto frames = [&](Conversation c, bool shuffle) {
    std::vector<FrameSpec> v = c.handshake();
    for (const auto& [d, m] : conv) {
      std::string s(m.begin(), m.end());
      v.push_back(d ? c.server(s) : c.client(s));
    }
    v.push_back(c.client("", 0x11));
    v.push_back(c.server("", 0x11));
    if (shuffle && v.size() > 8) {
      std::swap(v[5], v[7]);   // reordered
      v.insert(v.begin() + 9, v[8]);  // retransmitted
      v[12].payload.resize(v[12].payload.size() / 2);  // cut short
    }
    return v;
  };
  Conversation c4;
  Bytes in_order, shuffled, v6;
  for (auto& f : frames(c4, false)) record(in_order, 1, test::build_frame(f));
  for (auto& f : frames(c4, true)) record(shuffled, 1, test::build_frame(f));
  Conversation c6;
  c6.base.v6 = true;
  c6.base.dlt = DLT_LINUX_SLL2;
  c6.base.src = "fd00::1";
  c6.base.dst = "fd00::2";
  for (auto& f : frames(c6, false)) record(v6, 9, test::build_frame(f));
  save("tcp_reassembly", "ipv4-ethernet", in_order);
  save("tcp_reassembly", "ipv4-reordered-retransmitted", shuffled);
  save("tcp_reassembly", "ipv6-sll2", v6);

  fs::create_directories(root / "pcap");
  {
    test::PcapFile p((root / "pcap" / "ipv4-ethernet.pcap").string(), DLT_EN10MB);
    int64_t ns = 1'700'000'000'000'000'000;
    for (auto& f : frames(c4, false)) p.add(test::build_frame(f), ns += 1000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds CORPUS_DIR\n";
    return 2;
  }
  root = argv[1];
  traces();
  wire();
  packets();
  return 0;
}
