#include "app/units.h"

#include <cinttypes>
#include <cstdio>

namespace tierlab::app {

std::string format_bytes(uint64_t b) {
  char buf[32];
  if (b < 10 * 1024)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  else if (b < 10ull * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else if (b < 10ull * 1024 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace tierlab::app
