// The replay plan builder fed with the records of a decoded trace chunk
// (wrapped as in trace_chunk): no input may crash it.
#include "fuzz.h"

#include "replay/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tierlab::fuzz::Bytes in(data, size);
  uint8_t c = in.u8();
  auto bytes = tierlab::fuzz::trace_with_chunk(in.rest(), c & 0x7f, c & 0x80);
  tierlab::replay::PlanBuilder b;
  tierlab::fuzz::trace_roundtrip(bytes, [&](const tierlab::trace::Record& r) { b.add(r); });
  auto plan = b.finish();
  tierlab::fuzz::check(plan != nullptr, "PlanBuilder::finish returned no plan");
  for (uint32_t u : plan->session_units)
    tierlab::fuzz::check(u < plan->units.size(), "session_units index a unit");
  for (const auto& s : plan->sessions)
    tierlab::fuzz::check(uint64_t{s.first_unit} + s.n_units <= plan->session_units.size(),
                         "a session's units lie within session_units");
  return 0;
}
