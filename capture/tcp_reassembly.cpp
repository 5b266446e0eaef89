#include "capture/tcp_reassembly.h"

#include "common/error.h"

#include <arpa/inet.h>
#include <pcap/dlt.h>

#include <cassert>
#include <cstring>

namespace tierlab::capture {

// --- frames -------------------------------------------------------------------

namespace {

inline uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
inline uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}

constexpr uint16_t kEtherIPv4 = 0x0800;
constexpr uint16_t kEtherIPv6 = 0x86DD;
constexpr uint16_t kEtherVlan = 0x8100;
constexpr uint16_t kEtherQinQ = 0x88A8;
constexpr uint8_t kProtoTcp = 6;

ParseResult parse_tcp(const uint8_t* p, uint32_t avail, uint32_t tcp_len_wire, Segment* out) {
  if (avail < 20 || tcp_len_wire < 20) return ParseResult::Truncated;
  uint32_t hlen = static_cast<uint32_t>(p[12] >> 4) * 4;
  if (hlen < 20 || hlen > tcp_len_wire || hlen > avail) return ParseResult::Truncated;
  out->sport = be16(p);
  out->dport = be16(p + 2);
  out->seq = be32(p + 4);
  out->ack = be32(p + 8);
  out->flags = p[13];
  out->payload = p + hlen;
  uint32_t wire_payload = tcp_len_wire - hlen;
  uint32_t have = avail - hlen;
  out->payload_len = have < wire_payload ? have : wire_payload;
  out->payload_missing = wire_payload - out->payload_len;
  return ParseResult::Tcp;
}

ParseResult parse_ipv4(const uint8_t* p, uint32_t avail, uint32_t wire, Segment* out) {
  if (avail < 20) return ParseResult::Truncated;
  if ((p[0] >> 4) != 4) return ParseResult::Truncated;
  uint32_t ihl = static_cast<uint32_t>(p[0] & 0x0F) * 4;
  uint32_t total = be16(p + 2);
  // TSO/GRO on loopback can carry a total length of 0 for frames over 64 KiB;
  // the captured length then stands for the datagram.
  if (total == 0) total = wire;
  if (ihl < 20 || total < ihl || ihl > avail) return ParseResult::Truncated;
  if (total > wire) total = wire;  // cut by the capture: the rest is missing
  uint16_t frag = be16(p + 6);
  if (p[9] != kProtoTcp) return ParseResult::NotTcp;
  if ((frag & 0x2000) || (frag & 0x1FFF)) return ParseResult::Fragment;
  std::memset(out->src, 0, 10);
  out->src[10] = out->src[11] = 0xFF;
  std::memcpy(out->src + 12, p + 12, 4);
  std::memset(out->dst, 0, 10);
  out->dst[10] = out->dst[11] = 0xFF;
  std::memcpy(out->dst + 12, p + 16, 4);
  out->v6 = false;
  uint32_t have = avail < total ? avail : total;  // drop Ethernet padding
  return parse_tcp(p + ihl, have - ihl, total - ihl, out);
}

ParseResult parse_ipv6(const uint8_t* p, uint32_t avail, uint32_t wire, Segment* out) {
  if (avail < 40) return ParseResult::Truncated;
  if ((p[0] >> 4) != 6) return ParseResult::Truncated;
  uint32_t plen = be16(p + 4);
  if (plen == 0) plen = wire >= 40 ? wire - 40 : 0;  // jumbogram or GSO
  uint32_t total = 40 + plen;
  if (total > wire) total = wire;
  uint32_t have = avail < total ? avail : total;
  uint8_t next = p[6];
  uint32_t off = 40;
  // Skip extension headers: hop-by-hop, routing, destination options.
  while (next == 0 || next == 43 || next == 60) {
    if (off + 8 > have) return ParseResult::Truncated;
    uint32_t len = (static_cast<uint32_t>(p[off + 1]) + 1) * 8;
    next = p[off];
    off += len;
  }
  if (next == 44) return ParseResult::Fragment;
  if (next != kProtoTcp) return ParseResult::NotTcp;
  if (off > have) return ParseResult::Truncated;
  std::memcpy(out->src, p + 8, 16);
  std::memcpy(out->dst, p + 24, 16);
  out->v6 = true;
  return parse_tcp(p + off, have - off, total - off, out);
}

ParseResult parse_ip(uint16_t ethertype, const uint8_t* p, uint32_t avail, uint32_t wire,
                     Segment* out) {
  if (ethertype == kEtherIPv4) return parse_ipv4(p, avail, wire, out);
  if (ethertype == kEtherIPv6) return parse_ipv6(p, avail, wire, out);
  return ParseResult::NotTcp;
}

ParseResult parse_ip_by_version(const uint8_t* p, uint32_t avail, uint32_t wire, Segment* out) {
  if (avail < 1) return ParseResult::Truncated;
  if ((p[0] >> 4) == 4) return parse_ipv4(p, avail, wire, out);
  if ((p[0] >> 4) == 6) return parse_ipv6(p, avail, wire, out);
  return ParseResult::NotTcp;
}

}  // namespace

bool link_type_supported(int dlt) {
  switch (dlt) {
    case DLT_NULL:
    case DLT_LOOP:
    case DLT_EN10MB:
    case DLT_LINUX_SLL:
    case DLT_LINUX_SLL2:
    case DLT_RAW:
    case DLT_IPV4:
    case DLT_IPV6:
      return true;
    default:
      return false;
  }
}

ParseResult parse_packet(int dlt, const uint8_t* f, uint32_t caplen, uint32_t wirelen,
                         Segment* out) {
  if (wirelen < caplen) wirelen = caplen;
  auto sub = [&](uint32_t hdr) { return wirelen - hdr; };
  switch (dlt) {
    case DLT_NULL:
    case DLT_LOOP: {
      if (caplen < 4) return ParseResult::Truncated;
      // DLT_NULL: address family in the capturing host's byte order; DLT_LOOP:
      // network order. Either way IPv4 is 2 and IPv6 one of 10/24/28/30, so
      // look at the IP version nibble instead of the family.
      return parse_ip_by_version(f + 4, caplen - 4, sub(4), out);
    }
    case DLT_EN10MB: {
      if (caplen < 14) return ParseResult::Truncated;
      uint32_t off = 12;
      uint16_t type = be16(f + off);
      off += 2;
      while (type == kEtherVlan || type == kEtherQinQ) {
        if (caplen < off + 4) return ParseResult::Truncated;
        type = be16(f + off + 2);
        off += 4;
      }
      return parse_ip(type, f + off, caplen - off, sub(off), out);
    }
    case DLT_LINUX_SLL: {
      if (caplen < 16) return ParseResult::Truncated;
      return parse_ip(be16(f + 14), f + 16, caplen - 16, sub(16), out);
    }
    case DLT_LINUX_SLL2: {
      if (caplen < 20) return ParseResult::Truncated;
      return parse_ip(be16(f), f + 20, caplen - 20, sub(20), out);
    }
    case DLT_RAW:
      return parse_ip_by_version(f, caplen, wirelen, out);
    case DLT_IPV4:
      return parse_ipv4(f, caplen, wirelen, out);
    case DLT_IPV6:
      return parse_ipv6(f, caplen, wirelen, out);
    default:
      return ParseResult::UnknownLink;
  }
}

std::string endpoint_string(const uint8_t addr[16], uint16_t port) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  char buf[INET6_ADDRSTRLEN + 16];
  if (std::memcmp(addr, mapped, 12) == 0) {
    inet_ntop(AF_INET, addr + 12, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port);
  }
  inet_ntop(AF_INET6, addr, buf, sizeof buf);
  return "[" + std::string(buf) + "]:" + std::to_string(port);
}

// --- reassembly ---------------------------------------------------------------

namespace {

constexpr uint32_t kNil = 0xFFFFFFFFu;
constexpr uint32_t kBlock = 2048;

// Sequence-number comparisons modulo 2^32 (RFC 1982 style).
inline int32_t seq_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b); }
inline bool seq_lt(uint32_t a, uint32_t b) { return seq_diff(a, b) < 0; }

struct Key {
  uint8_t client[16];
  uint8_t server[16];
  uint16_t client_port;
  uint16_t server_port;
  bool operator==(const Key& o) const {
    return std::memcmp(client, o.client, 16) == 0 && std::memcmp(server, o.server, 16) == 0 &&
           client_port == o.client_port && server_port == o.server_port;
  }
};

inline uint64_t hash_key(const Key& k) {
  uint64_t a, b, c, d;
  std::memcpy(&a, k.client, 8);
  std::memcpy(&b, k.client + 8, 8);
  std::memcpy(&c, k.server, 8);
  std::memcpy(&d, k.server + 8, 8);
  // Independent multiplies (no chain through h): this runs once per packet.
  uint64_t h = (static_cast<uint64_t>(k.client_port) << 16 | k.server_port) * 0x9E3779B97F4A7C15ull;
  h ^= (a ^ (a >> 29)) * 0xBF58476D1CE4E5B9ull;
  h ^= (b ^ (b >> 29)) * 0x94D049BB133111EBull;
  h ^= (c ^ (c >> 29)) * 0xD6E8FEB86659FD93ull;
  h ^= (d ^ (d >> 29)) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 32;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}

// A segment held back behind a hole; its bytes live in a chain of blocks.
struct Node {
  uint32_t seq = 0;
  uint32_t len = 0;
  Nanos ts = 0;
  uint32_t next = kNil;   // next node of the direction, ascending seq
  uint32_t block = kNil;  // first block
  bool fin = false;       // the FIN follows the last byte
};

struct Half {
  uint32_t next_seq = 0;  // next byte expected in order
  bool known = false;     // next_seq is valid
  bool fin_done = false;  // FIN reached in order: no more data
  uint32_t ooo = kNil;    // held-back segments, ascending seq
  uint32_t ooo_bytes = 0;
  Nanos hole_since = 0;
};

struct Conn {
  Key key{};
  ConnInfo info{};
  Half half[2];
  bool used = false;
  uint32_t lru_prev = kNil, lru_next = kNil;  // most recent at the head
};

}  // namespace

struct Reassembler::Impl {
  Options opts;
  StreamHandler* h;
  ReassemblyStats st;

  std::vector<Conn> conns;
  std::vector<uint32_t> free_conns;
  std::vector<uint32_t> table;  // open addressing, linear probing; conn slot or kNil
  uint64_t mask = 0;
  uint32_t lru_head = kNil, lru_tail = kNil;
  uint32_t open = 0;

  std::vector<Node> nodes;
  std::vector<uint32_t> free_nodes;
  // Left uninitialised: the kernel hands out its pages on first use, so a
  // large pool costs nothing until segments are actually held back.
  std::unique_ptr<uint8_t[]> block_bytes;
  std::vector<uint32_t> block_next;
  std::vector<uint32_t> free_blocks;

  uint32_t holes = 0;  // directions with held-back segments
  Nanos last_sweep = 0;

  Impl(const Options& o, StreamHandler* handler) : opts(o), h(handler) {
    if (opts.max_connections == 0) throw InputError("reassembly: max_connections must be > 0");
    conns.resize(opts.max_connections);
    free_conns.reserve(opts.max_connections);
    for (uint32_t i = opts.max_connections; i-- > 0;) free_conns.push_back(i);
    uint64_t cap = 16;
    while (cap < 2ull * opts.max_connections) cap <<= 1;
    table.assign(cap, kNil);
    mask = cap - 1;
    size_t nblocks = opts.buffer_bytes / kBlock;
    if (nblocks < 64) nblocks = 64;
    block_bytes.reset(new uint8_t[nblocks * kBlock]);
    block_next.assign(nblocks, kNil);
    free_blocks.reserve(nblocks);
    for (size_t i = nblocks; i-- > 0;) free_blocks.push_back(static_cast<uint32_t>(i));
    nodes.resize(nblocks);
    free_nodes.reserve(nblocks);
    for (size_t i = nblocks; i-- > 0;) free_nodes.push_back(static_cast<uint32_t>(i));
  }

  // --- connection table ---

  uint32_t find(const Key& k) const {
    for (uint64_t i = hash_key(k) & mask;; i = (i + 1) & mask) {
      uint32_t c = table[i];
      if (c == kNil) return kNil;
      if (conns[c].key == k) return c;
    }
  }

  void table_insert(uint32_t c) {
    uint64_t i = hash_key(conns[c].key) & mask;
    while (table[i] != kNil) i = (i + 1) & mask;
    table[i] = c;
  }

  void table_erase(uint32_t c) {
    uint64_t i = hash_key(conns[c].key) & mask;
    while (table[i] != c) i = (i + 1) & mask;
    // Backward-shift deletion keeps every probe chain unbroken.
    uint64_t j = i;
    for (;;) {
      table[i] = kNil;
      for (;;) {
        j = (j + 1) & mask;
        if (table[j] == kNil) return;
        uint64_t home = hash_key(conns[table[j]].key) & mask;
        // Move table[j] into the hole at i unless its home lies in (i, j].
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) break;
      }
      table[i] = table[j];
      i = j;
    }
  }

  void lru_unlink(uint32_t c) {
    Conn& x = conns[c];
    if (x.lru_prev != kNil) conns[x.lru_prev].lru_next = x.lru_next; else lru_head = x.lru_next;
    if (x.lru_next != kNil) conns[x.lru_next].lru_prev = x.lru_prev; else lru_tail = x.lru_prev;
    x.lru_prev = x.lru_next = kNil;
  }

  void lru_push_front(uint32_t c) {
    Conn& x = conns[c];
    x.lru_prev = kNil;
    x.lru_next = lru_head;
    if (lru_head != kNil) conns[lru_head].lru_prev = c; else lru_tail = c;
    lru_head = c;
  }

  void touch(uint32_t c) {
    if (lru_head == c) return;
    lru_unlink(c);
    lru_push_front(c);
  }

  uint32_t create(const Key& k, bool joined, bool v6, Nanos ts) {
    if (free_conns.empty()) {
      ++st.evicted;
      close(lru_tail, CloseKind::Evicted, ts);
    }
    uint32_t c = free_conns.back();
    free_conns.pop_back();
    Conn& x = conns[c];
    x.key = k;
    x.half[0] = Half{};
    x.half[1] = Half{};
    x.used = true;
    std::memcpy(x.info.client, k.client, 16);
    std::memcpy(x.info.server, k.server, 16);
    x.info.client_port = k.client_port;
    x.info.server_port = k.server_port;
    x.info.v6 = v6;
    x.info.joined = joined;
    table_insert(c);
    lru_push_front(c);
    ++open;
    ++st.connections;
    if (joined) ++st.joined;
    h->on_open(c, x.info, ts);
    return c;
  }

  void close(uint32_t c, CloseKind how, Nanos ts) {
    Conn& x = conns[c];
    assert(x.used);
    flush_holes(c, Dir::ToServer, ts);
    flush_holes(c, Dir::ToClient, ts);
    h->on_close(c, how, ts);
    table_erase(c);
    lru_unlink(c);
    x.used = false;
    free_conns.push_back(c);
    --open;
  }

  // --- held-back segments ---

  void free_node(uint32_t n) {
    uint32_t b = nodes[n].block;
    while (b != kNil) {
      uint32_t nb = block_next[b];
      block_next[b] = kNil;
      free_blocks.push_back(b);
      b = nb;
    }
    nodes[n].block = kNil;
    free_nodes.push_back(n);
  }

  // Copies a segment into the pool; false if the pool or the direction's
  // bound has no room.
  bool hold(Half& hf, uint32_t seq, const uint8_t* data, uint32_t len, bool fin, Nanos ts) {
    uint32_t need = (len + kBlock - 1) / kBlock;
    if (hf.ooo_bytes + len > opts.max_buffered_per_dir) {
      ++st.held_per_dir_full;
      return false;
    }
    if (free_nodes.empty() || free_blocks.size() < need) {
      ++st.held_pool_full;
      return false;
    }
    // Find the insertion point; a duplicate of a held segment is dropped.
    uint32_t prev = kNil, cur = hf.ooo;
    while (cur != kNil && !seq_lt(seq, nodes[cur].seq)) {
      if (nodes[cur].seq == seq && nodes[cur].len >= len && (nodes[cur].fin || !fin)) {
        ++st.retransmitted;
        return true;
      }
      prev = cur;
      cur = nodes[cur].next;
    }
    uint32_t n = free_nodes.back();
    free_nodes.pop_back();
    Node& nd = nodes[n];
    nd.seq = seq;
    nd.len = len;
    nd.ts = ts;
    nd.fin = fin;
    nd.block = kNil;
    uint32_t* link = &nd.block;
    for (uint32_t off = 0; off < len; off += kBlock) {
      uint32_t b = free_blocks.back();
      free_blocks.pop_back();
      uint32_t chunk = len - off < kBlock ? len - off : kBlock;
      std::memcpy(&block_bytes[static_cast<size_t>(b) * kBlock], data + off, chunk);
      *link = b;
      link = &block_next[b];
    }
    nd.next = cur;
    if (prev == kNil) {
      if (hf.ooo == kNil) {
        ++holes;
        hf.hole_since = ts;
      }
      hf.ooo = n;
    } else {
      nodes[prev].next = n;
    }
    hf.ooo_bytes += len;
    ++st.out_of_order;
    return true;
  }

  // Delivers held-back segments that have become contiguous.
  void drain(uint32_t c, Dir d) {
    Half& hf = conns[c].half[static_cast<int>(d)];
    if (hf.ooo == kNil) return;
    while (hf.ooo != kNil && !seq_lt(hf.next_seq, nodes[hf.ooo].seq)) {
      uint32_t n = hf.ooo;
      Node& nd = nodes[n];
      hf.ooo = nd.next;
      hf.ooo_bytes -= nd.len;
      uint32_t skip = hf.next_seq - nd.seq;  // bytes already delivered
      if (skip < nd.len) {
        st.trimmed_bytes += skip;
        uint32_t b = nd.block, off = 0;
        while (b != kNil) {
          uint32_t chunk = nd.len - off < kBlock ? nd.len - off : kBlock;
          if (off + chunk > skip) {
            uint32_t from = skip > off ? skip - off : 0;
            h->on_data(c, d, &block_bytes[static_cast<size_t>(b) * kBlock + from], chunk - from,
                       nd.ts);
          }
          off += chunk;
          b = block_next[b];
        }
        hf.next_seq = nd.seq + nd.len;
        st.payload_bytes += nd.len - skip;
      } else if (nd.len > 0) {
        ++st.retransmitted;
      }
      if (nd.fin && hf.next_seq == nd.seq + nd.len) hf.fin_done = true;
      free_node(n);
    }
    if (hf.ooo == kNil)
      --holes;
    else
      hf.hole_since = nodes[hf.ooo].ts;
  }

  // Declares the bytes from next_seq up to `to` (or to the first held
  // segment, whichever comes first) missing, then delivers what follows.
  void skip_to(uint32_t c, Dir d, uint32_t to, Nanos ts) {
    Half& hf = conns[c].half[static_cast<int>(d)];
    while (seq_lt(hf.next_seq, to) && !hf.fin_done) {
      uint32_t end = to;
      if (hf.ooo != kNil && seq_lt(nodes[hf.ooo].seq, end)) end = nodes[hf.ooo].seq;
      if (seq_lt(hf.next_seq, end)) {
        uint32_t n = end - hf.next_seq;
        ++st.gaps;
        st.gap_bytes += n;
        h->on_gap(c, d, n, ts);
        hf.next_seq = end;
      }
      drain(c, d);
    }
  }

  void flush_holes(uint32_t c, Dir d, Nanos ts) {
    Half& hf = conns[c].half[static_cast<int>(d)];
    while (hf.ooo != kNil) {
      uint32_t last = hf.ooo;
      while (nodes[last].next != kNil) last = nodes[last].next;
      skip_to(c, d, nodes[last].seq + nodes[last].len, ts);
      if (hf.fin_done && hf.ooo != kNil) {
        // Data held beyond a FIN cannot belong to the stream.
        while (hf.ooo != kNil) {
          uint32_t n = hf.ooo;
          hf.ooo = nodes[n].next;
          hf.ooo_bytes -= nodes[n].len;
          free_node(n);
        }
        --holes;
      }
    }
  }

  void expire(uint32_t c, Dir d, Nanos now) {
    Half& hf = conns[c].half[static_cast<int>(d)];
    if (hf.ooo != kNil && now - hf.hole_since > opts.hole_timeout_ns)
      skip_to(c, d, nodes[hf.ooo].seq, now);
  }

  // --- the segment path ---

  void add(const Segment& s, Nanos ts) {
    ++st.segments;
    Dir d;
    Key k;
    if (s.dport == opts.server_port) {
      d = Dir::ToServer;
      std::memcpy(k.client, s.src, 16);
      std::memcpy(k.server, s.dst, 16);
      k.client_port = s.sport;
      k.server_port = s.dport;
    } else if (s.sport == opts.server_port) {
      d = Dir::ToClient;
      std::memcpy(k.client, s.dst, 16);
      std::memcpy(k.server, s.src, 16);
      k.client_port = s.dport;
      k.server_port = s.sport;
    } else {
      ++st.ignored;
      return;
    }
    const bool syn = s.flags & kTcpSyn, ack = s.flags & kTcpAck, rst = s.flags & kTcpRst,
               fin = s.flags & kTcpFin;
    const uint32_t len = s.payload_len + s.payload_missing;

    uint32_t c = find(k);
    if (c != kNil && syn && !ack && d == Dir::ToServer) {
      Half& cs = conns[c].half[0];
      if (cs.known && cs.next_seq == s.seq + 1) return;  // retransmitted SYN
      close(c, CloseKind::Replaced, ts);
      c = kNil;
    }
    if (c == kNil) {
      if (rst) {
        ++st.ignored;
        return;
      }
      if (syn) {
        c = create(k, false, s.v6, ts);
      } else if (len > 0) {
        c = create(k, true, s.v6, ts);
      } else {
        ++st.ignored;
        return;
      }
    } else {
      touch(c);
    }
    Conn& x = conns[c];
    Half& mine = x.half[static_cast<int>(d)];
    Half& peer = x.half[1 - static_cast<int>(d)];
    Dir peer_dir = d == Dir::ToServer ? Dir::ToClient : Dir::ToServer;

    if (rst) {
      close(c, CloseKind::Reset, ts);
      return;
    }
    if (syn) {
      if (!mine.known) {
        mine.next_seq = s.seq + 1;
        mine.known = true;
      }
      if (ack && !peer.known) {
        peer.next_seq = s.ack;  // the client's data starts where the SYN-ACK points
        peer.known = true;
      }
      return;
    }

    // The peer acknowledges bytes we never saw: the capture lost them.
    if (ack && peer.known && !peer.fin_done && seq_diff(s.ack, peer.next_seq) > 0 &&
        seq_diff(s.ack, peer.next_seq) < (1 << 30)) {
      uint32_t to = s.ack;
      // A FIN takes one sequence number; do not count it as a byte.
      uint32_t last = peer.ooo;
      while (last != kNil && nodes[last].next != kNil) last = nodes[last].next;
      if (last != kNil && nodes[last].fin && seq_diff(to, nodes[last].seq + nodes[last].len) > 0)
        to = nodes[last].seq + nodes[last].len;
      skip_to(c, peer_dir, to, ts);
    }

    if (len == 0 && !fin) return;  // pure ACK
    if (!mine.known) {
      mine.next_seq = s.seq;
      mine.known = true;
    }
    if (mine.fin_done) {
      if (len > 0) ++st.retransmitted;
      return;
    }
    accept(c, d, s, ts);

    if (x.half[0].fin_done && x.half[1].fin_done) close(c, CloseKind::Fin, ts);
  }

  void accept(uint32_t c, Dir d, const Segment& s, Nanos ts) {
    Half& hf = conns[c].half[static_cast<int>(d)];
    const bool fin = s.flags & kTcpFin;
    const uint32_t len = s.payload_len + s.payload_missing;
    for (;;) {
      int32_t rel = seq_diff(s.seq, hf.next_seq);
      if (rel <= 0) {
        uint32_t trim = 0u - static_cast<uint32_t>(rel);  // -rel overflows at INT32_MIN
        if (trim > len || (trim == len && !fin)) {
          if (len > 0) ++st.retransmitted;
          return;
        }
        if (trim < s.payload_len) {
          if (trim) st.trimmed_bytes += trim;
          h->on_data(c, d, s.payload + trim, s.payload_len - trim, ts);
          st.payload_bytes += s.payload_len - trim;
          hf.next_seq = s.seq + s.payload_len;
        }
        if (s.payload_missing && seq_lt(hf.next_seq, s.seq + len)) {
          // Cut by the snapshot length: those bytes are gone.
          uint32_t n = s.seq + len - hf.next_seq;
          ++st.gaps;
          st.gap_bytes += n;
          h->on_gap(c, d, n, ts);
          hf.next_seq = s.seq + len;
        }
        if (fin && hf.next_seq == s.seq + len) hf.fin_done = true;
        drain(c, d);
        expire(c, d, ts);
        return;
      }
      // Ahead of a hole: hold it back, making room by declaring the oldest
      // hole a gap when the bound is reached.
      if (hold(hf, s.seq, s.payload, s.payload_len, fin && s.payload_missing == 0, ts)) {
        expire(c, d, ts);
        return;
      }
      uint32_t to = hf.ooo != kNil ? nodes[hf.ooo].seq : s.seq;
      skip_to(c, d, to, ts);
      if (hf.fin_done) return;
    }
  }

  void advance(Nanos now) {
    if (holes == 0 || now - last_sweep < opts.hole_timeout_ns / 4) return;
    last_sweep = now;
    for (uint32_t c = lru_head; c != kNil;) {
      uint32_t next = conns[c].lru_next;
      expire(c, Dir::ToServer, now);
      expire(c, Dir::ToClient, now);
      c = next;
    }
  }

  void finish(Nanos now) {
    while (lru_head != kNil) close(lru_head, CloseKind::Flushed, now);
  }
};

Reassembler::Reassembler(const Options& opts, StreamHandler* handler)
    : impl_(std::make_unique<Impl>(opts, handler)) {}
Reassembler::~Reassembler() = default;
void Reassembler::add(const Segment& seg, Nanos ts) { impl_->add(seg, ts); }
void Reassembler::advance(Nanos now) { impl_->advance(now); }
void Reassembler::finish(Nanos now) { impl_->finish(now); }
const ReassemblyStats& Reassembler::stats() const { return impl_->st; }
uint32_t Reassembler::open_connections() const { return impl_->open; }

}  // namespace tierlab::capture
