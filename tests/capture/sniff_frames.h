// Builds captured frames (link header + IPv4/IPv6 + TCP) for the sniffer's
// tests, and writes them to pcap files with libpcap's own dumper.
#pragma once

#include <pcap/pcap.h>

#include <arpa/inet.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace tierlab::test {

struct FrameSpec {
  int dlt = DLT_EN10MB;
  bool v6 = false;
  std::string src = "10.0.0.1", dst = "10.0.0.2";
  uint16_t sport = 40000, dport = 5432;
  uint32_t seq = 0, ack = 0;
  uint8_t flags = 0x10;  // ACK
  std::string payload;
  int vlan = -1;  // EN10MB: add an 802.1Q tag
};

inline void put16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
inline void put32(std::vector<uint8_t>& b, uint32_t v) {
  put16(b, static_cast<uint16_t>(v >> 16));
  put16(b, static_cast<uint16_t>(v));
}

inline std::vector<uint8_t> build_frame(const FrameSpec& f) {
  std::vector<uint8_t> b;
  uint16_t ethertype = f.v6 ? 0x86DD : 0x0800;
  switch (f.dlt) {
    case DLT_EN10MB:
      for (int i = 0; i < 12; ++i) b.push_back(static_cast<uint8_t>(i));
      if (f.vlan >= 0) {
        put16(b, 0x8100);
        put16(b, static_cast<uint16_t>(f.vlan));
      }
      put16(b, ethertype);
      break;
    case DLT_NULL: {
      uint32_t fam = f.v6 ? 10 : 2;  // host byte order, as Linux writes it
      uint8_t raw[4];
      std::memcpy(raw, &fam, 4);
      b.insert(b.end(), raw, raw + 4);
      break;
    }
    case DLT_LINUX_SLL:
      put16(b, 0);  // packet type
      put16(b, 772);
      put16(b, 6);
      for (int i = 0; i < 8; ++i) b.push_back(0);
      put16(b, ethertype);
      break;
    case DLT_LINUX_SLL2:
      put16(b, ethertype);
      put16(b, 0);
      put32(b, 1);   // ifindex
      put16(b, 772); // ARPHRD
      b.push_back(0);
      b.push_back(6);
      for (int i = 0; i < 8; ++i) b.push_back(0);
      break;
    case DLT_RAW:
      break;
    default:
      throw std::runtime_error("build_frame: link type not supported by the test builder");
  }
  const uint32_t tcp_len = 20 + static_cast<uint32_t>(f.payload.size());
  if (!f.v6) {
    size_t ip = b.size();
    b.push_back(0x45);
    b.push_back(0);
    put16(b, static_cast<uint16_t>(20 + tcp_len));
    put16(b, 1);       // id
    put16(b, 0x4000);  // DF
    b.push_back(64);
    b.push_back(6);
    put16(b, 0);  // checksum (not checked)
    uint8_t a[4];
    inet_pton(AF_INET, f.src.c_str(), a);
    b.insert(b.end(), a, a + 4);
    inet_pton(AF_INET, f.dst.c_str(), a);
    b.insert(b.end(), a, a + 4);
    (void)ip;
  } else {
    put32(b, 0x60000000);
    put16(b, static_cast<uint16_t>(tcp_len));
    b.push_back(6);
    b.push_back(64);
    uint8_t a[16];
    inet_pton(AF_INET6, f.src.c_str(), a);
    b.insert(b.end(), a, a + 16);
    inet_pton(AF_INET6, f.dst.c_str(), a);
    b.insert(b.end(), a, a + 16);
  }
  put16(b, f.sport);
  put16(b, f.dport);
  put32(b, f.seq);
  put32(b, f.ack);
  b.push_back(0x50);  // data offset 5 words
  b.push_back(f.flags);
  put16(b, 65535);
  put16(b, 0);
  put16(b, 0);
  b.insert(b.end(), f.payload.begin(), f.payload.end());
  return b;
}

// Writes frames to a pcap file; times are nanoseconds since the epoch.
class PcapFile {
 public:
  PcapFile(const std::string& path, int dlt) {
    dead_ = pcap_open_dead_with_tstamp_precision(dlt, 262144, PCAP_TSTAMP_PRECISION_NANO);
    dump_ = pcap_dump_open(dead_, path.c_str());
    if (!dump_) throw std::runtime_error("pcap_dump_open " + path + ": " + pcap_geterr(dead_));
  }
  ~PcapFile() { close(); }
  void add(const std::vector<uint8_t>& frame, int64_t ns) {
    pcap_pkthdr h{};
    h.ts.tv_sec = ns / 1'000'000'000;
    h.ts.tv_usec = ns % 1'000'000'000;  // nanoseconds with the nano precision
    h.caplen = h.len = static_cast<bpf_u_int32>(frame.size());
    pcap_dump(reinterpret_cast<u_char*>(dump_), &h, frame.data());
  }
  void close() {
    if (dump_) pcap_dump_close(dump_);
    if (dead_) pcap_close(dead_);
    dump_ = nullptr;
    dead_ = nullptr;
  }

 private:
  pcap_t* dead_ = nullptr;
  pcap_dumper_t* dump_ = nullptr;
};

// A client/server TCP conversation generating frames with correct sequence
// numbers: handshake, data both ways, FIN.
struct Conversation {
  FrameSpec base;
  uint32_t cseq = 1000, sseq = 900000;

  FrameSpec client(const std::string& data, uint8_t flags = 0x18) {
    FrameSpec f = base;
    f.seq = cseq;
    f.ack = sseq;
    f.flags = flags;
    f.payload = data;
    cseq += static_cast<uint32_t>(data.size()) + ((flags & 0x03) ? 1 : 0);
    return f;
  }
  FrameSpec server(const std::string& data, uint8_t flags = 0x18) {
    FrameSpec f = base;
    std::swap(f.src, f.dst);
    std::swap(f.sport, f.dport);
    f.seq = sseq;
    f.ack = cseq;
    f.flags = flags;
    f.payload = data;
    sseq += static_cast<uint32_t>(data.size()) + ((flags & 0x03) ? 1 : 0);
    return f;
  }
  std::vector<FrameSpec> handshake() {
    std::vector<FrameSpec> v;
    v.push_back(client("", 0x02));
    v.push_back(server("", 0x12));
    v.push_back(client("", 0x10));
    return v;
  }
};

// PostgreSQL frontend/backend message builders.
inline std::string msg(char type, const std::string& body) {
  std::string m(1, type);
  uint32_t len = static_cast<uint32_t>(body.size() + 4);
  for (int s = 24; s >= 0; s -= 8) m.push_back(static_cast<char>((len >> s) & 0xFF));
  return m + body;
}
inline std::string cstr(const std::string& s) { return s + std::string(1, '\0'); }
inline std::string startup(const std::string& user, const std::string& db) {
  std::string body;
  uint32_t proto = 196608;
  for (int s = 24; s >= 0; s -= 8) body.push_back(static_cast<char>((proto >> s) & 0xFF));
  body += cstr("user") + cstr(user) + cstr("database") + cstr(db) + std::string(1, '\0');
  std::string m;
  uint32_t len = static_cast<uint32_t>(body.size() + 4);
  for (int s = 24; s >= 0; s -= 8) m.push_back(static_cast<char>((len >> s) & 0xFF));
  return m + body;
}
inline std::string auth_ok() { return msg('R', std::string("\0\0\0\0", 4)); }
inline std::string ready(char status) { return msg('Z', std::string(1, status)); }
inline std::string query(const std::string& sql) { return msg('Q', cstr(sql)); }
inline std::string complete(const std::string& tag) { return msg('C', cstr(tag)); }
inline std::string terminate() { return msg('X', ""); }

}  // namespace tierlab::test
