// planner_bound.h - lower bounds on the plan height beyond LOAD, for problems
// with fixed obstacles.
//
// With obstacles, LOAD may not be reachable: the obstacles live at a tick cut
// the memory below their top into gaps, and a buffer larger than a gap cannot
// use it. Per tick t, the live buffers must fit into the gaps of the obstacles
// live at t plus the top bin [top_t, H); relaxing each buffer to be divisible
// among the gaps it fits in gives a nested transportation problem, feasible
// exactly when, for every size s, the bytes of live buffers of size >= s fit
// into the gaps of capacity >= s plus the top bin (if it is >= s itself).
// Each gap's share of the buffers of size >= s is further capped by the
// largest subset sum of those sizes that fits in it (a knapsack on the
// buffers' common granularity), when that is cheap to compute.
//
// Invariants kept here: the bound never exceeds the height of any valid plan
// (it is max(LOAD, fixed top, per-tick bounds), each one valid); it is a pure
// function of the instance, computed in about O(pieces log n) plus the
// per-tick evaluations, which skip ticks that cannot raise it; with a Work
// budget it is deterministic (work counts, not the clock, stop it).
#pragma once

#include <cstdint>

#include "core/planner_greedy.h"
#include "core/planner_instance.h"
#include "core/planner_obstacles.h"

namespace renaissance::planner::detail {

// max(LOAD, fixed top, per-tick gap bound); see above. With `work`, the
// evaluation is charged to it and stops (still a valid bound, only weaker)
// once it is spent.
std::uint64_t lower_bound(const Instance& inst, const ObstacleMap& map, Work* work = nullptr);
inline std::uint64_t lower_bound(const Instance& inst, Work* work = nullptr) {
  return lower_bound(inst, ObstacleMap(inst), work);
}

}  // namespace renaissance::planner::detail
