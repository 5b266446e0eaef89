// The profile keeps what it needs of a capture's metadata, not one entry per
// session: the TLS record the capture proxy writes for each session
// (Meta "session.ID.tls") costs the profile nothing, however many sessions
// a capture has.
//
// Allocations are counted by support/alloc_counter.h, which replaces
// operator new/delete for the whole models unit test binary: this is the one
// file of the binary that includes it.
#include "models/profile.h"
#include "support/alloc_counter.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::models;

namespace {

// Allocations of adding `n` sessions' TLS metadata (the keys and values made
// beforehand) to a profile builder.
uint64_t allocations_of_tls_meta(ProfileBuilder& b, int n) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < n; ++i) {
    keys.push_back("session." + std::to_string(1000000 + i) + ".tls");
    values.push_back("client=TLSv1.3/TLS_AES_256_GCM_SHA384 server=TLSv1.3/TLS_AES_256_GCM_SHA384");
  }
  std::vector<trace::Record> recs;
  recs.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) recs.push_back(trace::Record{i, 0, trace::Meta{keys[i], values[i]}});
  const uint64_t before = test::allocations_this_thread();
  for (const auto& r : recs) b.add(r);
  return test::allocations_this_thread() - before;
}

}  // namespace

TEST_CASE("profile: a session's TLS metadata is not kept, however many sessions", "[profile][meta]") {
  ProfileBuilder b;
  b.add(trace::Record{0, 0, trace::Meta{"client_tls", "allow"}});
  CHECK(allocations_of_tls_meta(b, 10000) == 0);
  // Other metadata is still read: a setting reaches the profile.
  b.add(trace::Record{0, 0, trace::Meta{"setting.shared_buffers", "128MB"}});
  b.add(trace::Record{1, 1, trace::SessionBegin{"u", "d", "", "", 0, 0}});
  b.add(trace::Record{2, 1, trace::Query{"select 1"}});
  b.add(trace::Record{1'000'000'002, 1, trace::Ready{'I'}});
  const Profile p = b.finish("synthetic");
  CHECK(p.shared_buffers_bytes == 128.0 * 1024 * 1024);
}
