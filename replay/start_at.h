// A start time shared by the processes of one sharded replay (--start-at):
// parsing it, waiting for it, and what this host's clock is worth.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tierlab::replay {

// `text` as a CLOCK_REALTIME time, ns since the Unix epoch:
//   2026-12-03T14:00:00Z, 2026-12-03T15:00:00.250+01:00 (ISO 8601 with a
//   zone: Z, +HH:MM, +HHMM or +HH; ' ' for 'T' is accepted);
//   @1796306400 or @1796306400.5 (Unix seconds, as date +%s prints them);
//   +30s, +2m, +500ms (from `now_ns`, a CLOCK_REALTIME reading).
// InputError naming `flag` and the text otherwise (a time without a zone
// included: the hosts of one replay need not share one).
int64_t parse_start_at(std::string_view flag, std::string_view text, int64_t now_ns);

// `realtime_ns` as ISO 8601 in UTC with nanoseconds: 2026-12-03T14:00:00.000000000Z.
std::string format_realtime(int64_t realtime_ns);

// What the start is measured with: "CLOCK_REALTIME", then what adjtimex(2)
// says of its synchronisation: "NTP synchronised, max error 16.5 ms" or
// "not synchronised (adjtimex: clock unsynchronised)".
std::string realtime_clock_source();

// Sleeps until 1 ms before `start_realtime_ns` (CLOCK_REALTIME), in steps
// that call `wait_stop` (when set) so that a stop is not held up; returns
// the CLOCK_MONOTONIC time of `start_realtime_ns`, or -1 when `wait_stop`
// reported a stop (*stopped_by then names it).
int64_t wait_for_start(int64_t start_realtime_ns, const std::function<const char*(long)>& wait_stop,
                       const char** stopped_by);

// Sleeps until `epoch_mono_ns` (CLOCK_MONOTONIC) and returns how far the
// realtime clock then is past `start_realtime_ns`: how late (> 0) this
// process began on the shared start.
int64_t start_offset(int64_t start_realtime_ns, int64_t epoch_mono_ns);

}  // namespace tierlab::replay
