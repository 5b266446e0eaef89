// blkparse default text output importer.
//
// Lines look like (blkparse's "%D %2c %8s %5T.%9t %5p %2a %3d " header and
// the action's payload):
//   8,0    3       11     0.009507758   697  Q   W 223490 + 8 [kjournald]
//   8,0    3       14     0.009520542   697  D   W 223490 + 8 [kjournald]
//   8,0    1       15     0.010100213     0  C   W 223490 + 8 [0]
// D (issued to the driver) and C (completed) are paired by device and
// sector; flushes without a sector are paired first in, first out. Q gives
// the submitting pid when it precedes the D. Other actions are skipped; the
// per-CPU summary blkparse prints at the end stops the import.
#include "capture/import.h"
#include "capture/import_text.h"

#include "common/error.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <deque>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::capture {
namespace {

using import_text::bad;
using import_text::split_ws;

template <class T>
bool num(std::string_view s, T& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

// "12.000157890" -> nanoseconds, exactly.
bool parse_time(std::string_view s, trace::Nanos& out) {
  size_t dot = s.find('.');
  uint64_t sec = 0, frac = 0;
  // Seconds whose nanoseconds (plus a fraction) fit in Nanos.
  constexpr uint64_t kMaxSec = INT64_MAX / 1'000'000'000 - 1;
  if (dot == std::string_view::npos) {
    if (!num(s, sec) || sec > kMaxSec) return false;
    out = trace::Nanos(sec) * 1'000'000'000;
    return true;
  }
  std::string_view f = s.substr(dot + 1);
  if (f.empty() || f.size() > 9 || !num(s.substr(0, dot), sec) || !num(f, frac) || sec > kMaxSec)
    return false;
  for (size_t i = f.size(); i < 9; ++i) frac *= 10;
  out = trace::Nanos(sec) * 1'000'000'000 + trace::Nanos(frac);
  return true;
}

struct Rwbs {
  trace::IoOp op = trace::IoOp::Read;
  uint8_t flags = 0;
  bool usable = true;
};

// blk_fill_rwbs: optional leading F (preflush), then W/R/D/N/E, then F (FUA),
// A (readahead), S (sync), M (meta).
bool parse_rwbs(std::string_view s, Rwbs& r) {
  if (s.empty()) return false;
  size_t i = 0;
  bool preflush = false;
  if (s[0] == 'F') {
    preflush = true;
    ++i;
  }
  if (i >= s.size()) {
    r.op = trace::IoOp::Flush;
    return true;
  }
  switch (s[i]) {
    case 'W': r.op = trace::IoOp::Write; break;
    case 'R': r.op = trace::IoOp::Read; break;
    case 'D': case 'E': r.op = trace::IoOp::Discard; break;
    case 'N':
      r.op = trace::IoOp::Flush;
      r.usable = preflush;
      break;
    default: return false;
  }
  for (++i; i < s.size(); ++i) {
    switch (s[i]) {
      case 'F': r.flags |= trace::kIoFua; break;
      case 'S': r.flags |= trace::kIoSync; break;
      case 'M': r.flags |= trace::kIoMeta; break;
      case 'A': break;
      default: return false;
    }
  }
  return true;
}

struct Pending {
  trace::Nanos issue = 0;
  uint32_t length = 0;
  trace::IoOp op = trace::IoOp::Read;
  uint8_t flags = 0;
  int32_t pid = 0;
};

struct Out {
  trace::Nanos ts;
  trace::BlockIo io;
};

}  // namespace

ImportStats import_blkparse(std::istream& in, const std::string& name, trace::Writer& out) {
  ImportStats st;
  // (dev, sector) -> issued request; flushes per device in FIFO order.
  std::map<std::pair<uint32_t, uint64_t>, Pending> issued;
  std::map<std::pair<uint32_t, uint64_t>, int32_t> queued_pid;
  std::map<uint32_t, std::deque<Pending>> flushes;
  std::vector<Out> done;

  std::string line;
  uint64_t ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    ++st.lines;
    auto tok = split_ws(line);
    if (tok.empty()) continue;
    std::string_view d = tok[0];
    size_t comma = d.find(',');
    uint32_t maj = 0, min = 0;
    if (comma == std::string_view::npos || !num(d.substr(0, comma), maj) ||
        !num(d.substr(comma + 1), min)) {
      // blkparse's closing summary ("CPU0 (8,0):", "Total (8,0):") ends the events.
      if (d.rfind("CPU", 0) == 0 || d == "Total" || d == "Throughput" || d == "Events") break;
      bad(name, ln, "expected \"MAJ,MIN CPU SEQ TIME PID ACTION RWBS ...\", got \"" +
                        std::string(d) + "\"");
    }
    if (tok.size() < 7) bad(name, ln, "event line has " + std::to_string(tok.size()) + " fields, expected at least 7");
    uint32_t dev = (maj << 20) | min;
    trace::Nanos ts;
    if (!parse_time(tok[3], ts)) bad(name, ln, "bad time '" + std::string(tok[3]) + "'");
    int32_t pid = 0;
    if (!num(tok[4], pid)) bad(name, ln, "bad pid '" + std::string(tok[4]) + "'");
    std::string_view action = tok[5];
    if (action != "Q" && action != "D" && action != "C") continue;
    Rwbs rw;
    if (!parse_rwbs(tok[6], rw)) bad(name, ln, "bad RWBS '" + std::string(tok[6]) + "'");
    // Payload: [SECTOR [+ NSECT]] [(ELAPSED)] [COMM|ERROR]
    bool has_sector = false;
    uint64_t sector = 0, nsect = 0;
    size_t k = 7;
    if (k < tok.size() && tok[k][0] != '[' && tok[k][0] != '(') {
      if (!num(tok[k], sector)) bad(name, ln, "bad sector '" + std::string(tok[k]) + "'");
      has_sector = true;
      ++k;
      if (k < tok.size() && tok[k] == "+") {
        if (k + 1 >= tok.size() || !num(tok[k + 1], nsect))
          bad(name, ln, "expected a sector count after '+'");
        k += 2;
      }
    }
    if (action == "Q") {
      if (has_sector) queued_pid[{dev, sector}] = pid;
      continue;
    }
    if (!rw.usable) continue;
    bool is_flush = rw.op == trace::IoOp::Flush || (!has_sector && nsect == 0);
    if (action == "D") {
      Pending p{ts, uint32_t(nsect * 512), rw.op, rw.flags, pid};
      if (is_flush) {
        p.op = trace::IoOp::Flush;
        flushes[dev].push_back(p);
        continue;
      }
      auto q = queued_pid.find({dev, sector});
      if (q != queued_pid.end()) {
        p.pid = q->second;
        queued_pid.erase(q);
      }
      auto [it, fresh] = issued.insert({{dev, sector}, p});
      if (!fresh) {  // re-issued before a completion was seen: keep the first
        ++st.incomplete;
        done.push_back(Out{it->second.issue, trace::BlockIo{it->second.issue, dev, sector * 512,
                                                           it->second.length, it->second.op,
                                                           uint8_t(it->second.flags | trace::kIoIncomplete),
                                                           it->second.pid}});
        it->second = p;
      }
      continue;
    }
    // C
    Pending p;
    if (is_flush) {
      auto& fq = flushes[dev];
      if (fq.empty()) {
        ++st.orphans;
        continue;
      }
      p = fq.front();
      fq.pop_front();
      sector = 0;
    } else {
      auto it = issued.find({dev, sector});
      if (it == issued.end()) {
        ++st.orphans;
        continue;
      }
      p = it->second;
      issued.erase(it);
    }
    done.push_back(Out{p.issue, trace::BlockIo{ts, dev, sector * 512, p.length, p.op, p.flags, p.pid}});
  }
  for (auto& [key, p] : issued) {
    ++st.incomplete;
    done.push_back(Out{p.issue, trace::BlockIo{p.issue, key.first, key.second * 512, p.length, p.op,
                                               uint8_t(p.flags | trace::kIoIncomplete), p.pid}});
  }
  for (auto& [dev, fq] : flushes)
    for (auto& p : fq) {
      ++st.incomplete;
      done.push_back(Out{p.issue, trace::BlockIo{p.issue, dev, 0, 0, trace::IoOp::Flush,
                                                 uint8_t(p.flags | trace::kIoIncomplete), p.pid}});
    }
  std::stable_sort(done.begin(), done.end(), [](const Out& a, const Out& b) { return a.ts < b.ts; });
  for (auto& o : done) out.write(o.ts, 0, o.io);
  st.ios = done.size();
  return st;
}

}  // namespace tierlab::capture
