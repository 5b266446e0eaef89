#include "app/units.h"

#include "common/error.h"

#include <cinttypes>
#include <cstdio>

namespace tierlab::app {

// "60s", "5m", "1h", "500ms", "250us", "90" (seconds) -> nanoseconds.
int64_t parse_duration(const std::string& flag, const std::string& v) {
  size_t i = 0;
  while (i < v.size() && ((v[i] >= '0' && v[i] <= '9') || v[i] == '.')) ++i;
  if (i == 0) throw InputError(flag + " " + v + ": expected a duration such as 60s, 5m, 500ms");
  double n = std::stod(v.substr(0, i));
  std::string unit = v.substr(i);
  double mul;
  if (unit.empty() || unit == "s") mul = 1e9;
  else if (unit == "ms") mul = 1e6;
  else if (unit == "us") mul = 1e3;
  else if (unit == "m" || unit == "min") mul = 60e9;
  else if (unit == "h") mul = 3600e9;
  else throw InputError(flag + " " + v + ": unknown unit '" + unit + "' (us, ms, s, m, h)");
  if (n <= 0) throw InputError(flag + " " + v + ": must be positive");
  return static_cast<int64_t>(n * mul);
}

// "1GiB", "64MB", "65536" -> bytes.
uint64_t parse_size(const std::string& flag, const std::string& v) {
  size_t i = 0;
  while (i < v.size() && v[i] >= '0' && v[i] <= '9') ++i;
  if (i == 0 || i > 15) throw InputError(flag + " " + v + ": expected a size such as 1GiB or 64MB");
  uint64_t n = std::stoull(v.substr(0, i));
  std::string unit = v.substr(i);
  uint64_t mul;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "kB" || unit == "KB" || unit == "KiB" || unit == "k") mul = 1024;
  else if (unit == "MB" || unit == "MiB" || unit == "M") mul = 1024ull * 1024;
  else if (unit == "GB" || unit == "GiB" || unit == "G") mul = 1024ull * 1024 * 1024;
  else throw InputError(flag + " " + v + ": unknown unit '" + unit + "' (B, kB, MB, GB)");
  return n * mul;
}

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
