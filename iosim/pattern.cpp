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
