// fio-style I/O patterns, and the fio-style parsing of their rw names
// (sizes and durations: common/units.h).
//
//   PatternSpec spec;                       // defaults: randread, 4k, 1g, mix 50
//   spec.rw = parse_rw("randrw");
//   spec.bs = parse_size("--bs", "4k");
//   Pattern p(spec);                        // InputError if the spec is unusable
//   IoRequest r = p.next();                 // {op, offset, length}
//
// Offsets are multiples of bs within [offset, offset + size). Random patterns
// draw blocks uniformly with replacement (fio's norandommap); sequential ones
// walk the region from its start and wrap around. Mixed patterns (randrw,
// readwrite) make each I/O a read with probability rwmixread percent.
// next() is O(1), never allocates, and is deterministic for a seed.
#pragma once

#include "iosim/shaper.h"

#include <cstdint>
#include <string_view>

namespace tierlab::iosim {

enum class Rw : uint8_t { RandRead, RandWrite, Read, Write, RandRw, ReadWrite };

struct PatternSpec {
  Rw rw = Rw::RandRead;
  uint64_t bs = 4096;          // bytes per I/O
  uint64_t size = 1ull << 30;  // bytes of the region
  uint64_t offset = 0;         // start of the region
  unsigned rwmixread = 50;     // percent reads, mixed patterns only
  uint64_t seed = 1;
};

// "randread", "randwrite", "read", "write", "randrw", "readwrite" (or "rw");
// InputError listing the accepted names otherwise ("sideways: unknown
// pattern (known: ...)").
Rw parse_rw(std::string_view text);
std::string_view rw_name(Rw rw);

// Checks of one value each. The InputError starts with the value and says
// what is wrong with it ("0: must be at least 1 byte"); the caller, which
// knows where the value came from, puts that in front.
void check_bs(uint64_t bs);                    // 1 byte to 4 GiB - 1
void check_region(uint64_t size, uint64_t bs);  // at least one block
void check_rwmixread(unsigned percent);         // 0 to 100

// All of them, each message led by what the value is ("block size 0: must
// be at least 1 byte"): what Pattern's constructor checks.
void validate(const PatternSpec& spec);

class Pattern {
 public:
  explicit Pattern(const PatternSpec& spec);

  IoRequest next() {
    IoRequest r;
    r.length = static_cast<uint32_t>(bs_);
    switch (mix_) {
      case Mix::AllRead: r.op = IoOp::Read; break;
      case Mix::AllWrite: r.op = IoOp::Write; break;
      case Mix::Mixed: r.op = rng_.below(100) < rwmixread_ ? IoOp::Read : IoOp::Write; break;
    }
    if (random_) {
      r.offset = base_ + rng_.below(blocks_) * bs_;
    } else {
      r.offset = base_ + cursor_ * bs_;
      if (++cursor_ == blocks_) cursor_ = 0;
    }
    return r;
  }

  const PatternSpec& spec() const { return spec_; }

 private:
  enum class Mix : uint8_t { AllRead, AllWrite, Mixed };
  PatternSpec spec_;
  Rng rng_;
  Mix mix_ = Mix::AllRead;
  bool random_ = true;
  uint64_t bs_ = 0, base_ = 0, blocks_ = 0, cursor_ = 0;
  uint64_t rwmixread_ = 50;
};

}  // namespace tierlab::iosim
