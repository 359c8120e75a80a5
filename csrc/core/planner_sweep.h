// planner_sweep.h - the planner's cheap fallback placement: a sweep over
// time that allocates like an online allocator (best fit among free blocks,
// coalescing on free), for instances too large for the best-fit passes to
// finish within the budget.
//
// Invariants kept here:
//   * The plan is valid: a free item holds [offset, offset + size) from its
//     first tick until it ends, and only ranges no live item holds are
//     handed out (above `base`, for sweep_best_fit_above). Items whose lifetime wraps around (two pieces) or covers
//     every tick, and every fixed obstacle, are treated as live for the whole
//     horizon (a superset of their lifetime, so still valid).
//   * Offsets are 0, fixed ends, or sums of sizes on top of those (aligned
//     sizes give aligned offsets).
//   * O(P log P) time for P pieces, deterministic (ties by item index).
//   * Both functions poll inst.stop (planner_stop.h) once per item and per
//     sort comparison, so the hard stop can interrupt them (it throws).
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner_instance.h"

namespace renaissance::planner::detail {

// Places every free item: fills the free items' entries of `offsets` (sized
// num_items; fixed entries are left as they are) and returns the plan height
// (fixed included).
std::uint64_t sweep_best_fit(const Instance& inst, std::vector<std::uint64_t>& offsets);

// Places the free items of `offsets` still at kUnplaced above `base`, the
// height of everything already placed (fixed included), so they meet none
// of it; returns the new height.
std::uint64_t sweep_best_fit_above(const Instance& inst, std::uint64_t base,
                                   std::vector<std::uint64_t>& offsets);

}  // namespace renaissance::planner::detail
