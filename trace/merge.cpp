#include "trace/merge.h"

#include "trace/reader.h"
#include "trace/writer.h"

#include <memory>

namespace tierlab::trace {

void interleave(const std::vector<std::unique_ptr<Reader>>& readers, Writer& w,
                const std::function<void(Record&, size_t)>& adjust) {
  // Invariant: heads[i] is the next unwritten record of readers[i], already
  // adjusted (its views stay valid until readers[i]->next() is called
  // again).
  std::vector<Record> heads(readers.size());
  std::vector<bool> live(readers.size());
  auto advance = [&](size_t i) {
    live[i] = readers[i]->next(heads[i]);
    if (live[i] && adjust) adjust(heads[i], i);
  };
  for (size_t i = 0; i < readers.size(); ++i) advance(i);
  for (;;) {
    size_t best = readers.size();
    for (size_t i = 0; i < readers.size(); ++i)
      if (live[i] && (best == readers.size() || heads[i].ts < heads[best].ts)) best = i;
    if (best == readers.size()) break;
    w.write(heads[best]);
    advance(best);
  }
}

MergeResult merge_on_wall_clock(const std::vector<std::string>& inputs, const std::string& out) {
  MergeResult res;
  // First pass: each input's offset, span and highest session id.
  uint64_t next_base = 0;
  Nanos offset0 = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto r = open_reader(inputs[i]);
    MergeInput in;
    in.path = inputs[i];
    if (i == 0) offset0 = r->header().realtime_offset_ns;
    in.shift_ns = r->header().realtime_offset_ns - offset0;
    in.session_base = next_base;
    uint64_t top = 0;
    Record rec;
    bool any = false;
    while (r->next(rec)) {
      ++in.records;
      if (rec.session > top) top = rec.session;
      const Nanos wall = rec.ts + r->header().realtime_offset_ns;
      if (!any || wall < in.first_wall_ns) in.first_wall_ns = wall;
      if (!any || wall > in.last_wall_ns) in.last_wall_ns = wall;
      any = true;
    }
    next_base += top;
    in.sessions_top = top;
    res.inputs.push_back(in);
  }
  const MergeInput& first = res.inputs.front();
  for (const auto& in : res.inputs)
    if (in.records && first.records && (in.last_wall_ns < first.first_wall_ns || in.first_wall_ns > first.last_wall_ns))
      res.overlap = false;

  std::vector<std::unique_ptr<Reader>> readers;
  for (const auto& p : inputs) readers.push_back(open_reader(p));
  WriterOptions wo;
  wo.start_mono_ns = readers.front()->header().start_mono_ns;
  wo.realtime_offset_ns = offset0;
  auto writer = open_writer(out, wo);
  interleave(readers, *writer, [&](Record& h, size_t i) {
    const MergeInput& in = res.inputs[i];
    h.ts += in.shift_ns;
    if (h.session != 0) h.session += in.session_base;
    if (auto* b = std::get_if<BlockIo>(&h.body)) {
      b->complete_ns += in.shift_ns;
      if (b->queued_ns != 0) b->queued_ns += in.shift_ns;
    }
  });
  writer->close();
  res.records = writer->records_written();
  return res;
}

}  // namespace tierlab::trace
