// planner_improve.h - improvement searches that repair the buffers defining
// the peak: ruin and recreate with best fit (improve, for instances too large
// for the branch and bound), and a large-neighbourhood search whose repair
// step is the canonical search itself (repair_peaks: instances with fixed
// obstacles, and every instance too large for the branch and bound).
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

// Peak repair by sub-search. Each round takes the ticks where the plan
// reaches within a band of its height, frees every buffer live at one of
// them, and re-plans those as a problem of their own in which everything
// else (kept buffers at their offsets, fixed obstacles) is a fixed obstacle:
// the obstacle-aware bound of that sub-problem first (a sub-plan can only
// help when it is below the height), then a few best-fit passes and the
// canonical search. The obstacles are clipped at the freed buffers' top now
// (a sub-plan is kept only when all of them end lower) and above a floor
// (the lowest level leaving at most kObstaclesPerFreed obstacles per freed
// buffer, never above the lowest freed offset), so a sub-problem stays small
// on any instance. A kept sub-plan lowers the freed region's top: the plan's
// height when every buffer reaching it was freed, else one peak fewer. The
// band widens after each round without progress (more buffers freed, more
// freedom) and narrows back after progress; sub-problems over kMaxFreed
// buffers are cut to one run of peak ticks, then to the 80-320 (drawn)
// buffers with the highest tops over it.
void repair_peaks(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed,
                  Work& work, std::uint64_t& height, std::vector<std::uint64_t>& offsets,
                  std::string& method);

}  // namespace renaissance::planner::detail
