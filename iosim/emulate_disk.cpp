// The disk under the tier emulator's image: what it delivers, measured at
// start, and whether a tier asks for more.
#include "iosim/emulate.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/uring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tierlab::iosim {

DiskFigures measure_disk(const std::string& dir, std::string* why) {
  constexpr size_t kFile = 16u << 20, kChunk = 1u << 20, kRead = 4096;
  constexpr unsigned kDepth = 32;
  constexpr int64_t kPhaseNs = 150'000'000;
  DiskFigures out;
  auto fail = [&](const std::string& what, int e) {
    if (why) *why = errno_message(what, e);
    return DiskFigures{};
  };
  // An unnamed file where the file system has them, else a named one
  // removed at once: nothing is left behind either way.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string t = dir + "/.tierlab-disk-probe.XXXXXX";
    fd = ::mkostemp(t.data(), O_CLOEXEC);
    if (fd < 0) return fail("disk probe: creating a file in " + dir, errno);
    ::unlink(t.c_str());
    const int fl = ::fcntl(fd, F_GETFL);
    if (::fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) {
      const int e = errno;
      ::close(fd);
      return fail("disk probe: O_DIRECT in " + dir, e);
    }
  }
  void* mem = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return fail("disk probe: buffer", e);
  }
  char* buf = static_cast<char*>(mem);
  Rng rng(0x7465726c);
  for (size_t i = 0; i < kChunk; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(buf + i, &v, 8);
  }
  std::string err;
  int err_no = 0;
  for (size_t off = 0; off < kFile && err.empty(); off += kChunk)
    if (::pwrite(fd, buf, kChunk, off_t(off)) != ssize_t(kChunk)) err = "disk probe: writing", err_no = errno;
  if (err.empty() && ::fdatasync(fd) != 0) err = "disk probe: fdatasync", err_no = errno;
  const uint64_t blocks = kFile / kRead;
  // Queue depth 1: the p50 of a read.
  if (err.empty()) {
    std::vector<int64_t> lat;
    lat.reserve(400);
    const int64_t end = now_ns() + kPhaseNs;
    while (lat.size() < 400 && now_ns() < end) {
      const int64_t t0 = now_ns();
      if (::pread(fd, buf, kRead, off_t(rng.below(blocks) * kRead)) != ssize_t(kRead)) {
        err = "disk probe: reading", err_no = errno;
        break;
      }
      lat.push_back(now_ns() - t0);
    }
    if (!lat.empty()) {
      std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
      out.read_p50_ns = lat[lat.size() / 2];
    }
  }
  // Queue depth 32 through io_uring: the rate.
  if (err.empty()) {
    try {
      RingOptions ro;
      ro.entries = kDepth;
      Ring ring(ro);
      for (unsigned i = 0; i < kDepth; ++i) {
        io_uring_sqe* e = ring.sqe();
        io_uring_prep_read(e, fd, buf + size_t(i) * kRead, kRead, rng.below(blocks) * kRead);
        io_uring_sqe_set_data64(e, i);
      }
      const int64_t t0 = now_ns(), end = t0 + kPhaseNs;
      uint64_t done = 0;
      unsigned inflight = kDepth;
      io_uring_submit(ring.get());
      while (inflight > 0) {
        io_uring_cqe* cqe = nullptr;
        const int rc = io_uring_wait_cqe(ring.get(), &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) {
          err = "disk probe: io_uring", err_no = -rc;
          break;
        }
        const uint64_t slot = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(ring.get(), cqe);
        --inflight;
        if (res != int(kRead)) {
          if (err.empty()) err = "disk probe: reading at QD 32", err_no = res < 0 ? -res : EIO;
          continue;
        }
        ++done;
        if (err.empty() && now_ns() < end) {
          io_uring_sqe* e = ring.sqe();
          io_uring_prep_read(e, fd, buf + slot * kRead, kRead, rng.below(blocks) * kRead);
          io_uring_sqe_set_data64(e, slot);
          io_uring_submit(ring.get());
          ++inflight;
        }
      }
      const int64_t took = now_ns() - t0;
      if (err.empty() && took > 0) out.read_iops = double(done) * 1e9 / double(took);
    } catch (const std::exception& e) {
      err = std::string("disk probe: ") + e.what();
    }
  }
  ::munmap(mem, kChunk);
  ::close(fd);
  if (!err.empty()) {
    if (why) *why = err_no ? errno_message(err, err_no) : err;
    return DiskFigures{};
  }
  return out;
}

std::string faster_than_disk(const tiers::Tier& tier, const DiskFigures& disk, int64_t round_trip_ns) {
  std::string what;
  char b[200];
  const int64_t floor = disk.read_p50_ns + round_trip_ns;
  if (disk.read_p50_ns > 0 && tier.read.p50_ns < floor) {
    std::snprintf(b, sizeof b, "%s reads at a p50 of %.0f us, the image's disk and the emulator's round trip take %.0f us",
                  tier.name.c_str(), double(tier.read.p50_ns) / 1e3, double(floor) / 1e3);
    what = b;
  }
  double cap = 0;
  for (double c : {tier.total_iops, tier.read_iops, tier.burst.enabled() ? tier.burst.burst_iops : 0.0})
    if (c > 0 && (cap == 0 || c < cap)) cap = c;
  if (disk.read_iops > 0 && cap > disk.read_iops) {
    std::snprintf(b, sizeof b, "%s%s caps reads at %.0f IOPS, the image's disk delivers %.0f at queue depth 32",
                  what.empty() ? "" : "; ", what.empty() ? tier.name.c_str() : "it", cap, disk.read_iops);
    what += b;
  }
  if (what.empty()) return "";
  return "tier faster than the disk: " + what + " (measured at start); those I/Os run at the machine's speed";
}

}  // namespace tierlab::iosim
