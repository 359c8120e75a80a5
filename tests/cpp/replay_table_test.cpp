// replay_table_test.cpp - the replay fast path's tables (core/replay_table.h)
// against brute-force references, seeded:
//   * ReplayRoute's predecessors: for every planned position i, the set of
//     "last earlier planned position covering byte x" over x in i's range,
//     computed unit by unit;
//   * ReplayRoute's spots: one per distinct planned start (numbered by
//     their slots in a table at most half full), found from the offset, -1
//     for any other offset;
//   * FastSlots against a map spot -> live position under inserts, takes
//     and take_all (which must name exactly the live positions).
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

// A seeded route of n positions over `units` units of 64 bytes.
ReplayRoute random_route(std::mt19937& rng, std::vector<std::size_t>& offset,
                         std::vector<std::size_t>& size) {
  const std::size_t n = 1 + rng() % 300;
  const std::size_t units = 8 + rng() % 200;
  offset.assign(n, 0);
  size.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (rng() % 7 == 0) continue;  // unplanned (dynamic)
    const std::size_t lo = rng() % units;
    const std::size_t len = 1 + rng() % std::min<std::size_t>(units - lo, 1 + rng() % 40);
    offset[i] = lo * 64;
    size[i] = len * 64;
  }
  ReplayRoute r;
  r.build(offset, size);
  return r;
}

void check_spots(unsigned seed) {
  std::mt19937 rng(seed + 1000);
  std::vector<std::size_t> offset, size;
  const ReplayRoute r = random_route(rng, offset, size);
  std::map<std::size_t, std::uint32_t> spot_of_start;  // start -> the spot its positions share
  std::size_t top = 0;
  for (std::size_t i = 0; i < offset.size(); ++i) {
    if (size[i] == 0) continue;
    top = std::max(top, offset[i] + size[i]);
    auto [it, fresh] = spot_of_start.emplace(offset[i], r.spot(i));
    expect(fresh || it->second == r.spot(i), "two positions at one start have two spots", seed);
    expect(r.spot(i) < r.spots(), "a spot out of range", seed);
    expect(r.find_spot(offset[i]) == static_cast<std::int64_t>(r.spot(i)), "find_spot of a start", seed);
  }
  std::set<std::uint32_t> distinct;
  for (const auto& [start, k] : spot_of_start) distinct.insert(k);
  expect(distinct.size() == spot_of_start.size(), "spots are not one per distinct start", seed);
  // Numbered by their slots in a table at most half full (some numbers unused).
  expect(r.spots() >= 2 * spot_of_start.size() && r.spots() >= 2, "the spot table is over half full", seed);
  expect(r.top() == top, "top", seed);
  for (std::size_t off = 0; off < top + 4096; off += 64) {
    if (!spot_of_start.count(off)) expect(r.find_spot(off) == -1, "find_spot of no start", seed);
  }
}

// FastSlots under the fast path's use: positions in increasing order, each
// entered at its spot only when no live position stands there; random
// frees by spot and take_all()s, against a map spot -> position.
void check_fast_slots(unsigned seed) {
  std::mt19937 rng(seed + 2000);
  std::vector<std::size_t> offset, size;
  const ReplayRoute r = random_route(rng, offset, size);
  FastSlots t;
  t.reset(r.spots());
  std::map<std::uint32_t, std::uint32_t> ref;  // spot -> live position
  std::size_t first = 0;  // positions entered since the last take_all: [first, i]
  for (std::size_t i = 0; i < r.positions(); ++i) {
    if (size[i] > 0 && !ref.count(r.spot(i))) {
      t.insert(r.spot(i), static_cast<std::uint32_t>(i));
      ref[r.spot(i)] = static_cast<std::uint32_t>(i);
    }
    const unsigned op = rng() % 8;
    if (op < 3 && r.spots() > 0) {
      const auto k = static_cast<std::uint32_t>(rng() % r.spots());
      auto it = ref.find(k);
      const std::int64_t got = t.take(k);
      expect(got == (it == ref.end() ? -1 : static_cast<std::int64_t>(it->second)),
             "take differs from the map", seed);
      if (it != ref.end()) ref.erase(it);
    } else if (op == 3) {
      std::set<std::uint32_t> got, want;
      t.take_all(r, first, i + 1, [&](std::uint32_t pos) { got.insert(pos); });
      first = i + 1;
      for (const auto& [k, pos] : ref) want.insert(pos);
      expect(got == want, "take_all differs from the live positions", seed);
      ref.clear();
      for (std::uint32_t k = 0; k < r.spots(); ++k) {
        expect(t.take(k) == -1, "a spot still held after take_all", seed);
      }
    } else if (op == 4) {
      // A reset to the same size, with or without live positions: every
      // spot empty after it (it rewrites the table only when some are live).
      t.reset(r.spots());
      first = i + 1;
      ref.clear();
      expect(t.size() == 0, "live positions after a reset", seed);
      for (std::uint32_t k = 0; k < r.spots(); ++k) {
        expect(t.take(k) == -1, "a spot still held after a reset", seed);
      }
    }
    expect(t.size() == ref.size(), "size", seed);
  }
}

}  // namespace

int main() {
  for (unsigned seed = 0; seed < 300; ++seed) check_route(seed);
  for (unsigned seed = 0; seed < 200; ++seed) check_spots(seed);
  for (unsigned seed = 0; seed < 200; ++seed) check_fast_slots(seed);
  if (failures) {
    std::fprintf(stderr, "replay_table_test: %d failures\n", failures);
    return 1;
  }
  std::printf("replay_table_test: ok (300 routes, 200 spot tables, 200 live-slot runs)\n");
  return 0;
}
