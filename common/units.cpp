#include "common/units.h"

#include "common/error.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
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

std::string quoted(std::string_view flag, std::string_view text) {
  return std::string(flag) + ": '" + std::string(text) + "'";
}

}  // namespace

uint64_t parse_size(std::string_view flag, std::string_view text) {
  auto bad = [&] {
    return InputError(quoted(flag, text) +
                      " is not a size (examples: 512, 4k, 1.5M, 2GiB; k, M, G, T are powers of 1024)");
  };
  auto too_large = [&] { return InputError(quoted(flag, text) + " is too large (at most 2^64 - 1 bytes)"); };
  Quantity q;
  switch (split(text, q)) {
    case Split::Ok: break;
    case Split::NotANumber: throw bad();
    case Split::TooLarge: throw too_large();
  }
  const std::string& u = q.unit;
  uint64_t unit;
  if (u.empty() || u == "b") unit = 1;
  else if (u == "k" || u == "kb" || u == "kib") unit = 1ull << 10;
  else if (u == "m" || u == "mb" || u == "mib") unit = 1ull << 20;
  else if (u == "g" || u == "gb" || u == "gib") unit = 1ull << 30;
  else if (u == "t" || u == "tb" || u == "tib") unit = 1ull << 40;
  else throw bad();
  uint64_t bytes;
  if (!scale(q, unit, bytes)) throw too_large();
  return bytes;
}

int64_t parse_duration(std::string_view flag, std::string_view text) {
  auto bad = [&] {
    return InputError(quoted(flag, text) +
                      " is not a duration (examples: 30s, 500ms, 250us, 2m, 1h; a bare number is seconds)");
  };
  auto too_long = [&] { return InputError(quoted(flag, text) + " is too long (at most 292 years)"); };
  Quantity q;
  switch (split(text, q)) {
    case Split::Ok: break;
    case Split::NotANumber: throw bad();
    case Split::TooLarge: throw too_long();
  }
  const std::string& u = q.unit;
  uint64_t unit;
  if (u.empty() || u == "s") unit = 1'000'000'000;
  else if (u == "ns") unit = 1;
  else if (u == "us") unit = 1'000;
  else if (u == "ms") unit = 1'000'000;
  else if (u == "m" || u == "min") unit = 60'000'000'000;
  else if (u == "h") unit = 3'600'000'000'000;
  else throw bad();
  uint64_t ns;
  if (!scale(q, unit, ns) || ns > static_cast<uint64_t>(INT64_MAX)) throw too_long();
  return static_cast<int64_t>(ns);
}

int64_t parse_positive_duration(std::string_view flag, std::string_view text) {
  int64_t ns = parse_duration(flag, text);
  if (ns == 0) throw InputError(quoted(flag, text) + " must be longer than 0");
  return ns;
}

}  // namespace tierlab
