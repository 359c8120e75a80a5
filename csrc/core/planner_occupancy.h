// planner_occupancy.h - which memory ranges the placed items use over a
// range of ticks: a segment tree whose nodes keep merged range lists.
//
// Invariants kept here:
//   * Each node's lists are sorted and merged (disjoint); `sub` is the union
//     of `own` over the node's subtree, so a query's lists cover exactly the
//     ranges of the items overlapping it (in O(log T) lists).
//   * clear() touches only the nodes dirtied since the last clear.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/planner_instance.h"

namespace renaissance::planner::detail {

// Segment tree over ticks. Node v keeps two merged (disjoint, sorted) lists
// of memory ranges: own, the ranges of pieces whose canonical cover includes
// v, and sub, the union of own over v's subtree. The ranges used by items
// overlapping [lo, hi) are then the union of own on the boundary paths and
// sub on the canonical nodes of [lo, hi): O(log T) lists, each already
// merged, so a query costs about the number of holes, not the number of
// overlapping items (Placer::find_offset merges them, skipping runs of
// spans already covered).
class OccupancyTree {
 public:
  explicit OccupancyTree(std::int32_t ticks);
  void clear();
  void insert(std::int32_t lo, std::int32_t hi, Span s);
  // Appends the lists holding the ranges used over [lo, hi): each list is
  // sorted and merged; ranges in different lists may overlap.
  using List = std::pair<const Span*, const Span*>;
  void collect(std::int32_t lo, std::int32_t hi, std::vector<List>& out) const;
  // Nodes visited by insert() and collect() since the last call.
  std::uint64_t take_touches() {
    const std::uint64_t t = touches_;
    touches_ = 0;
    return t;
  }
  // True when the nodes outgrow the cache (then a visit costs about a miss).
  bool large() const { return nodes_.size() > kCacheNodes; }

 private:
  void insert(std::uint32_t v, std::int32_t l, std::int32_t r, std::int32_t lo,
              std::int32_t hi, Span s);
  void collect(std::uint32_t v, std::int32_t l, std::int32_t r, std::int32_t lo,
               std::int32_t hi, std::vector<List>& out) const;
  static void add(std::vector<Span>& list, Span s);

  struct Node {
    std::vector<Span> own, sub;  // together: one cache line per node
  };
  static constexpr std::size_t kCacheNodes = std::size_t{1} << 18;
  std::int32_t ticks_;
  std::vector<Node> nodes_;
  mutable std::uint64_t touches_ = 0;
  std::vector<std::uint32_t> dirty_;
};

}  // namespace renaissance::planner::detail
