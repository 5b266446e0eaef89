#include "models/project_memory.h"
#include "models/fmt.h"

#include "common/error.h"
#include "common/units.h"

#include <algorithm>

namespace tierlab::models {

double memory_factor(const Profile& p, double memory, double capture_memory, double growth,
                     std::vector<std::string>& notes, double& extra_reads) {
  extra_reads = 0;
  const bool grows = growth != 1.0;
  if ((memory <= 0 || memory == capture_memory) && !grows) return 1.0;
  // SettingError: the app names the option ("--memory cannot be projected: ...").
  const char* setting = memory > 0 && memory != capture_memory ? "memory" : "data_growth";
  // A profile from `profile synth` has its reads from its own cache model.
  if (p.mrc.empty() && p.source.rfind("synth: ", 0) == 0)
    throw SettingError(setting, "cannot be projected: " + p.source +
                                    " is a synthetic profile, with no miss-ratio curve: synthesize it at the "
                                    "target's memory, and for grown data at the grown scale");
  if (p.mrc.empty())
    throw SettingError(setting, "cannot be projected: " + p.source +
                                    " has no page references (record the server's file I/O: `tierlab capture "
                                    "run` as root; or block I/O: `tierlab capture run` on the data's device, "
                                    "or `tierlab capture block`)");
  if (capture_memory <= 0)
    throw SettingError("capture_memory", "needed: " + p.source +
                                             " does not record the capture's memory (meta memory.bytes)");
  if (memory <= 0) memory = capture_memory;
  // The memory as today's data sees it.
  const double reach = memory / growth;
  if (grows)
    notes.push_back("data growth " + fmt("%.3g", growth) + "x: the data and its working set taken as " +
                    fmt("%.3g", growth) + "x larger with the same access pattern (each page's share of the "
                    "references spread over that many more pages), so " + format_bytes(memory) +
                    " caches what " + format_bytes(reach) + " caches today: the miss-ratio curve (" +
                    p.mrc.source + ") is read at " + format_bytes(reach));
  double sb = p.shared_buffers_bytes;
  if (p.mrc.source == "file_io") {
    // The curve is of references below shared_buffers: the OS cache is what
    // is left of memory once shared_buffers is taken (kept as captured).
    // Below shared_buffers it says nothing: every such reference misses
    // there, and what shared_buffers itself would miss more is not added.
    double before = p.mrc.at(std::max(0.0, capture_memory - sb));
    double after = p.mrc.at(std::max(0.0, reach - sb));
    if (grows && reach < sb)
      notes.push_back("with the data " + fmt("%.3g", growth) + "x larger, shared_buffers (" + format_bytes(sb) +
                      ") reaches less than it does today: the curve starts at shared_buffers, so the reads "
                      "projected are a lower bound");
    if (after > before) {
      // Less memory: the references the smaller cache misses and the
      // capture's did not become device reads, added to those measured
      // (which may be none: everything the capture read was cached).
      const double refs_per_tx = p.transactions > 0 ? p.mrc.references / static_cast<double>(p.transactions) : 0;
      extra_reads = refs_per_tx * (after - before);
      notes.push_back("memory " + format_bytes(reach) + (grows ? " (today's data)" : "") +
                      ": the OS cache below shared_buffers shrinks from " +
                      format_bytes(std::max(0.0, capture_memory - sb)) + " to " +
                      format_bytes(std::max(0.0, reach - sb)) + "; its miss ratio (file I/O) rises from " +
                      fmt("%.3f", before) + " to " + fmt("%.3f", after) + ", " + fmt("%.3f", extra_reads) +
                      " more device reads per transaction");
      return 1.0;
    }
    if (before <= 0) {
      notes.push_back("the capture's reads all hit in the modelled cache; reads per transaction kept");
      return 1.0;
    }
    return after / before;
  }
  // Block-level curve: the reads that already missed the capture's cache.
  // More memory acts as a further LRU cache of the difference in front of
  // them; for less memory the curve has nothing to say.
  if (reach > capture_memory) return p.mrc.at(reach - capture_memory);
  if (reach == capture_memory) return 1.0;
  notes.push_back(std::string(grows ? "the data's growth leaves the cache reaching less than at capture"
                                    : "less memory than at capture") +
                  " with only block-level references: reads per "
                  "transaction kept as captured (block I/O shows only the reads that missed the capture's "
                  "cache; projecting a smaller memory needs the server's file reads: record them with "
                  "`tierlab capture run` as root)");
  return 1.0;
}

}  // namespace tierlab::models
