// Steady state allocates nothing: decoding a session's messages and
// recording them into the event loop's queue, and decoding them back out of
// the queue on the writer side; and forwarding through the proxy. Counts every operator new in this binary
// (support/alloc_counter.h; this is the one file of the binary that includes it).
#include "capture/proxy.h"
#include "capture/queue_impl.h"
#include "capture/wire.h"
#include "common/loop.h"
#include "support/alloc_counter.h"
#include "support/support.h"
#include "trace/writer.h"
#include "wire_builder.h"

#include <libpq-fe.h>

#include <catch2/catch.hpp>

#include <string>

using namespace tierlab;
using namespace tierlab::capture;
using namespace wiretest;

namespace {

// One pgbench-like round trip in each protocol, plus COPY and an error.
struct Traffic {
  Bytes login_f = startup("bench", "bench", "pgbench");
  Bytes login_b = cat({auth_ok(), param_status("server_version", "15.4"), key_data(77), ready('I')});
  Bytes f = cat({
      Msg('B').str("").str("P0_1").i16(1).i16(0).i16(2).i32(5).raw("12345").i32(-1).i16(1).i16(1),
      Msg('E').str("").i32(0), Msg('S'),
      Msg('P').str("").str("UPDATE t SET v = v + $1 WHERE id = $2").i16(2).i32(23).i32(23),
      Msg('B').str("").str("").i16(0).i16(2).i32(2).raw("-5").i32(3).raw("999").i16(0),
      Msg('D').u8('P').str(""), Msg('E').str("").i32(0), Msg('S'),
      query("BEGIN"), query("select 1/0"), query("copy t from stdin"),
      Msg('d').raw("1\tone\n"), Msg('d').raw("2\ttwo\n"), Msg('c'),
  });
  Bytes b = cat({
      Msg('2'), Msg('D').i16(1).i32(4).raw("1234"), complete("SELECT 1"), ready('I'),
      Msg('1'), Msg('2'), Msg('n'), complete("UPDATE 1"), ready('I'),
      complete("BEGIN"), ready('T'), error("ERROR", "22012", "division by zero"), ready('E'),
      Msg('G').u8(0).i16(2).i16(0).i16(0), complete("COPY 2"), ready('I'),
  });
};

void feed_split(SessionDecoder& dec, Direction d, const Bytes& bytes, size_t piece) {
  for (size_t i = 0; i < bytes.size(); i += piece) {
    size_t n = std::min(piece, bytes.size() - i);
    REQUIRE(dec.feed(d, bytes.data() + i, n, 1));
  }
}

}  // namespace

TEST_CASE("wire: no allocation per message once warm (decoder + queue)", "[wire][alloc]") {
  auto sink_owner = std::make_unique<trace::MemorySink>();
  detail::Recorder rec(std::make_unique<trace::Writer>(std::move(sink_owner)), 1, 64u << 20, false);
  auto& producer = rec.producer(0);
  SessionDecoder dec(producer);
  Traffic t;
  const size_t pieces[] = {100000, 7, 1, 64, 13};

  auto one_session = [&](uint64_t id, size_t piece) {
    dec.begin(id, "127.0.0.1:40000", 0, 1);
    feed_split(dec, Direction::Frontend, t.login_f, piece);
    feed_split(dec, Direction::Backend, t.login_b, piece);
    for (int i = 0; i < 50; ++i) {
      feed_split(dec, Direction::Frontend, t.f, piece);
      feed_split(dec, Direction::Backend, t.b, piece);
    }
    dec.end(trace::EndReason::Clean, 2);
  };
  // Warm up: buffers grow to the largest message once.
  for (size_t p : pieces) one_session(1, p);

  uint64_t before = test::allocations_all_threads();
  {
    std::string probe(200, 'x');  // the counter does count
    CHECK(test::allocations_all_threads() > before);
  }
  before = test::allocations_all_threads();
  uint64_t id = 2;
  for (size_t p : pieces) one_session(id++, p);
  uint64_t after = test::allocations_all_threads();
  CHECK(after - before == 0);
  CHECK(dec.stats().statements == 50 * 5);

  // Writer side: decoding records back out of a ring.
  detail::ByteRing ring(1 << 20);
  detail::RecordDecoder rd;
  struct RingSink : RecordSink {
    detail::ByteRing* ring;
    void record(const trace::Record& r) override {
      size_t n = detail::encoded_size(r);
      uint8_t* p = ring->reserve(n);
      REQUIRE(p);
      detail::encode(r, p);
      ring->commit();
    }
  } rs;
  rs.ring = &ring;
  SessionDecoder dec2(rs);
  auto drain = [&] {
    size_t len;
    trace::Record r;
    size_t n = 0;
    while (const uint8_t* p = ring.peek(&len)) {
      REQUIRE(rd.decode(p, len, r));
      ring.pop();
      ++n;
    }
    return n;
  };
  dec2.begin(1, "", 0, 0);
  feed_split(dec2, Direction::Frontend, t.login_f, 1000);
  feed_split(dec2, Direction::Backend, t.login_b, 1000);
  feed_split(dec2, Direction::Frontend, t.f, 1000);
  feed_split(dec2, Direction::Backend, t.b, 1000);
  drain();
  before = test::allocations_all_threads();
  size_t drained = 0;
  for (int i = 0; i < 200; ++i) {
    feed_split(dec2, Direction::Frontend, t.f, 1000);
    feed_split(dec2, Direction::Backend, t.b, 1000);
    drained += drain();
  }
  after = test::allocations_all_threads();
  CHECK(after - before == 0);
  CHECK(drained > 200 * 20);
  rec.stop();
}

// The proxy's forwarding path over its event loop (common/loop.h), on each
// backend: after a warm-up, more statements through an open session cost
// no more allocations than fewer (libpq's own mallocs are not counted).
namespace {

uint64_t allocations_of_queries(PGconn* c, int n) {
  uint64_t before = test::allocations_all_threads();
  for (int i = 0; i < n; ++i) {
    PGresult* r = PQexec(c, "SELECT 1");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) FAIL(PQerrorMessage(c));
    PQclear(r);
  }
  return test::allocations_all_threads() - before;
}

}  // namespace

TEST_CASE("proxy forwarding allocates nothing per statement, on either event loop, in plaintext and over TLS",
          "[proxy][pg][alloc]") {
  const std::string io = GENERATE(as<std::string>{}, "io_uring", "epoll");
  // disable: the zero-copy path; require: the client's TLS to the proxy
  // (the copying path, and the stage's encryption and decryption).
  const std::string sslmode = GENERATE(as<std::string>{}, "disable", "require");
  INFO(io << " sslmode=" << sslmode);
  if (io == "io_uring" && !loop_uring_missing().empty()) test::skip("io_uring loop not available: " + loop_uring_missing());
  auto& pg = test::shared_server();
  test::TempDir dir;
  ProxyOptions o;
  o.listen = "127.0.0.1:0";
  o.upstream = pg.host() + ":" + std::to_string(pg.port());
  o.out = dir.file("alloc.tlt");
  o.threads = 1;
  o.io = io;
  Proxy px(o);
  px.start();
  std::string ci = "host=127.0.0.1 port=" + std::to_string(px.port()) + " dbname=postgres user=" + pg.superuser() +
                   " sslmode=" + sslmode;
  PGconn* c = PQconnectdb(ci.c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  CHECK(PQsslInUse(c) == (sslmode == "require"));
  allocations_of_queries(c, 200);  // warm-up
  uint64_t few = allocations_of_queries(c, 100);
  uint64_t many = allocations_of_queries(c, 1000);
  CHECK(many <= few);
  PQfinish(c);
  px.stop();
  CHECK(px.summary().statements >= 1300);
}
