// Block I/O recorder: the kernel's block_rq_issue and block_rq_complete
// tracepoints, read from tracefs, become BlockIo records of a trace.
//
// The recorder works in its own tracing instance (instances/tierlab-block-
// PID, removed at the end; capture/tracefs.h), so other users of tracefs,
// and the file I/O recorder, are not disturbed. Event times are
// CLOCK_MONOTONIC, the clock of every other trace record. Events are filtered on the device in
// the kernel and on pids (if given) in user space, read in binary from the
// per-CPU trace_pipe_raw files, and an issue is paired with its completion
// by device and sector. Events the kernel could not buffer are counted and
// written as a Loss{EventsLost} record.
//
// Cache flushes: an fdatasync's empty PREFLUSH bio (and the flush before or
// after a PREFLUSH/FUA write) is not issued itself; the kernel's flush
// machinery issues a flush request (rwbs "FF") from a kblockd worker, which
// completes with another sector than it was issued with. Each flush record
// is that request, issue to completion, paired in issue order per device
// (the kernel keeps one flush in flight per hardware queue), so its latency
// is the device's flush time, like the flush ticks of /sys/block/X/stat.
// Its pid is that of the latest flush-asking bio (block_bio_queue, PREFLUSH
// or FUA) queued before it: the process whose fdatasync or journal commit
// caused it.
//
// Queue times (BlockIo.queued_ns): every bio queued on the device or its
// partitions is seen (block_bio_queue), and a bio submitted to a partition
// also at its remapping to the disk (block_bio_remap), which the kernel
// traces in the submitter's context before cgroup blkio throttling can hold
// the bio. A request's queue time is the earliest of its bios' (by sector:
// merged bios, the parts of a split one), and its pid that bio's submitter:
// a request the throttle held is issued by the throttle's kernel worker, on
// behalf of that process. block_bio_queue alone comes after the throttle (a
// held bio is queued by the worker when released), so on a whole disk
// (no partition) the wait for a cgroup IOPS limit is not in the queue time
// and such requests keep the worker's pid.
//
// Needs root (RuntimeError saying so otherwise).
#pragma once

#include "trace/record.h"
#include "trace/writer.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tierlab::capture {

struct BlockDevice {
  uint32_t dev = 0;      // kernel dev_t: major << 20 | minor (whole disk)
  std::string name;      // "vda", "loop3"
  bool from_partition = false;  // the spec named a partition or a file on one
};

// Resolves "vda", "/dev/vda", "254:0" or a path on a mounted file system to
// the whole disk that block requests are issued to. Throws InputError
// "SPEC: what is wrong".
BlockDevice resolve_block_device(const std::string& spec);

// Throws RuntimeError ("capture block needs root ...") unless the process
// may read kernel tracepoints, or ("tracefs: ...") when tracefs cannot be
// found or mounted (`tracefs`: "" = /sys/kernel/tracing, mounted if need
// be) or the kernel lacks the block tracepoints. Returns the tracefs
// mount. Callers check before creating the trace; capture_block() calls it
// too.
std::string require_block_tracing(const std::string& tracefs);

struct BlockCaptureOptions {
  std::string device;             // as resolve_block_device() takes it
  std::vector<int32_t> pids;      // record only I/Os issued by these; empty = all
  // Record only the I/O of this process and its descendants, those forked
  // after the start included (a new backend), and of kernel threads: the
  // kernel writes a process's buffered writes back, and the file system's
  // journal commits what its fdatasync asked for, from its own threads, so
  // their I/O (and the flushes they ask for) is the server's too. Other
  // processes' I/O is counted (BlockCaptureStats::others), not recorded.
  // 0 = every process.
  int32_t process_tree = 0;
  trace::Nanos duration_ns = 0;   // 0 = until *stop is set
  uint32_t buffer_kb = 8192;      // per-CPU ring buffer of the instance
  std::string tracefs;            // "" = /sys/kernel/tracing (mounted if needed)
  // When set, the I/Os recorded so far, updated every batch (0.1 s at
  // most), for a status line on another thread.
  std::atomic<uint64_t>* live_ios = nullptr;
};

// Throws InputError "PID: must be a process id" when `pid` is negative: the
// check of every pid the capture commands take (0 keeps the meaning the
// command gives it).
void check_pid(int64_t pid);

// Throws InputError "KB: ..." for a per-CPU ring buffer size tracefs
// refuses (0, above 1 GiB) or that would take more than half of memory on
// all CPUs.
void check_buffer_kb(uint32_t buffer_kb);

// Throws InputError, one line naming the bad value (check_pid,
// check_buffer_kb), for options capture_block() would refuse; callers check
// before creating the trace. capture_block() calls it too.
void check_block_capture_options(const BlockCaptureOptions& opts);

struct BlockCaptureStats {
  uint64_t ios = 0;          // BlockIo records written (complete ones)
  uint64_t flushes = 0;      // of all BlockIo records, the flush requests
  uint64_t incomplete = 0;   // issued, no completion seen before the end
  uint64_t filtered = 0;     // issues of other pids
  // With process_tree: I/Os of processes outside the tree (not kernel
  // threads), counted and not recorded; and I/Os recorded although their
  // process had exited before it could be looked up.
  bool process_tree = false;
  uint64_t others = 0;
  uint64_t exited_unchecked = 0;
  uint64_t orphans = 0;      // completions whose issue was not seen
  uint64_t lost = 0;         // events the kernel dropped or overwrote
  uint64_t events = 0;       // events read
  // Completions that end a request the flush machinery ran (an empty
  // PREFLUSH bio from fdatasync, or the second completion of a PREFLUSH/FUA
  // write): no record of their own, the flush requests carry the time.
  uint64_t flush_seq_ends = 0;
  // Flush records that keep the issuing worker's pid: no flush-asking bio
  // was seen before their issue.
  uint64_t flush_unattributed = 0;
};

// The counts a user reads after a capture, one line, without a newline:
// "N I/Os (F flushes), I incomplete, O completions without issue, L events
// lost", then ", S of other pids skipped" when pids were filtered,
// "; K of other processes counted, not recorded" with process_tree, and
// "; U flushes keep the kernel worker's pid" when some could not be
// attributed.
std::string describe(const BlockCaptureStats& st, bool pid_filter);

// Records until duration_ns has passed or *stop becomes true (checked every
// 100 ms at most). `ready` is called once the events are enabled, before
// anything is recorded. Writes Meta("device", name), the BlockIo records and
// a Loss record if any events were lost.
BlockCaptureStats capture_block(const BlockCaptureOptions& opts, trace::Writer& out,
                                const std::atomic<bool>* stop = nullptr,
                                const std::function<void()>& ready = {});

}  // namespace tierlab::capture
