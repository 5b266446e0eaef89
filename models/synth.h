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
// Cache model: two caches hold pages, one in front of the other, both
// inside `memory` (a server's RAM, or a cgroup's memory limit):
//   shared_buffers (`shared_buffers`, default 25% of memory) sees every
//   page reference; what it misses is read from the OS (PostgreSQL's
//   blks_read);
//   the OS page cache gets what is left: memory less shared_buffers, less
//   what is not a data page: PostgreSQL's other shared memory, the
//   processes' private memory, the kernel's own, the binaries mapped and
//   the free memory the kernel keeps. Measured on the machine tierlab was
//   developed on (PostgreSQL 15, pgbench -S, 8 clients, a cgroup v1 memory
//   limit of 192 to 384 MiB, shared_buffers 64 MB, max_connections 50):
//   other shared memory 9 MiB (shared_memory_size 73 MB), processes'
//   private memory 4.2 MiB, kernel memory 2-4 MiB, mapped files 13 MiB,
//   left free 15-16 MiB: 40 MiB plus ~0.5 MiB a client, taken as 40 MiB
//   plus 1 MiB a client (a backend's private memory grows with what it
//   caches and sorts).
// Each page class (each B-tree level, the heap) is referenced
// independently and uniformly within it. shared_buffers' hit ratio per
// class follows Che's approximation for LRU: its characteristic time T1
// (in transactions) solves sum_i pages_i (1 - exp(-rate_i T1)) =
// shared_buffers pages, and a page of rate r hits with 1 - exp(-r T1).
// The OS cache holds the pages *read from the OS* most recently, so it
// duplicates what shared_buffers has just loaded: a page's last read from
// the OS lies, on average, c = (1 - q) / (q r) - T1 before its last
// reference (q = exp(-r T1): the references that hit shared_buffers since
// then did not touch the OS; c ~ 0 for a cold page, large for a hot one).
// The OS cache's characteristic time T2 solves sum_i pages_i (1 -
// exp(-rate_i (T2 - c_i))) = OS cache pages, and a reference goes to the
// device when its page was last referenced more than max(T1, T2 - c)
// ago: miss = exp(-r max(T1, T2 - c)). For one class of N pages this is
// 1 - max(shared_buffers, OS cache) / N: the smaller cache is all
// duplicates; hot pages living in shared_buffers free the OS cache for
// colder ones.
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

// The two caches' sizes in pages (see the file comment): shared_buffers,
// and the OS page cache left by memory - shared_buffers - 40 MiB - 1 MiB
// per client (at least 0). Throws InputError when shared_buffers is not
// below memory.
inline constexpr double kNotCacheBytes = 40.0 * 1024 * 1024;
inline constexpr double kNotCacheBytesPerClient = 1.0 * 1024 * 1024;
struct CacheSizes {
  double shared_buffers_pages = 0;
  double os_pages = 0;
};
CacheSizes cache_sizes(double memory_bytes, double shared_buffers_bytes, int clients);

// Per page class: the share of its references that shared_buffers hits,
// and the share that either cache hits (the rest go to the device), by the
// two-level model of the file comment.
struct TwoLevelHits {
  std::vector<double> shared_buffers;
  std::vector<double> either;
};
TwoLevelHits two_level_hit_ratios(const std::vector<PageClass>& classes, const CacheSizes& cache);

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
  double shared_buffers_bytes = 0;  // 0: a quarter of memory_bytes
  int vcpus = 1;
  // Transactions per second assumed for the checkpoint interval
  // (checkpoint_timeout 300 s): only the write model uses it.
  double checkpoint_tps = 5000;
  KeyAccess aid;  // uniform over every row by default
};

struct SynthResult {
  Profile profile;
  PgbenchGeometry geometry;
  CacheSizes cache;
  std::vector<PageClass> classes;
  std::vector<double> hit;           // per class: either cache
  std::vector<double> shared_buffers_hit;  // per class
  double os_reads_per_tx = 0;        // shared_buffers' misses (blks_read)
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
