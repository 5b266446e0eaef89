// TCP reassembly on synthetic segments: order, holes, retransmissions,
// sequence wraparound, open and close.
#include "capture/tcp_reassembly.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

using namespace tierlab::capture;

namespace {

struct Event {
  char kind;  // 'o' open, 'd' data, 'g' gap, 'c' close
  uint32_t conn;
  Dir dir;
  std::string data;
  uint64_t n;
  CloseKind how;
};

struct Recorder : StreamHandler {
  std::vector<Event> ev;
  std::map<uint32_t, std::string> stream[2];
  std::map<uint32_t, bool> joined;
  void on_open(uint32_t c, const ConnInfo& info, Nanos) override {
    ev.push_back({'o', c, Dir::ToServer, "", 0, CloseKind::Fin});
    joined[c] = info.joined;
    stream[0][c].clear();
    stream[1][c].clear();
  }
  void on_data(uint32_t c, Dir d, const uint8_t* p, size_t n, Nanos) override {
    std::string s(reinterpret_cast<const char*>(p), n);
    ev.push_back({'d', c, d, s, n, CloseKind::Fin});
    stream[static_cast<int>(d)][c] += s;
  }
  void on_gap(uint32_t c, Dir d, uint64_t n, Nanos) override {
    ev.push_back({'g', c, d, "", n, CloseKind::Fin});
    stream[static_cast<int>(d)][c] += "<gap " + std::to_string(n) + ">";
  }
  void on_close(uint32_t c, CloseKind how, Nanos) override {
    ev.push_back({'c', c, Dir::ToServer, "", 0, how});
  }
  int count(char k) const {
    int n = 0;
    for (auto& e : ev) n += e.kind == k;
    return n;
  }
  const Event* last(char k) const {
    for (auto it = ev.rbegin(); it != ev.rend(); ++it)
      if (it->kind == k) return &*it;
    return nullptr;
  }
};

// A TCP endpoint pair client 10.0.0.1:40000 <-> server 10.0.0.2:5432.
struct Flow {
  uint32_t cseq, sseq;
  uint16_t cport = 40000;
  std::deque<std::string> keep;  // payload storage (stable addresses)

  Flow(uint32_t c_isn, uint32_t s_isn) : cseq(c_isn), sseq(s_isn) {}

  static void v4(uint8_t* a, uint8_t last) {
    std::memset(a, 0, 16);
    a[10] = a[11] = 0xFF;
    a[12] = 10;
    a[15] = last;
  }
  Segment seg(Dir d, uint32_t seq, uint32_t ack, uint8_t flags, const std::string& data) {
    keep.push_back(data);
    Segment s;
    if (d == Dir::ToServer) {
      v4(s.src, 1);
      v4(s.dst, 2);
      s.sport = cport;
      s.dport = 5432;
    } else {
      v4(s.src, 2);
      v4(s.dst, 1);
      s.sport = 5432;
      s.dport = cport;
    }
    s.seq = seq;
    s.ack = ack;
    s.flags = flags;
    s.payload = reinterpret_cast<const uint8_t*>(keep.back().data());
    s.payload_len = static_cast<uint32_t>(data.size());
    return s;
  }
  // Handshake: SYN, SYN-ACK, ACK.
  void open(Reassembler& r) {
    r.add(seg(Dir::ToServer, cseq, 0, kTcpSyn, ""), 1);
    r.add(seg(Dir::ToClient, sseq, cseq + 1, kTcpSyn | kTcpAck, ""), 2);
    ++cseq;
    ++sseq;
    r.add(seg(Dir::ToServer, cseq, sseq, kTcpAck, ""), 3);
  }
  // Next in-order segment from the client (advances the sequence).
  Segment c(const std::string& data, uint8_t flags = kTcpAck) {
    Segment s = seg(Dir::ToServer, cseq, sseq, flags, data);
    cseq += static_cast<uint32_t>(data.size());
    return s;
  }
  Segment s(const std::string& data, uint8_t flags = kTcpAck) {
    Segment x = seg(Dir::ToClient, sseq, cseq, flags, data);
    sseq += static_cast<uint32_t>(data.size());
    return x;
  }
};

Reassembler::Options opts() {
  Reassembler::Options o;
  o.max_connections = 8;
  o.buffer_bytes = 1 << 20;
  o.max_buffered_per_dir = 64 << 10;
  o.hole_timeout_ns = 1'000'000'000;
  return o;
}

}  // namespace

TEST_CASE("reassembly delivers an in-order exchange and closes on FIN both ways", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  REQUIRE(rec.count('o') == 1);
  CHECK_FALSE(rec.joined[0]);
  r.add(f.c("hello"), 10);
  r.add(f.s("world"), 11);
  r.add(f.c("again"), 12);
  Segment fin_c = f.c("", kTcpFin | kTcpAck);
  r.add(fin_c, 13);
  ++f.cseq;
  CHECK(rec.count('c') == 0);
  r.add(f.s("", kTcpFin | kTcpAck), 14);
  ++f.sseq;
  REQUIRE(rec.count('c') == 1);
  CHECK(rec.last('c')->how == CloseKind::Fin);
  CHECK(rec.stream[0][0] == "helloagain");
  CHECK(rec.stream[1][0] == "world");
  CHECK(rec.count('g') == 0);
  CHECK(r.open_connections() == 0);
  // The last ACK of a closed connection does not open a new one.
  r.add(f.c(""), 15);
  CHECK(rec.count('o') == 1);
}

TEST_CASE("reassembly reorders segments without a gap", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  Segment a = f.c("AAAA"), b = f.c("BBBB"), c = f.c("CCCC");
  r.add(a, 10);
  r.add(c, 11);
  CHECK(rec.stream[0][0] == "AAAA");
  r.add(b, 12);
  CHECK(rec.stream[0][0] == "AAAABBBBCCCC");
  CHECK(rec.count('g') == 0);
  CHECK(r.stats().out_of_order == 1);
}

TEST_CASE("reassembly trims retransmissions and overlaps", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  uint32_t start = f.cseq;
  r.add(f.c("0123456789"), 10);
  r.add(f.seg(Dir::ToServer, start, f.sseq, kTcpAck, "0123456789"), 11);  // full retransmit
  r.add(f.seg(Dir::ToServer, start + 5, f.sseq, kTcpAck, "56789abcde"), 12);  // overlap
  f.cseq = start + 15;
  CHECK(rec.stream[0][0] == "0123456789abcde");
  CHECK(r.stats().retransmitted == 1);
  CHECK(r.stats().trimmed_bytes == 5);
  // Overlapping held-back segments are trimmed when they are delivered.
  r.add(f.seg(Dir::ToServer, start + 20, f.sseq, kTcpAck, "KLMNO"), 13);
  r.add(f.seg(Dir::ToServer, start + 18, f.sseq, kTcpAck, "IJKLM"), 14);
  r.add(f.seg(Dir::ToServer, start + 15, f.sseq, kTcpAck, "FGH"), 15);
  CHECK(rec.stream[0][0] == "0123456789abcdeFGHIJKLMNO");
  CHECK(rec.count('g') == 0);
}

TEST_CASE("reassembly handles sequence numbers that wrap", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(0xFFFFFFF0u, 0xFFFFFFFEu);
  f.open(r);
  Segment a = f.c("0123456789ABCDEF"), b = f.c("ghij"), c = f.c("klmn");
  CHECK(b.seq < a.seq);  // wrapped
  r.add(a, 10);
  r.add(c, 11);
  r.add(b, 12);
  r.add(f.s("server-bytes"), 13);
  CHECK(rec.stream[0][0] == "0123456789ABCDEFghijklmn");
  CHECK(rec.stream[1][0] == "server-bytes");
  CHECK(rec.count('g') == 0);
}

TEST_CASE("a lost segment acknowledged by the peer is a gap at once", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  r.add(f.c("first"), 10);
  f.c("lost!");  // never captured
  // The server's reply acknowledges the lost bytes.
  r.add(f.s("reply"), 11);
  REQUIRE(rec.count('g') == 1);
  CHECK(rec.last('g')->n == 5);
  CHECK(rec.last('g')->dir == Dir::ToServer);
  // The gap is reported before the reply is delivered.
  CHECK(rec.ev[rec.ev.size() - 2].kind == 'g');
  r.add(f.c("third"), 12);
  CHECK(rec.stream[0][0] == "first<gap 5>third");
  CHECK(r.stats().gaps == 1);
  CHECK(r.stats().gap_bytes == 5);
}

TEST_CASE("a hole not filled within the timeout becomes a gap", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  r.add(f.c("aa"), 10);
  f.c("bbb");  // lost
  Segment c = f.seg(Dir::ToServer, f.cseq, 5001, kTcpAck, "cc");  // ack nothing new
  f.cseq += 2;
  r.add(c, 20);
  r.advance(500'000'000);
  CHECK(rec.count('g') == 0);
  r.advance(2'000'000'000);
  REQUIRE(rec.count('g') == 1);
  CHECK(rec.stream[0][0] == "aa<gap 3>cc");
}

TEST_CASE("the per-direction bound turns the oldest hole into a gap", "[tcp]") {
  Recorder rec;
  auto o = opts();
  o.max_buffered_per_dir = 10;
  Reassembler r(o, &rec);
  Flow f(1000, 5000);
  f.open(r);
  f.c("xx");  // lost
  Segment a = f.seg(Dir::ToServer, f.cseq, 5001, kTcpAck, "123456");
  Segment b = f.seg(Dir::ToServer, f.cseq + 6, 5001, kTcpAck, "789012");
  r.add(a, 10);
  CHECK(rec.count('g') == 0);
  r.add(b, 11);  // 12 bytes would be held: over the bound
  REQUIRE(rec.count('g') == 1);
  CHECK(rec.stream[0][0] == "<gap 2>123456789012");
}

TEST_CASE("RST closes and flushes held-back data as a gap", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  f.c("lost");
  Segment a = f.seg(Dir::ToServer, f.cseq, 5001, kTcpAck, "tail");
  r.add(a, 10);
  r.add(f.seg(Dir::ToClient, 5001, 0, kTcpRst, ""), 11);
  REQUIRE(rec.count('c') == 1);
  CHECK(rec.last('c')->how == CloseKind::Reset);
  CHECK(rec.stream[0][0] == "<gap 4>tail");
}

TEST_CASE("a connection without SYN is joined mid-stream", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(777, 888);
  // Pure ACKs of an unknown connection do not open it.
  r.add(f.seg(Dir::ToServer, 777, 888, kTcpAck, ""), 1);
  CHECK(rec.count('o') == 0);
  r.add(f.c("middle"), 2);
  REQUIRE(rec.count('o') == 1);
  CHECK(rec.joined[0]);
  r.add(f.s("answer"), 3);
  CHECK(rec.stream[0][0] == "middle");
  CHECK(rec.stream[1][0] == "answer");
  CHECK(r.stats().joined == 1);
}

TEST_CASE("finish flushes holes and closes every connection", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  r.add(f.c("a"), 10);
  f.c("b");
  Segment c = f.seg(Dir::ToServer, f.cseq, 5001, kTcpAck, "c");
  r.add(c, 11);
  r.finish(12);
  CHECK(rec.stream[0][0] == "a<gap 1>c");
  CHECK(rec.last('c')->how == CloseKind::Flushed);
  CHECK(r.open_connections() == 0);
}

TEST_CASE("a full table evicts the least recently active connection", "[tcp]") {
  Recorder rec;
  auto o = opts();
  o.max_connections = 2;
  Reassembler r(o, &rec);
  Flow a(1, 100), b(2, 200), c(3, 300);
  a.cport = 1001;
  b.cport = 1002;
  c.cport = 1003;
  a.open(r);
  b.open(r);
  r.add(a.c("a"), 5);  // b is now the least recently active
  c.open(r);
  CHECK(r.stats().evicted == 1);
  REQUIRE(rec.count('c') == 1);
  CHECK(rec.last('c')->how == CloseKind::Evicted);
  CHECK(rec.last('c')->conn == 1);
  r.add(a.c("b"), 6);
  r.add(c.c("z"), 7);
  CHECK(rec.stream[0][0] == "ab");
  CHECK(rec.stream[0][1] == "z");  // c reuses b's slot
}

TEST_CASE("a new SYN on a known address pair replaces the old connection", "[tcp]") {
  Recorder rec;
  Reassembler r(opts(), &rec);
  Flow f(1000, 5000);
  f.open(r);
  r.add(f.c("old"), 4);
  Flow g(90000, 70000);
  g.open(r);
  CHECK(rec.count('o') == 2);
  CHECK(rec.last('c')->how == CloseKind::Replaced);
  r.add(g.c("new"), 5);
  CHECK(rec.stream[0][0] == "new");
}

TEST_CASE("many connections with random loss stay consistent", "[tcp]") {
  // Segments reordered within small windows and occasionally lost: every
  // delivered byte is in place, and delivered + gap bytes add up to the stream.
  Recorder rec;
  auto o = opts();
  o.max_connections = 64;
  Reassembler r(o, &rec);
  uint64_t rng = 12345;
  auto rnd = [&] { return rng = rng * 6364136223846793005ull + 1442695040888963407ull, rng >> 33; };
  std::vector<Flow> flows;
  std::vector<std::string> truth(16);
  for (int i = 0; i < 16; ++i) {
    flows.emplace_back(static_cast<uint32_t>(rnd()), static_cast<uint32_t>(rnd()));
    flows.back().cport = static_cast<uint16_t>(20000 + i);
    flows.back().open(r);
  }
  Nanos t = 100;
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < 16; ++i) {
      std::vector<Segment> batch;
      for (int k = 0; k < 4; ++k) {
        std::string data(1 + rnd() % 300, static_cast<char>('a' + (rnd() % 26)));
        truth[i] += data;
        batch.push_back(flows[i].seg(Dir::ToServer, flows[i].cseq, flows[i].sseq, 0, data));
        flows[i].cseq += static_cast<uint32_t>(data.size());
      }
      std::swap(batch[rnd() % 4], batch[rnd() % 4]);
      for (auto& s : batch)
        if (rnd() % 50 != 0) r.add(s, t++);
    }
  }
  for (int i = 0; i < 16; ++i) {
    truth[i] += "END";
    r.add(flows[i].c("END", 0), t++);
  }
  r.finish(t);
  CHECK(r.stats().gaps > 0);
  CHECK(r.stats().out_of_order > 0);
  uint32_t slot = 0;
  for (int i = 0; i < 16; ++i, ++slot) {
    // Rebuild from events to compare position by position.
    std::string got;
    for (auto& e : rec.ev) {
      if (e.conn != slot || e.dir != Dir::ToServer) continue;
      if (e.kind == 'd') got += e.data;
      if (e.kind == 'g') got += std::string(e.n, '?');
    }
    REQUIRE(got.size() == truth[i].size());
    for (size_t p = 0; p < got.size(); ++p)
      if (got[p] != '?') REQUIRE(got[p] == truth[i][p]);
  }
}
