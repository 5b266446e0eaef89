#include "common/error.h"

#include <cstring>

namespace tierlab {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace tierlab
