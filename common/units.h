// Sizes and durations as users write them on the command line and as
// PostgreSQL prints them: one syntax for every flag and setting. And byte
// counts as tierlab prints them for a person to read.
//
//   uint64_t bs = parse_size("--bs", "4k");                    // 4096
//   int64_t think = parse_duration("--think", "250us");        // 250000 ns
//   int64_t stop = parse_positive_duration("--duration", "5m");  // 0 is an error
//   std::string shown = format_bytes(12345678);                // "11.8 MiB"
//
// A value is a decimal number ("4", "1.5", ".5") with an optional unit,
// case-insensitive; spaces around the number and between number and unit are
// ignored ("512 MB", PostgreSQL's "16384kB"). Negative numbers and exponents
// are not accepted.
//
// Size units: b; k, kb, kib; m, mb, mib; g, gb, gib; t, tb, tib. Every one is
// a power of 1024, whichever spelling: "4k" = "4kB" = "4KiB" = 4096 (as fio's
// "4k" and PostgreSQL's "4kB"). A bare number is bytes. A fraction is rounded
// to the nearest byte ("1.5k" = 1536).
//
// Duration units: ns, us, ms, s, m or min (minutes), h. A bare number is
// seconds, as for fio's --runtime. Rounded to the nearest nanosecond.
//
// Bad input throws InputError as one line naming the flag (or setting) and
// the text: "--bs: '4q' is not a size (examples: 512, 4k, 1.5M, 2GiB; ...)".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tierlab {

// Bytes; InputError when `text` is not a size or is over 2^64 - 1 bytes.
uint64_t parse_size(std::string_view flag, std::string_view text);

// Nanoseconds, 0 or more; InputError when `text` is not a duration or is over
// about 292 years.
int64_t parse_duration(std::string_view flag, std::string_view text);

// As parse_duration, and InputError when the duration is 0 ns: for flags
// where zero makes no sense (stop after, sample every).
int64_t parse_positive_duration(std::string_view flag, std::string_view text);

// `bytes` for a person to read, in the units parse_size reads back: a whole
// number of B below 1 KiB, then KiB, MiB, GiB or TiB with one decimal
// ("512 B", "8.0 KiB", "11.8 MiB", "2.0 TiB"). A fraction is fine (an average
// per transaction); a negative value is printed as 0 B.
std::string format_bytes(double bytes);

}  // namespace tierlab
