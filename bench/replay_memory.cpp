// Benchmark driver for bench/replay-memory: writes a synthetic pgbench-like
// trace of a given length with the trace library, for the script to replay
// and profile while it measures their memory.
//
//   tierlab_bench_replay_memory OUT.tlt STATEMENTS [SESSIONS]
//
// SESSIONS (64 by default) sessions open together at the start and run
// until their share of STATEMENTS is done, then end. Each statement is one
// extended-protocol unit as pgbench -M prepared sends it: Bind (text
// parameters), Execute, Sync; its answer (CommandComplete, ReadyForQuery
// 'I') comes 50-200 us later and the session's next statement 5-30 us after
// that. Nine statements in ten are pgbench -S's SELECT of one account; the
// tenth an autocommit UPDATE of one account's balance (a commit point for
// replay --sync commit). Each session prepares both statements first
// (Parse, Sync). Accounts are 1..100000, as pgbench -i -s 1 loads them.
// Records are written in time order across sessions, as a capture writes
// them. Prints the records and bytes written.
#include "trace/writer.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <queue>
#include <random>
#include <string>
#include <vector>

using namespace tierlab::trace;

namespace {

constexpr const char* kSelect = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";
constexpr const char* kUpdate = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2;";

// A session's next event: its next send, or the answer to its last one.
struct Event {
  Nanos ts;
  uint32_t session;
  bool answer;
  bool operator>(const Event& o) const { return ts != o.ts ? ts > o.ts : session > o.session; }
};

bool parse_count(const char* s, uint64_t& out) {
  const char* end = s + std::char_traits<char>::length(s);
  auto [p, ec] = std::from_chars(s, end, out);
  return ec == std::errc() && p == end && out > 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t statements = 0, sessions = 64;
  if (argc < 3 || argc > 4 || !parse_count(argv[2], statements) || (argc == 4 && !parse_count(argv[3], sessions)) ||
      sessions > 100000) {
    std::fprintf(stderr, "usage: %s OUT.tlt STATEMENTS [SESSIONS]  (counts above 0, SESSIONS up to 100000)\n",
                 argv[0]);
    return 2;
  }
  try {
    auto w = open_writer(argv[1]);
    std::mt19937_64 rng(42);
    const Nanos t0 = 1'000'000'000;  // 1 s after the trace's clock origin
    static const uint32_t int4[] = {23};
    static const uint32_t int4x2[] = {23, 23};
    std::vector<uint64_t> left(sessions);
    std::vector<bool> update(sessions, false);
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
    for (uint32_t s = 0; s < sessions; ++s) {
      const uint64_t id = s + 1;
      left[s] = statements / sessions + (s < statements % sessions ? 1 : 0);
      // Every session starts before the first statement (t0 + 10 ms), so
      // that its records stay in time order.
      const Nanos begin = t0 + static_cast<Nanos>(s) * 10'000'000 / static_cast<Nanos>(sessions + 1);
      w->write(begin, id, SessionBegin{"postgres", "postgres", "pgbench", "127.0.0.1:40000",
                                       static_cast<int32_t>(10000 + s), 0});
      w->write(begin + 100, id, Parse{"P0_1", kSelect, int4});
      w->write(begin + 100, id, Parse{"P0_2", kUpdate, int4x2});
      w->write(begin + 100, id, Sync{});
      w->write(begin + 200, id, Ready{'I'});
      events.push(Event{t0 + 10'000'000 + static_cast<Nanos>(s) * 1'000, s, false});
    }
    char aid[24], delta[24];
    Param params[2];
    while (!events.empty()) {
      const Event e = events.top();
      events.pop();
      const uint64_t id = e.session + 1;
      if (e.answer) {
        w->write(e.ts, id, Result{update[e.session] ? "UPDATE" : "SELECT", true, 1});
        w->write(e.ts, id, Ready{'I'});
        if (--left[e.session] == 0) {
          w->write(e.ts, id, SessionEnd{});
          continue;
        }
        events.push(Event{e.ts + 5'000 + static_cast<Nanos>(rng() % 25'001), e.session, false});
        continue;
      }
      const bool upd = rng() % 10 == 0;
      update[e.session] = upd;
      auto [a_end, a_ec] = std::to_chars(aid, aid + sizeof aid, 1 + rng() % 100'000);
      (void)a_ec;
      const std::string_view aid_v(aid, static_cast<size_t>(a_end - aid));
      if (upd) {
        auto [d_end, d_ec] = std::to_chars(delta, delta + sizeof delta, static_cast<int64_t>(rng() % 10'001) - 5'000);
        (void)d_ec;
        params[0] = Param{0, false, std::string_view(delta, static_cast<size_t>(d_end - delta))};
        params[1] = Param{0, false, aid_v};
        w->write(e.ts, id, Bind{"", "P0_2", std::span<const Param>(params, 2), {}});
      } else {
        params[0] = Param{0, false, aid_v};
        w->write(e.ts, id, Bind{"", "P0_1", std::span<const Param>(params, 1), {}});
      }
      w->write(e.ts, id, Execute{"", 0});
      w->write(e.ts, id, Sync{});
      events.push(Event{e.ts + 50'000 + static_cast<Nanos>(rng() % 150'001), e.session, true});
    }
    w->close();
    std::printf("records %llu bytes %llu\n", static_cast<unsigned long long>(w->records_written()),
                static_cast<unsigned long long>(w->bytes_written()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
