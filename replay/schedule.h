// The replay clock and the per-worker timer heap.
#pragma once

#include "trace/record.h"

#include <cassert>
#include <cstdint>
#include <vector>

namespace tierlab::replay {

using trace::Nanos;

// One absolute schedule: a captured time maps to
//   epoch + (t_capture - t0) / speed
// no matter when earlier sends actually happened, so lateness never
// accumulates. With max_speed every captured time maps to the epoch (send
// as soon as the session is ready).
struct Schedule {
  Nanos epoch = 0;   // replay clock (CLOCK_MONOTONIC) at t0
  Nanos t0 = 0;      // capture clock origin
  double speed = 1.0;
  bool max_speed = false;

  Nanos at(Nanos t_capture) const {
    if (max_speed) return epoch;
    double rel = static_cast<double>(t_capture - t0) / speed;
    return epoch + static_cast<Nanos>(rel);
  }
};

// Indexed binary min-heap over preallocated slots: each slot (a session of
// the worker) has at most one pending deadline. set() inserts or moves,
// cancel() removes; nothing allocates after construction.
class TimerHeap {
 public:
  explicit TimerHeap(uint32_t slots) : pos_(slots, kAbsent), due_(slots, 0) {
    heap_.reserve(slots);
  }

  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  bool armed(uint32_t slot) const { return pos_[slot] != kAbsent; }
  Nanos top_due() const { return due_[heap_.front()]; }
  uint32_t top() const { return heap_.front(); }

  void set(uint32_t slot, Nanos due) {
    if (pos_[slot] == kAbsent) {
      due_[slot] = due;
      pos_[slot] = static_cast<uint32_t>(heap_.size());
      heap_.push_back(slot);
      up(pos_[slot]);
    } else {
      Nanos old = due_[slot];
      due_[slot] = due;
      if (due < old) up(pos_[slot]);
      else down(pos_[slot]);
    }
  }

  void cancel(uint32_t slot) {
    uint32_t i = pos_[slot];
    if (i == kAbsent) return;
    uint32_t last = heap_.back();
    heap_.pop_back();
    pos_[slot] = kAbsent;
    if (i < heap_.size()) {
      heap_[i] = last;
      pos_[last] = i;
      up(i);
      down(pos_[last]);
    }
  }

  uint32_t pop() {
    uint32_t s = heap_.front();
    cancel(s);
    return s;
  }

 private:
  static constexpr uint32_t kAbsent = UINT32_MAX;
  bool less(uint32_t a, uint32_t b) const {
    return due_[heap_[a]] < due_[heap_[b]] ||
           (due_[heap_[a]] == due_[heap_[b]] && heap_[a] < heap_[b]);
  }
  void swap_at(uint32_t a, uint32_t b) {
    std::swap(heap_[a], heap_[b]);
    pos_[heap_[a]] = a;
    pos_[heap_[b]] = b;
  }
  void up(uint32_t i) {
    while (i > 0) {
      uint32_t p = (i - 1) / 2;
      if (!less(i, p)) break;
      swap_at(i, p);
      i = p;
    }
  }
  void down(uint32_t i) {
    for (;;) {
      uint32_t l = 2 * i + 1, r = l + 1, m = i;
      if (l < heap_.size() && less(l, m)) m = l;
      if (r < heap_.size() && less(r, m)) m = r;
      if (m == i) break;
      swap_at(i, m);
      i = m;
    }
  }

  std::vector<uint32_t> heap_;  // slots, heap-ordered by due_
  std::vector<uint32_t> pos_;   // slot -> index in heap_, kAbsent if not armed
  std::vector<Nanos> due_;      // slot -> deadline
};

}  // namespace tierlab::replay
