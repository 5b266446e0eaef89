// capture sniff on synthetic pcap files: a reordered segment, a dropped one,
// a segment lost in the middle of a message, a TLS session, a session joined
// mid-stream. The files are written with libpcap's dumper, then read by
// run_sniff() exactly as `tierlab capture sniff --pcap` does.
#include "capture/sniff.h"
#include "capture/sniff_frames.h"
#include "common/error.h"
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::test;

namespace {

struct Rec {
  uint64_t session;
  trace::Kind kind;
  std::string text;  // Query sql, Result tag, Meta key=value
  uint64_t n = 0;    // Loss count, SessionBegin flags, EndReason
  std::string user, database;
};

std::vector<Rec> read_all(const std::string& path) {
  auto r = trace::open_reader(path);
  std::vector<Rec> out;
  trace::Record rec;
  while (r->next(rec)) {
    Rec x{rec.session, rec.kind(), "", 0, "", ""};
    if (auto* q = std::get_if<trace::Query>(&rec.body)) x.text = q->sql;
    if (auto* res = std::get_if<trace::Result>(&rec.body)) x.text = res->tag;
    if (auto* l = std::get_if<trace::Loss>(&rec.body)) {
      x.n = l->count;
      x.text = std::to_string(static_cast<int>(l->what));
    }
    if (auto* b = std::get_if<trace::SessionBegin>(&rec.body)) {
      x.n = b->flags;
      x.user = b->user;
      x.database = b->database;
      x.text = b->client_addr;
    }
    if (auto* e = std::get_if<trace::SessionEnd>(&rec.body)) x.n = static_cast<uint64_t>(e->reason);
    if (auto* m = std::get_if<trace::Meta>(&rec.body))
      x.text = std::string(m->key) + "=" + std::string(m->value);
    out.push_back(std::move(x));
  }
  return out;
}

std::vector<std::string> queries(const std::vector<Rec>& v) {
  std::vector<std::string> q;
  for (auto& r : v)
    if (r.kind == trace::Kind::Query) q.push_back(r.text);
  return q;
}

int count(const std::vector<Rec>& v, trace::Kind k) {
  int n = 0;
  for (auto& r : v) n += r.kind == k;
  return n;
}

const int64_t kT0 = 1'750'000'000'000'000'000;

// Startup exchange of a plain session.
void start_session(PcapFile& pf, Conversation& c, int64_t& t, const std::string& user = "alice",
                   const std::string& db = "shop") {
  for (auto& f : c.handshake()) pf.add(build_frame(f), t += 10'000);
  pf.add(build_frame(c.client(startup(user, db))), t += 10'000);
  pf.add(build_frame(c.server(auth_ok() + ready('I'))), t += 10'000);
}

void exchange(PcapFile& pf, Conversation& c, int64_t& t, const std::string& sql) {
  pf.add(build_frame(c.client(query(sql))), t += 10'000);
  pf.add(build_frame(c.server(complete("SELECT 1") + ready('I'))), t += 10'000);
}

void finish(PcapFile& pf, Conversation& c, int64_t& t) {
  pf.add(build_frame(c.client(terminate())), t += 10'000);
  pf.add(build_frame(c.client("", 0x11)), t += 10'000);
  pf.add(build_frame(c.server("", 0x11)), t += 10'000);
  pf.add(build_frame(c.client("", 0x10)), t += 10'000);
}

capture::SniffSummary sniff(const std::string& pcap, const std::string& out,
                            const std::string& map = "") {
  capture::SniffOptions o;
  o.pcap_file = pcap;
  o.out = out;
  o.session_map = map;
  std::ostringstream log;
  auto s = capture::run_sniff(o, log);
  INFO(log.str());
  return s;
}

}  // namespace

TEST_CASE("a reordered segment is put back in order and a dropped one is a counted gap",
          "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("drop.pcap");
  {
    PcapFile pf(pcap, DLT_EN10MB);
    Conversation c;
    int64_t t = kT0;
    start_session(pf, c, t);
    exchange(pf, c, t, "select 1");
    // select 2 arrives in two segments, the second one first.
    std::string q2 = query("select 2 from generate_series(1, 10)");
    auto a = c.client(q2.substr(0, 12));
    auto b = c.client(q2.substr(12));
    pf.add(build_frame(b), t += 10'000);
    pf.add(build_frame(a), t += 10'000);
    pf.add(build_frame(c.server(complete("SELECT 10") + ready('I'))), t += 10'000);
    exchange(pf, c, t, "select 3");
    // select 4 never made it into the capture; the server's reply
    // acknowledges it.
    c.client(query("select 4"));
    pf.add(build_frame(c.server(complete("SELECT 1") + ready('I'))), t += 10'000);
    exchange(pf, c, t, "select 5");
    exchange(pf, c, t, "select 6");
    finish(pf, c, t);
  }
  auto sum = sniff(pcap, dir.file("drop.tlt"));
  auto recs = read_all(dir.file("drop.tlt"));

  CHECK(queries(recs) == std::vector<std::string>{"select 1",
                                                  "select 2 from generate_series(1, 10)",
                                                  "select 3", "select 5", "select 6"});
  CHECK(sum.out_of_order == 1);
  CHECK(sum.gaps == 1);
  CHECK(sum.gap_bytes == query("select 4").size());
  CHECK(sum.statements == 5);
  CHECK(sum.transactions == 5);  // the lost query's reply closes a unit without statements
  CHECK(sum.sessions == 1);
  CHECK(sum.joined == 0);
  // The gap is in the trace, in the session, with its size.
  int gaps = 0;
  for (auto& r : recs)
    if (r.kind == trace::Kind::Loss &&
        r.text == std::to_string(static_cast<int>(trace::LossKind::StreamGap))) {
      ++gaps;
      CHECK(r.session == 1);
      CHECK(r.n == query("select 4").size());
    }
  CHECK(gaps == 1);
  CHECK(count(recs, trace::Kind::Result) == 6);  // the lost query's reply is still decoded
  REQUIRE(count(recs, trace::Kind::SessionBegin) == 1);
  for (auto& r : recs) {
    if (r.kind == trace::Kind::SessionBegin) {
      CHECK(r.user == "alice");
      CHECK(r.database == "shop");
      CHECK(r.text == "10.0.0.1:40000");
      CHECK((r.n & trace::kSessionUnknownStartup) == 0);
    }
    if (r.kind == trace::Kind::SessionEnd) CHECK(r.n == static_cast<uint64_t>(trace::EndReason::Clean));
    if (r.kind == trace::Kind::Meta && r.text.rfind("time_source=", 0) == 0)
      CHECK(r.text == "time_source=pcap");
  }
}

TEST_CASE("a segment lost inside a message skips that message and decoding resumes",
          "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("mid.pcap");
  {
    PcapFile pf(pcap, DLT_LINUX_SLL);
    Conversation c;
    c.base.dlt = DLT_LINUX_SLL;
    int64_t t = kT0;
    start_session(pf, c, t);
    exchange(pf, c, t, "select 1");
    std::string big = query("select '" + std::string(3000, 'x') + "'");
    auto p1 = c.client(big.substr(0, 1000));
    c.client(big.substr(1000, 1000));  // lost
    auto p3 = c.client(big.substr(2000));
    pf.add(build_frame(p1), t += 10'000);
    pf.add(build_frame(p3), t += 10'000);
    pf.add(build_frame(c.server(complete("SELECT 1") + ready('I'))), t += 10'000);
    exchange(pf, c, t, "select 3");
    finish(pf, c, t);
  }
  auto sum = sniff(pcap, dir.file("mid.tlt"));
  auto recs = read_all(dir.file("mid.tlt"));
  CHECK(queries(recs) == std::vector<std::string>{"select 1", "select 3"});
  CHECK(sum.gaps == 1);
  CHECK(sum.gap_bytes == 1000);
  CHECK(sum.statements == 2);
}

TEST_CASE("TLS sessions are counted and recorded as not decodable", "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("tls.pcap");
  {
    PcapFile pf(pcap, DLT_EN10MB);
    Conversation c;
    int64_t t = kT0;
    for (auto& f : c.handshake()) pf.add(build_frame(f), t += 10'000);
    std::string ssl("\0\0\0\x08\x04\xd2\x16\x2f", 8);
    pf.add(build_frame(c.client(ssl)), t += 10'000);
    pf.add(build_frame(c.server("S")), t += 10'000);
    pf.add(build_frame(c.client(std::string("\x16\x03\x01\x00\x05hello", 10))), t += 10'000);
    pf.add(build_frame(c.server(std::string("\x16\x03\x03\x00\x05world", 10))), t += 10'000);
    finish(pf, c, t);

    // A plain session next to it still decodes.
    Conversation d;
    d.base.sport = 40001;
    start_session(pf, d, t);
    exchange(pf, d, t, "select 1");
    finish(pf, d, t);
  }
  auto sum = sniff(pcap, dir.file("tls.tlt"));
  auto recs = read_all(dir.file("tls.tlt"));
  CHECK(sum.tls_sessions == 1);
  CHECK(sum.sessions == 2);
  CHECK(sum.statements == 1);
  int tls_begins = 0, unsupported = 0;
  for (auto& r : recs) {
    if (r.kind == trace::Kind::SessionBegin && (r.n & trace::kSessionTls)) ++tls_begins;
    if (r.kind == trace::Kind::Loss &&
        r.text == std::to_string(static_cast<int>(trace::LossKind::Unsupported)))
      ++unsupported;
  }
  CHECK(tls_begins == 1);
  CHECK(unsupported == 1);
  std::ostringstream out;
  capture::print_summary(sum, false, out);
  CHECK(out.str().find("1 sessions encrypted") != std::string::npos);
}

TEST_CASE("a session without its start is joined and named by the session map",
          "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("join.pcap");
  {
    PcapFile pf(pcap, DLT_EN10MB);
    Conversation c;
    c.base.sport = 41000;
    int64_t t = kT0;
    // No handshake, no startup: the capture begins mid-session.
    exchange(pf, c, t, "select 1");
    pf.add(build_frame(c.client(query("begin"))), t += 10'000);
    pf.add(build_frame(c.server(complete("BEGIN") + ready('T'))), t += 10'000);
    pf.add(build_frame(c.client(query("update t set x = 1"))), t += 10'000);
    pf.add(build_frame(c.server(complete("UPDATE 1") + ready('T'))), t += 10'000);
    pf.add(build_frame(c.client(query("commit"))), t += 10'000);
    pf.add(build_frame(c.server(complete("COMMIT") + ready('I'))), t += 10'000);
    finish(pf, c, t);
  }
  {
    std::FILE* f = std::fopen(dir.file("map").c_str(), "w");
    std::fputs("10.0.0.1:41000 bob inventory\n", f);
    std::fclose(f);
  }
  auto sum = sniff(pcap, dir.file("join.tlt"), dir.file("map"));
  auto recs = read_all(dir.file("join.tlt"));
  CHECK(sum.joined == 1);
  CHECK(sum.statements == 4);
  CHECK(sum.transactions == 2);
  CHECK(sum.gaps == 0);
  REQUIRE(count(recs, trace::Kind::SessionBegin) == 1);
  for (auto& r : recs)
    if (r.kind == trace::Kind::SessionBegin) {
      CHECK((r.n & trace::kSessionUnknownStartup) != 0);
      CHECK(r.user == "bob");
      CHECK(r.database == "inventory");
    }
  CHECK(queries(recs) ==
        std::vector<std::string>{"select 1", "begin", "update t set x = 1", "commit"});
}

TEST_CASE("a pcap file cut short keeps everything before the cut, with a warning",
          "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("cut.pcap");
  {
    PcapFile pf(pcap, DLT_EN10MB);
    Conversation c;
    int64_t t = kT0;
    start_session(pf, c, t);
    exchange(pf, c, t, "select 1");
    exchange(pf, c, t, "select 2");
  }
  // Cut the last frame in half, as a capture killed while writing leaves it.
  std::FILE* f = std::fopen(pcap.c_str(), "rb+");
  REQUIRE(f);
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fclose(f);
  REQUIRE(truncate(pcap.c_str(), size - 20) == 0);

  capture::SniffOptions o;
  o.pcap_file = pcap;
  o.out = dir.file("cut.tlt");
  std::ostringstream log;
  auto sum = capture::run_sniff(o, log);
  CHECK(log.str().find("warning") != std::string::npos);
  CHECK(log.str().find("stopped after") != std::string::npos);
  CHECK(sum.statements == 2);  // the reply to select 2 was cut, the query was not
  auto recs = read_all(dir.file("cut.tlt"));
  CHECK(queries(recs) == std::vector<std::string>{"select 1", "select 2"});
}

TEST_CASE("compression levels 0, 1 and the fast default write the same records", "[sniff][pcap]") {
  TempDir dir;
  std::string pcap = dir.file("many.pcap");
  std::vector<std::string> sent;
  {
    PcapFile pf(pcap, DLT_EN10MB);
    Conversation c;
    int64_t t = kT0;
    start_session(pf, c, t);
    for (int i = 0; i < 500; ++i) {
      sent.push_back("select abalance from pgbench_accounts where aid = " + std::to_string(i));
      exchange(pf, c, t, sent.back());
    }
    finish(pf, c, t);
  }
  auto file_size = [](const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f);
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fclose(f);
    return n;
  };
  capture::SniffOptions o;
  o.pcap_file = pcap;
  std::ostringstream log;
  o.out = dir.file("fast.tlt");
  auto fast = capture::run_sniff(o, log);  // the default: a fast (negative) zstd level
  CHECK(o.compression_level < 0);
  o.out = dir.file("zstd.tlt");
  o.compression_level = 1;
  auto packed = capture::run_sniff(o, log);
  o.out = dir.file("raw.tlt");
  o.compression_level = 0;
  auto raw = capture::run_sniff(o, log);
  CHECK(raw.statements == 500);
  CHECK(raw.records == packed.records);
  CHECK(fast.records == packed.records);
  CHECK(queries(read_all(dir.file("raw.tlt"))) == sent);
  CHECK(queries(read_all(dir.file("zstd.tlt"))) == sent);
  CHECK(queries(read_all(dir.file("fast.tlt"))) == sent);
  CHECK(file_size(dir.file("raw.tlt")) > 2 * file_size(dir.file("zstd.tlt")));
  CHECK(file_size(dir.file("raw.tlt")) > 2 * file_size(dir.file("fast.tlt")));

  // The library names the level, not a flag (the CLI puts --compress-level
  // in front: tests/app/cli_test.cpp).
  const std::string range = ": must be -100 to 22 (0 writes the trace uncompressed)";
  o.compression_level = 23;
  CHECK_THROWS_AS(capture::run_sniff(o, log), InputError);
  CHECK_THROWS_WITH(capture::run_sniff(o, log), "capture sniff: compression level 23" + range);
  o.compression_level = -101;
  CHECK_THROWS_WITH(capture::run_sniff(o, log), "capture sniff: compression level -101" + range);
}
