// fio iolog v2/v3 importer and v3 exporter.
#include "capture/import.h"
#include "capture/import_text.h"

#include "common/error.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::capture {
namespace {

using import_text::bad;
using import_text::split_ws;

constexpr std::string_view kV2 = "fio version 2 iolog";
constexpr std::string_view kV3 = "fio version 3 iolog";

uint64_t parse_u64(std::string_view s, const std::string& name, uint64_t line, const char* what) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size())
    bad(name, line, std::string(what) + " '" + std::string(s) + "' is not a number");
  return v;
}

struct FioAction {
  trace::IoOp op;
  uint8_t flags;
};

bool io_action(std::string_view act, FioAction& out) {
  if (act == "read") out = {trace::IoOp::Read, 0};
  else if (act == "write") out = {trace::IoOp::Write, 0};
  else if (act == "trim") out = {trace::IoOp::Discard, 0};
  else if (act == "sync") out = {trace::IoOp::Flush, trace::kIoMeta};
  else if (act == "datasync") out = {trace::IoOp::Flush, 0};
  else return false;
  return true;
}

const char* fio_action_name(trace::IoOp op, uint8_t flags) {
  switch (op) {
    case trace::IoOp::Read: return "read";
    case trace::IoOp::Write: return "write";
    case trace::IoOp::Discard: return "trim";
    default: return (flags & trace::kIoMeta) ? "sync" : "datasync";
  }
}

}  // namespace

ImportStats import_fio_iolog(std::istream& in, const std::string& name, trace::Writer& out) {
  ImportStats st;
  std::string line;
  if (!std::getline(in, line)) bad(name, 1, "empty file, expected \"fio version 2 iolog\" or \"fio version 3 iolog\"");
  st.lines = 1;
  std::string_view head = line;
  while (!head.empty() && (head.back() == '\r' || head.back() == ' ')) head.remove_suffix(1);
  // fio compares only the start of the line; tierlab's exports put a
  // comment after the version ("fio version 3 iolog  # ...").
  auto is = [&](std::string_view v) {
    return head.substr(0, v.size()) == v && (head.size() == v.size() || head[v.size()] == ' ' || head[v.size()] == '\t');
  };
  if (is(kV2)) st.version = 2;
  else if (is(kV3)) st.version = 3;
  else bad(name, 1, "not a fio iolog version 2 or 3 (first line is \"" + std::string(head) + "\")");
  out.write(0, 0, trace::Meta{"fio.iolog.version", st.version == 2 ? "2" : "3"});

  std::unordered_map<std::string, uint32_t> files;
  auto file_index = [&](std::string_view fname, trace::Nanos ts) {
    auto it = files.find(std::string(fname));
    if (it != files.end()) return it->second;
    uint32_t idx = uint32_t(files.size());
    files.emplace(std::string(fname), idx);
    std::string key = "fio.file." + std::to_string(idx);
    out.write(ts, 0, trace::Meta{key, fname});
    return idx;
  };

  trace::Nanos clock_ns = 0;  // v2: advanced by wait lines
  uint64_t ln = 1;
  while (std::getline(in, line)) {
    ++ln;
    ++st.lines;
    auto tok = split_ws(line);
    if (tok.empty()) continue;
    trace::Nanos ts = clock_ns;
    size_t base = 0;
    if (st.version == 3) {
      uint64_t us = parse_u64(tok[0], name, ln, "timestamp");
      if (us > static_cast<uint64_t>(INT64_MAX / 1000))
        bad(name, ln, "timestamp '" + std::string(tok[0]) + "' is too large (microseconds past 2^63 ns)");
      ts = trace::Nanos(us) * 1000;
      base = 1;
    }
    size_t n = tok.size() - base;
    if (n != 2 && n != 4)
      bad(name, ln,
          st.version == 3 ? "expected \"TIME FILE ACTION [OFFSET LENGTH]\""
                          : "expected \"FILE ACTION [OFFSET LENGTH]\"");
    std::string_view fname = tok[base], act = tok[base + 1];
    if (n == 2) {
      if (act != "add" && act != "open" && act != "close")
        bad(name, ln, "unknown file action '" + std::string(act) + "' (add, open or close)");
      file_index(fname, ts);
      std::string key = "fio.file." + std::string(act);
      out.write(ts, 0, trace::Meta{key, fname});
      ++st.file_actions;
      continue;
    }
    uint64_t off = parse_u64(tok[base + 2], name, ln, "offset");
    uint64_t len = parse_u64(tok[base + 3], name, ln, "length");
    if (act == "wait") {
      if (st.version == 3) bad(name, ln, "'wait' is not allowed in a version 3 iolog");
      if (off > static_cast<uint64_t>(INT64_MAX / 1'000'000))
        bad(name, ln, "wait '" + std::string(tok[base + 2]) + "' is too large (milliseconds past 2^63 ns)");
      clock_ns = trace::Nanos(off) * 1'000'000;  // fio: milliseconds since the start
      continue;
    }
    FioAction a;
    if (!io_action(act, a))
      bad(name, ln, "unknown I/O action '" + std::string(act) + "' (read, write, trim, sync, datasync, wait)");
    if (len > UINT32_MAX) bad(name, ln, "length " + std::to_string(len) + " is too large");
    trace::BlockIo b;
    b.complete_ns = ts;
    b.device = file_index(fname, ts);
    b.offset = off;
    b.length = uint32_t(len);
    b.op = a.op;
    b.flags = uint8_t(a.flags | trace::kIoIncomplete);
    out.write(ts, 0, b);
    ++st.ios;
  }
  return st;
}

namespace {

// /dev/NAME of a block device from sysfs, or /dev/block/MAJ:MIN.
std::string device_node(uint32_t dev) {
  unsigned maj = dev >> 20, min = dev & ((1u << 20) - 1);
  std::string mm = std::to_string(maj) + ":" + std::to_string(min);
  std::ifstream ue("/sys/dev/block/" + mm + "/uevent");
  std::string l;
  while (std::getline(ue, l))
    if (l.rfind("DEVNAME=", 0) == 0) return "/dev/" + l.substr(8);
  return "/dev/block/" + mm;
}

struct Line {
  trace::Nanos ts;
  uint64_t seq;
  std::string text;
};

}  // namespace

FioExportStats write_fio_iolog_v3(trace::Reader& in, std::ostream& out, const FioExportOptions& opts) {
  out << kV3;
  if (!opts.comment.empty()) out << "  # " << opts.comment;
  out << '\n';
  FioExportStats st;
  trace::Record rec;
  bool first = true, imported = false;
  // An imported iolog comes out as it went in, unless renamed or filtered.
  const bool verbatim = opts.filename.empty() && opts.trims;
  char buf[64];
  auto us = [&](trace::Nanos ts) {
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, uint64_t(ts < 0 ? 0 : ts / 1000));
    (void)ec;
    return std::string_view(buf, size_t(p - buf));
  };

  std::map<uint32_t, std::string> names;  // fio.file.N
  std::map<uint32_t, bool> seen;          // devices whose name is in st.sources
  // Captured traces: lines collected, then sorted by time.
  std::vector<Line> lines;
  std::map<uint32_t, bool> opened;
  trace::Nanos base = 0, last = 0;
  uint64_t seq = 0;

  while (in.next(rec)) {
    if (auto* m = std::get_if<trace::Meta>(&rec.body)) {
      if (first && m->key == "fio.iolog.version") imported = true;
      first = false;
      if (m->key.substr(0, 9) == "fio.file.") {
        std::string_view rest = m->key.substr(9);
        if (rest == "add" || rest == "open" || rest == "close") {
          if (imported && verbatim) out << us(rec.ts) << ' ' << m->value << ' ' << rest << '\n';
        } else {
          uint32_t idx = 0;
          auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
          if (ec == std::errc() && p == rest.data() + rest.size()) names[idx] = std::string(m->value);
        }
      }
      continue;
    }
    auto* b = std::get_if<trace::BlockIo>(&rec.body);
    if (!b) {
      first = false;
      continue;
    }
    if (b->op == trace::IoOp::Discard && !opts.trims) {
      ++st.trims_dropped;
      continue;
    }
    const bool flush = b->op == trace::IoOp::Flush;
    if (flush) ++st.syncs;
    else st.end = std::max(st.end, b->offset + b->length);
    auto it = names.find(b->device);
    if (it == names.end())
      it = names.emplace(b->device, imported ? "file" + std::to_string(b->device) : device_node(b->device)).first;
    if (!seen[b->device]) {
      seen[b->device] = true;
      st.sources.push_back(it->second);
    }
    const std::string& name = opts.filename.empty() ? it->second : opts.filename;
    const char* act = fio_action_name(b->op, b->flags);
    ++st.ios;
    if (imported && verbatim) {
      out << us(rec.ts) << ' ' << name << ' ' << act << ' ' << b->offset << ' ' << b->length << '\n';
      continue;
    }
    if (st.ios == 1 || rec.ts < base) base = rec.ts;
    first = false;
    if (rec.ts > last) last = rec.ts;
    std::ostringstream l;
    l << ' ' << name << ' ' << act << ' ';
    if (flush) l << "0 0";
    else l << b->offset << ' ' << b->length;
    uint32_t key = opts.filename.empty() ? b->device : 0;  // one file when renamed
    if (!opened[key]) {
      opened[key] = true;
      // Placed before every I/O by time -1 and sequence order.
      lines.push_back(Line{INT64_MIN, seq++, ' ' + name + " add"});
      lines.push_back(Line{INT64_MIN, seq++, ' ' + name + " open"});
    }
    lines.push_back(Line{rec.ts, seq++, l.str()});
  }
  if (!(imported && verbatim)) {
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.seq < b.seq;
    });
    for (auto& l : lines) out << us(l.ts == INT64_MIN ? 0 : l.ts - base) << l.text << '\n';
    for (auto& [dev, o] : opened) {
      (void)o;
      const std::string& name = opts.filename.empty() ? names[dev] : opts.filename;
      out << us(last - base) << ' ' << name << " close\n";
    }
  }
  return st;
}

}  // namespace tierlab::capture
