// planner_improve.h - improvement search for instances too large for the
// branch and bound: repairs the buffers that define the peak.
//
// Invariants kept here: the plan passed in is only ever replaced by a valid
// plan that is strictly lower; the search is bounded by the Work budget and
// seeded deterministically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/planner_greedy.h"
#include "core/planner_instance.h"

namespace renaissance::planner::detail {

void improve(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed, Work& work,
             std::uint64_t& height, std::vector<std::uint64_t>& offsets, std::string& method);

}  // namespace renaissance::planner::detail
