#include "capture/sniff.h"

#include "capture/tcp_reassembly.h"
#include "capture/wire.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/realtime.h"
#include "common/units.h"
#include "trace/writer.h"

#include <pcap/pcap.h>

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <ostream>
#include <sstream>

namespace tierlab::capture {

// --- session map ------------------------------------------------------------

std::vector<SessionMapEntry> parse_session_map(const std::string& text, const std::string& name) {
  std::vector<SessionMapEntry> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string client;
    SessionMapEntry e;
    if (!(fields >> client)) continue;
    auto where = [&] { return name + ":" + std::to_string(lineno) + ": "; };
    if (!(fields >> e.user >> e.database))
      throw InputError(where() + "expected CLIENT USER DATABASE [APPLICATION_NAME]");
    fields >> e.application_name;
    std::string extra;
    if (fields >> extra) throw InputError(where() + "unexpected field '" + extra + "'");
    std::string addr = client, port;
    if (!client.empty() && client[0] == '[') {
      auto close = client.find(']');
      if (close == std::string::npos) throw InputError(where() + "unclosed '[' in '" + client + "'");
      addr = client.substr(1, close - 1);
      if (close + 1 < client.size()) {
        if (client[close + 1] != ':') throw InputError(where() + "bad client '" + client + "'");
        port = client.substr(close + 2);
      }
    } else if (auto colon = client.rfind(':'); colon != std::string::npos &&
                                               client.find(':') == colon) {
      addr = client.substr(0, colon);
      port = client.substr(colon + 1);
    }
    if (!port.empty()) {
      char* end = nullptr;
      unsigned long p = std::strtoul(port.c_str(), &end, 10);
      if (*end || p == 0 || p > 65535)
        throw InputError(where() + "bad port '" + port + "' in '" + client + "'");
      e.port = static_cast<uint16_t>(p);
    }
    if (!addr.empty()) {
      uint8_t buf[16];
      if (inet_pton(AF_INET, addr.c_str(), buf) != 1 && inet_pton(AF_INET6, addr.c_str(), buf) != 1)
        throw InputError(where() + "bad address '" + addr + "'");
    }
    e.addr = addr;
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

std::atomic<bool> g_stop{false};
std::atomic<pcap_t*> g_pcap{nullptr};

Nanos realtime_now() { return clock_ns(CLOCK_REALTIME); }

bool same_addr(const std::string& text, const uint8_t addr[16]) {
  uint8_t buf[16];
  if (inet_pton(AF_INET, text.c_str(), buf) == 1) {
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    return std::memcmp(addr, mapped, 12) == 0 && std::memcmp(addr + 12, buf, 4) == 0;
  }
  if (inet_pton(AF_INET6, text.c_str(), buf) == 1) return std::memcmp(addr, buf, 16) == 0;
  return false;
}

bool looks_like_tls_record(const uint8_t* p, size_t n) {
  // TLS record header: content type 20-23, version 3.x, length.
  return n >= 5 && p[0] >= 20 && p[0] <= 23 && p[1] == 3 && p[2] <= 4;
}

// Writes decoded records into the trace. When the file cannot take more (a
// full disk) it says so once in `log`, and from then on only counts: the
// writer holds the records of its last whole chunk, the rest are lost.
class TraceSink : public RecordSink {
 public:
  TraceSink(trace::Writer& w, std::ostream& log, std::string path) : w_(w), log_(log), path_(std::move(path)) {}
  void record(const trace::Record& r) override {
    ++records;
    if (!error.empty()) return;
    try {
      w_.write(r);
    } catch (const RuntimeError& e) {
      stop(e, r.ts);
    }
  }
  // Ends the chunk being filled (the writer's flush()), unless stopped.
  void flush(Nanos ts) {
    if (!error.empty()) return;
    try {
      w_.flush();
    } catch (const RuntimeError& e) {
      stop(e, ts);
    }
  }
  // Closes the trace at `end_ts`; what the file holds then goes into `sum`.
  void close(SniffSummary& sum, Nanos start_ts, Nanos end_ts) {
    if (error.empty()) {
      try {
        w_.close();
      } catch (const RuntimeError& e) {
        stop(e, end_ts);
      }
    }
    if (error.empty()) {
      sum.records = records;
      return;
    }
    sum.records = w_.records_flushed();
    sum.lost_records = records - sum.records;
    sum.recording_error = error;
    sum.recording_stopped_s = stopped_ts > start_ts ? static_cast<double>(stopped_ts - start_ts) / 1e9 : 0;
  }
  void parameter_status(uint64_t, std::string_view name, std::string_view value,
                        Nanos ts) override {
    if (!server_version_seen && name == "server_version") {
      server_version_seen = true;
      record(trace::Record{ts, 0, trace::Meta{"server_version", value}});
    }
  }
  uint64_t records = 0;  // given to record(), written or not
  bool server_version_seen = false;
  std::string error;     // why the trace stopped taking records; "" while it takes them
  Nanos stopped_ts = 0;

 private:
  void stop(const RuntimeError& e, Nanos ts) {
    error = e.what();
    stopped_ts = ts;
    log_ << "tierlab capture sniff: RECORDING STOPPED: " << error << ": the trace " << path_
         << " cannot take more; still decoding, nothing more is recorded (the trace so far is kept)" << std::endl;
  }

  trace::Writer& w_;
  std::ostream& log_;
  std::string path_;
};

// Connects reassembled streams to one SessionDecoder per connection slot.
class Sessions : public StreamHandler {
 public:
  Sessions(uint32_t slots, TraceSink& sink, std::vector<SessionMapEntry> map, std::ostream& log,
           SniffSummary& sum, const WireLimits& limits)
      : sink_(sink), map_(std::move(map)), log_(log), sum_(sum), limits_(limits), slots_(slots) {}

  void on_open(uint32_t conn, const ConnInfo& info, Nanos ts) override {
    Slot& s = slots_[conn];
    if (!s.dec) s.dec = std::make_unique<SessionDecoder>(sink_, limits_);
    s.id = ++next_id_;
    s.info = info;
    s.client_addr = endpoint_string(info.client, info.client_port);
    s.state = info.joined ? State::JoinPending : State::Decoding;
    s.failed_reported = false;
    if (!info.joined) s.dec->begin(s.id, s.client_addr, 0, ts);
  }

  void on_data(uint32_t conn, Dir dir, const uint8_t* p, size_t n, Nanos ts) override {
    Slot& s = slots_[conn];
    if (s.state == State::JoinPending) {
      if (looks_like_tls_record(p, n)) {
        encrypted(s, ts, trace::kSessionUnknownStartup);
        return;
      }
      join(s, ts);
    }
    if (s.state != State::Decoding) return;
    Direction d = dir == Dir::ToServer ? Direction::Frontend : Direction::Backend;
    bool ok = s.dec->feed(d, p, n, ts);
    if (!ok) {
      failed(s, ts);
      return;
    }
    if (s.dec->tls()) encrypted(s, ts, 0);
  }

  void on_gap(uint32_t conn, Dir dir, uint64_t bytes, Nanos ts) override {
    Slot& s = slots_[conn];
    if (s.state == State::JoinPending) join(s, ts);
    if (s.state == State::Decoding) {
      // The startup was lost: what follows can only be joined.
      if (!s.dec->started()) join(s, ts);
      s.dec->gap(dir == Dir::ToServer ? Direction::Frontend : Direction::Backend, bytes, ts);
    } else if (s.state == State::Opaque) {
      sink_.record(trace::Record{ts, s.id, trace::Loss{trace::LossKind::StreamGap, bytes}});
    }
  }

  void on_close(uint32_t conn, CloseKind how, Nanos ts) override {
    Slot& s = slots_[conn];
    SessionDecoder& dec = *s.dec;
    trace::EndReason reason = trace::EndReason::Unknown;
    switch (how) {
      case CloseKind::Fin:
      case CloseKind::Reset:
        reason = dec.terminated()   ? trace::EndReason::Clean
                 : dec.fatal_seen() ? trace::EndReason::ServerClosed
                                    : trace::EndReason::ClientAbort;
        break;
      case CloseKind::Flushed:
        reason = trace::EndReason::CaptureEnd;
        break;
      case CloseKind::Evicted:
      case CloseKind::Replaced:
        reason = trace::EndReason::Unknown;
        break;
    }
    if (s.state == State::Opaque) {
      sink_.record(trace::Record{ts, s.id, trace::SessionEnd{reason}});
    } else if (s.state != State::JoinPending) {
      dec.end(reason, ts);
      const SessionStats& st = dec.stats();
      if (dec.started()) ++sum_.sessions;
      if (dec.cancel_request()) ++sum_.cancel_requests;
      sum_.statements += st.statements;
      sum_.transactions += st.transactions;
      sum_.errors += st.errors;
      sum_.hunt_discarded += st.hunt_discarded;
    }
    s.state = State::Closed;
  }

 private:
  enum class State : uint8_t { Closed, JoinPending, Decoding, Opaque, Failed };
  struct Slot {
    std::unique_ptr<SessionDecoder> dec;
    uint64_t id = 0;
    ConnInfo info;
    std::string client_addr;
    State state = State::Closed;
    bool failed_reported = false;
  };

  void join(Slot& s, Nanos ts) {
    JoinInfo ji;
    ji.client_addr = s.client_addr;
    for (const auto& e : map_) {
      if (e.port && e.port != s.info.client_port) continue;
      if (!e.addr.empty() && !same_addr(e.addr, s.info.client)) continue;
      ji.user = e.user;
      ji.database = e.database;
      ji.application_name = e.application_name;
      break;
    }
    s.dec->join(s.id, ji, ts);
    s.state = State::Decoding;
    ++sum_.joined;
  }

  void encrypted(Slot& s, Nanos ts, uint32_t flags) {
    ++sum_.tls_sessions;
    ++sum_.sessions;
    sink_.record(trace::Record{
        ts, s.id, trace::SessionBegin{{}, {}, {}, s.client_addr, 0, flags | trace::kSessionTls}});
    sink_.record(trace::Record{ts, s.id, trace::Loss{trace::LossKind::Unsupported, 1}});
    s.state = State::Opaque;
  }

  void failed(Slot& s, Nanos ts) {
    ++sum_.decode_failures;
    if (!s.failed_reported) {
      log_ << "tierlab capture sniff: session " << s.id << " (" << s.client_addr
           << "): stopped decoding: " << s.dec->error() << "\n";
      s.failed_reported = true;
    }
    s.dec->end(trace::EndReason::ProtocolError, ts);
    const SessionStats& st = s.dec->stats();
    ++sum_.sessions;
    sum_.statements += st.statements;
    sum_.transactions += st.transactions;
    sum_.errors += st.errors;
    s.state = State::Failed;
  }

  TraceSink& sink_;
  std::vector<SessionMapEntry> map_;
  std::ostream& log_;
  SniffSummary& sum_;
  WireLimits limits_;
  std::vector<Slot> slots_;
  uint64_t next_id_ = 0;
};

// Everything one capture run needs, reachable from the pcap callback.
struct Run {
  Reassembler* reasm = nullptr;
  SniffSummary* sum = nullptr;
  int dlt = 0;
  bool nano = true;
  Nanos offset = 0;  // CLOCK_REALTIME - CLOCK_MONOTONIC
  Nanos first_rt = 0, last_rt = 0;
  Segment seg;
};

void on_packet(u_char* user, const pcap_pkthdr* h, const u_char* bytes) {
  Run& run = *reinterpret_cast<Run*>(user);
  SniffSummary& sum = *run.sum;
  ++sum.packets;
  sum.bytes += h->len;
  Nanos rt = static_cast<Nanos>(h->ts.tv_sec) * 1'000'000'000 +
             static_cast<Nanos>(h->ts.tv_usec) * (run.nano ? 1 : 1000);
  if (run.first_rt == 0) run.first_rt = rt;
  run.last_rt = rt;
  switch (parse_packet(run.dlt, bytes, h->caplen, h->len, &run.seg)) {
    case ParseResult::Tcp:
      run.reasm->add(run.seg, rt - run.offset);
      break;
    case ParseResult::NotTcp:
      ++sum.not_tcp;
      break;
    case ParseResult::Fragment:
      ++sum.fragments;
      break;
    case ParseResult::Truncated:
    case ParseResult::UnknownLink:
      ++sum.malformed;
      break;
  }
}

struct PcapCloser {
  void operator()(pcap_t* p) const {
    g_pcap.store(nullptr);
    pcap_close(p);
  }
};
using PcapPtr = std::unique_ptr<pcap_t, PcapCloser>;

std::string filter_expr(const SniffOptions& o) {
  std::string f = "tcp port " + std::to_string(o.port);
  if (!o.host.empty()) f += " and host " + o.host;
  for (const auto& c : o.ignore_clients)
    f += " and not (host " + c.addr + " and port " + std::to_string(c.port) + ")";
  return f;
}

void check(pcap_t* p, int rc, const std::string& what) {
  if (rc < 0) {
    const char* msg = rc == PCAP_ERROR ? pcap_geterr(p) : pcap_statustostr(rc);
    throw RuntimeError(what + ": " + msg);
  }
}

// On a loopback interface every packet passes the tap twice: once as it is
// sent and once as it is received. libpcap discards the sent copy in user
// space, after the kernel has cloned it and copied it into the ring; asking
// the kernel not to deliver sent packets (PACKET_IGNORE_OUTGOING, Linux 4.20)
// halves the per-packet work the capture puts on the traffic it watches. On
// other interfaces the server's replies are outgoing packets, so this is
// loopback only; on a kernel without the option libpcap's filtering remains.
void ignore_loopback_echo(pcap_t* p, const std::string& interface) {
  int fd = pcap_fileno(p);
  ifreq ifr{};
  if (interface.size() >= sizeof ifr.ifr_name) return;
  std::memcpy(ifr.ifr_name, interface.data(), interface.size());
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0 || !(ifr.ifr_flags & IFF_LOOPBACK)) return;
  int one = 1;
  (void)setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
}

// The kernel ring's bounds: below a few blocks libpcap silently rounds up,
// and libpcap takes the size as an int.
constexpr uint64_t kMinRingBytes = 64ull << 10;
constexpr uint64_t kMaxRingBytes = 1ull << 30;
// Connections tracked at once: each takes a slot of reassembly and decoder
// state, allocated when the capture starts.
constexpr uint32_t kMaxConnections = 1u << 20;

PcapPtr open_live(const SniffOptions& o, bool* nano, std::ostream& log) {
  char err[PCAP_ERRBUF_SIZE] = {};
  PcapPtr p(pcap_create(o.interface.c_str(), err));
  if (!p) throw RuntimeError("capture sniff: interface " + o.interface + ": " + err);
  std::string where = "capture sniff: interface " + o.interface;
  check(p.get(), pcap_set_snaplen(p.get(), o.snaplen), where + ": snaplen");
  check(p.get(), pcap_set_buffer_size(p.get(), static_cast<int>(o.buffer_bytes)),
        where + ": buffer size");
  check(p.get(), pcap_set_immediate_mode(p.get(), 0), where + ": immediate mode");
  check(p.get(), pcap_set_timeout(p.get(), 100), where + ": timeout");
  check(p.get(), pcap_set_promisc(p.get(), 0), where + ": promiscuous mode");
  *nano = pcap_set_tstamp_precision(p.get(), PCAP_TSTAMP_PRECISION_NANO) == 0;
  int rc = pcap_activate(p.get());
  if (rc == PCAP_ERROR_NO_SUCH_DEVICE)
    throw InputError(where + ": no such interface");
  if (rc == PCAP_ERROR_PERM_DENIED)
    throw RuntimeError(where + ": permission denied (needs root or CAP_NET_RAW)");
  if (rc < 0) throw RuntimeError(where + ": " + pcap_geterr(p.get()));
  if (rc > 0) log << "tierlab capture sniff: warning: " << pcap_geterr(p.get()) << "\n";
  *nano = pcap_get_tstamp_precision(p.get()) == PCAP_TSTAMP_PRECISION_NANO;
  ignore_loopback_echo(p.get(), o.interface);
  return p;
}

PcapPtr open_file(const SniffOptions& o, bool* nano) {
  char err[PCAP_ERRBUF_SIZE] = {};
  PcapPtr p(pcap_open_offline_with_tstamp_precision(o.pcap_file.c_str(),
                                                    PCAP_TSTAMP_PRECISION_NANO, err));
  if (!p) throw InputError(o.pcap_file + ": " + err);
  *nano = pcap_get_tstamp_precision(p.get()) == PCAP_TSTAMP_PRECISION_NANO;
  return p;
}

void set_filter(pcap_t* p, const std::string& f, const std::string& where) {
  bpf_program prog;
  if (pcap_compile(p, &prog, f.c_str(), 1, PCAP_NETMASK_UNKNOWN) < 0)
    throw InputError(where + ": filter '" + f + "': " + pcap_geterr(p));
  int rc = pcap_setfilter(p, &prog);
  pcap_freecode(&prog);
  if (rc < 0) throw RuntimeError(where + ": filter '" + f + "': " + pcap_geterr(p));
}

std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError(errno_message(path, errno));
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

}  // namespace

void check_sniff_options(const SniffOptions& o, const std::string& who) {
  if (o.interface.empty() == o.pcap_file.empty())
    throw InputError(who + ": give exactly one of a network interface and a pcap file");
  if (o.out.empty()) throw InputError(who + ": no trace file to write given");
  auto unix_path = [](const std::string& s) {
    return !s.empty() && (s[0] == '/' || s.rfind("unix", 0) == 0);
  };
  if (unix_path(o.interface) || unix_path(o.host))
    throw InputError(
        who + ": unix-domain socket traffic never reaches a network interface and cannot "
        "be sniffed; a capture proxy listening on a unix-domain socket records it");
  if (o.port == 0) throw SettingError("port", "0: must be 1-65535");
  if (o.max_connections == 0 || o.max_connections > kMaxConnections)
    throw SettingError("max_connections", std::to_string(o.max_connections) + ": must be 1 to " +
                     std::to_string(kMaxConnections));
  if (!o.interface.empty() && o.interface != "any" && ::if_nametoindex(o.interface.c_str()) == 0)
    throw SettingError("interface", o.interface + ": no such interface");
  if (o.snaplen < 128) throw SettingError("snaplen", std::to_string(o.snaplen) + ": must be at least 128");
  if (o.reassembly_bytes < (64u << 10) || o.reassembly_bytes > (16ull << 30))
    throw SettingError("reassembly_bytes", format_bytes(static_cast<double>(o.reassembly_bytes)) +
                     ": must be 64 KiB to 16 GiB");
  if (!o.interface.empty() && (o.buffer_bytes < kMinRingBytes || o.buffer_bytes > kMaxRingBytes))
    throw SettingError("buffer_bytes", format_bytes(static_cast<double>(o.buffer_bytes)) + ": must be 64 KiB to 1 GiB");
  try {
    trace::check_compression_level(o.compression_level);
  } catch (const InputError& e) {
    throw InputError(who + ": compression level " + e.what());
  }
  if (o.duration_s < 0) throw SettingError("duration_s", std::to_string(o.duration_s) + " s: must not be negative");
  if (!o.host.empty()) {
    uint8_t buf[16];
    if (inet_pton(AF_INET, o.host.c_str(), buf) != 1 &&
        inet_pton(AF_INET6, o.host.c_str(), buf) != 1)
      throw SettingError("host", "'" + o.host + "' is not an IPv4 or IPv6 address");
  }
}

void stop_sniff() {
  g_stop.store(true);
  if (pcap_t* p = g_pcap.load()) pcap_breakloop(p);
}

SniffSummary run_sniff(const SniffOptions& o, std::ostream& log) {
  check_sniff_options(o, "capture sniff");
  std::vector<SessionMapEntry> map;
  if (!o.session_map.empty()) map = parse_session_map(read_file(o.session_map), o.session_map);

  const bool live = !o.interface.empty();
  bool nano = true;
  PcapPtr pcap = live ? open_live(o, &nano, log) : open_file(o, &nano);
  const std::string where = live ? "capture sniff: interface " + o.interface : o.pcap_file;
  int dlt = pcap_datalink(pcap.get());
  if (!link_type_supported(dlt)) {
    const char* name = pcap_datalink_val_to_name(dlt);
    throw InputError(where + ": link type " + (name ? name : std::to_string(dlt)) +
                     " is not supported (Ethernet, loopback, Linux cooked, raw IP are)");
  }
  const std::string filter = filter_expr(o);
  set_filter(pcap.get(), filter, where);

  // Packet times are CLOCK_REALTIME; the trace's are CLOCK_MONOTONIC. The
  // offset measured here goes into the trace header and converts every packet.
  const Nanos mono0 = now_ns();
  const Nanos rt0 = realtime_now();
  const Nanos mono1 = now_ns();
  Nanos offset = rt0 - (mono0 + (mono1 - mono0) / 2);
  trace::WriterOptions wo;
  // A file's first packet: its time becomes the trace's start, so that the
  // header's offset maps every record back to the packet's wall-clock time.
  pcap_pkthdr first_hdr{};
  std::vector<uint8_t> first_frame;
  if (!live) {
    pcap_pkthdr* h = nullptr;
    const u_char* data = nullptr;
    int rc = pcap_next_ex(pcap.get(), &h, &data);
    if (rc == PCAP_ERROR) throw InputError(where + ": " + pcap_geterr(pcap.get()));
    if (rc == 1) {
      first_hdr = *h;
      first_frame.assign(data, data + h->caplen);
      Nanos first_rt = static_cast<Nanos>(h->ts.tv_sec) * 1'000'000'000 +
                       static_cast<Nanos>(h->ts.tv_usec) * (nano ? 1 : 1000);
      offset = first_rt - mono0;
      wo.start_mono_ns = mono0;
    }
  }
  wo.realtime_offset_ns = offset;
  wo.compression_level = o.compression_level;
  auto writer = trace::open_writer(o.out, wo);

  SniffSummary sum;
  if (live) sum.buffer_bytes = o.buffer_bytes;
  TraceSink sink(*writer, log, o.out);
  {
    auto meta = [&](std::string_view k, std::string_view v) {
      sink.record(trace::Record{now_ns(), 0, trace::Meta{k, v}});
    };
    meta("capture", "sniff");
    meta("time_source", live ? "kernel" : "pcap");
    if (live) meta("interface", o.interface);
    else meta("pcap_file", o.pcap_file);
    meta("server_port", std::to_string(o.port));
    if (!o.host.empty()) meta("server_host", o.host);
    const char* lname = pcap_datalink_val_to_name(dlt);
    meta("link_type", lname ? lname : std::to_string(dlt));
    for (const auto& [k, v] : o.meta) meta(k, v);
  }

  BufferBudget decoder_budget(o.decoder_memory);  // outlives the decoders in `sessions`
  WireLimits limits;
  limits.budget = &decoder_budget;
  Sessions sessions(o.max_connections, sink, std::move(map), log, sum, limits);
  Reassembler::Options ro;
  ro.server_port = o.port;
  ro.max_connections = o.max_connections;
  ro.buffer_bytes = o.reassembly_bytes;
  ro.max_buffered_per_dir = std::max<size_t>(o.reassembly_bytes / 64, 256 * 1024);
  ro.hole_timeout_ns = static_cast<Nanos>(o.hole_timeout_s * 1e9);
  Reassembler reasm(ro, &sessions);

  Run run;
  run.reasm = &reasm;
  run.sum = &sum;
  run.dlt = dlt;
  run.nano = nano;
  run.offset = offset;

  g_stop.store(false);
  g_pcap.store(pcap.get());
  const Nanos start_mono = now_ns();
  const Nanos deadline =
      o.duration_s > 0 ? start_mono + static_cast<Nanos>(o.duration_s * 1e9) : 0;
  if (live)
    log << "capturing on " << o.interface << ", filter '" << filter
        << "', writing " << o.out << std::endl;

  uint64_t drops_recorded = 0;
  auto record_drops = [&](Nanos ts) {
    pcap_stat ps{};
    if (!live || pcap_stats(pcap.get(), &ps) != 0) return;
    sum.kernel_drops = ps.ps_drop;
    sum.if_drops = ps.ps_ifdrop;
    uint64_t total = static_cast<uint64_t>(ps.ps_drop) + ps.ps_ifdrop;
    if (total > drops_recorded) {
      sink.record(trace::Record{ts, 0, trace::Loss{trace::LossKind::PacketDrop,
                                                    total - drops_recorded}});
      drops_recorded = total;
    }
  };

  Nanos last_housekeeping = start_mono;
  Nanos drain_until = 0;
  if (!first_frame.empty())
    on_packet(reinterpret_cast<u_char*>(&run), &first_hdr, first_frame.data());
  // Live: non-blocking reads driven by poll() with a short timeout, so that
  // --duration, signals and hole timeouts are served while no packet arrives
  // (libpcap's TPACKET_V3 reads would otherwise block until a block is full).
  int fd = -1;
  char errbuf[PCAP_ERRBUF_SIZE] = {};
  if (live) {
    if (pcap_setnonblock(pcap.get(), 1, errbuf) != 0)
      throw RuntimeError(where + ": non-blocking mode: " + errbuf);
    fd = pcap_get_selectable_fd(pcap.get());
    // The ring holds seconds of traffic: reading it a few milliseconds late
    // costs nothing, while waking onto a CPU a backend or client is using
    // would slow the transaction the capture is watching.
    run_as_batch_thread();
  }
  for (;;) {
    if (live) {
      pollfd pfd{fd, POLLIN, 0};
      int pr = poll(&pfd, 1, 100);
      if (pr < 0 && errno != EINTR) throw RuntimeError(errno_message(where + ": poll", errno));
    }
    // Live: whatever the ring holds; a file: a batch at a time, so that
    // stream holes time out in packet time as the file goes by.
    int n = pcap_dispatch(pcap.get(), live ? -1 : 4096, on_packet,
                          reinterpret_cast<u_char*>(&run));
    if (n == PCAP_ERROR) {
      std::string msg = where + ": " + pcap_geterr(pcap.get());
      if (live) throw RuntimeError(msg);
      // A file cut short (tcpdump killed): keep everything before the cut.
      log << "tierlab capture sniff: warning: " << msg << "; stopped after " << sum.packets
          << " packets\n";
      break;
    }
    if (o.live_packets) o.live_packets->store(sum.packets, std::memory_order_relaxed);
    if (o.live_bytes) o.live_bytes->store(sum.bytes, std::memory_order_relaxed);
    if (!live && n == 0) break;  // end of file
    if (!live && g_stop.load()) break;
    if (live) {
      Nanos now = now_ns();
      reasm.advance(now);  // holes time out even when their stream is idle
      // Stopping: packets already captured sit in ring blocks the kernel
      // hands over only when they fill or time out (100 ms): drain them.
      if (!drain_until && (g_stop.load() || (deadline && now >= deadline)))
        drain_until = now + 300'000'000;
      if (drain_until && now >= drain_until) break;
      if (now - last_housekeeping >= 1'000'000'000) {
        last_housekeeping = now;
        record_drops(now);
        sink.flush(now);
      }
    } else if (run.last_rt) {
      reasm.advance(run.last_rt - offset);
    }
  }
  Nanos end_ts = live ? now_ns() : (run.last_rt ? run.last_rt - offset : 0);
  record_drops(end_ts);
  reasm.finish(end_ts);
  g_pcap.store(nullptr);

  const ReassemblyStats& rs = reasm.stats();
  sum.tcp_payload = rs.payload_bytes;
  sum.gaps = rs.gaps;
  sum.gap_bytes = rs.gap_bytes;
  sum.out_of_order = rs.out_of_order;
  sum.retransmitted = rs.retransmitted;
  sum.evicted = rs.evicted;
  sum.held_per_connection_full = rs.held_per_dir_full;
  sum.held_pool_full = rs.held_pool_full;
  sum.decoder_refused = decoder_budget.refused.load(std::memory_order_relaxed);
  sum.seconds = live ? static_cast<double>(end_ts - start_mono) / 1e9
                     : static_cast<double>(run.last_rt - run.first_rt) / 1e9;
  sink.close(sum, live ? start_mono : run.first_rt - offset, end_ts);
  return sum;
}

void print_summary(const SniffSummary& s, bool live, std::ostream& out) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "packets: %" PRIu64 " (%.1f MB) in %.3f s%s\n", s.packets,
                static_cast<double>(s.bytes) / 1e6, s.seconds, live ? "" : " of packet time");
  out << buf;
  if (live) {
    std::snprintf(buf, sizeof buf, "kernel drops: %" PRIu64 ", interface drops: %" PRIu64 "\n",
                  s.kernel_drops, s.if_drops);
    out << buf << drop_advice(s);
  }
  std::snprintf(buf, sizeof buf,
                "sessions: %" PRIu64 " (%" PRIu64 " joined mid-stream)\n"
                "statements: %" PRIu64 ", transactions: %" PRIu64 ", errors: %" PRIu64 "\n"
                "stream gaps: %" PRIu64 " (%" PRIu64 " bytes), out of order: %" PRIu64
                ", retransmitted: %" PRIu64 "\n",
                s.sessions, s.joined, s.statements, s.transactions, s.errors, s.gaps, s.gap_bytes,
                s.out_of_order, s.retransmitted);
  out << buf;
  if (s.tls_sessions)
    out << s.tls_sessions << " sessions encrypted (TLS/GSS), not decodable\n";
  if (s.decode_failures)
    out << s.decode_failures << " sessions stopped decoding (malformed stream)\n";
  if (s.fragments || s.malformed) {
    std::snprintf(buf, sizeof buf, "IP fragments: %" PRIu64 ", malformed frames: %" PRIu64 "\n",
                  s.fragments, s.malformed);
    out << buf;
  }
  if (s.decoder_refused)
    out << "caps reached: decoder memory full: " << s.decoder_refused
        << " messages not reassembled, stream gaps in the trace\n";
  if (s.evicted || s.held_per_connection_full || s.held_pool_full) {
    std::snprintf(buf, sizeof buf,
                  "caps reached: connections evicted: %" PRIu64 " (--max-connections), reassembly buffer full: %" PRIu64
                  " per connection, %" PRIu64 " in all (--reassembly-buffer); their holes became stream gaps\n",
                  s.evicted, s.held_per_connection_full, s.held_pool_full);
    out << buf;
  }
  out << "records written: " << s.records << "\n";
  if (!s.recording_error.empty()) {
    std::snprintf(buf, sizeof buf, "recording stopped after %.1f s: ", s.recording_stopped_s);
    out << buf << s.recording_error << "\n";
    out << "not recorded: " << s.lost_records
        << " records (the chunk being written and every one after); the trace ends there, without its end record\n";
  }
}

std::string drop_advice(const SniffSummary& s) {
  if (s.kernel_drops == 0) return {};
  return "the capture ring (" + format_bytes(static_cast<double>(s.buffer_bytes)) +
         ") overflowed: the sessions those packets belonged to have stream gaps; "
         "capture with a larger --buffer-size\n";
}

}  // namespace tierlab::capture
