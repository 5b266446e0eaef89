// The tiers-file parser: any JSON text either loads or throws InputError.
#include "fuzz.h"

#include "tiers/tiers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlab;
  auto cat = tiers::Catalog::builtin();
  try {
    cat.load_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const InputError&) {
    return 0;
  }
  for (const auto& t : cat.tiers()) fuzz::check(cat.find(t.name) != nullptr, "every tier is found by name");
  return 0;
}
