// The fio iolog importer (versions 2 and 3): input either imports or throws
// InputError; what it writes reads back with one BlockIo per I/O line; and
// an imported log exported as version 3 and imported again gives the same
// I/Os.
#include "fuzz.h"

#include "capture/import.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlab;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  fuzz::MemoryTrace t;
  capture::ImportStats st;
  try {
    st = capture::import_fio_iolog(in, "fuzz.log", t.writer());
  } catch (const InputError&) {
    return 0;
  }
  const auto first = t.close_and_dump(trace::Kind::BlockIo);
  fuzz::check(first.size() == st.ios, "one BlockIo per I/O line",
              std::to_string(first.size()) + " vs " + std::to_string(st.ios));

  // Export as version 3 and import that again.
  trace::Reader r(trace::memory_source(t.bytes(), "imported.tlt"));
  std::ostringstream v3;
  capture::write_fio_iolog_v3(r, v3);
  std::istringstream in2(v3.str());
  fuzz::MemoryTrace t2;
  try {
    capture::import_fio_iolog(in2, "exported.log", t2.writer());
  } catch (const InputError& e) {
    fuzz::fail("an exported iolog does not import", e.what() + std::string("\n") + v3.str());
  }
  const auto second = t2.close_and_dump(trace::Kind::BlockIo);
  fuzz::check(first.size() == second.size(), "export and import keep every I/O",
              std::to_string(first.size()) + " vs " + std::to_string(second.size()));
  return 0;
}
