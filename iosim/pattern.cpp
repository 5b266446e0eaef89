#include "iosim/pattern.h"

#include "common/error.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

namespace tierlab::iosim {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "1.5ms" into 1.5 and "ms"; false if there is no number.
bool split_number(std::string_view text, double& value, std::string& unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  std::string num(text.substr(0, i));
  if (num.find_first_of("0123456789") == std::string::npos) return false;
  char* end = nullptr;
  value = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) return false;
  unit = lower(text.substr(i));
  return true;
}

}  // namespace

Rw parse_rw(std::string_view text) {
  auto s = lower(text);
  if (s == "randread") return Rw::RandRead;
  if (s == "randwrite") return Rw::RandWrite;
  if (s == "read") return Rw::Read;
  if (s == "write") return Rw::Write;
  if (s == "randrw") return Rw::RandRw;
  if (s == "readwrite" || s == "rw") return Rw::ReadWrite;
  throw InputError("--rw: unknown pattern \"" + std::string(text) +
                   "\" (known: randread, randwrite, read, write, randrw, readwrite)");
}

std::string_view rw_name(Rw rw) {
  switch (rw) {
    case Rw::RandRead: return "randread";
    case Rw::RandWrite: return "randwrite";
    case Rw::Read: return "read";
    case Rw::Write: return "write";
    case Rw::RandRw: return "randrw";
    case Rw::ReadWrite: return "readwrite";
  }
  return "?";
}

uint64_t parse_size(std::string_view text, std::string_view what) {
  double v = 0;
  std::string unit;
  auto bad = [&]() -> InputError {
    return InputError(std::string(what) + ": bad size \"" + std::string(text) +
                      "\" (expected a number with an optional k, m, g or t suffix, e.g. 4k, 1g)");
  };
  if (!split_number(text, v, unit)) throw bad();
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw bad();
  double bytes = v * mult;
  if (bytes > 1.8e19 || bytes != std::floor(bytes)) throw bad();
  return static_cast<uint64_t>(bytes);
}

Nanos parse_duration(std::string_view text, std::string_view what) {
  double v = 0;
  std::string unit;
  auto bad = [&]() -> InputError {
    return InputError(std::string(what) + ": bad duration \"" + std::string(text) +
                      "\" (expected e.g. 10s, 500ms, 250us, 2m; a bare number is seconds)");
  };
  if (!split_number(text, v, unit)) throw bad();
  double mult;
  if (unit.empty() || unit == "s") mult = 1e9;
  else if (unit == "ns") mult = 1;
  else if (unit == "us") mult = 1e3;
  else if (unit == "ms") mult = 1e6;
  else if (unit == "m" || unit == "min") mult = 60e9;
  else if (unit == "h") mult = 3600e9;
  else throw bad();
  double ns = v * mult;
  if (ns > 9.2e18) throw bad();
  return static_cast<Nanos>(std::llround(ns));
}

void validate(const PatternSpec& spec) {
  if (spec.bs == 0) throw InputError("--bs: must be at least 1 byte");
  if (spec.bs > UINT32_MAX) throw InputError("--bs: must be below 4 GiB");
  if (spec.size < spec.bs)
    throw InputError("--size: the region (" + std::to_string(spec.size) +
                     " bytes) must hold at least one block of --bs (" + std::to_string(spec.bs) + " bytes)");
  if (spec.rwmixread > 100) throw InputError("--rwmixread: must be a percentage from 0 to 100");
}

Pattern::Pattern(const PatternSpec& spec) : spec_(spec), rng_(spec.seed) {
  validate(spec);
  bs_ = spec.bs;
  base_ = spec.offset;
  blocks_ = spec.size / spec.bs;
  rwmixread_ = spec.rwmixread;
  switch (spec.rw) {
    case Rw::RandRead: mix_ = Mix::AllRead; random_ = true; break;
    case Rw::RandWrite: mix_ = Mix::AllWrite; random_ = true; break;
    case Rw::Read: mix_ = Mix::AllRead; random_ = false; break;
    case Rw::Write: mix_ = Mix::AllWrite; random_ = false; break;
    case Rw::RandRw: mix_ = Mix::Mixed; random_ = true; break;
    case Rw::ReadWrite: mix_ = Mix::Mixed; random_ = false; break;
  }
}

}  // namespace tierlab::iosim
