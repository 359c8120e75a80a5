// planner_occupancy.cpp - the occupancy tree (see planner_occupancy.h).
#include "core/planner_occupancy.h"

#include <algorithm>

namespace renaissance::planner::detail {

OccupancyTree::OccupancyTree(std::int32_t ticks)
    : ticks_(ticks),
      nodes_(4 * static_cast<std::size_t>(std::max(ticks, 1))) {}

void OccupancyTree::clear() {
  for (std::uint32_t v : dirty_) {
    nodes_[v].own.clear();
    nodes_[v].sub.clear();
  }
  dirty_.clear();
}

void OccupancyTree::add(std::vector<Span>& list, Span s) {
  if (list.empty() || list.back().end < s.off) {
    list.push_back(s);
    return;
  }
  // First range ending at or after s.off, first range starting after s.end:
  // everything in between touches s and merges with it.
  auto first = std::lower_bound(list.begin(), list.end(), s.off,
                                [](const Span& x, std::uint64_t o) { return x.end < o; });
  auto last = std::upper_bound(first, list.end(), s.end,
                               [](std::uint64_t e, const Span& x) { return e < x.off; });
  if (first == last) {
    list.insert(first, s);
    return;
  }
  first->off = std::min(first->off, s.off);
  first->end = std::max((last - 1)->end, s.end);
  list.erase(first + 1, last);
}

void OccupancyTree::insert(std::int32_t lo, std::int32_t hi, Span s) {
  insert(1, 0, ticks_, lo, hi, s);
}

void OccupancyTree::insert(std::uint32_t v, std::int32_t l, std::int32_t r,
                           std::int32_t lo, std::int32_t hi, Span s) {
  if (r <= lo || hi <= l) return;
  ++touches_;
  Node& node = nodes_[v];
  if (node.sub.empty() && node.own.empty()) dirty_.push_back(v);
  add(node.sub, s);
  if (lo <= l && r <= hi) {
    add(node.own, s);
    return;
  }
  const std::int32_t m = l + (r - l) / 2;
  insert(2 * v, l, m, lo, hi, s);
  insert(2 * v + 1, m, r, lo, hi, s);
}

void OccupancyTree::collect(std::int32_t lo, std::int32_t hi,
                            std::vector<List>& out) const {
  collect(1, 0, ticks_, lo, hi, out);
}

void OccupancyTree::collect(std::uint32_t v, std::int32_t l, std::int32_t r,
                            std::int32_t lo, std::int32_t hi,
                            std::vector<List>& out) const {
  if (r <= lo || hi <= l) return;
  ++touches_;
  const Node& node = nodes_[v];
  if (lo <= l && r <= hi) {
    if (!node.sub.empty()) out.emplace_back(node.sub.data(), node.sub.data() + node.sub.size());
    return;
  }
  if (node.sub.empty()) return;
  if (!node.own.empty()) out.emplace_back(node.own.data(), node.own.data() + node.own.size());
  const std::int32_t m = l + (r - l) / 2;
  collect(2 * v, l, m, lo, hi, out);
  collect(2 * v + 1, m, r, lo, hi, out);
}

}  // namespace renaissance::planner::detail
