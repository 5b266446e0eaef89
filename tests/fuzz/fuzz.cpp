#include "fuzz.h"

#include "trace/crc32c.h"

#include <sstream>
#include <type_traits>

namespace tierlab::fuzz {
namespace {

void put(std::ostream& o, std::string_view s) { o << s.size() << ':' << s << ' '; }

struct Dumper {
  std::ostream& o;
  void operator()(const trace::SessionBegin& b) {
    put(o, b.user); put(o, b.database); put(o, b.application_name); put(o, b.client_addr);
    o << b.backend_pid << ' ' << b.flags;
  }
  void operator()(const trace::SessionEnd& b) { o << int(b.reason); }
  void operator()(const trace::Query& b) { put(o, b.sql); }
  void operator()(const trace::Parse& b) {
    put(o, b.statement); put(o, b.sql);
    for (uint32_t t : b.param_types) o << t << ',';
  }
  void operator()(const trace::Bind& b) {
    put(o, b.portal); put(o, b.statement);
    for (const auto& p : b.params) {
      o << p.format << '/' << p.is_null << '/';
      put(o, p.value);
    }
    o << '|';
    for (int16_t f : b.result_formats) o << f << ',';
  }
  void operator()(const trace::Execute& b) { put(o, b.portal); o << b.max_rows; }
  void operator()(const trace::Describe& b) { o << int(b.target) << ' '; put(o, b.name); }
  void operator()(const trace::Close& b) { o << int(b.target) << ' '; put(o, b.name); }
  void operator()(const trace::Sync&) {}
  void operator()(const trace::Flush&) {}
  void operator()(const trace::CopyData& b) { o << int(b.dir) << ' '; put(o, b.data); }
  void operator()(const trace::CopyDone& b) { o << int(b.dir); }
  void operator()(const trace::CopyFail& b) { put(o, b.message); }
  void operator()(const trace::Result& b) { put(o, b.tag); o << b.has_rows << ' ' << b.rows; }
  void operator()(const trace::Error& b) { put(o, b.sqlstate); put(o, b.severity); put(o, b.message); }
  void operator()(const trace::Ready& b) { o << int(b.status); }
  void operator()(const trace::Suspended&) {}
  void operator()(const trace::EmptyQuery&) {}
  void operator()(const trace::BlockIo& b) {
    o << b.complete_ns << ' ' << b.device << ' ' << b.offset << ' ' << b.length << ' '
      << int(b.op) << ' ' << int(b.flags) << ' ' << b.pid;
  }
  void operator()(const trace::FileIo& b) {
    o << b.pid << ' ';
    put(o, b.file);
    o << b.offset << ' ' << b.length << ' ' << int(b.op) << ' ' << int(b.flags) << ' ' << b.latency_ns;
  }
  void operator()(const trace::Sample& b) {
    put(o, b.name);
    uint64_t bits;  // NaN compares by its bits
    std::memcpy(&bits, &b.value, 8);
    o << bits;
  }
  void operator()(const trace::Meta& b) { put(o, b.key); put(o, b.value); }
  void operator()(const trace::Loss& b) { o << int(b.what) << ' ' << b.count; }
};

void le(std::vector<uint8_t>& v, uint64_t x, int n) {
  for (int i = 0; i < n; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
}
void set32(uint8_t* p, uint32_t x) { std::memcpy(p, &x, 4); }

}  // namespace

std::string dump(const trace::Record& r) {
  std::ostringstream o;
  o << r.ts << ' ' << r.session << ' ' << int(r.kind()) << ' ';
  std::visit(Dumper{o}, r.body);
  return o.str();
}

std::vector<uint8_t> trace_with_chunk(std::string_view payload, uint32_t records, bool end) {
  static const uint8_t magic[8] = {0x89, 'T', 'L', 'T', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> v(magic, magic + 8);
  le(v, 1, 2);   // major
  le(v, 1, 2);   // minor
  le(v, 36, 4);  // header length
  le(v, 0, 8);   // start_mono_ns
  le(v, 0, 8);   // realtime_offset_ns
  le(v, trace::crc32c(0, v.data(), v.size()), 4);
  size_t h = v.size();
  le(v, 0x4b434c54, 4);     // chunk magic
  le(v, end ? 2 : 0, 4);    // flags: raw, maybe the last
  le(v, payload.size(), 4);  // stored
  le(v, payload.size(), 4);  // raw
  le(v, records, 4);
  le(v, 0, 4);
  le(v, 0, 8);  // first_ts
  le(v, 0, 4);  // payload crc
  le(v, 0, 4);  // header crc
  uint32_t pcrc = trace::crc32c(trace::crc32c(0, v.data() + h, 32), payload.data(), payload.size());
  set32(v.data() + h + 32, pcrc);
  set32(v.data() + h + 36, trace::crc32c(0, v.data() + h, 36));
  v.insert(v.end(), payload.begin(), payload.end());
  return v;
}

}  // namespace tierlab::fuzz
