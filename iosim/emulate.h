// A block device that behaves like a storage tier: `tierlab iosim emulate`.
//
// The image file is exported as the single file of a FUSE file system
// (libfuse3's low-level API) and a loop device is attached to that file with
// direct I/O. The page cache and the file system stay in the kernel above the
// loop device, so every request the emulator serves is one a volume would
// see: a read that missed the cache, writeback, a journal write, a flush.
// Each request is admitted by the tier's Shaper (iosim/shaper.h, the same
// rules as `iosim simulate` and `iosim run --tier`), its backing I/O goes to
// the image with O_DIRECT, and its reply is held until the tier's completion
// time, less the round trip the reply still travels (measured at start:
// round_trip_ns()). A flush (fsync of the FUSE file) is acknowledged only after the
// image's fdatasync, so nothing acknowledged is lost.
//
//   Emulator emu(tier, opts);           // mounted and attached, or throws
//   std::puts(emu.device().c_str());    // "/dev/loop3"
//   ... emu.take_interval() every second ...
//   emu.detach_loop();                  // at SIGINT/SIGTERM
//   while (!emu.loop_detached()) ...;   // a user may still have it mounted
//   emu.shutdown();                     // stops serving, unmounts
//
// One thread serves the device: it reads requests from /dev/fuse, puts
// their backing I/O in an io_uring and sends each reply at its time, so the
// requests in flight are bounded by the kernel's FUSE queue and the
// emulator's buffers, not by threads (iosim/emulate_serve.cpp). It runs
// with PR_SET_IO_FLUSHER, the process's memory is locked (mlockall) and
// every buffer is preallocated, so serving a request never waits on
// writeback of the device being served.
// The destructor cleans up whatever was set up (loop device, mount, mount
// point), also when the constructor fails half-way.
#pragma once

#include "common/histogram.h"
#include "iosim/shaper.h"
#include "tiers/tiers.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::iosim {

struct EmulateOptions {
  std::string image;   // the backing file
  uint64_t size = 0;   // grow or create the image to this many bytes; 0 = its size
  uint64_t seed = 1;   // the shaper's latency draws
};

// What the emulator served between two take_interval() calls (or since the
// start), as the tier sees it.
struct EmulateInterval {
  int64_t ns = 0;             // length of the interval
  uint64_t ios[3] = {0, 0, 0};     // requests served: read, write, flush (+ discard as write)
  uint64_t bytes[3] = {0, 0, 0};
  uint64_t counted_ios = 0;   // I/Os the tier counted against its caps
  int64_t throttled_ns = 0;   // time during which some I/O waited for tokens
  uint32_t queue_depth = 0;   // requests in flight at the end of the interval
  uint32_t max_queue_depth = 0;
  uint64_t slower_than_tier = 0;  // backing I/O finished after the tier's completion time
  uint64_t errors = 0;        // requests answered with an error
  Histogram lat;              // arrival to the reply reaching the reader (reply + round_trip_ns()), every request
};

// What the image's disk delivers, measured at start on a scratch file
// beside the image (written, synced, read with O_DIRECT, then removed):
// 4 KiB random reads at queue depth 1 (their p50) and 32 (their rate).
// Zeros when it could not be measured.
struct DiskFigures {
  int64_t read_p50_ns = 0;
  double read_iops = 0;
};

// Measures DiskFigures in `dir` within about half a second. Never throws:
// zeros, and `why` says what failed.
DiskFigures measure_disk(const std::string& dir, std::string* why = nullptr);

// "" when the emulator can hold `tier` on this disk; else one line: what the
// tier asks that is faster than the disk (read p50 below the disk's plus the
// emulator's round trip, an IOPS cap above the disk's rate at QD 32), and
// that such I/Os run at the machine's speed.
std::string faster_than_disk(const tiers::Tier& tier, const DiskFigures& disk, int64_t round_trip_ns);

// An emulator killed with SIGKILL leaves its FUSE mount behind (dead: its
// requests fail with ENOTCONN) and its mount point. Each emulator holds a
// lock beside its mount point (MOUNTPOINT.lock) while it lives; this removes
// (lazily unmounts, then deletes) every /run/tierlab-emulate.* and
// /tmp/tierlab-emulate.* whose lock is free, and returns a line for each.
// A loop device still open over a dead mount keeps failing its I/O until its
// last user closes it (it was attached with autoclear). The constructor
// calls it first.
std::vector<std::string> remove_stale_mounts();

class Emulator {
 public:
  // Checks the machine (root, /dev/fuse, /dev/loop-control), opens or
  // creates the image, mounts the FUSE file system on a fresh directory and
  // attaches a loop device with direct I/O. RuntimeError naming what is
  // missing or failed; InputError for a bad image or size.
  Emulator(const tiers::Tier& tier, const EmulateOptions& opts);
  ~Emulator();
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  const std::string& device() const;      // "/dev/loopN"
  const std::string& mountpoint() const;  // where the FUSE file system is
  uint64_t size() const;                  // bytes of the device
  uint32_t block_size() const;            // the loop device's logical block size
  const tiers::Tier& tier() const;
  // What a reader of the device waits beyond the emulator's own time for a
  // request (the loop device, the FUSE queue, the serving thread's
  // wake-up), measured
  // at start with reads held as a tier holds them. Replies leave this much
  // before the tier's completion time, so a reader sees the tier's latency;
  // a tier faster than this (plus the disk's time) runs at the machine's
  // speed instead.
  int64_t round_trip_ns() const;
  // The image's disk, measured at start (measure_disk).
  const DiskFigures& disk() const;
  // What remove_stale_mounts() removed at start, a line each.
  const std::vector<std::string>& leftovers() const;

  // What was served since the last call (the first: since the start).
  EmulateInterval take_interval();
  // Everything served since the start.
  EmulateInterval totals();

  // Asks the kernel to detach the loop device: at once when nobody else
  // has it open, else when its last user closes it (a mounted file system
  // keeps it). Requests are served until then.
  void detach_loop();
  // True once the loop device no longer serves the image.
  bool loop_detached() const;
  // Stops serving and unmounts the FUSE file system; a loop device still
  // attached then fails its I/O (EIO or ENOTCONN). Idempotent.
  void shutdown();

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace tierlab::iosim
