// The tier emulator's parts, shared by iosim/emulate*.cpp (not a public
// header: iosim/emulate.h is).
//
//   emulate.cpp         the Emulator: set-up, round trip, statistics, stop
//   emulate_serve.cpp   the FUSE file system and the thread that serves it
//   emulate_system.cpp  mount points and their locks, stale mounts, the
//                       loop device, the FUSE connection
//   emulate_disk.cpp    the image's disk (measure_disk, faster_than_disk)
#pragma once

#define FUSE_USE_VERSION 312
#include "iosim/emulate.h"

#include "common/realtime.h"

#include <fuse3/fuse_lowlevel.h>

#include <atomic>
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tierlab::iosim {

namespace emulate_detail {

constexpr fuse_ino_t kImageIno = 2;
constexpr const char* kImageName = "image";
constexpr const char* kLockSuffix = ".lock";
constexpr uint32_t kMaxRequest = 1u << 20;  // the largest read or write FUSE sends (max_write, max_pages)
constexpr uint32_t kMaxBackground = 256;    // requests the kernel keeps in flight to the emulator

struct Server;
struct ServerDeleter {
  void operator()(Server* v) const;
};

}  // namespace emulate_detail

struct Emulator::State {
  tiers::Tier tier;
  EmulateOptions opts;
  std::string device, mountpoint;
  uint64_t size = 0;
  uint32_t block_size = 512;
  int image_fd = -1;
  int loop_fd = -1;
  int loop_index = -1;
  bool loop_detach_asked = false;
  fuse_session* se = nullptr;
  bool mounted = false;

  // The shaper and the cumulative counters it keeps, under one lock (the
  // serving thread admits, take_interval() reads).
  std::mutex shaper_mu;
  Shaper shaper;

  // The serving thread, its ring, request slots and buffers
  // (emulate_serve.cpp).
  std::unique_ptr<emulate_detail::Server, emulate_detail::ServerDeleter> server;
  std::thread serve_thread;

  // Interval and total statistics.
  std::mutex stats_mu;
  EmulateInterval interval, total;
  int64_t interval_start = 0, start = 0;
  ShaperStats shaper_at_interval{};
  std::atomic<uint32_t> inflight{0};
  // The round trip a reader of the device sees beyond the emulator's own
  // arrival-to-reply time (loop device, FUSE queue, the serving thread's
  // wake-up, the timed wait's overshoot), measured at start: replies leave
  // this much before the tier's completion time, so the reader sees the
  // tier's.
  int64_t round_trip_ns = 0;
  DiskFigures disk;
  int lock_fd = -1;                     // MOUNTPOINT.lock, locked while this emulator lives
  long fuse_conn = -1;                  // the FUSE connection's number (/sys/fs/fuse/connections/N)
  std::vector<std::string> leftovers;   // what remove_stale_mounts() did at start
  // While measuring the round trip: requests bypass the shaper and the
  // statistics, and are replied at arrival + calibration_delay_ns.
  std::atomic<bool> calibrating{false};
  std::atomic<int64_t> calibration_served_ns{0};
  int64_t calibration_delay_ns = 0;
  CpuLatencyHold cpu_latency{true};  // idle CPUs wake at once: replies leave at the tier's time

  State(const tiers::Tier& t, const EmulateOptions& o) : tier(t), opts(o), shaper(t, o.seed) {}
  ~State();
};

namespace emulate_detail {

// --- emulate_serve.cpp ---
// The low-level operations of the one-file file system; the session's
// userdata is the State.
const fuse_lowlevel_ops& fuse_ops();
// Allocates and locks the request buffers and sets up the serving ring.
// RuntimeError naming what failed.
void make_server(Emulator::State& s);
// Starts the serving thread on the mounted session (s.se).
void start_serving(Emulator::State& s);
// Stops it: held replies leave at once, backing I/O in flight completes
// and is replied, requests not yet received stay with the kernel.
// Idempotent.
void stop_serving(Emulator::State& s);

// --- emulate_system.cpp ---
// RuntimeError naming `what` when `path` cannot be opened read-write.
void require_device(const char* path, const char* what);
// A fresh mount point, and beside it its lock file (MOUNT.lock, holding the
// pid), locked for the life of `lock_fd`.
std::string make_mountpoint(int& lock_fd);
// Attaches a free loop device with direct I/O to `file` (sets s.loop_fd,
// s.loop_index, s.device) and limits its requests to the tier's counting
// unit. RuntimeError naming what failed.
void attach_loop(Emulator::State& s, const std::string& file);
// The FUSE connection of the mount at `path`, from /proc/self/mountinfo;
// -1 if not found.
long fuse_connection(const std::string& path);
// Aborts FUSE connection `conn` (/sys/fs/fuse/connections/N/abort): every
// request waiting on it, and every later one, fails. False when it could
// not be done.
bool abort_connection(long conn);

}  // namespace emulate_detail
}  // namespace tierlab::iosim
