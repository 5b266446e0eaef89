// Private to replay/: the commit order that replay --sync commit keeps
// across sessions (see Plan::commits and Unit::sync_need).
//
// Commit points are numbered in capture order. When one completes in the
// replay (its unit's answer came, or its session ended or failed before
// it: a commit that cannot come counts as done at once) its flag is set;
// done() is the length of the prefix of flags set, which only grows. A
// unit waits until done() reaches its sync_need. Marking is lock-free and
// allocates nothing: one flag store and a compare-and-swap per commit
// point the prefix passes.
//
// Waking: each worker that has units waiting publishes the least need
// among them (Waiter::need) and watches its Waiter::fd (an eventfd) on
// its loop. A worker that moves the prefix writes to the eventfd of each
// other worker whose least need it reached, once until that worker reads
// it (Waiter::signalled), so nothing spins and a wake costs one write.
//
// Invariant (no lost wake-up): a worker publishes its need and then reads
// done(); a marker moves done() and then reads the needs, all sequentially
// consistent. Either the worker sees the new prefix or the marker sees
// the need and signals.
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
  // `commits` points; `workers` waiters, whose eventfds are made here
  // (RuntimeError when they cannot be).
  CommitOrder(uint32_t commits, int workers);
  ~CommitOrder();
  CommitOrder(const CommitOrder&) = delete;
  CommitOrder& operator=(const CommitOrder&) = delete;

  uint64_t done() const { return prefix_.load(std::memory_order_seq_cst); }
  uint32_t commits() const { return n_; }

  // Commit point i completed (again: no effect). Returns the prefix after
  // it; the caller then calls wake().
  uint64_t complete(uint32_t i);

  // Signals the workers other than `self` whose least need is at most
  // `prefix`.
  void wake(uint64_t prefix, int self);

  Waiter& waiter(int w) { return waiters_[w]; }

 private:
  uint32_t n_;
  std::unique_ptr<std::atomic<uint8_t>[]> flags_;
  std::atomic<uint64_t> prefix_{0};
  std::vector<Waiter> waiters_;
};

}  // namespace tierlab::replay::detail
