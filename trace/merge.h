// Joining traces recorded apart (a proxy capture on one machine, a cloud
// provider's metrics imported from another) into one trace on one clock.
#pragma once

#include "trace/record.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::trace {

class Reader;
class Writer;

// Writes every record of `readers` to `w` in time order, each passed
// through `adjust(record, index of its reader)` first when one is given
// (times compared after it). Each reader's records must be in time order;
// of equal times the earlier reader's goes first. Does not close `w`.
void interleave(const std::vector<std::unique_ptr<Reader>>& readers, Writer& w,
                const std::function<void(Record&, size_t)>& adjust = {});

struct MergeInput {
  std::string path;
  uint64_t records = 0;
  Nanos shift_ns = 0;       // added to its times: its realtime offset minus the first input's
  uint64_t session_base = 0;  // added to its session ids (0 stays "no session")
  uint64_t sessions_top = 0;  // its highest session id (0: no sessions)
  Nanos first_wall_ns = 0, last_wall_ns = 0;  // wall-clock span of its records (0, 0: none)
};

struct MergeResult {
  std::vector<MergeInput> inputs;
  uint64_t records = 0;
  // Whether every input's span overlaps the first one's (inputs without
  // records aside).
  bool overlap = true;
};

// Writes every record of `inputs` into a new trace at `out`, in time
// order, joined on their wall clocks: a record's wall-clock time is its ts
// plus its trace's realtime_offset_ns (docs/trace-format.md), and the
// output keeps the first input's clock origin and realtime offset, so each
// other input's times (BlockIo's complete_ns and queued_ns too) move by the
// difference of the offsets. Session ids of the second input on are
// renumbered after the highest of the inputs before it, so sessions of
// different captures stay apart. Throws like Reader and Writer (InputError
// naming a file that is not a trace).
MergeResult merge_on_wall_clock(const std::vector<std::string>& inputs, const std::string& out);

}  // namespace tierlab::trace
