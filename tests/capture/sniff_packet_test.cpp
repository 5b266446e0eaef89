// Frame decoding per link type, the session map format, and pcap files read
// back through libpcap into the reassembler.
#include "capture/sniff.h"
#include "capture/sniff_frames.h"
#include "capture/tcp_reassembly.h"
#include "common/error.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <iostream>
#include <map>
#include <sstream>
#include <string>

using namespace tierlab;
using namespace tierlab::capture;
using tierlab::test::build_frame;
using tierlab::test::FrameSpec;

namespace {

std::string addr_of(const Segment& s, bool src) {
  return endpoint_string(src ? s.src : s.dst, src ? s.sport : s.dport);
}

}  // namespace

TEST_CASE("parse_packet finds TCP in every supported link type", "[sniff][packet]") {
  for (int dlt : {DLT_EN10MB, DLT_NULL, DLT_LINUX_SLL, DLT_LINUX_SLL2, DLT_RAW}) {
    for (bool v6 : {false, true}) {
      INFO("dlt " << dlt << " v6 " << v6);
      FrameSpec f;
      f.dlt = dlt;
      f.v6 = v6;
      if (v6) {
        f.src = "2001:db8::1";
        f.dst = "::1";
      }
      f.seq = 0xDEADBEEF;
      f.ack = 42;
      f.flags = 0x18;
      f.payload = "Q\0\0\0\x0dselect 1";
      auto frame = build_frame(f);
      Segment s;
      REQUIRE(parse_packet(dlt, frame.data(), static_cast<uint32_t>(frame.size()),
                           static_cast<uint32_t>(frame.size()), &s) == ParseResult::Tcp);
      CHECK(s.v6 == v6);
      CHECK(s.sport == 40000);
      CHECK(s.dport == 5432);
      CHECK(s.seq == 0xDEADBEEF);
      CHECK(s.ack == 42);
      CHECK(s.flags == 0x18);
      CHECK(s.payload_len == f.payload.size());
      CHECK(s.payload_missing == 0);
      CHECK(std::string(reinterpret_cast<const char*>(s.payload), s.payload_len) == f.payload);
      if (v6) {
        CHECK(addr_of(s, true) == "[2001:db8::1]:40000");
        CHECK(addr_of(s, false) == "[::1]:5432");
      } else {
        CHECK(addr_of(s, true) == "10.0.0.1:40000");
        CHECK(addr_of(s, false) == "10.0.0.2:5432");
      }
    }
  }
}

TEST_CASE("parse_packet handles VLAN tags, padding, snaplen and foreign frames", "[sniff][packet]") {
  FrameSpec f;
  f.vlan = 100;
  f.payload = "abc";
  auto frame = build_frame(f);
  Segment s;
  REQUIRE(parse_packet(DLT_EN10MB, frame.data(), static_cast<uint32_t>(frame.size()),
                       static_cast<uint32_t>(frame.size()), &s) == ParseResult::Tcp);
  CHECK(s.payload_len == 3);

  // Ethernet pads short frames to 60 bytes: the IP length bounds the payload.
  f.vlan = -1;
  frame = build_frame(f);
  frame.resize(60, 0);
  REQUIRE(parse_packet(DLT_EN10MB, frame.data(), 60, 60, &s) == ParseResult::Tcp);
  CHECK(s.payload_len == 3);

  // Cut by the snapshot length: the rest is reported missing.
  f.payload = std::string(100, 'x');
  frame = build_frame(f);
  uint32_t wire = static_cast<uint32_t>(frame.size());
  REQUIRE(parse_packet(DLT_EN10MB, frame.data(), wire - 40, wire, &s) == ParseResult::Tcp);
  CHECK(s.payload_len == 60);
  CHECK(s.payload_missing == 40);

  // Headers cut short.
  CHECK(parse_packet(DLT_EN10MB, frame.data(), 30, wire, &s) == ParseResult::Truncated);

  // UDP is not TCP; ARP is not IP.
  auto udp = build_frame(FrameSpec{});
  udp[14 + 9] = 17;
  CHECK(parse_packet(DLT_EN10MB, udp.data(), static_cast<uint32_t>(udp.size()),
                     static_cast<uint32_t>(udp.size()), &s) == ParseResult::NotTcp);
  auto arp = build_frame(FrameSpec{});
  arp[12] = 0x08;
  arp[13] = 0x06;
  CHECK(parse_packet(DLT_EN10MB, arp.data(), static_cast<uint32_t>(arp.size()),
                     static_cast<uint32_t>(arp.size()), &s) == ParseResult::NotTcp);

  // A fragment is counted, not decoded.
  auto frag = build_frame(FrameSpec{});
  frag[14 + 6] = 0x20;  // more fragments
  CHECK(parse_packet(DLT_EN10MB, frag.data(), static_cast<uint32_t>(frag.size()),
                     static_cast<uint32_t>(frag.size()), &s) == ParseResult::Fragment);

  CHECK(parse_packet(DLT_IEEE802_11, frag.data(), 60, 60, &s) == ParseResult::UnknownLink);
  CHECK_FALSE(link_type_supported(DLT_IEEE802_11));
}

TEST_CASE("a live summary with kernel drops says the ring overflowed and how to avoid it",
          "[sniff][summary]") {
  SniffSummary s;
  s.buffer_bytes = 8ull << 20;
  std::ostringstream clean;
  print_summary(s, /*live=*/true, clean);
  CHECK(drop_advice(s).empty());
  CHECK(clean.str().find("--buffer-size") == std::string::npos);

  s.kernel_drops = 12;
  std::string advice = drop_advice(s);
  CHECK(advice == "the capture ring (8.0 MiB) overflowed: the sessions those packets belonged to "
                  "have stream gaps; capture with a larger --buffer-size\n");
  std::ostringstream dropped;
  print_summary(s, /*live=*/true, dropped);
  CHECK(dropped.str().find("kernel drops: 12, interface drops: 0\n" + advice) != std::string::npos);
}

TEST_CASE("session map lines name user and database per client", "[sniff][map]") {
  auto m = parse_session_map(
      "# joined sessions\n"
      "127.0.0.1:40001 alice shop\n"
      ":40002 bob    inventory   reporting  # app name\n"
      "[::1]:40003 carol db\n"
      "10.1.2.3 dave dwh\n"
      "\n",
      "map.txt");
  REQUIRE(m.size() == 4);
  CHECK(m[0].addr == "127.0.0.1");
  CHECK(m[0].port == 40001);
  CHECK(m[0].user == "alice");
  CHECK(m[0].database == "shop");
  CHECK(m[1].addr.empty());
  CHECK(m[1].port == 40002);
  CHECK(m[1].application_name == "reporting");
  CHECK(m[2].addr == "::1");
  CHECK(m[2].port == 40003);
  CHECK(m[3].addr == "10.1.2.3");
  CHECK(m[3].port == 0);

  CHECK_THROWS_WITH(parse_session_map("1.2.3.4:5 alice\n", "m"),
                    Catch::Contains("m:1:") && Catch::Contains("CLIENT USER DATABASE"));
  CHECK_THROWS_WITH(parse_session_map("\nx.y:5 a b\n", "m"), Catch::Contains("m:2: bad address"));
  CHECK_THROWS_WITH(parse_session_map(":99999 a b\n", "m"), Catch::Contains("bad port"));
  CHECK_THROWS_AS(parse_session_map("1.2.3.4:1 a b c d\n", "m"), InputError);
}

namespace {

struct Collect : StreamHandler {
  std::map<uint32_t, std::string> s[2];
  int opens = 0, closes = 0, gaps = 0;
  void on_open(uint32_t c, const ConnInfo&, Nanos) override {
    ++opens;
    s[0][c].clear();
    s[1][c].clear();
  }
  void on_data(uint32_t c, Dir d, const uint8_t* p, size_t n, Nanos) override {
    s[static_cast<int>(d)][c].append(reinterpret_cast<const char*>(p), n);
  }
  void on_gap(uint32_t c, Dir d, uint64_t n, Nanos) override {
    ++gaps;
    s[static_cast<int>(d)][c] += "<" + std::to_string(n) + ">";
  }
  void on_close(uint32_t, CloseKind, Nanos) override { ++closes; }
};

}  // namespace

TEST_CASE("a pcap file written by libpcap reads back into ordered streams", "[sniff][pcap]") {
  char dir[] = "/tmp/tierlab-sniff-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string path = std::string(dir) + "/t.pcap";
  test::Conversation c;
  c.base.dlt = DLT_LINUX_SLL2;
  {
    test::PcapFile pf(path, DLT_LINUX_SLL2);
    int64_t t = 1'700'000'000'000'000'000;
    for (auto& f : c.handshake()) pf.add(build_frame(f), t += 1000);
    auto a = c.client("one-");
    auto b = c.client("two-");
    auto d = c.client("three");
    pf.add(build_frame(a), t += 1000);
    pf.add(build_frame(d), t += 1000);  // reordered
    pf.add(build_frame(b), t += 1000);
    pf.add(build_frame(c.server("reply")), t += 1000);
    pf.add(build_frame(c.client("", 0x11)), t += 1000);
    pf.add(build_frame(c.server("", 0x11)), t += 1000);
  }
  char err[PCAP_ERRBUF_SIZE];
  pcap_t* p = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err);
  REQUIRE(p);
  CHECK(pcap_datalink(p) == DLT_LINUX_SLL2);
  Collect col;
  Reassembler r(Reassembler::Options{}, &col);
  pcap_pkthdr* h;
  const u_char* data;
  int64_t first_ts = 0;
  while (pcap_next_ex(p, &h, &data) == 1) {
    Segment s;
    REQUIRE(parse_packet(DLT_LINUX_SLL2, data, h->caplen, h->len, &s) == ParseResult::Tcp);
    int64_t ts = static_cast<int64_t>(h->ts.tv_sec) * 1'000'000'000 + h->ts.tv_usec;
    if (!first_ts) first_ts = ts;
    r.add(s, ts);
  }
  pcap_close(p);
  CHECK(first_ts == 1'700'000'000'000'001'000);  // nanoseconds survive the file
  CHECK(col.opens == 1);
  CHECK(col.closes == 1);
  CHECK(col.gaps == 0);
  CHECK(col.s[0][0] == "one-two-three");
  CHECK(col.s[1][0] == "reply");
  std::remove(path.c_str());
  rmdir(dir);
}

TEST_CASE("capture sniff refuses unix sockets and bad options in one line", "[sniff][cli]") {
  SniffOptions o;
  o.out = "/tmp/never-written.tlt";
  o.interface = "/var/run/postgresql";
  CHECK_THROWS_WITH(run_sniff(o, std::cerr), Catch::Contains("unix-domain socket"));
  o.interface = "lo";
  for (uint64_t bad : {uint64_t{0}, uint64_t{4096}, uint64_t{2} << 30}) {
    o.buffer_bytes = bad;
    CHECK_THROWS_WITH(run_sniff(o, std::cerr), Catch::EndsWith(": must be 64 KiB to 1 GiB"));
    // The library names the member and its value; the command its flag.
    try {
      run_sniff(o, std::cerr);
    } catch (const SettingError& e) {
      CHECK(e.setting() == "buffer_bytes");
      CHECK(std::string(e.what()).find("--") == std::string::npos);
    }
  }
  o.buffer_bytes = 8ull << 20;
  o.interface.clear();
  CHECK_THROWS_WITH(run_sniff(o, std::cerr),
                    "capture sniff: give exactly one of a network interface and a pcap file");
  o.pcap_file = "/nonexistent/file.pcap";
  CHECK_THROWS_AS(run_sniff(o, std::cerr), InputError);
  o.pcap_file = "x.pcap";
  o.host = "not-an-address";
  CHECK_THROWS_WITH(run_sniff(o, std::cerr), "'not-an-address' is not an IPv4 or IPv6 address");
}
