// A fixed-capacity hash table of values, open addressing with linear
// probing, for the tracefs recorders' pairing tables (no allocation after
// construction). Duplicate keys are allowed: find() returns the first
// match from the key's home slot, the one inserted first unless erasures
// moved it. Deletion shifts the following entries back (no tombstones), so
// probe chains stay short however many inserts and erases come.
#pragma once

#include <cassert>
#include <cstddef>
#include <vector>

namespace tierlab::capture {

// Hash: size_t(const V&), the hash of a value's key; find() is given the
// same hash of the key looked for.
template <class V, class Hash>
class ProbeTable {
 public:
  explicit ProbeTable(size_t cap_pow2) : slots_(cap_pow2), mask_(cap_pow2 - 1) {
    assert(cap_pow2 && (cap_pow2 & mask_) == 0);
  }
  // Three quarters used: inserts are refused to keep probes short.
  bool full() const { return used_ * 4 >= slots_.size() * 3; }
  size_t size() const { return used_; }

  bool insert(const V& v) {
    if (full()) return false;
    size_t i = Hash{}(v) & mask_;
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i].used = true;
    slots_[i].v = v;
    ++used_;
    return true;
  }
  // The first value from `hash`'s home slot for which match(v) holds;
  // nullptr if none. The pointer is valid until the next insert or erase.
  template <class Match>
  V* find(size_t hash, Match match) {
    for (size_t i = hash & mask_; slots_[i].used; i = (i + 1) & mask_)
      if (match(slots_[i].v)) return &slots_[i].v;
    return nullptr;
  }
  // Removes the value `v` points to (from find()).
  void erase(V* v) {
    size_t i = static_cast<size_t>(reinterpret_cast<Slot*>(reinterpret_cast<char*>(v) - offsetof(Slot, v)) -
                                   slots_.data());
    size_t j = i;
    for (;;) {
      slots_[i].used = false;
      for (;;) {
        j = (j + 1) & mask_;
        if (!slots_[j].used) {
          --used_;
          return;
        }
        size_t k = Hash{}(slots_[j].v) & mask_;
        // Move j to i unless its home k lies cyclically in (i, j].
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        break;
      }
      slots_[i] = slots_[j];
      i = j;
    }
  }
  template <class F>
  void for_each(F f) const {
    for (const auto& s : slots_)
      if (s.used) f(s.v);
  }
  void clear() {
    for (auto& s : slots_) s.used = false;
    used_ = 0;
  }

 private:
  struct Slot {
    V v{};
    bool used = false;
  };
  std::vector<Slot> slots_;
  size_t mask_;
  size_t used_ = 0;
};

}  // namespace tierlab::capture
