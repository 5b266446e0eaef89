#include "iosim/engine.h"

#include <algorithm>

namespace tierlab::iosim {

std::vector<TimedIo> load_trace_schedule(trace::Reader& reader) {
  std::vector<TimedIo> out;
  trace::Record rec;
  bool first = true;
  Nanos t0 = 0;
  while (reader.next(rec)) {
    TimedIo q;
    if (auto* b = std::get_if<trace::BlockIo>(&rec.body)) {
      q = TimedIo{rec.ts, b->offset, b->length, b->op, b->flags};
    } else if (auto* f = std::get_if<trace::FileIo>(&rec.body)) {
      q = TimedIo{rec.ts, f->offset, f->length, f->op, f->flags};
    } else {
      continue;
    }
    if (first) {
      t0 = rec.ts;
      first = false;
    }
    q.at = rec.ts - t0;
    q.flags &= uint8_t(~trace::kIoIncomplete);
    out.push_back(q);
  }
  // Open loop needs a non-decreasing schedule; captures are in issue order
  // per CPU, so sort stably by time.
  std::stable_sort(out.begin(), out.end(),
                   [](const TimedIo& a, const TimedIo& b) { return a.at < b.at; });
  return out;
}

}  // namespace tierlab::iosim
