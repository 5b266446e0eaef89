// --start-at: the forms a shared start is written in, and one line for
// what is not one.
#include "common/clock.h"
#include "common/error.h"
#include "replay/start_at.h"

#include <catch2/catch.hpp>

using namespace tierlab;
using namespace tierlab::replay;

namespace {
constexpr int64_t kSec = 1'000'000'000;
// 2026-12-03T14:00:00Z, as date -u -d 2026-12-03T14:00:00Z +%s gives it.
constexpr int64_t kT = 1796306400LL * kSec;
}  // namespace

TEST_CASE("start-at: ISO 8601 with a zone, Unix seconds, and +DURATION from now", "[replay][start]") {
  CHECK(parse_start_at("--start-at", "2026-12-03T14:00:00Z", 0) == kT);
  CHECK(parse_start_at("--start-at", "2026-12-03 14:00:00z", 0) == kT);
  CHECK(parse_start_at("--start-at", "2026-12-03T15:00:00+01:00", 0) == kT);
  CHECK(parse_start_at("--start-at", "2026-12-03T15:30:00+0130", 0) == kT);
  CHECK(parse_start_at("--start-at", "2026-12-03T09:00:00-05", 0) == kT);
  CHECK(parse_start_at("--start-at", "2026-12-03T14:00:00.25Z", 0) == kT + kSec / 4);
  CHECK(parse_start_at("--start-at", "2026-12-03T14:00:00,000000001Z", 0) == kT + 1);
  CHECK(parse_start_at("--start-at", "2024-02-29T00:00:00Z", 0) == 1709164800LL * kSec);
  CHECK(parse_start_at("--start-at", "1970-01-01T00:00:00Z", 0) == 0);
  CHECK(parse_start_at("--start-at", "@1796306400", 0) == kT);
  CHECK(parse_start_at("--start-at", "@1796306400.5", 0) == kT + kSec / 2);
  CHECK(parse_start_at("--start-at", "+30s", kT) == kT + 30 * kSec);
  CHECK(parse_start_at("--start-at", "+2m", kT) == kT + 120 * kSec);
  CHECK(parse_start_at("--start-at", "+500ms", kT) == kT + kSec / 2);
  CHECK(format_realtime(kT + 5) == "2026-12-03T14:00:00.000000005Z");
  // What format_realtime prints reads back.
  const int64_t now = clock_ns(CLOCK_REALTIME);
  CHECK(parse_start_at("--start-at", format_realtime(now), 0) == now);
}

TEST_CASE("start-at: a time without a zone, or not a time, is refused naming the flag", "[replay][start]") {
  auto says = [](const char* text, const char* what) {
    try {
      parse_start_at("--start-at", text, 0);
      FAIL("accepted " << text);
    } catch (const InputError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.rfind(std::string("--start-at ") + text + ": ", 0) == 0);
      CHECK(m.find(what) != std::string::npos);
    }
  };
  says("2026-12-03T14:00:00", "no time zone");
  says("2026-12-03", "expected an ISO 8601 time");
  says("14:00", "expected an ISO 8601 time");
  says("2026-13-03T14:00:00Z", "no such date");
  says("2026-02-29T14:00:00Z", "no such date");
  says("2026-12-03T24:00:00Z", "no such time of day");
  says("2026-12-03T14:00:00+25:00", "no such zone offset");
  says("2026-12-03T14:00:00Zx", "expected an ISO 8601 time");
  says("@", "Unix seconds");
  says("@12x", "Unix seconds");
  says("soon", "expected an ISO 8601 time");
  CHECK_THROWS_AS(parse_start_at("--start-at", "+fast", 0), InputError);
}

TEST_CASE("start-at: the wait ends on the shared time and measures how late it began", "[replay][start]") {
  const int64_t start = clock_ns(CLOCK_REALTIME) + 50'000'000;  // 50 ms from now
  const char* why = nullptr;
  const int64_t epoch = wait_for_start(start, nullptr, &why);
  CHECK(why == nullptr);
  // It waits until 1 ms before the start (how much later it wakes depends on
  // the machine's load), and the epoch is the start on the monotonic clock.
  CHECK(clock_ns(CLOCK_REALTIME) >= start - 1'000'000);
  const int64_t off = start_offset(start, epoch);
  CHECK(off >= -1'000'000);  // clocks read apart: within a millisecond
  CHECK(off < 50'000'000);   // late by a wake-up, not by the wait (a loaded machine: generous)
  // A stop during the wait ends it at once.
  const int64_t later = clock_ns(CLOCK_REALTIME) + 60 * kSec;
  const int64_t t0 = clock_ns(CLOCK_MONOTONIC);
  CHECK(wait_for_start(later, [](long) -> const char* { return "SIGINT"; }, &why) == -1);
  CHECK(std::string(why) == "SIGINT");
  CHECK(clock_ns(CLOCK_MONOTONIC) - t0 < kSec);
  CHECK(realtime_clock_source().rfind("CLOCK_REALTIME, ", 0) == 0);
}
