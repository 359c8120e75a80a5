// slot_room.h - how far each planned slot of a layout can grow upward at its
// offset before it reaches another planned buffer (StepPlanner: a request
// that outgrew its slot, e.g. a longer sequence, takes the planned offset
// only where the extra bytes touch no other planned buffer).
//
// Invariants:
//   * room_above(...)[i][p] is the largest g such that the range
//     [offset[p] + size, offset[p] + size + g) of slot i in phase p meets no
//     planned (non-dynamic) buffer instance other than that one (either
//     phase, at any time: the answer holds for every step the layout
//     replays) and stays below `top`; the same answer as scanning every
//     slot for each question (the old StepPlanner::room_to_grow, kept in
//     tests/cpp/slot_room_test.cpp as the reference).
//   * O(n log n) for n slots, computed once per installed layout; a question
//     is then O(1) on the allocation path (it was O(n) under the arena lock).
//   * Header-only and torch-free: the slot type needs `size`, `offset[2]`
//     (bytes) and `dynamic` (no planned range).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace renaissance {

// Per slot, per phase: the bytes slot i may grow above its end in phase p
// (0 for dynamic slots). `phases` is 1 or 2 (a one-phase layout has one
// instance per slot: offset[1] is ignored); `top` is the layout's end (bytes).
template <class Slot>
std::vector<std::array<std::uint64_t, 2>> room_above(const std::vector<Slot>& slots, int phases,
                                                    std::uint64_t top) {
  struct Instance {
    std::uint64_t begin, end;
  };
  std::vector<Instance> inst;
  inst.reserve(slots.size() * static_cast<std::size_t>(phases));
  for (const Slot& s : slots) {
    if (s.dynamic) continue;
    for (int p = 0; p < phases; ++p) {
      const auto at = static_cast<std::uint64_t>(s.offset[p]);
      inst.push_back(Instance{at, at + static_cast<std::uint64_t>(s.size)});
    }
  }
  std::sort(inst.begin(), inst.end(), [](const Instance& a, const Instance& b) { return a.begin < b.begin; });
  // reach[k]: the highest end among the first k + 1 instances (by begin).
  std::vector<std::uint64_t> reach(inst.size());
  for (std::size_t k = 0; k < inst.size(); ++k) reach[k] = std::max(k ? reach[k - 1] : 0, inst[k].end);

  std::vector<std::array<std::uint64_t, 2>> room(slots.size(), {0, 0});
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (s.dynamic) continue;
    for (int p = 0; p < phases; ++p) {
      const std::uint64_t lo = static_cast<std::uint64_t>(s.offset[p]) + static_cast<std::uint64_t>(s.size);
      if (lo >= top) continue;
      // Instances beginning at or below lo: one that ends above lo is in
      // the way at once (the slot's own instance ends at lo, so it never
      // counts; its other phase's instance does, as any other buffer).
      const auto first_above = std::upper_bound(inst.begin(), inst.end(), lo,
                                                [](std::uint64_t v, const Instance& x) { return v < x.begin; });
      const auto k = static_cast<std::size_t>(first_above - inst.begin());
      if (k > 0 && reach[k - 1] > lo) continue;
      const std::uint64_t limit = first_above == inst.end() ? top : std::min(top, first_above->begin);
      room[i][static_cast<std::size_t>(p)] = limit - lo;
    }
    if (phases == 1) room[i][1] = room[i][0];
  }
  return room;
}

// Stores room_above(slots, phases, top) into each slot's `room[2]` (bytes):
// done whenever a layout's offsets or top change (install, a bridge's end).
template <class Slot>
void set_room_above(std::vector<Slot>& slots, int phases, std::uint64_t top) {
  const auto room = room_above(slots, phases, top);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slots[i].room[0] = room[i][0];
    slots[i].room[1] = room[i][1];
  }
}

}  // namespace renaissance
