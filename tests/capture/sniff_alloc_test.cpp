// The sniffer's per-packet path — frame decoding, TCP reassembly (in order,
// reordered and lost segments), the wire decoder and the trace writer — does
// not allocate once warm.
//
// Counting happens one level below operator new (which another test of this
// binary replaces): malloc, calloc and realloc of this binary are counted per
// thread and forwarded to the C library's allocator. Every heap allocation of
// C++ and C code, libraries included, goes through them.
#include "capture/sniff_frames.h"
#include "capture/tcp_reassembly.h"
#include "capture/wire.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
}

namespace {
thread_local uint64_t t_allocs = 0;
}

extern "C" void* malloc(size_t n) {
  ++t_allocs;
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t n, size_t m) {
  ++t_allocs;
  return __libc_calloc(n, m);
}
extern "C" void* realloc(void* p, size_t n) {
  ++t_allocs;
  return __libc_realloc(p, n);
}

using namespace tierlab;
using namespace tierlab::capture;
using namespace tierlab::test;

namespace {

class NullSink : public trace::Sink {
 public:
  void append(const void*, size_t len) override { bytes += len; }
  uint64_t bytes = 0;
};

class WriterSink : public RecordSink {
 public:
  explicit WriterSink(trace::Writer& w) : w_(w) {}
  void record(const trace::Record& r) override {
    w_.write(r);
    ++records;
  }
  uint64_t records = 0;

 private:
  trace::Writer& w_;
};

// One decoder per connection slot, as the sniffer keeps them.
class Feed : public StreamHandler {
 public:
  explicit Feed(RecordSink& sink) {
    for (auto& d : dec_) d = std::make_unique<SessionDecoder>(sink);
  }
  void on_open(uint32_t c, const ConnInfo& info, Nanos ts) override {
    if (info.joined) {
      JoinInfo ji;
      ji.client_addr = "10.0.0.1:40000";
      dec_[c]->join(++id_, ji, ts);
    } else {
      dec_[c]->begin(++id_, "10.0.0.1:40000", 0, ts);
    }
  }
  void on_data(uint32_t c, Dir d, const uint8_t* p, size_t n, Nanos ts) override {
    dec_[c]->feed(d == Dir::ToServer ? Direction::Frontend : Direction::Backend, p, n, ts);
  }
  void on_gap(uint32_t c, Dir d, uint64_t n, Nanos ts) override {
    dec_[c]->gap(d == Dir::ToServer ? Direction::Frontend : Direction::Backend, n, ts);
  }
  void on_close(uint32_t c, CloseKind, Nanos ts) override {
    dec_[c]->end(trace::EndReason::Clean, ts);
  }
  uint64_t statements() const {
    uint64_t n = 0;
    for (auto& d : dec_) n += d->stats().statements;
    return n;
  }

 private:
  std::unique_ptr<SessionDecoder> dec_[4];
  uint64_t id_ = 0;
};

// One round of a session's traffic: queries answered, one query's segments
// swapped, one query's segment lost.
std::vector<std::vector<uint8_t>> round_frames(Conversation& c) {
  std::vector<std::vector<uint8_t>> out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(build_frame(c.client(query("select " + std::to_string(i) + " from t"))));
    out.push_back(build_frame(c.server(complete("SELECT 1") + ready('I'))));
  }
  std::string q = query("update accounts set abalance = abalance + 1 where aid = 7");
  auto a = build_frame(c.client(q.substr(0, 10)));
  auto b = build_frame(c.client(q.substr(10)));
  out.push_back(b);
  out.push_back(a);
  out.push_back(build_frame(c.server(complete("UPDATE 1") + ready('I'))));
  c.client(query("select 'lost'"));  // never captured
  out.push_back(build_frame(c.server(complete("SELECT 1") + ready('I'))));
  return out;
}

}  // namespace

TEST_CASE("the sniffer's per-packet path does not allocate once warm", "[sniff][alloc]") {
  {
    uint64_t b = t_allocs;
    auto probe = std::make_unique<int>(1);
    REQUIRE(t_allocs == b + 1);  // the counter is live
  }
  auto sink = std::make_unique<NullSink>();
  NullSink* raw = sink.get();
  trace::Writer writer(std::move(sink));
  WriterSink records(writer);
  Feed feed(records);
  Reassembler::Options o;
  o.max_connections = 4;
  o.buffer_bytes = 1 << 20;
  Reassembler r(o, &feed);

  Conversation c;
  std::vector<std::vector<uint8_t>> frames;
  for (auto& f : c.handshake()) frames.push_back(build_frame(f));
  frames.push_back(build_frame(c.client(startup("alice", "shop"))));
  frames.push_back(build_frame(c.server(auth_ok() + ready('I'))));
  std::vector<std::vector<std::vector<uint8_t>>> rounds;
  for (int i = 0; i < 200; ++i) rounds.push_back(round_frames(c));

  Nanos ts = 1'000'000;
  auto play = [&](const std::vector<std::vector<uint8_t>>& fs) {
    for (const auto& f : fs) {
      Segment s;
      REQUIRE(parse_packet(DLT_EN10MB, f.data(), static_cast<uint32_t>(f.size()),
                           static_cast<uint32_t>(f.size()), &s) == ParseResult::Tcp);
      r.add(s, ts += 1000);
    }
  };
  play(frames);
  for (int i = 0; i < 20; ++i) play(rounds[i]);  // warm up: buffers reach their size

  uint64_t before = t_allocs;
  for (int i = 20; i < 200; ++i) {
    const auto& fs = rounds[i];
    for (const auto& f : fs) {
      Segment s;
      ParseResult pr = parse_packet(DLT_EN10MB, f.data(), static_cast<uint32_t>(f.size()),
                                    static_cast<uint32_t>(f.size()), &s);
      if (pr != ParseResult::Tcp) FAIL("frame did not parse");
      r.add(s, ts += 1000);
    }
  }
  uint64_t allocs = t_allocs - before;
  CHECK(allocs == 0);
  CHECK(r.stats().gaps == 200);
  CHECK(r.stats().out_of_order == 200);
  CHECK(feed.statements() == 200 * 9);
  CHECK(raw->bytes > 0);
}
