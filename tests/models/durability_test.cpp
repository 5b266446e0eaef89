// Whether a capture's commits waited for the device: the warning profile
// and project print first.
#include "models/profile.h"

#include <catch2/catch.hpp>

using tierlab::models::commit_durability_warning;
using tierlab::models::Profile;

TEST_CASE("durability: fsync or synchronous_commit off at capture is named", "[profile][durability]") {
  Profile p;
  CHECK(commit_durability_warning(p).empty());  // a trace without settings says nothing
  p.settings = {{"fsync", "on"}, {"synchronous_commit", "on"}};
  CHECK(commit_durability_warning(p).empty());
  p.settings = {{"fsync", "off"}, {"synchronous_commit", "on"}};
  CHECK(commit_durability_warning(p).rfind("fsync=off at capture: commits did not wait for the device", 0) == 0);
  CHECK(commit_durability_warning(p).find("commit latency on other tiers is not projected") != std::string::npos);
  p.settings = {{"fsync", "on"}, {"synchronous_commit", "off"}};
  CHECK(commit_durability_warning(p).rfind("synchronous_commit=off at capture", 0) == 0);
  p.settings = {{"fsync", "off"}, {"synchronous_commit", "off"}};
  CHECK(commit_durability_warning(p).rfind("fsync=off and synchronous_commit=off at capture", 0) == 0);
  // Values that still wait for the local flush.
  for (const char* v : {"local", "remote_write", "remote_apply"}) {
    p.settings = {{"fsync", "on"}, {"synchronous_commit", v}};
    CHECK(commit_durability_warning(p).empty());
  }
}
