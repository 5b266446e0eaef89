// Private to replay/: the commit order that replay --sync keeps across
// sessions (see Plan::commits, Unit::sync_need and Unit::sync_dep).
//
// Commit points are numbered in capture order. When one completes in the
// replay (its unit's answer came, or its session ended or failed before
// it: a commit that cannot come counts as done at once) its flag is set;
// done() is the length of the prefix of flags set, which only grows. A
// unit waits until done() reaches its sync_need and the flag of each
// commit point it lists (Tables::sync_deps) is set. Marking is lock-free and
// allocates nothing: one flag set, one exchange of the point's watchers,
// and a compare-and-swap per commit point the prefix passes. The flags are
// a bitset (a bit per commit point), and the watchers kWatchSlots masks
// that the commit points share (point i's are slot i % kWatchSlots): memory
// does not grow past one bit per commit point, and a worker that a
// completion signals for another point of its slot watches again.
//
// Waking: each worker that has units waiting for the prefix publishes the
// least need among them (Waiter::need); one whose unit waits for a listed
// commit point adds itself to that point's watchers (watch()). Each worker
// watches its Waiter::fd (an eventfd) on its loop. A worker that moves the
// prefix writes to the eventfd of each other worker whose least need it
// reached, and one that completes a point to that of each of the point's
// watchers, once until that worker reads it (Waiter::signalled), so
// nothing spins and a wake costs one write.
//
// Invariant (no lost wake-up): a worker publishes its need, or adds
// itself to a point's watchers, and then reads done() or the point's flag;
// a marker moves done() and then reads the needs, or sets the flag and
// then takes the watchers, all sequentially consistent. Either the worker
// sees the commit or the marker sees the worker and signals.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace tierlab::replay::detail {

struct alignas(64) Waiter {
  int fd = -1;                              // eventfd the worker's loop watches
  std::atomic<uint64_t> need{UINT64_MAX};   // least sync_need waiting; MAX: none
  std::atomic<bool> signalled{false};       // fd written, not read yet
};

class CommitOrder {
 public:
  static constexpr uint32_t kWatchSlots = 4096;
  // `commits` points; `workers` waiters, whose eventfds are made here
  // (RuntimeError when they cannot be).
  CommitOrder(uint32_t commits, int workers);
  ~CommitOrder();
  CommitOrder(const CommitOrder&) = delete;
  CommitOrder& operator=(const CommitOrder&) = delete;

  uint64_t done() const { return prefix_.load(std::memory_order_seq_cst); }
  uint32_t commits() const { return n_; }

  // Commit point i completed (again: no effect). Returns the prefix after
  // it; the caller then calls wake(), and signals the point's watchers
  // (take_watchers).
  uint64_t complete(uint32_t i);

  bool is_done(uint32_t i) const {
    return i >= n_ || (flags_[i / 64].load(std::memory_order_seq_cst) >> (i % 64) & 1) != 0;
  }

  // Worker `w` waits for point i: it is signalled when i completes. True
  // when i has completed already (no signal need come).
  bool watch(uint32_t i, int w);

  // The workers watching point i or another point of its slot (a bit per
  // worker, worker w at w % 64), who watch them no more.
  uint64_t take_watchers(uint32_t i) {
    return i < n_ ? watchers_[i % kWatchSlots].exchange(0, std::memory_order_seq_cst) : 0;
  }

  // Signals the workers other than `self` in `mask` (take_watchers).
  void signal(uint64_t mask, int self);

  // Signals the workers other than `self` whose least need is at most
  // `prefix`.
  void wake(uint64_t prefix, int self);

  // Writes to worker w's eventfd unless it was signalled and has not read.
  void signal_one(int w);

  Waiter& waiter(int w) { return waiters_[w]; }

 private:
  uint32_t n_;
  std::unique_ptr<std::atomic<uint64_t>[]> flags_;     // bit i % 64 of word i / 64
  std::unique_ptr<std::atomic<uint64_t>[]> watchers_;  // kWatchSlots
  std::atomic<uint64_t> prefix_{0};
  std::vector<Waiter> waiters_;
};

}  // namespace tierlab::replay::detail
