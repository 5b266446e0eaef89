// Synthetic workload profiles: what a pgbench run at a given scale would ask
// of the machine, computed from pgbench's schema and access pattern instead
// of measured from a capture.
//
// Page model (PostgreSQL 15, 8 KiB pages, pgbench -i defaults):
//   pgbench_accounts heap: 61 rows per page at fillfactor 100 (tuple header
//   24 B + aid, bid, abalance 12 B + filler char(84) 85 B, MAXALIGNed to
//   128 B, plus a 4 B line pointer, on 8,168 usable bytes): 100,000 rows
//   per scale unit = 1,640 pages (~13.4 MB).
//   pgbench_accounts_pkey (int4): 20 B per index entry (8 B IndexTuple + 4 B
//   key, MAXALIGNed to 16, + 4 B line pointer) on 8,152 usable bytes,
//   leaves filled to 90% (367 entries), inner pages to 70% (285 downlinks)
//   by the index build; levels until one root page.
//   Branches, tellers and history are a few pages per scale unit that stay
//   cached.
//
// Cache model: `memory` less what the server's processes and the kernel
// keep for themselves (512 MiB plus 8 MiB per client) caches pages;
// shared_buffers and the OS page cache are taken together as one LRU cache
// of that size (pages held by both counted once, i.e. double caching
// ignored, which makes the reads a lower bound). Every page class (each
// B-tree level, the heap) is referenced independently and uniformly within
// it; the hit ratio of each under LRU follows Che's approximation: the
// cache's characteristic time T solves sum_i pages_i (1 - exp(-rate_i T))
// = cache pages, and a page of rate r hits with 1 - exp(-r T). For a single
// class of N pages this is the uniform miss ratio 1 - C/N for C < N.
//
// Writes (tpcb-like): each transaction updates one random accounts row.
// The heap pages are full at fillfactor 100, so the update is not HOT: the
// old row's page is dirtied, the new version goes to a page with room (the
// relation's end: 1/61 of a new page per transaction) and an entry is
// inserted into the primary key's leaf (dirtied). Tellers, branches and
// history are hot and cached. A dirtied page is written once per checkpoint
// interval (checkpoint_timeout 300 s at `checkpoint_tps`) or when it is
// evicted first: writes per transaction for a class of N pages dirtied at
// rate 1 per transaction = max(miss ratio, (1 - e^-u)/u) with u =
// transactions per checkpoint / N, the distinct pages dirtied per
// transaction in one interval. The same fraction of dirtied pages carries a
// full-page image into the WAL (8 KiB each) besides ~600 B of records; the
// commit writes the WAL and flushes it once (group commit then shares
// flushes in `project`).
#pragma once

#include "models/profile.h"

#include <string>
#include <vector>

namespace tierlab::models {

struct PgbenchGeometry {
  double rows = 0;         // pgbench_accounts rows
  double heap_pages = 0;   // pgbench_accounts heap pages
  // pgbench_accounts_pkey pages per level, root first; the last is the leaves.
  std::vector<double> index_levels;
  double bytes() const;    // heap and index, bytes
};

inline constexpr double kPageBytes = 8192;
inline constexpr double kRowsPerScale = 100000;
inline constexpr double kHeapRowsPerPage = 61;
inline constexpr double kLeafEntriesPerPage = 367;
inline constexpr double kInnerEntriesPerPage = 285;

// Throws InputError when scale is not positive.
PgbenchGeometry pgbench_geometry(double scale);

// A set of pages referenced uniformly: `refs_per_tx` references per
// transaction spread evenly over `pages` pages.
struct PageClass {
  std::string name;
  double pages = 0;
  double refs_per_tx = 0;
};

// Hit ratio of each class in an LRU cache of `cache_pages` pages (Che's
// approximation, see the file comment); all 1 when everything fits.
std::vector<double> lru_hit_ratios(const std::vector<PageClass>& classes, double cache_pages);

// 1 - C/N for C < N, else 0.
double uniform_miss_ratio(double pages, double cache_pages);

// Pages the memory leaves for the cache: (memory - 512 MiB - 8 MiB per
// client) / 8 KiB, at least 0.
double cache_pages_for(double memory_bytes, int clients);

enum class PgbenchMode { SelectOnly, TpcbLike };

// How a transaction picks its pgbench_accounts row (pgbench's \set
// functions, over the keys lo..hi): random (uniform), random_gaussian
// (mean at the middle, standard deviation (hi - lo + 1) / 2 / param, cut at
// +-param deviations) or random_exponential (density proportional to
// exp(-param (k - lo) / (hi - lo + 1))). Rows are loaded in key order, so
// key k sits on heap page k / 61 and leaf k / 367: the key range is cut into
// 1,000 slices, each slice's heap pages and leaves one page class with the
// slice's share of the references (leaves and heap pages outside lo..hi
// are not referenced).
enum class KeyDist { Uniform, Gaussian, Exponential };
struct KeyAccess {
  KeyDist dist = KeyDist::Uniform;
  double lo = 1;
  double hi = 0;      // 0: every row (100,000 x scale)
  double param = 0;   // gaussian / exponential parameter
};

// What a custom pgbench script does, as far as the model goes: the
// distribution of the variable its pgbench_accounts statements look rows up
// by ("aid = :NAME"), and whether it updates pgbench_accounts (then the
// tpcb-like write model applies). `vars` are -D NAME=VALUE (and "scale");
// expressions may use integers, :NAME, + - * / and parentheses. Throws
// InputError naming `name` and the line.
struct ScriptAccess {
  KeyAccess aid;
  bool updates_accounts = false;
};
ScriptAccess parse_pgbench_script(const std::string& text, const std::vector<std::pair<std::string, double>>& vars,
                                  const std::string& name);

// What one transaction costs apart from storage: CPU, the client's round
// trips and the time between its transactions, and the device the figures
// were taken on (which `project` calibrates with).
struct SynthCalibration {
  std::string source;         // the trace, or "defaults" (see default_calibration)
  double cpu_s_per_tx = 0;
  double other_s = 0;         // round trips, client time: `project`'s "other" at one client
  double think_time_s = 0;
  double read_latency_s = 0;  // the device the figures are calibrated on
  double write_latency_s = 0;
  double flush_latency_s = 0;
};

// Defaults when there is no capture to calibrate on. CPU per transaction:
// the machine's busy CPU per direct pgbench transaction in
// docs/benchmarks.md's capture-overhead runs on this machine (server,
// kernel and pgbench together, so an upper bound of the server's):
// ~100 us select-only, ~800 us tpcb-like. Round trips: 1 per select-only
// transaction, 7 per tpcb-like one (each statement waits for its reply),
// 50 us each (an assumption for a client on the same host or the next
// rack, not a measurement). Device: nvme-local's mean latencies.
SynthCalibration default_calibration(PgbenchMode mode);

struct SynthOptions {
  double scale = 1;
  PgbenchMode mode = PgbenchMode::SelectOnly;
  int clients = 1;
  double memory_bytes = 0;
  int vcpus = 1;
  // Transactions per second assumed for the checkpoint interval
  // (checkpoint_timeout 300 s): only the write model uses it.
  double checkpoint_tps = 5000;
  KeyAccess aid;  // uniform over every row by default
};

struct SynthResult {
  Profile profile;
  PgbenchGeometry geometry;
  double cache_pages = 0;
  std::vector<PageClass> classes;
  std::vector<double> hit;           // per class
  double reads_per_tx = 0;
  double dirty_writes_per_tx = 0;    // checkpoint/background writes
  double wal_bytes_per_tx = 0;
  std::vector<std::string> assumptions;  // what the figures rest on, for the output
};

// Builds the profile. `project` reads it like a captured one: it calibrates
// "other" at one client (Profile::mean_clients = 1) on the calibration's
// device, so that at one client the transaction takes CPU + device time +
// calibration.other_s; `clients` is the profile's client count. Throws
// InputError for a bad option value (names the value).
SynthResult synth_pgbench(const SynthOptions& opts, const SynthCalibration& cal);

// CPU, round trips and think time from a profiled capture of the same
// script at a small scale (its reads are left out: the synthetic model
// gives them). Throws InputError when the profile has no CPU samples.
SynthCalibration calibration_from(const Profile& captured);

// A profile from profile_json's JSON text (what `tierlab profile --json`
// and `tierlab profile synth` print); `name` stands for the file in
// messages. Throws InputError naming the file and key.
Profile profile_from_json(const std::string& text, const std::string& name);
// Reads the file; InputError when it cannot be read.
Profile read_profile_json(const std::string& path);

}  // namespace tierlab::models
