// The trace reader on one chunk's payload: the input (after a byte giving
// the record count and the end flag) is wrapped as an uncompressed chunk
// with valid CRCs, so mutations reach the record decoder instead of failing
// the checksum. Same properties as trace_reader.
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tierlab::fuzz::Bytes in(data, size);
  uint8_t c = in.u8();
  auto bytes = tierlab::fuzz::trace_with_chunk(in.rest(), c & 0x7f, c & 0x80);
  tierlab::fuzz::trace_roundtrip(bytes, [](const tierlab::trace::Record&) {});
  return 0;
}
