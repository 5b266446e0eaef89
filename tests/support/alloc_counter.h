// Counts C++ heap allocations, for tests that prove a path allocates nothing
// per event.
//
//   uint64_t before = tierlab::test::allocations_all_threads();
//   run_the_steady_state();
//   CHECK(tierlab::test::allocations_all_threads() == before);
//
// Including this header replaces the global operator new and delete (every
// form: plain, array, nothrow, aligned, sized) of the whole test binary with
// versions that count each allocation, per thread and in total, and the bytes
// live on the heap, and otherwise behave like the default ones
// (malloc / aligned_alloc, free). A replacement may be defined only once per
// program, so exactly one .cpp of a test binary includes this header as it
// is; the others define TIERLAB_ALLOC_COUNTER_READ_ONLY before including it
// and get the counters without the replacements.
// Allocations of C code (libpq's PGresults, ...) are not counted.
//
// Unity builds put several test files in one translation unit, in either
// order: so the header undefines TIERLAB_ALLOC_COUNTER_READ_ONLY at its end
// (the next file's include is not read-only by accident), and its two parts
// have guards of their own (a read-only include before the replacing one
// does not hide the replacements).
#ifndef TIERLAB_TESTS_ALLOC_COUNTER_H
#define TIERLAB_TESTS_ALLOC_COUNTER_H

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace tierlab::test {

inline thread_local uint64_t alloc_counter_thread = 0;
inline std::atomic<uint64_t> alloc_counter_total{0};
inline std::atomic<int64_t> alloc_counter_live{0};  // bytes allocated and not freed

// operator new calls so far by the calling thread.
inline uint64_t allocations_this_thread() { return alloc_counter_thread; }

// operator new calls so far by every thread of the process.
inline uint64_t allocations_all_threads() { return alloc_counter_total.load(std::memory_order_relaxed); }

// Bytes allocated by operator new and not yet freed, every thread (as
// malloc_usable_size counts them).
inline int64_t live_heap_bytes() { return alloc_counter_live.load(std::memory_order_relaxed); }

namespace alloc_counter_detail {

inline void count() {
  ++alloc_counter_thread;
  alloc_counter_total.fetch_add(1, std::memory_order_relaxed);
}

inline void* live(void* p) {
  alloc_counter_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  return p;
}

inline void release(void* p) noexcept {
  if (!p) return;
  alloc_counter_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}

inline void* allocate(std::size_t n) {
  count();
  if (n == 0) n = 1;
  if (void* p = std::malloc(n)) return live(p);
  throw std::bad_alloc();
}

inline void* allocate_aligned(std::size_t n, std::align_val_t al) {
  count();
  std::size_t a = static_cast<std::size_t>(al);
  if (n == 0) n = 1;
  n = (n + a - 1) / a * a;  // aligned_alloc wants a multiple of the alignment
  if (void* p = std::aligned_alloc(a, n)) return live(p);
  throw std::bad_alloc();
}

inline void* allocate_nothrow(std::size_t n) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace alloc_counter_detail
}  // namespace tierlab::test

#endif  // TIERLAB_TESTS_ALLOC_COUNTER_H

#if !defined(TIERLAB_ALLOC_COUNTER_READ_ONLY) && !defined(TIERLAB_ALLOC_COUNTER_REPLACED)
#define TIERLAB_ALLOC_COUNTER_REPLACED
// Replacement functions may not be inline: these are the one definition.
void* operator new(std::size_t n) { return tierlab::test::alloc_counter_detail::allocate(n); }
void* operator new[](std::size_t n) { return tierlab::test::alloc_counter_detail::allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return tierlab::test::alloc_counter_detail::allocate_nothrow(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return tierlab::test::alloc_counter_detail::allocate_nothrow(n);
}
void* operator new(std::size_t n, std::align_val_t al) {
  return tierlab::test::alloc_counter_detail::allocate_aligned(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al) {
  return tierlab::test::alloc_counter_detail::allocate_aligned(n, al);
}
void operator delete(void* p) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete[](void* p) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete(void* p, std::size_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete[](void* p, std::size_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { tierlab::test::alloc_counter_detail::release(p); }
#endif  // replacements
#undef TIERLAB_ALLOC_COUNTER_READ_ONLY
