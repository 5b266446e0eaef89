// The profile is built in one pass in memory that does not grow with the
// trace's transactions or device I/O: the test binary's operator new counts
// the bytes live on the heap, and a stream ten times as long must not leave the
// builder holding more.
#include "models/profile.h"
// profile_alloc_test.cpp defines this binary's operator new replacements.
#define TIERLAB_ALLOC_COUNTER_READ_ONLY
#include "support/alloc_counter.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

using namespace tierlab;
using trace::Nanos;

namespace {

constexpr int kBackends = 64;

// `n` transactions over 64 backends, 100 per millisecond of the trace:
// each one autocommit SELECT whose backend reads one block while it runs
// (issued 250 us in, stamped so), recorded after the transaction's
// ReadyForQuery (as a capture records a block I/O, at its completion), and
// a background write every millisecond.
void feed(models::ProfileBuilder& b, uint64_t first, uint64_t n) {
  for (uint64_t i = first; i < first + n; ++i) {
    const uint64_t session = 1 + i % kBackends;
    const int32_t pid = static_cast<int32_t>(1000 + session);
    const Nanos t = static_cast<Nanos>(i) * 10'000;  // 10 us apart
    b.add({t, session, trace::Query{"SELECT abalance FROM pgbench_accounts WHERE aid = 7"}});
    b.add({t + 300'000, session, trace::Result{"SELECT", true, 1}});
    b.add({t + 300'000, session, trace::Ready{'I'}});
    b.add({t + 250'000, 0,
           trace::BlockIo{t + 350'000, 0x00fe00000, i * 8192 % (1u << 30), 8192, trace::IoOp::Read, 0, pid, 0}});
    if (i % 100 == 0)
      b.add({t, 0, trace::BlockIo{t + 100'000, 0x00fe00000, 2u << 30, 8192, trace::IoOp::Write, 0, 99, 0}});
  }
}

}  // namespace

TEST_CASE("profile: memory does not grow with the trace's transactions and I/O", "[profile][memory]") {
  models::ProfileOptions opts;
  opts.exact_pages = 1 << 12;  // the miss-ratio curve's own bound, small here
  models::ProfileBuilder b(opts);
  for (int s = 1; s <= kBackends; ++s)
    b.add({0, static_cast<uint64_t>(s), trace::SessionBegin{"u", "db", "app", "", 1000 + s, 0}});
  constexpr uint64_t kWarm = 20'000, kMore = 200'000;
  feed(b, 0, kWarm);
  const int64_t warm = tierlab::test::live_heap_bytes();
  feed(b, kWarm, kMore);
  const int64_t grown = tierlab::test::live_heap_bytes() - warm;
  // Held per millisecond of trace (2 ms of 100 transactions each): a few
  // bytes; per transaction or I/O record it would be tens of megabytes.
  INFO("heap grew by " << grown << " bytes over " << kMore << " more transactions");
  CHECK(grown < 512 * 1024);
  models::Profile p = b.finish("synthetic");
  CHECK(p.transactions == kWarm + kMore);
  // Every read was recorded after its transaction ended, and still counts as its.
  CHECK(p.reads_per_tx == Approx(1.0));
  CHECK(p.unattributed_backend_ios == 0);
  CHECK(p.quiet_transactions == 0);
  CHECK(p.background_writes_per_s == Approx(1000).epsilon(0.01));
}

TEST_CASE("profile: a backend's I/O recorded before or after its transaction's messages is still its", "[profile]") {
  // Transactions of 1 ms every 2 ms on backend 100; each reads one block
  // 0.5 ms in, recorded before the transaction's Query (every third), after
  // its ReadyForQuery (every third) or between them; and one read every
  // 10th gap, in no transaction. Backend 101's transactions of 0.2 ms end
  // 0.6 ms into each of 100's, recorded first: the transactions' span
  // already holds a read recorded before its transaction began.
  constexpr Nanos kMs = 1'000'000;
  models::ProfileBuilder b;
  b.add({0, 1, trace::SessionBegin{"u", "db", "app", "", 100, 0}});
  b.add({0, 2, trace::SessionBegin{"u", "db", "app", "", 101, 0}});
  auto read = [&](Nanos issue, uint64_t i) {
    b.add({issue, 0, trace::BlockIo{issue + kMs / 10, 0x00fe00000, i * 8192, 8192, trace::IoOp::Read, 0, 100, 0}});
  };
  constexpr int kTx = 300;
  for (int i = 0; i < kTx; ++i) {
    const Nanos t = kMs + 2 * kMs * i;
    b.add({t + kMs * 4 / 10, 2, trace::Query{"SELECT v FROM b"}});
    b.add({t + kMs * 6 / 10, 2, trace::Result{"SELECT", true, 1}});
    b.add({t + kMs * 6 / 10, 2, trace::Ready{'I'}});
    if (i % 3 == 0) read(t + kMs / 2, static_cast<uint64_t>(i));
    b.add({t, 1, trace::Query{"SELECT v FROM a"}});
    if (i % 3 == 1) read(t + kMs / 2, static_cast<uint64_t>(i));
    b.add({t + kMs, 1, trace::Result{"SELECT", true, 1}});
    b.add({t + kMs, 1, trace::Ready{'I'}});
    if (i % 3 == 2) read(t + kMs / 2, static_cast<uint64_t>(i));
    if (i % 10 == 5) read(t + kMs + kMs / 2, 100'000 + static_cast<uint64_t>(i));
  }
  models::Profile p = b.finish("synthetic");
  CHECK(p.transactions == 2 * kTx);
  REQUIRE(p.templates.size() == 2);
  for (const auto& t : p.templates) {
    INFO(t.text);
    CHECK(t.reads_per_tx == Approx(t.text == "select v from a" ? 1.0 : 0.0));
  }
  CHECK(p.reads_per_tx == Approx(0.5));
  CHECK(p.unattributed_backend_ios == kTx / 10);
  CHECK(p.quiet_transactions == kTx);
}
