// replay_table_test.cpp - the replay fast path's tables (core/replay_table.h)
// against brute-force references, seeded:
//   * ReplayRoute's predecessors: for every planned position i, the set of
//     "last earlier planned position covering byte x" over x in i's range,
//     computed unit by unit;
//   * FastLive against a std::map under random inserts and takes (linear
//     probing with backward-shift deletion: a take that moves the wrong
//     entry loses a key or finds a removed one).
// Build and run: `make build/replay_table_test && build/replay_table_test`
// (part of `make test-cpp`).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/replay_table.h"

using namespace renaissance;

namespace {

int failures = 0;

void expect(bool ok, const char* what, unsigned seed) {
  if (!ok) {
    std::fprintf(stderr, "replay_table_test: %s (seed %u)\n", what, seed);
    ++failures;
  }
}

void check_route(unsigned seed) {
  std::mt19937 rng(seed);
  const std::size_t n = 1 + rng() % 300;
  const std::size_t units = 8 + rng() % 200;  // the space, in units of 64 bytes
  std::vector<std::size_t> offset(n), size(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (rng() % 7 == 0) continue;  // unplanned (dynamic)
    const std::size_t lo = rng() % units;
    const std::size_t len = 1 + rng() % std::min<std::size_t>(units - lo, 1 + rng() % 40);
    offset[i] = lo * 64;
    size[i] = len * 64;
  }
  ReplayRoute r;
  r.build(offset, size);
  expect(r.positions() == n, "positions", seed);
  std::vector<long> last(units, -1);  // per unit: the last position covering it
  for (std::size_t i = 0; i < n; ++i) {
    std::set<std::uint32_t> want;
    if (size[i] > 0) {
      for (std::size_t u = offset[i] / 64; u < (offset[i] + size[i]) / 64; ++u) {
        if (last[u] >= 0) want.insert(static_cast<std::uint32_t>(last[u]));
        last[u] = static_cast<long>(i);
      }
    }
    std::vector<std::uint32_t> got(r.preds_begin(i), r.preds_end(i));
    std::set<std::uint32_t> got_set(got.begin(), got.end());
    expect(got.size() == got_set.size(), "a predecessor listed twice", seed);
    expect(got_set == want, "predecessors differ from the brute force", seed);
    expect(r.offset(i) == offset[i] && r.size(i) == size[i], "range", seed);
  }
}

void check_fast_live(unsigned seed) {
  std::mt19937_64 rng(seed);
  const std::size_t cap = 1 + rng() % 500;
  FastLive t;
  t.reset(cap);
  std::map<std::uintptr_t, std::uint32_t> ref;
  for (int op = 0; op < 20000; ++op) {
    // Addresses on 512-byte steps from a small window, so that keys collide in probing.
    const std::uintptr_t p = 0x7f0000000000ull + 512 * (rng() % (3 * cap + 1));
    if (rng() % 2 && ref.size() < cap && t.has_room()) {
      if (!ref.count(p)) {
        const auto pos = static_cast<std::uint32_t>(rng() % 100000);
        t.insert(p, pos);
        ref[p] = pos;
      }
    } else {
      const std::int64_t got = t.take(p);
      auto it = ref.find(p);
      expect(got == (it == ref.end() ? -1 : static_cast<std::int64_t>(it->second)),
             "take differs from the map", static_cast<unsigned>(seed));
      if (it != ref.end()) ref.erase(it);
    }
    expect(t.size() == ref.size(), "size", static_cast<unsigned>(seed));
  }
  for (const auto& [p, pos] : ref) {
    expect(t.find(p) == static_cast<std::int64_t>(pos), "find after the run", static_cast<unsigned>(seed));
  }
  std::size_t seen = 0;
  t.for_each([&](std::uintptr_t, std::uint32_t) { ++seen; });
  expect(seen == ref.size(), "for_each count", static_cast<unsigned>(seed));
  t.clear();
  expect(t.size() == 0 && t.find(ref.empty() ? 1 : ref.begin()->first) == -1, "clear",
         static_cast<unsigned>(seed));
}

}  // namespace

int main() {
  for (unsigned seed = 0; seed < 300; ++seed) check_route(seed);
  for (unsigned seed = 0; seed < 40; ++seed) check_fast_live(seed);
  if (failures) {
    std::fprintf(stderr, "replay_table_test: %d failures\n", failures);
    return 1;
  }
  std::printf("replay_table_test: ok (300 routes, 40 address tables)\n");
  return 0;
}
