#include "iosim/pattern.h"

#include "common/error.h"

#include <cctype>
#include <string>

namespace tierlab::iosim {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
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
  throw InputError(std::string(text) + ": unknown pattern (known: randread, randwrite, read, write, randrw, readwrite)");
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

void check_bs(uint64_t bs) {
  if (bs == 0) throw InputError("0: must be at least 1 byte");
  if (bs > UINT32_MAX) throw InputError(std::to_string(bs) + ": must be below 4 GiB");
}

void check_region(uint64_t size, uint64_t bs) {
  if (size < bs)
    throw InputError(std::to_string(size) + " bytes: must hold at least one block (" + std::to_string(bs) + " bytes)");
}

void check_rwmixread(unsigned percent) {
  if (percent > 100) throw InputError(std::to_string(percent) + ": must be a percentage from 0 to 100");
}

void validate(const PatternSpec& spec) {
  auto named = [](const char* what, auto check) {
    try {
      check();
    } catch (const InputError& e) {
      throw InputError(std::string(what) + " " + e.what());
    }
  };
  named("block size", [&] { check_bs(spec.bs); });
  named("region", [&] { check_region(spec.size, spec.bs); });
  named("rwmixread", [&] { check_rwmixread(spec.rwmixread); });
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
