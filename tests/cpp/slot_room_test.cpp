// slot_room_test.cpp - a slot's room above (core/slot_room.h) against the
// scan StepPlanner::room_to_grow made before it (every slot, both phases,
// for each question): seeded random layouts of 1-200 slots, one or two
// phases, some dynamic, offsets that overlap (buffers disjoint in time share
// bytes) or touch, zero sizes, tops above the highest end; for every slot
// and phase, growths of 1 byte up to past the top (all of them on small
// layouts, the answer's edges and random ones on large). Built and run by
// `make test-cpp`.
#include <cstdio>
#include <random>
#include <vector>

#include "core/slot_room.h"

using namespace renaissance;

namespace {

int g_failures = 0;

struct Slot {
  std::size_t size = 0;
  std::size_t offset[2] = {0, 0};
  bool dynamic = false;
};

// The old StepPlanner::room_to_grow: can slot i (phase `phase`) take
// `rounded` > size bytes at its offset without reaching into another planned
// buffer's range (either phase) or above `top`?
bool scan(const std::vector<Slot>& slots, int phases, std::size_t top, std::size_t i, int phase,
          std::size_t rounded) {
  const Slot& s = slots[i];
  const std::size_t lo = s.offset[phase] + s.size, hi = s.offset[phase] + rounded;
  if (hi > top) return false;
  for (std::size_t j = 0; j < slots.size(); ++j) {
    const Slot& o = slots[j];
    if (o.dynamic) continue;
    for (int p = 0; p < phases; ++p) {
      if (j == i && (phases == 1 || p == phase)) continue;
      if (o.offset[p] < hi && lo < o.offset[p] + o.size) return false;
    }
  }
  return true;
}

void check(const std::vector<Slot>& slots, int phases, std::size_t top, std::mt19937_64& rng, unsigned seed) {
  const auto room = room_above(slots, phases, top);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].dynamic) continue;
    for (int p = 0; p < phases; ++p) {
      const std::size_t size = slots[i].size;
      const std::uint64_t r = room[i][static_cast<std::size_t>(p)];
      std::vector<std::size_t> growths = {1, 2, r, r + 1, r + 2, top + 1};
      if (top <= 4096) {
        for (std::size_t g = 1; g <= top + 1; ++g) growths.push_back(g);
      } else {
        for (int k = 0; k < 16; ++k) growths.push_back(1 + rng() % (top + 1));
      }
      for (std::size_t g : growths) {
        if (g == 0) continue;
        const bool want = scan(slots, phases, top, i, p, size + g);
        const bool got = g <= r;
        if (want != got && g_failures++ < 20) {
          std::printf("FAIL seed %u: slot %zu phase %d size %zu growth %zu: scan %d, room %llu\n", seed, i, p,
                      size, g, want, static_cast<unsigned long long>(r));
        }
      }
    }
  }
}

void run(unsigned seed) {
  std::mt19937_64 rng(seed);
  const std::size_t n = 1 + rng() % (seed % 4 == 0 ? 200 : 12);
  const int phases = 1 + static_cast<int>(rng() % 2);
  const std::size_t unit = (seed % 3 == 0) ? 64 : 1;
  const std::size_t span = unit * (8 + rng() % (seed % 4 == 0 ? 4000 : 40));
  std::vector<Slot> slots(n);
  std::size_t top = 0;
  for (Slot& s : slots) {
    s.dynamic = rng() % 8 == 0;
    s.size = rng() % 10 == 0 ? 0 : unit * (rng() % (span / unit / 4 + 1));
    s.offset[0] = unit * (rng() % (span / unit));
    s.offset[1] = phases == 2 && rng() % 3 != 0 ? unit * (rng() % (span / unit)) : s.offset[0];
    if (!s.dynamic) {
      for (int p = 0; p < phases; ++p) top = std::max(top, s.offset[p] + s.size);
    }
  }
  top += unit * (rng() % 4);  // a top rounded above the highest end
  check(slots, phases, top, rng, seed);
}

}  // namespace

int main() {
  for (unsigned seed = 1; seed <= 400; ++seed) run(seed);
  // Hand-made: one-phase slots [0,4) [4,8) [8,16), top 16; slot 0 cannot
  // grow, slot 1 cannot, slot 2 can to the top only.
  {
    std::vector<Slot> s(3);
    s[0].size = 4, s[1].offset[0] = s[1].offset[1] = 4, s[1].size = 4;
    s[2].offset[0] = s[2].offset[1] = 8, s[2].size = 8;
    const auto r = room_above(s, 1, 20);
    if (r[0][0] != 0 || r[1][0] != 0 || r[2][0] != 4) {
      std::printf("FAIL hand-made: %llu %llu %llu\n", (unsigned long long)r[0][0], (unsigned long long)r[1][0],
                  (unsigned long long)r[2][0]);
      ++g_failures;
    }
    // Two phases: slot 0's other phase sits above its end (blocks it).
    std::vector<Slot> t(1);
    t[0].size = 4, t[0].offset[0] = 0, t[0].offset[1] = 6;
    const auto q = room_above(t, 2, 10);
    if (q[0][0] != 2 || q[0][1] != 0) {
      std::printf("FAIL two phases: %llu %llu\n", (unsigned long long)q[0][0], (unsigned long long)q[0][1]);
      ++g_failures;
    }
  }
  if (g_failures) {
    std::printf("slot_room_test: %d failures\n", g_failures);
    return 1;
  }
  std::printf("slot_room_test: ok (400 seeded layouts)\n");
  return 0;
}
