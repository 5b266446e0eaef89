// Whether the captured commits waited for the device.
#include "models/profile.h"

namespace tierlab::models {

std::string commit_durability_warning(const Profile& p) {
  std::string fsync, sync_commit;
  for (const auto& [name, value] : p.settings) {
    if (name == "fsync") fsync = value;
    else if (name == "synchronous_commit") sync_commit = value;
  }
  // fsync=off: PostgreSQL never asks for a flush; synchronous_commit=off: a
  // commit returns before its WAL is flushed (the WAL writer flushes later).
  // Either way the captured commit latency holds no device time to scale.
  std::string what;
  if (fsync == "off") what = "fsync=off";
  if (sync_commit == "off") what += what.empty() ? "synchronous_commit=off" : " and synchronous_commit=off";
  if (what.empty()) return "";
  return what +
         " at capture: commits did not wait for the device, so commit latency on other tiers is not projected "
         "(capture again with fsync and synchronous_commit on)";
}

}  // namespace tierlab::models
