// The blkparse text importer: input either imports or throws InputError,
// and what it writes reads back with one BlockIo per I/O it counted.
#include "fuzz.h"

#include "capture/import.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlab;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  fuzz::MemoryTrace t;
  capture::ImportStats st;
  try {
    st = capture::import_blkparse(in, "fuzz.blktrace", t.writer());
  } catch (const InputError&) {
    return 0;
  }
  const size_t n = t.close_and_dump(trace::Kind::BlockIo).size();
  fuzz::check(n == st.ios, "one BlockIo per I/O", std::to_string(n) + " vs " + std::to_string(st.ios));
  return 0;
}
