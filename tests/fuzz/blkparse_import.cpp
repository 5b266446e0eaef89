// The blkparse text importer: input either imports or throws InputError,
// and what it writes reads back with one BlockIo per I/O it counted.
#include "fuzz.h"

#include "capture/import.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlab;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = 0;
  trace::Writer w(std::move(sink), wo);
  capture::ImportStats st;
  try {
    st = capture::import_blkparse(in, "fuzz.blktrace", w);
  } catch (const InputError&) {
    return 0;
  }
  w.close();
  trace::Reader r(trace::memory_source(mem->bytes(), "imported.tlt"));
  trace::Record rec;
  uint64_t n = 0;
  while (r.next(rec)) n += rec.kind() == trace::Kind::BlockIo;
  fuzz::check(n == st.ios, "one BlockIo per I/O", std::to_string(n) + " vs " + std::to_string(st.ios));
  return 0;
}
