#include "common/uring.h"

#include "common/error.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tierlab {

namespace {

const char* flags_name(unsigned flags) {
  if (flags & IORING_SETUP_DEFER_TASKRUN) return "single issuer, deferred task work";
  if (flags & IORING_SETUP_COOP_TASKRUN) return "cooperative task work";
  return "plain";
}

}  // namespace

Ring::Ring(const RingOptions& o) {
  unsigned base = (o.submit_all ? IORING_SETUP_SUBMIT_ALL : 0) | (o.disabled ? IORING_SETUP_R_DISABLED : 0) |
                  (o.cq_entries ? IORING_SETUP_CQSIZE : 0);
  const unsigned flag = o.taskrun_flag ? IORING_SETUP_TASKRUN_FLAG : 0;
  unsigned tries[3];
  int ntries = 0;
  if (o.single_task) {
    tries[ntries++] = base | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | flag;
    if (o.fallback) {
      tries[ntries++] = base | IORING_SETUP_COOP_TASKRUN | flag;
      tries[ntries++] = base;
    }
  } else {
    tries[ntries++] = base;
  }
  int rc = -EINVAL;
  unsigned used = 0;
  for (int i = 0; i < ntries; ++i) {
    io_uring_params p{};
    p.flags = used = tries[i];
    p.cq_entries = o.cq_entries;
    rc = io_uring_queue_init_params(o.entries, &ring_, &p);
    if (rc == 0) {
      features_ = p.features;
      return;
    }
    if (rc != -EINVAL) break;
  }
  throw RuntimeError(errno_message(std::string("io_uring_queue_init (") + flags_name(used) + ")", -rc));
}

int Ring::enable() {
  // (liburing 2.3 declares io_uring_enable_rings but does not export it.)
  int rc = static_cast<int>(::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0));
  if (rc < 0) return -errno;
  // Spares the descriptor lookup in every io_uring_enter; optional.
  (void)io_uring_register_ring_fd(&ring_);
  return 0;
}

BufRing::BufRing(Ring& ring, uint16_t group, uint32_t count, uint32_t size)
    : ring_(ring), group_(group), count_(count), size_(size) {
  const size_t bytes = sizeof(io_uring_buf) * count;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (mem == MAP_FAILED) throw RuntimeError(errno_message("mmap of a provided buffer ring", errno));
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uint64_t>(mem);
  reg.ring_entries = count;
  reg.bgid = group;
  if (int rc = io_uring_register_buf_ring(ring.get(), &reg, 0); rc < 0) {
    munmap(mem, bytes);
    throw RuntimeError(errno_message("registering a provided buffer ring (Linux 5.19 or later)", -rc));
  }
  br_ = static_cast<io_uring_buf_ring*>(mem);
  io_uring_buf_ring_init(br_);
  mem_.reset(new uint8_t[static_cast<size_t>(count) * size]);
  held_ = count;
  for (uint32_t i = 0; i < count; ++i) give_back(i);
  publish();
}

BufRing::~BufRing() {
  io_uring_unregister_buf_ring(ring_.get(), group_);
  munmap(br_, sizeof(io_uring_buf) * count_);
}

const UringSupport& uring_support() {
  static const UringSupport s = [] {
    UringSupport r;
    try {
      RingOptions o;
      o.entries = 8;
      o.cq_entries = 16;
      o.single_task = true;
      Ring ring(o);
      r.ext_arg = (ring.features() & IORING_FEAT_EXT_ARG) != 0;
      r.ops = io_uring_get_probe_ring(ring.get());
      try {
        BufRing br(ring, 0, 2, 64);
      } catch (const RuntimeError& e) {
        r.buf_ring_error = e.what();
      }
    } catch (const RuntimeError& e) {
      r.setup_error = e.what();
    }
    return r;
  }();
  return s;
}

std::string uring_missing(const UringNeeds& need) {
  const UringSupport& s = uring_support();
  if (!s.setup_error.empty()) return s.setup_error;
  if (need.ext_arg && !s.ext_arg) return "io_uring_enter has no timeout argument (IORING_FEAT_EXT_ARG)";
  if (need.buf_ring && !s.buf_ring_error.empty()) return s.buf_ring_error;
  if (need.ops.size() && !s.ops) return "probing io_uring operations failed (IORING_REGISTER_PROBE, Linux 5.6 or later)";
  for (const auto& [op, name] : need.ops)
    if (!io_uring_opcode_supported(s.ops, op)) return std::string("io_uring operation ") + name + " not supported";
  return "";
}

bool use_uring(const std::string& io, const char* who, bool auto_uring, std::string (*missing)()) {
  if (io != "auto" && io != "io_uring" && io != "epoll") throw InputError(io + ": expected auto, io_uring or epoll");
  if (io == "epoll") return false;
  if (io == "auto") return auto_uring && missing().empty();
  if (std::string why = missing(); !why.empty()) throw RuntimeError(std::string(who) + ": io_uring: " + why);
  return true;
}

}  // namespace tierlab
