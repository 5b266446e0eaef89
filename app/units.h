// Byte counts for a person to read in the CLI's summaries. Parsing sizes and
// durations is common/units.h.
#pragma once

#include <cstdint>
#include <string>

namespace tierlab::app {

// 12345678 -> "11.8 MiB": bytes for a person to read (B below 10 KiB, then
// KiB, MiB, GiB with one decimal).
std::string format_bytes(uint64_t b);

}  // namespace tierlab::app
