// The server-log readers (capture/log.h: stderr with a log_line_prefix,
// csvlog, jsonlog, pgreplay replay files): input either reads or throws
// InputError; what LogCapture writes reads back as a trace in which every
// session begins once before its other records and ends once after them,
// and whose counts of sessions, queries, executions and errors are the
// ones LogStats reports.
//
// Input: one control byte, then (when it asks for a prefix of its own) the
// log_line_prefix up to the first '\n', then the log. Control bits:
//   0-2  format: Auto (named .log), Stderr, Csv, Json, Pgreplay, Auto named
//        .csv, Auto named .json, Stderr with the prefix from the input;
//   3-4  for Stderr: no prefix (recognised), or one of kPrefixes;
//   5    --database db1 --user bob (only with a prefix giving both, or none);
//   6    a --begin/--end window;
//   7    the log read as two files (rotated), split at the next byte's share.
#include "fuzz.h"

#include "capture/log.h"
#include "trace/reader.h"

#include <map>
#include <memory>

using namespace tierlab;

namespace {

constexpr const char* kPrefixes[] = {"%m [%p] %e %c ", "%m [%-6p] %q%10u@%d ",
                                     "%t:%r:%u@%d:[%p]:%a|%h|%l|%s|%v|%x|%n|%Q "};

struct Counts {
  uint64_t sessions = 0, queries = 0, executes = 0, errors = 0;
};

// Reads the trace back and checks each session's records lie between its
// one SessionBegin and its one SessionEnd.
Counts read_back(const std::vector<uint8_t>& bytes) {
  Counts c;
  enum class State { Open, Ended };
  std::map<uint64_t, State> sessions;
  trace::Reader r(trace::memory_source(bytes, "log.tlt"));
  trace::Record rec;
  while (r.next(rec)) {
    const trace::Kind k = rec.kind();
    if (k == trace::Kind::Meta) continue;
    auto it = sessions.find(rec.session);
    if (k == trace::Kind::SessionBegin) {
      fuzz::check(it == sessions.end(), "a session begins once", fuzz::dump(rec));
      sessions.emplace(rec.session, State::Open);
      ++c.sessions;
      continue;
    }
    fuzz::check(it != sessions.end(), "a session's records follow its begin", fuzz::dump(rec));
    fuzz::check(it->second == State::Open, "no record after a session's end", fuzz::dump(rec));
    if (k == trace::Kind::SessionEnd) it->second = State::Ended;
    else if (k == trace::Kind::Query) ++c.queries;
    else if (k == trace::Kind::Execute) ++c.executes;
    else if (k == trace::Kind::Error) ++c.errors;
  }
  for (const auto& [id, state] : sessions)
    fuzz::check(state == State::Ended, "every session ends", "session " + std::to_string(id));
  fuzz::check(r.stats().terminated, "the trace has its end record");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t ctl = in.u8();
  const uint8_t split = (ctl & 0x80) ? in.u8() : 0;
  capture::LogOptions o;
  capture::LogFormat format = capture::LogFormat::Auto;
  std::string name = "pg.log";
  switch (ctl & 7) {
    case 0: break;
    case 1: format = capture::LogFormat::Stderr; break;
    case 2: format = capture::LogFormat::Csv; break;
    case 3: format = capture::LogFormat::Json; break;
    case 4: format = capture::LogFormat::Pgreplay; break;
    case 5: name = "pg.csv"; break;
    case 6: name = "pg.json"; break;
    case 7: {
      format = capture::LogFormat::Stderr;
      std::string_view rest(reinterpret_cast<const char*>(data) + (size - in.left()), in.left());
      size_t nl = rest.find('\n');
      if (nl == std::string_view::npos || nl > 64) return 0;
      o.prefix = std::string(in.take(nl));
      in.take(1);
      break;
    }
  }
  if ((ctl & 7) != 7 && ((ctl >> 3) & 3) != 0) o.prefix = kPrefixes[((ctl >> 3) & 3) - 1];
  if (ctl & 0x20) o.database = "db1", o.user = "bob";
  if (ctl & 0x40) {
    o.begin = capture::parse_log_time("2026-12-03 10:00:00.002 UTC");
    o.end = capture::parse_log_time("2026-12-03 10:48:06.238 UTC");
  }
  const std::string text(in.rest());
  (void)capture::parse_log_time(std::string_view(text).substr(0, 40));

  std::unique_ptr<trace::Writer> w;
  trace::MemorySink* mem = nullptr;
  int opened = 0;
  capture::LogStats st;
  try {
    capture::LogCapture cap(o, [&](int64_t start) -> trace::Writer& {
      ++opened;
      auto sink = std::make_unique<trace::MemorySink>();
      mem = sink.get();
      trace::WriterOptions wo;
      wo.start_mono_ns = 0;
      wo.realtime_offset_ns = start;
      w = std::make_unique<trace::Writer>(std::move(sink), wo);
      return *w;
    });
    if (ctl & 0x80) {
      const size_t at = text.size() * split / 256;
      cap.read_text(text.substr(0, at), name, format);
      cap.read_text(text.substr(at), name, format);
    } else {
      cap.read_text(text, name, format);
    }
    st = cap.finish();
  } catch (const InputError&) {
    return 0;  // bad input: `capture log` keeps no trace of it
  }
  fuzz::check(opened == 1, "the writer is opened once", std::to_string(opened));
  w->close();
  Counts c;
  try {
    c = read_back(mem->bytes());
  } catch (const InputError& e) {
    fuzz::fail("the trace written does not read back", e.what());
  }
  auto same = [](const char* what, uint64_t records, uint64_t stat) {
    fuzz::check(records == stat, what, std::to_string(records) + " records, " + std::to_string(stat) + " counted");
  };
  same("one SessionBegin per session counted", c.sessions, st.sessions);
  same("one Query per query counted", c.queries, st.queries);
  same("one Execute per execution counted", c.executes, st.executes);
  same("one Error per error counted", c.errors, st.errors);
  fuzz::check(st.files == ((ctl & 0x80) ? 2u : 1u), "every file counted", std::to_string(st.files));
  return 0;
}
