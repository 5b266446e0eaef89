// Flag values with units, as the capture subcommands take them. Both throw
// InputError naming the flag and the value.
#pragma once

#include <cstdint>
#include <string>

namespace tierlab::app {

// "60s", "5m", "1h", "500ms", "250us", "90" (seconds) -> nanoseconds; must be positive.
int64_t parse_duration(const std::string& flag, const std::string& v);

// "1GiB", "64MB", "65536" -> bytes (k/M/G are powers of 1024).
uint64_t parse_size(const std::string& flag, const std::string& v);

// 12345678 -> "11.8 MiB": bytes for a person to read (B below 10 KiB, then
// KiB, MiB, GiB with one decimal).
std::string format_bytes(uint64_t b);

}  // namespace tierlab::app
