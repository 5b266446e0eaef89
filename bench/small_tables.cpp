// The replay's per-session name tables (replay/plan_builder.h: prepared
// statements and bound portals, looked up by the name a Bind or an Execute
// carries) as std::unordered_map keyed by std::string, looked up through a
// std::string made of the record's string_view, against
// boost::container::flat_map<std::string, V, std::less<>>, looked up by the
// string_view itself, at the table sizes sessions have (pgbench -M prepared:
// up to 7 statements, one unnamed portal; ORMs and pools: tens).
//
//   tierlab_bench_small_tables [LOOKUPS]
//
// Prints per table size and name shape the ns per lookup of each, and of
// std::unordered_map with a transparent hash (looked up by the string_view,
// C++20), and the ratios unordered_map / flat_map (above 1, flat_map is
// faster). Short
// names ("P_3", pgbench's) fit std::string's inline buffer; long ones
// ("__asyncpg_stmt_3f__", asyncpg's) make the lookup's std::string allocate.
#include "common/clock.h"

#include <boost/container/flat_map.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

struct TransparentHash {
  using is_transparent = void;
  size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
};

struct Entry {
  const char* sql = nullptr;
  uint32_t fp = 0;
  uint32_t types = 0;
  int ntypes = 0;
};

std::vector<std::string> names(size_t n, bool long_names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, long_names ? "__asyncpg_stmt_%zx__" : "P_%zu", i);
    out.emplace_back(buf);
  }
  return out;
}

// ns per lookup of `find` over `keys`, round robin, `lookups` times.
template <class Find>
double time_lookups(const std::vector<std::string_view>& keys, size_t lookups, Find&& find) {
  uint64_t sum = 0;
  const tierlab::Nanos t0 = tierlab::clock_ns(CLOCK_THREAD_CPUTIME_ID);
  for (size_t i = 0; i < lookups; ++i) sum += find(keys[i % keys.size()]);
  const tierlab::Nanos t = tierlab::clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
  if (sum == 1) std::puts("");  // keeps the lookups
  return static_cast<double>(t) / static_cast<double>(lookups);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t lookups = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4'000'000;
  if (lookups == 0) {
    std::fprintf(stderr, "usage: tierlab_bench_small_tables [LOOKUPS >= 1]\n");
    return 2;
  }
  std::printf("%-6s %-6s %14s %14s %14s %8s %8s\n", "size", "names", "unordered_ns", "transparent_ns",
              "flat_map_ns", "ratio", "ratio_t");
  for (bool long_names : {false, true}) {
    for (size_t n : {1, 2, 4, 8, 16, 64}) {
      const auto ns = names(n, long_names);
      std::unordered_map<std::string, Entry> u;
      std::unordered_map<std::string, Entry, TransparentHash, std::equal_to<>> ut;
      boost::container::flat_map<std::string, Entry, std::less<>> f;
      for (size_t i = 0; i < n; ++i) {
        u[ns[i]] = Entry{nullptr, static_cast<uint32_t>(i), 0, 0};
        ut[ns[i]] = Entry{nullptr, static_cast<uint32_t>(i), 0, 0};
        f[ns[i]] = Entry{nullptr, static_cast<uint32_t>(i), 0, 0};
      }
      std::vector<std::string_view> keys(ns.begin(), ns.end());
      const double tu = time_lookups(keys, lookups, [&](std::string_view k) {
        auto it = u.find(std::string(k));
        return it == u.end() ? 0u : it->second.fp + 1;
      });
      const double tt = time_lookups(keys, lookups, [&](std::string_view k) {
        auto it = ut.find(k);
        return it == ut.end() ? 0u : it->second.fp + 1;
      });
      const double tf = time_lookups(keys, lookups, [&](std::string_view k) {
        auto it = f.find(k);
        return it == f.end() ? 0u : it->second.fp + 1;
      });
      std::printf("%-6zu %-6s %14.1f %14.1f %14.1f %8.2f %8.2f\n", n, long_names ? "long" : "short", tu, tt, tf,
                  tu / tf, tt / tf);
    }
  }
  return 0;
}
