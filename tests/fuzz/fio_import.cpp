// The fio iolog importer (versions 2 and 3): input either imports or throws
// InputError; what it writes reads back with one BlockIo per I/O line; and
// an imported log exported as version 3 and imported again gives the same
// I/Os.
#include "fuzz.h"

#include "capture/import.h"

#include <sstream>

namespace {

using namespace tierlab;

std::vector<std::string> block_ios(std::vector<uint8_t> bytes, uint64_t* n = nullptr) {
  trace::Reader r(trace::memory_source(std::move(bytes), "imported.tlt"));
  std::vector<std::string> out;
  trace::Record rec;
  while (r.next(rec))
    if (rec.kind() == trace::Kind::BlockIo) out.push_back(fuzz::dump(rec));
  if (n) *n = out.size();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = 0;
  trace::Writer w(std::move(sink), wo);
  capture::ImportStats st;
  try {
    st = capture::import_fio_iolog(in, "fuzz.log", w);
  } catch (const InputError&) {
    return 0;
  }
  w.close();
  uint64_t n = 0;
  auto first = block_ios(mem->bytes(), &n);
  fuzz::check(n == st.ios, "one BlockIo per I/O line", std::to_string(n) + " vs " + std::to_string(st.ios));

  // Export as version 3 and import that again.
  trace::Reader r(trace::memory_source(mem->bytes(), "imported.tlt"));
  std::ostringstream v3;
  capture::write_fio_iolog_v3(r, v3);
  std::istringstream in2(v3.str());
  auto sink2 = std::make_unique<trace::MemorySink>();
  auto* mem2 = sink2.get();
  trace::Writer w2(std::move(sink2), wo);
  try {
    capture::import_fio_iolog(in2, "exported.log", w2);
  } catch (const InputError& e) {
    fuzz::fail("an exported iolog does not import", e.what() + std::string("\n") + v3.str());
  }
  w2.close();
  auto second = block_ios(mem2->bytes());
  fuzz::check(first.size() == second.size(), "export and import keep every I/O",
              std::to_string(first.size()) + " vs " + std::to_string(second.size()));
  return 0;
}
