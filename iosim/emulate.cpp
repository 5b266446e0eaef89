// The tier emulator: a FUSE file over the image, a loop device over that
// file (iosim/emulate_internal.h names the parts).
#include "iosim/emulate_internal.h"

#include "common/clock.h"
#include "common/error.h"
#include "iosim/engine.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace tierlab::iosim {

using namespace emulate_detail;

namespace {

// The round trip is measured with reads held as long as the tier holds
// them (its read p50, within these bounds): how late the serving thread and
// the reader wake after a timed wait depends on its length. At most
// kCalibrationReads reads, at most kCalibrationNs in all.
constexpr int64_t kCalibrationMinDelayNs = 100'000;
constexpr int64_t kCalibrationMaxDelayNs = 5'000'000;
constexpr int64_t kCalibrationNs = 300'000'000;
constexpr int kCalibrationReads = 100;

// Measures the round trip (see State::round_trip_ns): reads of the device
// at queue depth 1, each held by the emulator for the tier's read p50
// (bounded); what the reader waited beyond what the emulator took is the
// round trip. The median of the reads. Returns 0 when the device cannot be
// read.
int64_t measure_round_trip(Emulator::State& s) {
  const size_t len = std::max<size_t>(4096, s.block_size);
  if (s.size < len) return 0;
  int fd = ::open(s.device.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return 0;
  void* buf = nullptr;
  if (::posix_memalign(&buf, len, len) != 0) {
    ::close(fd);
    return 0;
  }
  std::vector<int64_t> extra;
  extra.reserve(kCalibrationReads);
  const uint64_t blocks = s.size / len;
  s.calibration_delay_ns = std::clamp<int64_t>(s.tier.read.p50_ns, kCalibrationMinDelayNs, kCalibrationMaxDelayNs);
  const int reads = int(std::clamp<int64_t>(kCalibrationNs / s.calibration_delay_ns, 30, kCalibrationReads));
  s.calibrating.store(true, std::memory_order_release);
  for (int i = 0; i < reads; ++i) {
    const off_t off = off_t((uint64_t(i) * 7919 % blocks) * len);
    s.calibration_served_ns.store(-1, std::memory_order_release);
    const int64_t t0 = now_ns();
    const ssize_t n = ::pread(fd, buf, len, off);  // the emulator serves it
    const int64_t t1 = now_ns();
    const int64_t served = s.calibration_served_ns.load(std::memory_order_acquire);
    if (n == ssize_t(len) && served >= 0) extra.push_back(std::max<int64_t>(0, t1 - t0 - served));
  }
  s.calibrating.store(false, std::memory_order_release);
  std::free(buf);
  ::close(fd);
  if (extra.empty()) return 0;
  std::nth_element(extra.begin(), extra.begin() + extra.size() / 2, extra.end());
  return extra[extra.size() / 2];
}

}  // namespace

Emulator::State::~State() {
  if (loop_fd >= 0) {
    if (!loop_detach_asked) ::ioctl(loop_fd, LOOP_CLR_FD, 0);
    ::close(loop_fd);
  }
  stop_serving(*this);
  if (se) {
    if (mounted) fuse_session_unmount(se);
    fuse_session_destroy(se);
  }
  if (!mountpoint.empty()) {
    ::rmdir(mountpoint.c_str());
    ::unlink((mountpoint + kLockSuffix).c_str());
  }
  if (lock_fd >= 0) ::close(lock_fd);
  if (image_fd >= 0) ::close(image_fd);
}

Emulator::Emulator(const tiers::Tier& tier, const EmulateOptions& o) {
  if (::geteuid() != 0) throw RuntimeError("emulating a tier needs root (FUSE mount and loop device)");
  require_device("/dev/fuse", "FUSE");
  require_device("/dev/loop-control", "loop devices");
  auto s = std::make_unique<State>(tier, o);
  State& st = *s;

  // The image: opened with O_DIRECT, so its I/O never goes through the page cache.
  struct stat sb{};
  const bool exists = ::stat(o.image.c_str(), &sb) == 0;
  if (exists && !S_ISREG(sb.st_mode)) throw InputError(o.image + ": not a regular file");
  if (!exists && o.size == 0) throw InputError(o.image + ": does not exist (give a size to create it)");
  st.image_fd = ::open(o.image.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (st.image_fd < 0) throw InputError(errno_message(o.image, errno));
  st.block_size = uint32_t(std::max<uint64_t>(512, direct_io_alignment(o.image)));
  uint64_t size = exists ? uint64_t(sb.st_size) : 0;
  if (o.size > size) {
    if (::fallocate(st.image_fd, 0, 0, off_t(o.size)) != 0 && ::ftruncate(st.image_fd, off_t(o.size)) != 0)
      throw RuntimeError(errno_message(o.image + ": growing to " + std::to_string(o.size) + " bytes", errno));
    size = o.size;
  }
  size -= size % st.block_size;
  if (size == 0) throw InputError(o.image + ": is empty (give a size)");
  st.size = size;

  // The disk under the image, before the emulator adds its own load.
  const size_t slash = o.image.rfind('/');
  st.disk = measure_disk(slash == std::string::npos ? "." : slash == 0 ? "/" : o.image.substr(0, slash));

  // The serving thread's buffers and ring, then every page of the process
  // locked (future ones as they are touched: thread stacks stay as small
  // as they are used).
  make_server(st);
  if (::mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0)
    throw RuntimeError(errno_message("mlockall (the emulator must not be paged out)", errno));

  // The FUSE file system, served by one thread.
  st.leftovers = remove_stale_mounts();
  st.mountpoint = make_mountpoint(st.lock_fd);
  char arg0[] = "tierlab";
  char* argv[] = {arg0, nullptr};
  fuse_args args = FUSE_ARGS_INIT(1, argv);
  st.se = fuse_session_new(&args, &fuse_ops(), sizeof(fuse_lowlevel_ops), &st);
  if (!st.se) throw RuntimeError("FUSE: cannot create a session (libfuse3)");
  if (fuse_session_mount(st.se, st.mountpoint.c_str()) != 0)
    throw RuntimeError("FUSE: cannot mount on " + st.mountpoint);
  st.mounted = true;
  st.fuse_conn = fuse_connection(st.mountpoint);
  start_serving(st);

  // The loop device, direct I/O on the FUSE file.
  attach_loop(st, st.mountpoint + "/" + kImageName);
  st.round_trip_ns = measure_round_trip(st);
  st.start = st.interval_start = now_ns();
  s_ = std::move(s);
}

Emulator::~Emulator() = default;

const std::string& Emulator::device() const { return s_->device; }
const std::string& Emulator::mountpoint() const { return s_->mountpoint; }
uint64_t Emulator::size() const { return s_->size; }
uint32_t Emulator::block_size() const { return s_->block_size; }
const tiers::Tier& Emulator::tier() const { return s_->tier; }
int64_t Emulator::round_trip_ns() const { return s_->round_trip_ns; }
const DiskFigures& Emulator::disk() const { return s_->disk; }
const std::vector<std::string>& Emulator::leftovers() const { return s_->leftovers; }

EmulateInterval Emulator::take_interval() {
  ShaperStats ss;
  {
    std::lock_guard<std::mutex> g(s_->shaper_mu);
    ss = s_->shaper.stats();
  }
  std::lock_guard<std::mutex> g(s_->stats_mu);
  EmulateInterval out = s_->interval;
  const int64_t now = now_ns();
  out.ns = now - s_->interval_start;
  out.counted_ios = ss.counted_ios - s_->shaper_at_interval.counted_ios;
  out.throttled_ns = ss.throttled_ns - s_->shaper_at_interval.throttled_ns;
  out.queue_depth = s_->inflight.load();
  s_->shaper_at_interval = ss;
  s_->interval_start = now;
  s_->interval = EmulateInterval{};
  return out;
}

EmulateInterval Emulator::totals() {
  ShaperStats ss;
  {
    std::lock_guard<std::mutex> g(s_->shaper_mu);
    ss = s_->shaper.stats();
  }
  std::lock_guard<std::mutex> g(s_->stats_mu);
  EmulateInterval out = s_->total;
  out.ns = now_ns() - s_->start;
  out.counted_ios = ss.counted_ios;
  out.throttled_ns = ss.throttled_ns;
  out.queue_depth = s_->inflight.load();
  return out;
}

void Emulator::detach_loop() {
  State& st = *s_;
  if (st.loop_fd < 0 || st.loop_detach_asked) return;
  // With other users the kernel defers the detach to the last close
  // (autoclear, set at attach); ours is closed right after.
  ::ioctl(st.loop_fd, LOOP_CLR_FD, 0);
  st.loop_detach_asked = true;
  ::close(st.loop_fd);
  st.loop_fd = -1;
}

bool Emulator::loop_detached() const {
  const State& st = *s_;
  if (st.loop_index < 0) return true;
  if (st.loop_fd >= 0) return false;
  const std::string f = "/sys/block/loop" + std::to_string(st.loop_index) + "/loop/backing_file";
  return ::access(f.c_str(), F_OK) != 0;
}

void Emulator::shutdown() {
  State& st = *s_;
  detach_loop();
  if (st.se && st.mounted) {
    stop_serving(st);  // held replies leave now
    // A loop device still attached keeps the FUSE file open, and with it the
    // connection: abort it, so that its I/O fails instead of waiting
    // forever. (libfuse leaves an aborted connection's mount alone: unmount
    // it here.)
    if (!loop_detached() && abort_connection(st.fuse_conn)) ::umount2(st.mountpoint.c_str(), MNT_DETACH);
    fuse_session_unmount(st.se);
    st.mounted = false;
  }
  stop_serving(st);
  if (!st.mountpoint.empty()) {
    ::rmdir(st.mountpoint.c_str());
    ::unlink((st.mountpoint + kLockSuffix).c_str());
    st.mountpoint.clear();
  }
}

}  // namespace tierlab::iosim
