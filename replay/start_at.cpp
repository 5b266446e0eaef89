#include "replay/start_at.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"

#include <sys/timex.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace tierlab::replay {
namespace {

constexpr int64_t kSec = 1'000'000'000;


struct Cursor {
  std::string_view s;
  size_t i = 0;
  bool digits(size_t n, int64_t* out) {
    if (i + n > s.size()) return false;
    int64_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      const char c = s[i + k];
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    i += n;
    return true;
  }
  bool eat(char c) {
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool done() const { return i == s.size(); }
};

}  // namespace

int64_t parse_start_at(std::string_view flag, std::string_view text, int64_t now_ns) {
  auto bad = [&](const std::string& why) -> InputError {
    return InputError(std::string(flag) + " " + std::string(text) + ": " + why);
  };
  if (!text.empty() && text[0] == '+') {
    const int64_t d = parse_duration(flag, text.substr(1));
    return now_ns + d;
  }
  if (!text.empty() && text[0] == '@') {
    Cursor c{text, 1};
    int64_t sec = 0, frac = 0, scale = kSec;
    size_t start = c.i;
    while (c.i < text.size() && text[c.i] >= '0' && text[c.i] <= '9' && c.i - start < 12)
      sec = sec * 10 + (text[c.i++] - '0');
    if (c.i == start) throw bad("expected @ and Unix seconds (date +%s)");
    if (c.eat('.'))
      while (c.i < text.size() && text[c.i] >= '0' && text[c.i] <= '9') {
        if (scale > 1) frac = frac * 10 + (text[c.i] - '0'), scale /= 10;
        ++c.i;
      }
    if (!c.done()) throw bad("expected @ and Unix seconds (date +%s)");
    return sec * kSec + frac * scale;
  }
  const std::string shape = "expected an ISO 8601 time with a zone (2026-12-03T14:00:00Z, +01:00), "
                            "@UNIX_SECONDS or +DURATION (+30s)";
  Cursor c{text};
  int64_t y, mo, d, h, mi, se;
  if (!(c.digits(4, &y) && c.eat('-') && c.digits(2, &mo) && c.eat('-') && c.digits(2, &d)))
    throw bad(shape);
  if (!(c.eat('T') || c.eat('t') || c.eat(' '))) throw bad(shape);
  if (!(c.digits(2, &h) && c.eat(':') && c.digits(2, &mi) && c.eat(':') && c.digits(2, &se))) throw bad(shape);
  static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] ||
      (mo == 2 && d == 29 && !(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))))
    throw bad("no such date");
  if (h > 23 || mi > 59 || se > 60) throw bad("no such time of day");
  int64_t frac = 0;
  if (c.eat('.') || c.eat(',')) {
    int64_t scale = kSec;
    size_t start = c.i;
    while (c.i < text.size() && text[c.i] >= '0' && text[c.i] <= '9') {
      if (scale > 1) frac = frac * 10 + (text[c.i] - '0'), scale /= 10;
      ++c.i;
    }
    if (c.i == start) throw bad(shape);
    frac *= scale;
  }
  int64_t zone = 0;  // seconds east of UTC
  if (c.eat('Z') || c.eat('z')) {
  } else if (c.i < text.size() && (text[c.i] == '+' || text[c.i] == '-')) {
    const int sign = text[c.i++] == '-' ? -1 : 1;
    int64_t zh = 0, zm = 0;
    if (!c.digits(2, &zh)) throw bad(shape);
    if (c.eat(':')) {
      if (!c.digits(2, &zm)) throw bad(shape);
    } else if (!c.done() && !c.digits(2, &zm)) {
      throw bad(shape);
    }
    if (zh > 23 || zm > 59) throw bad("no such zone offset");
    zone = sign * (zh * 3600 + zm * 60);
  } else if (c.done()) {
    throw bad("no time zone: add Z (UTC) or an offset such as +01:00, so that every host reads the same time");
  }
  if (!c.done()) throw bad(shape);
  const int64_t secs = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) * 86400 +
                       h * 3600 + mi * 60 + se - zone;
  if (secs < 0) throw bad("before 1970");
  return secs * kSec + frac;
}

std::string format_realtime(int64_t ns) {
  const time_t secs = static_cast<time_t>(ns / kSec);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, static_cast<long long>(ns % kSec));
  return buf;
}

std::string realtime_clock_source() {
  timex tx{};
  const int state = ::adjtimex(&tx);
  std::string s = "CLOCK_REALTIME, ";
  if (state < 0) return s + "synchronisation unknown (adjtimex: " + std::string(std::strerror(errno)) + ")";
  if (state == TIME_ERROR || (tx.status & STA_UNSYNC)) return s + "not synchronised (adjtimex: clock unsynchronised)";
  char buf[96];
  std::snprintf(buf, sizeof buf, "NTP synchronised, max error %.1f ms, estimated error %.1f ms",
                static_cast<double>(tx.maxerror) / 1e3, static_cast<double>(tx.esterror) / 1e3);
  return s + buf;
}

int64_t wait_for_start(int64_t start_realtime_ns, const std::function<const char*(long)>& wait_stop,
                       const char** stopped_by) {
  const int64_t wake = start_realtime_ns - 1'000'000;  // 1 ms for the threads to start
  for (;;) {
    const int64_t left = wake - clock_ns(CLOCK_REALTIME);
    if (left <= 0) break;
    const int64_t step = std::min<int64_t>(left, 50'000'000);
    if (wait_stop) {
      if (const char* why = wait_stop(static_cast<long>(step))) {
        *stopped_by = why;
        return -1;
      }
    } else {
      timespec ts{static_cast<time_t>(step / kSec), static_cast<long>(step % kSec)};
      ::nanosleep(&ts, nullptr);
    }
  }
  // The two clocks read back to back: the monotonic time of the start.
  const int64_t mono = now_ns();
  const int64_t real = clock_ns(CLOCK_REALTIME);
  return mono + (start_realtime_ns - real);
}

int64_t start_offset(int64_t start_realtime_ns, int64_t epoch_mono_ns) {
  sleep_until_ns(epoch_mono_ns);
  return clock_ns(CLOCK_REALTIME) - start_realtime_ns;
}

}  // namespace tierlab::replay
