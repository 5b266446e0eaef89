#include "common/units.h"

#include "common/error.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

namespace tierlab {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// "1.5 MiB" as its whole part 1, fraction .5 and unit "mib" (lower case).
struct Quantity {
  uint64_t whole = 0;
  double frac = 0;
  std::string unit;
};

enum class Split { Ok, NotANumber, TooLarge };

Split split(std::string_view text, Quantity& q) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && is_digit(text[i])) ++i;
  std::string_view whole = text.substr(0, i);
  std::string_view frac;
  if (i < text.size() && text[i] == '.') {
    size_t f = ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
    frac = text.substr(f, i - f);
  }
  if (whole.empty() && frac.empty()) return Split::NotANumber;
  if (!whole.empty()) {
    auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), q.whole);
    if (ec == std::errc::result_out_of_range) return Split::TooLarge;
    if (ec != std::errc() || end != whole.data() + whole.size()) return Split::NotANumber;
  }
  if (!frac.empty()) q.frac = std::strtod(("0." + std::string(frac)).c_str(), nullptr);
  while (i < text.size() && is_space(text[i])) ++i;
  q.unit.clear();
  for (; i < text.size(); ++i) {
    char c = text[i];
    q.unit += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return Split::Ok;
}

// whole * unit + frac * unit, rounded; false on overflow of uint64_t.
bool scale(const Quantity& q, uint64_t unit, uint64_t& out) {
  uint64_t whole;
  if (__builtin_mul_overflow(q.whole, unit, &whole)) return false;
  auto part = static_cast<uint64_t>(std::llround(q.frac * static_cast<double>(unit)));
  return !__builtin_add_overflow(whole, part, &out);
}

struct Unit {
  std::string_view name;  // lower case; "" for a bare number
  uint64_t scale;
};

constexpr Unit kSizeUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
    {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
    {"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
    {"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
};

constexpr Unit kDurationUnits[] = {
    {"", 1'000'000'000},  // a bare number is seconds
    {"ns", 1},
    {"us", 1'000},
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"m", 60'000'000'000}, {"min", 60'000'000'000},
    {"h", 3'600'000'000'000},
};

// What a parser accepts and how it says no.
struct Syntax {
  std::span<const Unit> units;
  const char* not_this;   // " is not a size (examples: ...)"
  const char* too_large;  // " is too large (...)"
  uint64_t max;
};

std::string quoted(std::string_view flag, std::string_view text) {
  return std::string(flag) + ": '" + std::string(text) + "'";
}

uint64_t parse(std::string_view flag, std::string_view text, const Syntax& syntax) {
  Quantity q;
  Split s = split(text, q);
  if (s == Split::TooLarge) throw InputError(quoted(flag, text) + syntax.too_large);
  const Unit* unit = nullptr;
  if (s == Split::Ok)
    for (const Unit& u : syntax.units)
      if (u.name == q.unit) unit = &u;
  if (!unit) throw InputError(quoted(flag, text) + syntax.not_this);
  uint64_t v;
  if (!scale(q, unit->scale, v) || v > syntax.max) throw InputError(quoted(flag, text) + syntax.too_large);
  return v;
}

}  // namespace

uint64_t parse_size(std::string_view flag, std::string_view text) {
  static constexpr Syntax kSize{
      kSizeUnits,
      " is not a size (examples: 512, 4k, 1.5M, 2GiB; k, M, G, T are powers of 1024)",
      " is too large (at most 2^64 - 1 bytes)", UINT64_MAX};
  return parse(flag, text, kSize);
}

int64_t parse_duration(std::string_view flag, std::string_view text) {
  static constexpr Syntax kDuration{
      kDurationUnits,
      " is not a duration (examples: 30s, 500ms, 250us, 2m, 1h; a bare number is seconds)",
      " is too long (at most 292 years)", INT64_MAX};
  return static_cast<int64_t>(parse(flag, text, kDuration));
}

int64_t parse_positive_duration(std::string_view flag, std::string_view text) {
  int64_t ns = parse_duration(flag, text);
  if (ns == 0) throw InputError(quoted(flag, text) + " must be longer than 0");
  return ns;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = bytes > 0 ? bytes : 0;
  size_t u = 0;
  // Step up where the printed figure would reach 1024: 1023.6 B is "1.0 KiB",
  // not "1024 B".
  while (u + 1 < std::size(kUnits) && v >= (u == 0 ? 1023.5 : 1023.95)) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace tierlab
