#include "iosim/engine.h"

#include <algorithm>

namespace tierlab::iosim {

std::vector<TimedIo> load_trace_schedule(trace::Reader& reader) {
  std::vector<TimedIo> out, files;
  trace::Record rec;
  while (reader.next(rec)) {
    TimedIo q;
    if (auto* b = std::get_if<trace::BlockIo>(&rec.body)) {
      q = TimedIo{rec.ts, b->offset, b->length, b->op, b->flags};
      out.push_back(q);
    } else if (auto* f = std::get_if<trace::FileIo>(&rec.body)) {
      q = TimedIo{rec.ts, f->offset, f->length, f->op, f->flags};
      if (out.empty()) files.push_back(q);
    }
  }
  if (out.empty()) out.swap(files);
  if (!out.empty()) {
    const Nanos t0 = std::min_element(out.begin(), out.end(),
                                      [](const TimedIo& a, const TimedIo& b) { return a.at < b.at; })->at;
    for (auto& q : out) {
      q.at -= t0;
      q.flags &= uint8_t(~trace::kIoIncomplete);
    }
  }
  // Open loop needs a non-decreasing schedule; captures are in issue order
  // per CPU, so sort stably by time.
  std::stable_sort(out.begin(), out.end(),
                   [](const TimedIo& a, const TimedIo& b) { return a.at < b.at; });
  return out;
}

}  // namespace tierlab::iosim
