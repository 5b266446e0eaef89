// Reads per transaction at another memory size, or with the data grown,
// from the profile's miss-ratio curve (private to models/).
#pragma once

#include "models/profile.h"

#include <string>
#include <vector>

namespace tierlab::models {

// Reads per transaction at `memory` relative to the capture's, and the
// device reads per transaction that a smaller memory adds (`extra_reads`).
// With the data `growth` times larger, the cache of `memory` holds what
// memory / growth holds today: the curve is read there. `memory` 0: the
// capture's. Notes what it assumed; throws InputError when the profile has
// no curve or no capture memory to read it from.
double memory_factor(const Profile& p, double memory, double capture_memory, double growth,
                     std::vector<std::string>& notes, double& extra_reads);

}  // namespace tierlab::models
