// The trace reader on whole files: bad input ends in InputError, and every
// record it reads comes back equal after a write and a read.
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  tierlab::fuzz::trace_roundtrip(bytes, [](const tierlab::trace::Record&) {});
  return 0;
}
