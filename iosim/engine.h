// The io_uring engine: drives real I/O against a file or block device,
// closed loop at a queue depth or open loop at recorded times, optionally
// shaped to behave like a storage tier.
//
// One thread owns a run. Everything the hot loop needs (request slots, their
// registered buffers, the held-completion heap, histograms) is allocated in
// run_engine() before the first I/O; the loop itself does not allocate. The
// slot index is the submission's user_data.
//
// Errors: setup problems throw (InputError for a bad target or options,
// RuntimeError for a missing kernel feature, naming it). An I/O that fails
// with anything but a short transfer, EAGAIN or EINTR stops the run, and
// run_engine() throws RuntimeError naming the op and offset once the ring is
// drained. A --verify mismatch throws RuntimeError naming the offset.
#pragma once

#include "common/error.h"
#include "common/histogram.h"
#include "iosim/shaper.h"
#include "trace/reader.h"
#include "trace/record.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::iosim {

// One I/O to issue (a shaper IoRequest with a time and flags). `at` is its scheduled time in nanoseconds after the
// start of the schedule (open loop only). Flush: offset/length ignored by the
// engine; kIoMeta in flags asks for fsync (otherwise fdatasync).
struct TimedIo {
  Nanos at = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  IoOp op = IoOp::Read;
  uint8_t flags = 0;
};

// Supplies the I/Os of a run, in order. next() is called from the hot loop
// and must not allocate; it returns false when the stream ends.
class IoSource {
 public:
  virtual ~IoSource() = default;
  virtual bool next(TimedIo& out) = 0;
};

// A preloaded list of requests (a trace's schedule).
class VectorSource : public IoSource {
 public:
  explicit VectorSource(std::vector<TimedIo> reqs) : reqs_(std::move(reqs)) {}
  bool next(TimedIo& out) override {
    if (pos_ >= reqs_.size()) return false;
    out = reqs_[pos_++];
    return true;
  }
  const std::vector<TimedIo>& requests() const { return reqs_; }

 private:
  std::vector<TimedIo> reqs_;
  size_t pos_ = 0;
};

// The schedule recorded in a trace: its BlockIo records, or its FileIo
// records when it has no BlockIo (a trace of `capture run` holds both, and
// the file calls the OS cache answered never reached the device), in time
// order, with `at` relative to the first one. Records with the
// kIoIncomplete flag are kept (they were issued). Throws like the Reader.
std::vector<TimedIo> load_trace_schedule(trace::Reader& reader);

// Counters of a run in progress, for another thread to read (progress
// lines). The engine's thread is the only writer; relaxed atomics.
struct EngineLive {
  std::atomic<int64_t> start_ns{0};  // CLOCK_MONOTONIC when the run's I/O began; 0 before
  std::atomic<uint64_t> ios{0};      // counted I/Os completed so far
  std::atomic<uint64_t> bytes{0};
  std::atomic<int64_t> lat_sum_ns{0};  // sum of their latencies (OpStats::lat)
};

struct EngineOptions {
  std::string target;        // regular file or block device
  bool direct = false;       // O_DIRECT; buffers are 4 KiB aligned
  uint32_t iodepth = 32;     // request slots (also the open-loop limit)
  // Submit once this many requests are prepared (fio's iodepth_batch_submit);
  // 0 = once per pass of the loop, together with the wait for completions.
  uint32_t submit_batch = 1;
  uint64_t size = 0;         // regular file: created/extended to this size
  bool open_loop = false;    // issue at TimedIo::at instead of at once
  Nanos runtime_ns = 0;      // stop issuing after this long; 0 = no limit
  uint64_t max_ios = 0;      // stop after this many I/Os; 0 = no limit
  uint32_t max_block = 0;    // largest request length (sizes slot buffers)
  bool verify = false;       // write a known pattern, check it on reads
  bool verify_existing = false;  // reads check every sector, not only those
                                 // written in this run (read-only verify)
  uint64_t seed = 0x746965726c6162ull;  // pattern seed
  // Not owned; null = no shaping. At submission the shaper says when the
  // tier completes the I/O; the completion is reported at the later of that
  // and the device's own completion.
  Shaper* shaper = nullptr;
  // Run the loop at real-time priority (SCHED_FIFO 1) so that other
  // processes on a busy machine do not delay issue and release times.
  // Needs root or CAP_SYS_NICE; RuntimeError otherwise.
  bool realtime = false;
  // Runs with deadlines (open loop, or a shaper) hold the CPU wake-up
  // latency limit (/dev/cpu_dma_latency) at 0 us, as cyclictest does, so
  // that idle CPUs do not sleep too deeply to wake on time. Needs root;
  // skipped without it (EngineResult::cpu_latency_held says which).
  bool hold_cpu_latency = true;
  bool allow_create = true;  // a missing regular file is created with `size` bytes
  // A regular file is laid out before the run: the parts of [0, size) that
  // hold no written data (holes, and unwritten extents such as those
  // posix_fallocate leaves, which the file system answers reads of without
  // the device) are written with the verify pattern of `seed` (non-zero, so
  // no compressing or deduplicating layer can skip them), as fio writes a
  // new file out. Called with the target and the bytes to write before
  // writing them; may be empty.
  std::function<void(const std::string& target, uint64_t bytes)> on_layout;
  // The source only reads (and flushes): the target is opened read-only
  // unless it has to be created or extended to `size`, so a file the user
  // may only read can be driven, as fio does.
  bool read_only = false;
  // Not owned; null = none. Another thread (a signal watcher) sets it
  // non-zero to stop the run early: nothing more is issued, the I/Os in
  // flight complete and are counted, the verify read-back pass is skipped,
  // and run_engine() returns the results so far with `stopped` set. Checked
  // once per pass of the loop; sleeps are cut to 50 ms so that a long wait
  // for an open loop's next due time does not delay it.
  const std::atomic<int>* stop = nullptr;
  // If set, receives the completion time of each counted I/O, up to its
  // capacity (reserve it beforehand: the loop never grows it): the tier's
  // time under a tier (what its caps govern; a device or a descheduled loop
  // slower than that is counted in slower_than_tier and release_lag), else
  // the reap time.
  std::vector<Nanos>* completion_log = nullptr;
  // Not owned; null = none. Updated as I/Os complete (see EngineLive).
  EngineLive* live = nullptr;
};

struct OpStats {
  uint64_t ios = 0;
  uint64_t bytes = 0;
  Histogram lat;         // latency as reported (ns), fio's lat (not its
                         // clat: a virtual disk may serve the I/O within the
                         // submission), from when the I/O could go to its
                         // completion; with a tier, to max(tier completion,
                         // device completion). Closed loop: from the moment
                         // its slot was freed (the loop's start for the first
                         // iodepth I/Os), so that time waiting behind other
                         // submissions of the same pass is counted and
                         // IOPS x mean lat = iodepth (Little's law). Open
                         // loop: from just before its submitting
                         // io_uring_enter (lateness before that is issue_lag).
  Histogram device_lat;  // what the device alone took (ns), from just before
                         // the submitting io_uring_enter
};

struct EngineResult {
  Nanos elapsed_ns = 0;      // first issue to last completion
  Nanos schedule_ns = 0;     // open loop: last scheduled `at`
  uint64_t ios = 0;
  uint64_t bytes = 0;
  OpStats op[4];             // indexed by IoOp
  Histogram lat;             // all ops
  Histogram issue_lag;       // open loop: actual issue - scheduled (ns)
  // Open loop: issues later than kLateIssueNs, and the stalls they came in
  // (a stall: consecutive late issues), so a reader can tell a few long
  // stalls (the longest shows as issue_lag's max) from lateness spread over
  // the run.
  static constexpr Nanos kLateIssueNs = 100'000;
  uint64_t late_issues = 0;
  uint64_t issue_stalls = 0;
  Histogram release_lag;     // tier: actual release - tier completion (ns)
  uint64_t short_ios = 0;    // I/Os with a short transfer (rest resubmitted, or EOF)
  uint64_t eof_short = 0;    // reads cut short by end of file
  uint64_t eagain = 0;       // -EAGAIN, retried
  uint64_t eintr = 0;        // -EINTR, retried
  uint64_t skipped = 0;      // requests the engine cannot issue (discard)
  uint64_t wrapped = 0;      // requests whose offset was folded into the target
  uint64_t slot_waits = 0;   // open loop: a request waited for a free slot
  uint64_t slower_than_tier = 0;  // device latency exceeded the tier's
  uint64_t verified_bytes = 0;
  uint64_t target_size = 0;
  uint64_t laid_out_bytes = 0;  // written before the run (see EngineOptions::on_layout)
  std::string tier;          // tier name, "" without shaping
  bool cpu_latency_held = false;  // see EngineOptions::hold_cpu_latency
  bool stopped = false;      // ended early through EngineOptions::stop
};

// Checks once that io_uring and the features the engine uses exist: ring
// setup, READ/WRITE(_FIXED), FSYNC, registered files and buffers. Throws
// RuntimeError naming the first missing one.
void probe_io_uring();

// Throws InputError "N: must be 1 to 65536" for a number of request slots
// (EngineOptions::iodepth) the engine does not run with.
void check_iodepth(uint32_t iodepth);

// InputError about the target that the caller can mend: `fix` says what
// would (the engine names the target, the command names its flag).
class TargetError : public InputError {
 public:
  enum class Fix {
    None,
    CreateWithSize,  // "TARGET: does not exist": a size creates it
    GiveSize,        // "TARGET: is empty": a size grows it
    DropDirect,  // "TARGET: O_DIRECT is not supported here"
  };
  TargetError(const std::string& what, Fix fix) : InputError(what), fix(fix) {}
  Fix fix;
};

// Runs the I/Os of `source` against opts.target. See the file comment.
// Throws TargetError for a target it cannot use as given.
EngineResult run_engine(const EngineOptions& opts, IoSource& source);

// The verify pattern: the byte at file offset `off` for `seed`.
void fill_pattern(uint8_t* buf, uint64_t off, uint32_t len, uint64_t seed);

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The parts of [0, size) of the regular file open as `fd` that hold no
// written data: holes, and extents FIEMAP marks FIEMAP_EXTENT_UNWRITTEN
// (allocated but never written: reads return zeros without the device).
// Sorted, merged. Where the file system has no FIEMAP, its holes
// (SEEK_DATA/SEEK_HOLE). Throws RuntimeError if FIEMAP fails otherwise.
std::vector<ByteRange> unwritten_ranges(int fd, uint64_t size);

// The alignment O_DIRECT needs of offsets and lengths on `target`: statx's
// stx_dio_offset_align where the kernel reports it (Linux 6.1+), else a
// block device's logical block size (BLKSSZGET); for a file not created
// yet, the logical block size of the device under its directory; 4096 when
// none of these says.
uint64_t direct_io_alignment(const std::string& target);

// Writes `ranges` of the file `path` with fill_pattern(seed): large O_DIRECT
// writes where aligned and allowed, buffered ones elsewhere, then fdatasync,
// and drops what went through the page cache. Returns the bytes written.
// Stops early, between writes, once `stop` (if given) is non-zero.
// InputError if the file cannot be opened for writing, RuntimeError if a
// write fails.
uint64_t lay_out(const std::string& path, const std::vector<ByteRange>& ranges, uint64_t seed,
                 const std::atomic<int>* stop = nullptr);

}  // namespace tierlab::iosim
