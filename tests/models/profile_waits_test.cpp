// The profile's split of a transaction's time by wait class, from the
// pg_stat_activity counts `capture run` samples (capture/activity.h).
#include "models/profile_internal.h"

#include <catch2/catch.hpp>

using namespace tierlab::models;

TEST_CASE("profile: wait events go to their class", "[profile][waits]") {
  CHECK(wait_class("CPU", "running") == "cpu");
  CHECK(wait_class("Client", "ClientRead") == "client");
  CHECK(wait_class("IO", "DataFileRead") == "io");
  CHECK(wait_class("IO", "WALSync") == "commit");
  CHECK(wait_class("LWLock", "WALWrite") == "commit");
  CHECK(wait_class("LWLock", "BufferIO") == "io");
  CHECK(wait_class("LWLock", "BufferContent") == "lock");
  CHECK(wait_class("Lock", "transactionid") == "lock");
  CHECK(wait_class("IPC", "ProcArrayGroupUpdate") == "other");
}

TEST_CASE("profile: sampled waits split the mean latency by their shares", "[profile][waits]") {
  ActivitySamples a;
  // Two rounds of 8 backends in a transaction: 10 on the WAL, 4 on the
  // client, 1 on a lock, 1 running.
  for (int r = 0; r < 2; ++r) {
    a.add("pg.activity.backends", 8);
    a.add("pg.activity.LWLock.WALWrite", 3);
    a.add("pg.activity.IO.WALSync", 2);
    a.add("pg.activity.Client.ClientRead", 2);
    if (r == 0) a.add("pg.activity.Lock.transactionid", 1);
    else a.add("pg.activity.CPU.running", 1);
  }
  a.add("pg.blks_read", 5);  // not a wait: ignored
  Profile p;
  p.latency.mean_s = 0.016;
  profile_waits(p, a);
  CHECK(p.waits.rounds == 2);
  CHECK(p.waits.backends == 16);
  CHECK(p.waits.commit_s == Approx(0.016 * 10 / 16));
  CHECK(p.waits.client_s == Approx(0.016 * 4 / 16));
  CHECK(p.waits.lock_s == Approx(0.001));
  CHECK(p.waits.cpu_s == Approx(0.001));
  CHECK(p.waits.io_s == 0);
  CHECK(p.waits.source.find("pg_stat_activity, 2 rounds") == 0);
  // No samples: no split.
  Profile none;
  profile_waits(none, ActivitySamples{});
  CHECK(none.waits.rounds == 0);
}
