// planner_greedy.h - constructive placement: best fit / first fit in a
// given order over the occupancy tree (planner_occupancy.h), and the static
// orderings. The work budget all strategies share is planner_work.h.
//
// Invariants kept here:
//   * Placement never moves an already placed item and never creates a
//     collision: each new offset is the start of a free gap among the placed
//     items overlapping it in time (fixed obstacles included), or the top of
//     them, so it is 0, a fixed end or a sum of sizes on top of those.
//   * Everything is deterministic: ties break by item index, and the work
//     counter decides when a search stops, unless the wall-clock deadline
//     of the Work budget comes first (see Work).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/planner_instance.h"
#include "core/planner_occupancy.h"
#include "core/planner_work.h"

namespace renaissance::planner::detail {

enum class Fit { kBest, kFirst };

class Placer {
 public:
  explicit Placer(const Instance& inst);

  // Resets the tree to the items placed in `offsets` (fixed obstacles and
  // any free item already placed).
  void reset(const std::vector<std::uint64_t>& offsets);

  // Best (or first) fitting offset for `item` among the placed items.
  std::uint64_t find_offset(std::uint32_t item, Fit fit, Work& work);
  void commit(std::uint32_t item, std::uint64_t offset);

  // Places `order` one by one on top of `offsets` (reset() first); returns
  // the plan height (max end of all placed items, fixed included). Runs to
  // the end whatever the budget (callers bound it).
  std::uint64_t place(const std::vector<std::uint32_t>& order,
                      std::vector<std::uint64_t>& offsets, Fit fit, Work& work);
  // The same, but gives up (returns false; `offsets` then holds a partial
  // plan) once `work` is out before an item; on success sets `height`.
  bool try_place(const std::vector<std::uint32_t>& order, std::vector<std::uint64_t>& offsets,
                 Fit fit, Work& work, std::uint64_t& height);

 private:
  const Instance& inst_;
  OccupancyTree tree_;
  std::vector<OccupancyTree::List> lists_;
  // find_offset's merge scratch (a loser tree over lists_).
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> loser_, winners_;
};

// Offsets vector with fixed obstacles in place and free items unplaced.
std::vector<std::uint64_t> initial_offsets(const Instance& inst);
std::uint64_t height(const Instance& inst, const std::vector<std::uint64_t>& offsets);

// Static orderings of the free items.
enum class Order {
  kSize,      // size desc, then start asc, duration desc (the baseline)
  kArea,      // size x length desc
  kLength,    // length desc, then size desc
  kStart,     // start asc, then size desc
  kPressure,  // max LOAD profile over lifetime desc, then size desc
  kPressureArea,  // pressure desc, then area desc
  kSizeClass,  // size class desc (sizes within a factor of 4: floor(log2 size) / 2),
               // then duration (upper - lower, original time) desc, then size desc
  kLengthClass,  // duration class desc (floor(log2 duration)), then end (lower + duration)
                 // asc, then size desc
  kEnd,          // end (lower + duration, original time) desc, then size desc
};
std::vector<std::uint32_t> make_order(const Instance& inst, Order order);
// Peak first: the free items live at the peak tick (the first tick where
// live reaches the LOAD) in `clique`'s order, then all the others in
// `rest`'s. Placed by best or first fit, the peak's items stack from the
// bottom with no hole between them (each overlaps every one placed before
// it), so the peak tick is at the LOAD whatever comes after; the others
// then fill in around that stack. A plan at the LOAD must have the peak's
// items stacked without a hole; when the constructive passes that
// interleave them with the others leave one there (SOMAS pangu 2.6B: a
// 40 MiB hole at its one peak tick, +0.758% over LOAD after every pass and
// every improvement phase), placing them first closes it
// (docs/benchmarks.md, issue 12's eighteenth pass).
std::vector<std::uint32_t> peak_first_order(const Instance& inst, Order clique, Order rest);
// Per free item: max of inst.live over its pieces.
std::vector<std::uint64_t> pressures(const Instance& inst);

}  // namespace renaissance::planner::detail
