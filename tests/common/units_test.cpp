// Sizes and durations: every spelling a flag or PostgreSQL setting uses, and
// one clear line for anything else.
#include "common/units.h"

#include "common/error.h"

#include <catch2/catch.hpp>

#include <string>

using namespace tierlab;

namespace {
constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024;
constexpr int64_t kUs = 1000, kMs = 1000 * kUs, kS = 1000 * kMs;
}  // namespace

TEST_CASE("sizes: bytes, and k, M, G, T as powers of 1024 in every spelling", "[units]") {
  CHECK(parse_size("--bs", "512") == 512);
  CHECK(parse_size("--bs", "0") == 0);
  CHECK(parse_size("--bs", "512B") == 512);
  CHECK(parse_size("--bs", "512b") == 512);
  for (const char* k : {"4k", "4K", "4kb", "4kB", "4KB", "4KiB", "4kib"}) {
    INFO(k);
    CHECK(parse_size("--bs", k) == 4 * KiB);
  }
  for (const char* m : {"64m", "64M", "64MB", "64mb", "64MiB"}) {
    INFO(m);
    CHECK(parse_size("--max-message-size", m) == 64 * MiB);
  }
  for (const char* g : {"1g", "1G", "1GB", "1GiB", "1gib"}) {
    INFO(g);
    CHECK(parse_size("--size", g) == GiB);
  }
  for (const char* t : {"2t", "2T", "2TB", "2TiB"}) {
    INFO(t);
    CHECK(parse_size("--size", t) == 2 * TiB);
  }
  CHECK(parse_size("--size", "18446744073709551615") == UINT64_MAX);
}

TEST_CASE("sizes: PostgreSQL's settings and spaces", "[units]") {
  CHECK(parse_size("meta setting.shared_buffers", "128MB") == 128 * MiB);
  CHECK(parse_size("meta setting.shared_buffers", "16384kB") == 16384 * KiB);
  CHECK(parse_size("meta setting.shared_buffers", "8kB") == 8 * KiB);
  CHECK(parse_size("--memory", " 512 MB ") == 512 * MiB);
  CHECK(parse_size("--memory", "8\tGB") == 8 * GiB);
}

TEST_CASE("sizes: fractions are rounded to the nearest byte", "[units]") {
  CHECK(parse_size("--size", "1.5m") == 1572864);
  CHECK(parse_size("--memory", "1.5G") == 3 * GiB / 2);
  CHECK(parse_size("--memory", ".5k") == 512);
  CHECK(parse_size("--memory", "2.") == 2);
  CHECK(parse_size("--bs", "1.3k") == 1331);  // 1331.2
  CHECK(parse_size("--bs", "0.7") == 1);
}

TEST_CASE("sizes: anything else is one line naming the flag and the text", "[units]") {
  CHECK_THROWS_WITH(parse_size("--bs", "4q"),
                    "--bs: '4q' is not a size (examples: 512, 4k, 1.5M, 2GiB; k, M, G, T are powers of 1024)");
  for (const char* bad : {"", " ", "lots", "3 parsecs", "4 k b", "-1", "+1", "1e3", ".", "1.2.3", "k", "4kk",
                          "0x10", "1,5k", "4p", "4KiBs"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(parse_size("--memory", bad), InputError);
    CHECK_THROWS_WITH(parse_size("--memory", bad), Catch::StartsWith("--memory: '" + std::string(bad) + "' is not a size"));
  }
  CHECK_THROWS_WITH(parse_size("--size", "18446744073709551616"),
                    "--size: '18446744073709551616' is too large (at most 2^64 - 1 bytes)");
  CHECK_THROWS_WITH(parse_size("--size", "16777216T"), Catch::EndsWith("is too large (at most 2^64 - 1 bytes)"));
  CHECK(parse_size("--size", "16777215T") == 16777215 * TiB);
}

TEST_CASE("durations: ns to hours, a bare number is seconds", "[units]") {
  CHECK(parse_duration("--runtime", "30") == 30 * kS);
  CHECK(parse_duration("--runtime", "10s") == 10 * kS);
  CHECK(parse_duration("--runtime", "500ms") == 500 * kMs);
  CHECK(parse_duration("--think", "250us") == 250 * kUs);
  CHECK(parse_duration("--think", "750ns") == 750);
  CHECK(parse_duration("--duration", "5m") == 300 * kS);
  CHECK(parse_duration("--duration", "5min") == 300 * kS);
  CHECK(parse_duration("--duration", "1h") == 3600 * kS);
  CHECK(parse_duration("--runtime", "10S") == 10 * kS);
  CHECK(parse_duration("--runtime", "500MS") == 500 * kMs);
  CHECK(parse_duration("--runtime", "2M") == 120 * kS);
  CHECK(parse_duration("--runtime", " 2 s ") == 2 * kS);
  CHECK(parse_duration("--think", "0") == 0);
}

TEST_CASE("durations: fractions are rounded to the nearest nanosecond", "[units]") {
  CHECK(parse_duration("--runtime", "1.5") == 1'500'000'000);
  CHECK(parse_duration("--runtime", "0.1s") == 100'000'000);
  CHECK(parse_duration("--runtime", ".25ms") == 250'000);
  CHECK(parse_duration("--runtime", "1.5h") == 5400 * kS);
  CHECK(parse_duration("--think", "0.4ns") == 0);
  CHECK(parse_duration("--think", "2.5us") == 2500);
}

TEST_CASE("durations: anything else is one line naming the flag and the text", "[units]") {
  CHECK_THROWS_WITH(parse_duration("--runtime", "ten"),
                    "--runtime: 'ten' is not a duration (examples: 30s, 500ms, 250us, 2m, 1h; a bare number is seconds)");
  for (const char* bad : {"", "10 parsecs", "-1", "-1s", "1e3", ".", "1.2.3", "s", "10sec", "1d", "5 m s", "1,5s",
                          "10µs"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH(parse_duration("--runtime", bad),
                      Catch::StartsWith("--runtime: '" + std::string(bad) + "' is not a duration"));
  }
  CHECK_THROWS_WITH(parse_duration("--runtime", "3000000h"),
                    "--runtime: '3000000h' is too long (at most 292 years)");
  CHECK_THROWS_AS(parse_duration("--runtime", "99999999999999999999"), InputError);
  CHECK(parse_duration("--runtime", "2000000h") == int64_t{2'000'000} * 3600 * kS);
}

TEST_CASE("durations: replay --begin/--end offsets from the trace start", "[units]") {
  // Every form these flags took before they shared this parser, and 0.
  CHECK(parse_duration("--begin", "0") == 0);
  CHECK(parse_duration("--begin", "30") == 30 * kS);
  CHECK(parse_duration("--begin", "1.5") == 1'500'000'000);
  CHECK(parse_duration("--begin", "5.") == 5 * kS);
  CHECK(parse_duration("--begin", "30s") == 30 * kS);
  CHECK(parse_duration("--end", "250ms") == 250 * kMs);
  CHECK(parse_duration("--end", "250us") == 250 * kUs);
  CHECK(parse_duration("--end", "90ns") == 90);
  CHECK(parse_duration("--end", "2m") == 120 * kS);
  CHECK(parse_duration("--end", "2min") == 120 * kS);
  CHECK(parse_duration("--end", "1h") == 3600 * kS);
  CHECK_THROWS_WITH(parse_duration("--end", "soon"), Catch::StartsWith("--end: 'soon' is not a duration"));
  CHECK_THROWS_WITH(parse_duration("--begin", "-1"), Catch::StartsWith("--begin: '-1' is not a duration"));
  CHECK_THROWS_AS(parse_duration("--begin", "5 parsecs"), InputError);
  CHECK_THROWS_AS(parse_duration("--begin", "inf"), InputError);
}

TEST_CASE("positive durations: zero is an error", "[units]") {
  CHECK(parse_positive_duration("--duration", "1ns") == 1);
  CHECK(parse_positive_duration("--sample-interval", "100ms") == 100 * kMs);
  CHECK_THROWS_WITH(parse_positive_duration("--duration", "0"), "--duration: '0' must be longer than 0");
  CHECK_THROWS_AS(parse_positive_duration("--duration", "0s"), InputError);
  CHECK_THROWS_AS(parse_positive_duration("--duration", "0.1ns"), InputError);
  CHECK_THROWS_WITH(parse_positive_duration("--duration", "soon"), Catch::Contains("is not a duration"));
}

TEST_CASE("format_bytes: B below 1 KiB, then one decimal in KiB to TiB", "[units]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1023.4) == "1023 B");
  CHECK(format_bytes(1023.6) == "1.0 KiB");  // never "1024 B"
  CHECK(format_bytes(1024) == "1.0 KiB");
  CHECK(format_bytes(8192) == "8.0 KiB");
  CHECK(format_bytes(1536.0 * 1024) == "1.5 MiB");
  CHECK(format_bytes(12345678) == "11.8 MiB");
  CHECK(format_bytes(1024.0 * MiB - 1) == "1.0 GiB");  // never "1024.0 MiB"
  CHECK(format_bytes(static_cast<double>(100 * GiB)) == "100.0 GiB");
  CHECK(format_bytes(static_cast<double>(2 * TiB)) == "2.0 TiB");
  CHECK(format_bytes(static_cast<double>(2048 * TiB)) == "2048.0 TiB");
  CHECK(format_bytes(static_cast<double>(UINT64_MAX)) == "16777216.0 TiB");
  CHECK(format_bytes(-5) == "0 B");
  // What it prints, parse_size reads back (to the precision shown).
  CHECK(parse_size("--size", format_bytes(1536.0 * 1024)) == 1536 * KiB);
}
