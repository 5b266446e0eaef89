#include "common/uring.h"

namespace tierlab {

std::string uring_missing_op(io_uring& ring, std::initializer_list<std::pair<int, const char*>> ops) {
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  if (!probe) return "probing io_uring operations failed";
  std::string missing;
  for (const auto& [op, name] : ops)
    if (!io_uring_opcode_supported(probe, op)) {
      missing = std::string("io_uring operation ") + name + " not supported";
      break;
    }
  io_uring_free_probe(probe);
  return missing;
}

}  // namespace tierlab
