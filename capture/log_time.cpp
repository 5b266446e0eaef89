// Timestamps as PostgreSQL logs them (%t, %m, %n, csvlog, jsonlog).
#include "capture/log_internal.h"
#include "common/clock.h"

#include <cctype>
#include <cstdint>

namespace tierlab::capture {
namespace logimpl {
namespace {

bool digits(std::string_view s, size_t pos, size_t n) {
  if (pos + n > s.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[pos + i]))) return false;
  return true;
}

int num(std::string_view s, size_t pos, size_t n) {
  int v = 0;
  for (size_t i = 0; i < n; ++i) v = v * 10 + (s[pos + i] - '0');
  return v;
}


bool tz_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-'; }

// Seconds whose nanoseconds (plus a fraction and a zone) fit in int64_t,
// from the epoch on, so that the distance between any two times fits too:
// years 1970 to 2261.
constexpr int64_t kMaxSecs = INT64_MAX / 1'000'000'000 - 86400;

}  // namespace

// Parses a timestamp at the start of `s`; sets `len` to the characters used.
// with_zone: a " ZONE" must follow (%t, %m, csvlog, jsonlog).
std::optional<int64_t> parse_time_prefix(std::string_view s, size_t& len, bool with_zone) {
  // "YYYY-MM-DD HH:MM:SS"
  if (!(digits(s, 0, 4) && s.size() >= 19 && s[4] == '-' && digits(s, 5, 2) && s[7] == '-' &&
        digits(s, 8, 2) && s[10] == ' ' && digits(s, 11, 2) && s[13] == ':' && digits(s, 14, 2) &&
        s[16] == ':' && digits(s, 17, 2)))
    return std::nullopt;
  int64_t days = days_from_civil(num(s, 0, 4), num(s, 5, 2), num(s, 8, 2));
  int64_t secs = days * 86400 + num(s, 11, 2) * 3600 + num(s, 14, 2) * 60 + num(s, 17, 2);
  int64_t ns = 0;
  size_t p = 19;
  if (p < s.size() && s[p] == '.') {
    ++p;
    int64_t scale = 100'000'000;
    while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
      ns += (s[p] - '0') * scale;
      scale /= 10;
      ++p;
    }
  }
  if (p < s.size() && s[p] == ' ' && p + 1 < s.size() && tz_char(s[p + 1])) {
    size_t q = p + 1;
    while (q < s.size() && tz_char(s[q])) ++q;
    std::string_view zone = s.substr(p + 1, q - p - 1);
    if ((zone[0] == '+' || zone[0] == '-') && zone.size() >= 3 && digits(zone, 1, 2)) {
      int off = num(zone, 1, 2) * 3600;
      if (zone.size() >= 5 && digits(zone, 3, 2)) off += num(zone, 3, 2) * 60;
      secs -= zone[0] == '+' ? off : -off;
    }
    p = q;
  } else if (with_zone) {
    return std::nullopt;
  }
  if (secs > kMaxSecs || secs < 0) return std::nullopt;
  len = p;
  return secs * 1'000'000'000 + ns;
}

// Seconds since the epoch, "1764758886.190" (%n).
std::optional<int64_t> parse_epoch_prefix(std::string_view s, size_t& len) {
  size_t p = 0;
  int64_t secs = 0;
  while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
    secs = secs * 10 + (s[p++] - '0');
    if (secs > kMaxSecs) return std::nullopt;
  }
  if (p == 0) return std::nullopt;
  int64_t ns = 0;
  if (p < s.size() && s[p] == '.') {
    ++p;
    int64_t scale = 100'000'000;
    while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
      ns += (s[p++] - '0') * scale;
      scale /= 10;
    }
  }
  len = p;
  return secs * 1'000'000'000 + ns;
}

}  // namespace logimpl

std::optional<int64_t> parse_log_time(std::string_view s) {
  size_t len = 0;
  if (auto t = logimpl::parse_time_prefix(s, len, false); t && len == s.size()) return t;
  if (auto t = logimpl::parse_epoch_prefix(s, len); t && len == s.size()) return t;
  return std::nullopt;
}

}  // namespace tierlab::capture
