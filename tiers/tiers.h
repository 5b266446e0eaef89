// The storage tier catalog: what a tier can do, as data.
//
// A Tier says how many I/Os per second it admits (per op or combined), how
// many bytes per second, how it counts an I/O (EBS counts each I/O up to
// 256 KiB as one and merges physically sequential small I/Os), how long an
// I/O takes once the tier starts serving it (a latency distribution per op),
// how many I/Os it serves at once, and whether it has a gp2-style burst
// bucket. iosim's Shaper turns a Tier into admission and completion times;
// nothing here knows about time passing.
//
// The built-in tiers and the sources of their figures are in docs/tiers.md.
// Users add or replace tiers with a JSON file (`--tiers-file FILE`), in the
// same format `tierlab tiers show NAME --json` prints.
#pragma once

#include "common/clock.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tierlab::tiers {

// Shape of the per-I/O service time.
enum class LatencyDist : uint8_t {
  Fixed = 0,        // always p50_ns
  Lognormal = 1,    // median p50_ns, 99th percentile p99_ns (p99_ns > p50_ns)
  Exponential = 2,  // median p50_ns (mean = p50_ns / ln 2); memoryless
};

struct Latency {
  LatencyDist dist = LatencyDist::Fixed;
  Nanos p50_ns = 0;
  Nanos p99_ns = 0;  // Lognormal only
};

// gp2-style burst bucket. The bucket holds up to `credits` I/O credits and
// starts full; every counted I/O takes one credit; credits come back at
// `refill_iops`. While credits last the tier runs at up to `burst_iops`;
// once they are gone it runs at `refill_iops` (the baseline).
struct Burst {
  double credits = 0;      // 0 = no burst bucket
  double burst_iops = 0;
  double refill_iops = 0;
  bool enabled() const { return credits > 0; }
};

struct Tier {
  std::string name;
  std::string description;

  // IOPS caps in counted I/Os per second; 0 = no cap. total_iops applies to
  // reads and writes together, read_iops / write_iops to one op each.
  double read_iops = 0;
  double write_iops = 0;
  double total_iops = 0;
  // Throughput cap in bytes per second, reads and writes together; 0 = none.
  double bytes_per_sec = 0;
  // How long an idle tier banks unused tokens: a token bucket of rate r
  // holds at most r * bucket_ns of them, so any window of length w sees at
  // most r * (w + bucket_ns) counted I/Os (plus the one being admitted).
  Nanos bucket_ns = 1'000'000;

  // I/O counting: an I/O of len bytes counts ceil(len / io_unit_bytes) I/Os
  // (0 = every I/O counts one). With merge_sequential, an I/O that starts
  // where the previous one of the same op ended is merged into it while the
  // merged size stays within io_unit_bytes, and then counts nothing.
  uint64_t io_unit_bytes = 0;
  bool merge_sequential = false;
  // A cache flush (the device write-back flush an fsync asks for) counts
  // as one write I/O against the write and total IOPS caps. Linux's block
  // throttling (cgroup blkio / io.max) counts them; cloud volumes' IOPS
  // figures count data I/Os only.
  bool count_flushes = false;

  // Service time once the tier starts an I/O.
  Latency read;
  Latency write;
  Latency flush;

  // How many I/Os the tier serves at once; 0 = unlimited.
  uint32_t parallelism = 0;

  Burst burst;
};

// Checks a tier's figures (non-negative caps, p99 > p50 for lognormal, ...);
// throws InputError starting with `where` and naming the field.
void validate(const Tier& tier, const std::string& where);

// The tier as a JSON object (pretty-printed text), in the tiers-file format.
std::string to_json(const Tier& tier);

class Catalog {
 public:
  // The built-in tiers (see docs/tiers.md).
  static Catalog builtin();

  // Adds the tiers of a tiers file; a tier with the name of an existing one
  // replaces it. Throws InputError naming the file and the offending key
  // ("tiers.json: tiers[1].latency.read.p50_us: expected a number").
  void load_file(const std::string& path);
  // Same, from JSON text; `name` stands for the file in messages.
  void load_json(std::string_view text, const std::string& name);

  // The tier called `name`; InputError listing the known names otherwise.
  const Tier& get(std::string_view name) const;
  const Tier* find(std::string_view name) const;

  // Every tier, built-ins first in catalog order, then user tiers in file order.
  const std::vector<Tier>& tiers() const { return tiers_; }

  // "nvme-local, ebs-gp3, ..."
  std::string names() const;

 private:
  std::vector<Tier> tiers_;
};

// The built-in catalog plus `tiers_file` when it is not empty.
Catalog load_catalog(const std::string& tiers_file);

std::string_view dist_name(LatencyDist d);

}  // namespace tierlab::tiers
