// territory_index_test.cpp - the territory's free-block index
// (core/territory_index.h) against a std::map reference: seeded random
// inserts and erases of block starts (multiples of the unit, over ranges
// that make the bitmap grow to 1, 2, 3 and 4 levels), every answer of find()
// and holding() compared with the map's (the highest key <= p), and check()
// after every batch. Built and run by `make test-cpp`.
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "core/block.h"
#include "core/territory_index.h"

using namespace renaissance;

namespace {

int g_failures = 0;

void expect(bool ok, const char* what, std::size_t a, std::size_t b) {
  if (!ok && g_failures++ < 20) std::printf("FAIL: %s (%zu, %zu)\n", what, a, b);
}

// `span` units of `unit` bytes; `ops` random operations.
void run(unsigned seed, std::size_t unit, std::size_t span, int ops) {
  std::mt19937_64 rng(seed);
  std::vector<char> memory(1);  // only addresses are used: base + offset, never dereferenced
  char* base = reinterpret_cast<char*>(std::uintptr_t(1) << 40);
  std::vector<Block> blocks(span);
  TerritoryIndex index;
  index.set_origin(base, unit);
  std::map<char*, Block*> ref;
  std::uniform_int_distribution<std::size_t> pick(0, span - 1);
  for (int k = 0; k < ops; ++k) {
    const std::size_t u = pick(rng);
    char* p = base + u * unit;
    const int what = static_cast<int>(rng() % 4);
    if (what <= 1) {  // insert (or erase when present)
      if (ref.count(p)) {
        index.erase(p);
        ref.erase(p);
      } else {
        blocks[u].ptr = p;
        index.insert(p, &blocks[u]);
        ref[p] = &blocks[u];
      }
    } else if (what == 2) {  // erase of something absent is a no-op
      if (!ref.count(p)) index.erase(p);
    }
    // Queries at a block start, inside a unit, and beyond the range.
    for (const char* q : {static_cast<const char*>(p), static_cast<const char*>(p + unit / 2),
                          static_cast<const char*>(base + (span + 3) * unit)}) {
      auto it = ref.upper_bound(const_cast<char*>(q));
      Block* want = it == ref.begin() ? nullptr : std::prev(it)->second;
      expect(index.holding(q) == want, "holding() differs from the map", u,
             static_cast<std::size_t>(q - base));
    }
    auto f = ref.find(p);
    expect(index.find(p) == (f == ref.end() ? nullptr : f->second), "find() differs", u, 0);
    expect(index.size() == ref.size(), "size() differs", index.size(), ref.size());
    if (k % 512 == 0) expect(index.check(), "check() failed", static_cast<std::size_t>(k), 0);
  }
  expect(index.holding(base - 1) == nullptr, "an address below the base is held", 0, 0);
  expect(index.check(), "check() failed at the end", 0, 0);
  // Emptying it leaves no summary bit behind.
  for (auto& [p, b] : ref) index.erase(p);
  expect(index.size() == 0 && index.check(), "not empty after erasing every block", 0, 0);
  expect(index.holding(base + (span - 1) * unit) == nullptr, "an empty index holds a block", 0, 0);
  (void)memory;
}

}  // namespace

int main() {
  int runs = 0;
  for (unsigned seed = 0; seed < 6; ++seed) {
    run(seed, 512, 40, 4000);          // one level
    run(seed, 64, 3000, 8000);         // two levels
    run(seed, 512, 200000, 8000);      // three levels (sparse)
    runs += 3;
  }
  run(99, 512, std::size_t(1) << 19, 6000);  // four levels (a 256 MiB range)
  ++runs;
  if (g_failures) {
    std::printf("territory_index_test: %d failures\n", g_failures);
    return 1;
  }
  std::printf("territory_index_test: %d runs ok\n", runs);
  return 0;
}
