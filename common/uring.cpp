#include "common/uring.h"

#include "common/error.h"

#include <cstdlib>

namespace tierlab {

bool use_uring(const std::string& asked, const char* env, const char* who, bool auto_uring,
               std::string (*missing)()) {
  const char* env_io = std::getenv(env);
  std::string io = env_io && *env_io ? env_io : asked;
  if (io != "auto" && io != "io_uring" && io != "epoll")
    throw InputError(std::string(env) + " " + io + ": expected auto, io_uring or epoll");
  if (io == "epoll") return false;
  if (io == "auto") return auto_uring && missing().empty();
  if (std::string why = missing(); !why.empty()) throw RuntimeError(std::string(who) + ": io_uring: " + why);
  return true;
}

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
