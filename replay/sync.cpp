// The commit order of replay --sync commit (replay/sync.h).
#include "replay/sync.h"

#include "common/error.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace tierlab::replay::detail {

CommitOrder::CommitOrder(uint32_t commits, int workers)
    : n_(commits), flags_(std::make_unique<std::atomic<uint64_t>[]>(commits / 64 + 1)),
      watchers_(std::make_unique<std::atomic<uint64_t>[]>(kWatchSlots)), waiters_(workers) {
  for (uint32_t i = 0; i <= commits / 64; ++i) flags_[i].store(0, std::memory_order_relaxed);
  for (uint32_t i = 0; i < kWatchSlots; ++i) watchers_[i].store(0, std::memory_order_relaxed);
  for (Waiter& w : waiters_) {
    w.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w.fd < 0) {
      const int err = errno;
      for (Waiter& o : waiters_)
        if (o.fd >= 0) ::close(o.fd);
      throw RuntimeError(errno_message("replay: eventfd (commit order)", err));
    }
  }
}

CommitOrder::~CommitOrder() {
  for (Waiter& w : waiters_)
    if (w.fd >= 0) ::close(w.fd);
}

uint64_t CommitOrder::complete(uint32_t i) {
  if (i < n_) flags_[i / 64].fetch_or(uint64_t{1} << (i % 64), std::memory_order_seq_cst);
  uint64_t p = prefix_.load(std::memory_order_seq_cst);
  // Invariant: flags 0..p are all set. Whoever sees flag p set may move the
  // prefix past it; a failed exchange reloads p and goes on.
  while (p < n_ && is_done(static_cast<uint32_t>(p))) {
    if (prefix_.compare_exchange_weak(p, p + 1, std::memory_order_seq_cst)) ++p;
  }
  return p;
}

bool CommitOrder::watch(uint32_t i, int w) {
  if (i >= n_) return true;
  watchers_[i % kWatchSlots].fetch_or(uint64_t{1} << (w % 64), std::memory_order_seq_cst);
  return is_done(i);
}

void CommitOrder::signal_one(int w) {
  Waiter& o = waiters_[w];
  if (o.signalled.exchange(true, std::memory_order_seq_cst)) return;
  const uint64_t one = 1;
  // Cannot fail but for an overflow of the counter, which the reader
  // prevents by reading it; a short write is impossible on an eventfd.
  [[maybe_unused]] ssize_t r = ::write(o.fd, &one, sizeof one);
}

void CommitOrder::wake(uint64_t prefix, int self) {
  for (int w = 0; w < static_cast<int>(waiters_.size()); ++w) {
    if (w == self) continue;
    if (waiters_[w].need.load(std::memory_order_seq_cst) > prefix) continue;
    signal_one(w);
  }
}

void CommitOrder::signal(uint64_t mask, int self) {
  if (mask == 0) return;
  for (int w = 0; w < static_cast<int>(waiters_.size()); ++w)
    if (w != self && (mask >> (w % 64) & 1)) signal_one(w);
}

}  // namespace tierlab::replay::detail
