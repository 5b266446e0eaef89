// The record queue between event loops and the trace writer thread: codec,
// ring wrap-around, back-pressure and counted drops, read back through the
// real trace reader.
#include "capture/queue_impl.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using namespace tierlab::capture::detail;

namespace {

std::vector<trace::Record> sample_records() {
  static const uint32_t types[] = {23, 25};
  static const trace::Param params[] = {{0, false, "42"}, {1, true, ""}, {1, false, std::string_view("\0\1\2", 3)}};
  static const int16_t fmts[] = {1, 0};
  std::vector<trace::Record> v;
  v.push_back({1, 7, trace::SessionBegin{"alice", "shop", "pgbench", "127.0.0.1:5000", 4242, 2}});
  v.push_back({2, 7, trace::Query{"select 1"}});
  v.push_back({3, 7, trace::Parse{"s1", "select $1, $2", types}});
  v.push_back({4, 7, trace::Bind{"p", "s1", params, fmts}});
  v.push_back({5, 7, trace::Execute{"p", 10}});
  v.push_back({6, 7, trace::Describe{'P', "p"}});
  v.push_back({7, 7, trace::Close{'S', "s1"}});
  v.push_back({8, 7, trace::Sync{}});
  v.push_back({9, 7, trace::Flush{}});
  v.push_back({10, 7, trace::CopyData{trace::CopyDir::Out, "1\ta\n"}});
  v.push_back({11, 7, trace::CopyDone{trace::CopyDir::In}});
  v.push_back({12, 7, trace::CopyFail{"no"}});
  v.push_back({13, 7, trace::Result{"INSERT", true, 5}});
  v.push_back({14, 7, trace::Error{"22012", "ERROR", "division by zero"}});
  v.push_back({15, 7, trace::Ready{'T'}});
  v.push_back({15, 7, trace::Suspended{}});
  v.push_back({15, 7, trace::EmptyQuery{}});
  v.push_back({16, 0, trace::Meta{"server_version", "15.4"}});
  v.push_back({17, 0, trace::Loss{trace::LossKind::QueueOverflow, 3}});
  v.push_back({18, 7, trace::SessionEnd{trace::EndReason::ClientAbort}});
  return v;
}

// Every field, as text.
std::string text(const trace::Record& r) {
  std::string s = std::to_string(r.ts) + "/" + std::to_string(r.session) + "/" +
                  std::to_string(r.body.index()) + ":";
  std::visit(
      [&s](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, trace::SessionBegin>)
          s += std::string(b.user) + "," + std::string(b.database) + "," + std::string(b.application_name) +
               "," + std::string(b.client_addr) + "," + std::to_string(b.backend_pid) + "," + std::to_string(b.flags);
        else if constexpr (std::is_same_v<T, trace::SessionEnd>) s += std::to_string(int(b.reason));
        else if constexpr (std::is_same_v<T, trace::Query>) s += b.sql;
        else if constexpr (std::is_same_v<T, trace::Parse>) {
          s += std::string(b.statement) + "," + std::string(b.sql);
          for (auto t : b.param_types) s += "," + std::to_string(t);
        } else if constexpr (std::is_same_v<T, trace::Bind>) {
          s += std::string(b.portal) + "," + std::string(b.statement);
          for (auto& p : b.params) s += "," + std::to_string(p.format) + (p.is_null ? "N" : "V") + std::string(p.value);
          for (auto f : b.result_formats) s += ",f" + std::to_string(f);
        } else if constexpr (std::is_same_v<T, trace::Execute>) s += std::string(b.portal) + std::to_string(b.max_rows);
        else if constexpr (std::is_same_v<T, trace::Describe> || std::is_same_v<T, trace::Close>)
          s += std::string(1, b.target) + std::string(b.name);
        else if constexpr (std::is_same_v<T, trace::CopyData>) s += std::to_string(int(b.dir)) + std::string(b.data);
        else if constexpr (std::is_same_v<T, trace::CopyDone>) s += std::to_string(int(b.dir));
        else if constexpr (std::is_same_v<T, trace::CopyFail>) s += b.message;
        else if constexpr (std::is_same_v<T, trace::Result>)
          s += std::string(b.tag) + (b.has_rows ? std::to_string(b.rows) : "-");
        else if constexpr (std::is_same_v<T, trace::Error>)
          s += std::string(b.sqlstate) + std::string(b.severity) + std::string(b.message);
        else if constexpr (std::is_same_v<T, trace::Ready>) s += b.status;
        else if constexpr (std::is_same_v<T, trace::Meta>) s += std::string(b.key) + "=" + std::string(b.value);
        else if constexpr (std::is_same_v<T, trace::Loss>) s += std::to_string(int(b.what)) + "x" + std::to_string(b.count);
      },
      r.body);
  return s;
}

struct MemTrace {
  trace::MemorySink* sink;
  std::unique_ptr<trace::Writer> writer;
  MemTrace() {
    auto s = std::make_unique<trace::MemorySink>();
    sink = s.get();
    writer = std::make_unique<trace::Writer>(std::move(s));
  }
};

std::vector<trace::Record> read_back(trace::MemorySink& sink, std::vector<std::string>* texts) {
  trace::Reader rd(trace::memory_source(sink.bytes()));
  trace::Record r;
  std::vector<trace::Record> out;
  while (rd.next(r)) {
    texts->push_back(text(r));
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("proxy queue: every record kind survives encode and decode", "[proxy]") {
  RecordDecoder dec;
  for (const auto& r : sample_records()) {
    std::vector<uint8_t> buf(encoded_size(r));
    uint8_t* end = encode(r, buf.data());
    REQUIRE(end == buf.data() + buf.size());
    trace::Record back;
    REQUIRE(dec.decode(buf.data(), buf.size(), back));
    CHECK(text(back) == text(r));
    if (buf.size() > 1) CHECK_FALSE(dec.decode(buf.data(), buf.size() - 1, back));
  }
}

TEST_CASE("proxy queue: the ring wraps and keeps entries in order", "[proxy]") {
  ByteRing ring(4096);
  uint64_t produced = 0, consumed = 0;
  for (int round = 0; round < 2000; ++round) {
    size_t n = 1 + static_cast<size_t>(round * 37) % 700;
    uint8_t* p = ring.reserve(n);
    if (p) {
      std::memset(p, static_cast<int>(produced & 0xff), n);
      p[0] = static_cast<uint8_t>(n & 0xff);
      ring.commit();
      ++produced;
    }
    if (!p || round % 3 == 0) {
      size_t len;
      while (const uint8_t* q = ring.peek(&len)) {
        CHECK(q[0] == static_cast<uint8_t>(len & 0xff));
        CHECK(q[len - 1] == static_cast<uint8_t>((len == 1 ? len : consumed) & 0xff));
        ring.pop();
        ++consumed;
        if (consumed % 2) break;
      }
    }
  }
  size_t len;
  while (ring.peek(&len)) {
    ring.pop();
    ++consumed;
  }
  CHECK(produced == consumed);
  CHECK(produced > 1000);
  CHECK(ring.empty());
}

namespace {
// Drives a ByteRing of kCap bytes with a hot part of kHot in batches of 10
// entries of kEntry bytes, each entry numbered; after each batch the
// consumer takes all but `keep` entries, checking their order.
struct HotRing {
  static constexpr size_t kCap = 64 * 1024, kHot = 8 * 1024, kEntry = 100;
  static constexpr size_t kSlot = 104;  // 4-byte length + payload, rounded up to 8
  ByteRing ring{kCap, kHot};
  uint8_t* base = nullptr;
  size_t furthest = 0;  // the furthest byte of the buffer an entry reached
  uint32_t next = 0, expect = 0, pending = 0;

  bool produce() {
    uint8_t* p = ring.reserve(kEntry);
    if (!p) return false;
    if (!base) base = p - 4;  // the first entry starts the buffer
    std::memcpy(p, &next, sizeof next);
    ++next;
    ++pending;
    ring.commit();
    furthest = std::max(furthest, static_cast<size_t>(p - base) + kEntry);
    return true;
  }
  void consume(uint32_t keep) {
    size_t len;
    while (pending > keep) {
      const uint8_t* q = ring.peek(&len);
      REQUIRE(q);
      uint32_t v;
      std::memcpy(&v, q, sizeof v);
      REQUIRE(v == expect);
      ++expect;
      --pending;
      ring.pop();
    }
  }
  void batches(int n, uint32_t keep) {
    for (int b = 0; b < n; ++b) {
      for (int i = 0; i < 10; ++i) REQUIRE(produce());
      consume(keep);
    }
  }
};
}  // namespace

TEST_CASE("proxy queue: a ring the consumer keeps up with stays in its hot part", "[proxy]") {
  HotRing h;
  h.batches(200, 0);
  CHECK(h.furthest > HotRing::kHot);
  // It wraps at the first entry past the hot part that finds the ring
  // empty: at most a batch further.
  CHECK(h.furthest <= HotRing::kHot + 10 * HotRing::kSlot);
  h.consume(0);
  CHECK(h.ring.empty());
}

TEST_CASE("proxy queue: a ring the consumer lags behind uses its whole capacity", "[proxy]") {
  HotRing h;
  h.batches(200, 1);  // the newest entry stays unconsumed: never caught up
  CHECK(h.furthest > HotRing::kCap - 2 * HotRing::kSlot);
  h.consume(0);
  CHECK(h.expect == h.next);
}

TEST_CASE("proxy queue: a ring whose consumer stops still takes its hot part", "[proxy]") {
  HotRing h;
  h.batches(37, 0);  // caught up, somewhere in the hot part
  size_t held = 0;
  while (h.produce()) held += HotRing::kSlot;
  CHECK(held >= HotRing::kHot);
  h.consume(0);
  CHECK(h.expect == h.next);
  CHECK(h.ring.empty());
}

TEST_CASE("proxy queue: records from several threads reach the trace, none lost", "[proxy]") {
  MemTrace mt;
  auto* sink = mt.sink;
  Recorder rec(std::move(mt.writer), 3, 4096, false);  // small rings: producers wait
  rec.meta("capture", "test");
  rec.start();
  const int kPer = 5000;
  std::vector<std::thread> ths;
  for (int t = 0; t < 3; ++t) {
    ths.emplace_back([&rec, t] {
      auto& p = rec.producer(static_cast<size_t>(t));
      std::string big(3000, 'x');  // bigger than a quarter ring: goes by pointer
      for (int i = 0; i < kPer; ++i) {
        uint64_t session = static_cast<uint64_t>(t + 1);
        if (i % 1000 == 999) p.record({i, session, trace::Query{big}});
        else p.record({i, session, trace::Execute{"", static_cast<uint32_t>(i)}});
      }
    });
  }
  for (auto& th : ths) th.join();
  rec.stop();
  auto st = rec.stats();
  CHECK(st.dropped == 0);
  CHECK(st.waits > 0);
  std::vector<std::string> texts;
  auto recs = read_back(*sink, &texts);
  REQUIRE(recs.size() == 1 + 3 * kPer);
  CHECK(st.records_written == recs.size());
  // Per session, in order.
  int next[4] = {0, 0, 0, 0};
  for (const auto& r : recs) {
    if (r.session == 0) continue;
    CHECK(r.ts == next[r.session]);
    ++next[r.session];
  }
}

TEST_CASE("proxy queue: drop mode counts what it drops and writes a Loss record", "[proxy]") {
  MemTrace mt;
  auto* sink = mt.sink;
  Recorder rec(std::move(mt.writer), 1, 4096, true);  // not started: nothing drains
  auto& p = rec.producer(0);
  for (int i = 0; i < 1000; ++i) p.record({i, 1, trace::Query{"select 1"}});
  auto dropped = rec.stats().dropped;
  CHECK(dropped > 800);
  rec.stop();
  std::vector<std::string> texts;
  auto recs = read_back(*sink, &texts);
  uint64_t queries = 0, lost = 0;
  for (const auto& r : recs) {
    if (r.kind() == trace::Kind::Query) ++queries;
    if (auto* l = std::get_if<trace::Loss>(&r.body)) {
      CHECK(l->what == trace::LossKind::QueueOverflow);
      lost += l->count;
    }
  }
  CHECK(lost == dropped);
  CHECK(queries + lost == 1000);
}

TEST_CASE("proxy queue: server_version becomes one Meta record", "[proxy]") {
  MemTrace mt;
  auto* sink = mt.sink;
  Recorder rec(std::move(mt.writer), 2, 1 << 16, false);
  rec.producer(0).parameter_status(1, "server_version", "15.4", 5);
  rec.producer(1).parameter_status(2, "server_version", "15.4", 6);
  rec.producer(1).parameter_status(2, "TimeZone", "UTC", 6);
  rec.stop();
  std::vector<std::string> texts;
  read_back(*sink, &texts);
  REQUIRE(texts.size() == 1);
  CHECK(texts[0] == "5/0/19:server_version=15.4");
}
