// planner_greedy.cpp - best fit / first fit placement and static orderings.
//
// Invariants kept here: a placed item never collides with any placed item
// overlapping it in time (the chosen range lies in a gap of the union of
// their ranges, or above it); offsets are 0 or ends of placed items; all
// orderings are total (ties broken by item index), hence deterministic.
#include "core/planner_greedy.h"

#include <algorithm>
#include <numeric>

namespace renaissance::planner::detail {

OccupancyTree::OccupancyTree(std::int32_t ticks)
    : ticks_(ticks),
      own_(4 * static_cast<std::size_t>(std::max(ticks, 1))),
      sub_(own_.size()) {}

void OccupancyTree::clear() {
  for (std::uint32_t v : dirty_) {
    own_[v].clear();
    sub_[v].clear();
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
  if (sub_[v].empty() && own_[v].empty()) dirty_.push_back(v);
  add(sub_[v], s);
  if (lo <= l && r <= hi) {
    add(own_[v], s);
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
  if (lo <= l && r <= hi) {
    if (!sub_[v].empty()) out.emplace_back(sub_[v].data(), sub_[v].data() + sub_[v].size());
    return;
  }
  if (sub_[v].empty()) return;
  if (!own_[v].empty()) out.emplace_back(own_[v].data(), own_[v].data() + own_[v].size());
  const std::int32_t m = l + (r - l) / 2;
  collect(2 * v, l, m, lo, hi, out);
  collect(2 * v + 1, m, r, lo, hi, out);
}

Placer::Placer(const Instance& inst) : inst_(inst), tree_(inst.ticks) {}

void Placer::reset(const std::vector<std::uint64_t>& offsets) {
  tree_.clear();
  for (std::uint32_t i = 0; i < inst_.num_items; ++i) {
    if (offsets[i] != kUnplaced) commit(i, offsets[i]);
  }
}

void Placer::commit(std::uint32_t item, std::uint64_t offset) {
  const Span s{offset, offset + inst_.size[item]};
  for (std::uint32_t k = inst_.piece_begin[item]; k < inst_.piece_begin[item + 1]; ++k) {
    tree_.insert(inst_.pieces[k].lo, inst_.pieces[k].hi, s);
  }
}

std::uint64_t Placer::find_offset(std::uint32_t item, Fit fit, Work& work) {
  lists_.clear();
  for (std::uint32_t k = inst_.piece_begin[item]; k < inst_.piece_begin[item + 1]; ++k) {
    tree_.collect(inst_.pieces[k].lo, inst_.pieces[k].hi, lists_);
  }
  // Walk the union of the sorted lists in offset order (k-way merge on a
  // binary min-heap of list heads), tracking the gaps.
  auto heads = lists_.data();
  std::size_t k = lists_.size();
  auto less = [](const OccupancyTree::List& a, const OccupancyTree::List& b) {
    return a.first->off > b.first->off;  // for a min-heap via std::*_heap
  };
  std::make_heap(heads, heads + k, less);
  const std::uint64_t need = inst_.size[item];
  std::uint64_t cur = 0;
  std::uint64_t best = kUnplaced, best_gap = kUnplaced;
  std::uint64_t steps = 0;
  while (k > 0) {
    std::pop_heap(heads, heads + k, less);
    OccupancyTree::List& top = heads[k - 1];
    const Span s = *top.first;
    ++steps;
    if (++top.first == top.second) {
      --k;
    } else {
      std::push_heap(heads, heads + k, less);
    }
    if (s.off > cur) {
      const std::uint64_t gap = s.off - cur;
      if (gap >= need) {
        if (fit == Fit::kFirst) {
          best = cur;
          break;
        }
        if (gap < best_gap) {
          best_gap = gap;
          best = cur;
          if (gap == need) break;
        }
      }
    }
    if (s.end > cur) cur = s.end;
  }
  // Units (see planner.cpp) are about 4 ns here: a heap step costs about 7,
  // the tree walk and the commit about 170.
  work.add(170 + 7 * steps);
  return best != kUnplaced ? best : cur;
}

std::uint64_t Placer::place(const std::vector<std::uint32_t>& order,
                            std::vector<std::uint64_t>& offsets, Fit fit,
                            Work& work) {
  for (std::uint32_t item : order) {
    offsets[item] = find_offset(item, fit, work);
    commit(item, offsets[item]);
  }
  return height(inst_, offsets);
}

std::vector<std::uint64_t> initial_offsets(const Instance& inst) {
  std::vector<std::uint64_t> offsets(inst.num_items, kUnplaced);
  for (std::uint32_t i = inst.num_free; i < inst.num_items; ++i) {
    offsets[i] = inst.fixed_offset[i - inst.num_free];
  }
  return offsets;
}

std::uint64_t height(const Instance& inst, const std::vector<std::uint64_t>& offsets) {
  std::uint64_t h = 0;
  for (std::uint32_t i = 0; i < inst.num_items; ++i) {
    if (offsets[i] != kUnplaced) h = std::max(h, offsets[i] + inst.size[i]);
  }
  return h;
}

namespace {

// Max of inst.live over each item's pieces, with a sparse table.
std::vector<std::uint64_t> pressures(const Instance& inst) {
  const std::int32_t T = inst.ticks;
  std::vector<std::vector<std::uint64_t>> table{inst.live};
  for (std::int32_t w = 1; 2 * w <= T; w *= 2) {
    const std::vector<std::uint64_t>& prev = table.back();
    std::vector<std::uint64_t> next(static_cast<std::size_t>(T - 2 * w + 1));
    for (std::size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + w]);
    table.push_back(std::move(next));
  }
  std::vector<std::uint64_t> out(inst.num_free, 0);
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      const Piece& p = inst.pieces[k];
      std::int32_t level = 0;
      while ((2 << level) <= p.hi - p.lo) ++level;
      const std::vector<std::uint64_t>& row = table[level];
      out[i] = std::max({out[i], row[p.lo], row[p.hi - (1 << level)]});
    }
  }
  return out;
}

std::int32_t first_tick(const Instance& inst, std::uint32_t item) {
  std::int32_t t = inst.ticks;
  for (std::uint32_t k = inst.piece_begin[item]; k < inst.piece_begin[item + 1]; ++k) {
    t = std::min(t, inst.pieces[k].lo);
  }
  return t;
}

}  // namespace

std::vector<std::uint32_t> make_order(const Instance& inst, Order order) {
  const std::uint32_t n = inst.num_free;
  std::vector<std::uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  std::vector<std::int64_t> len(n);
  for (std::uint32_t i = 0; i < n; ++i) len[i] = inst.length(i);
  const std::vector<std::uint64_t>& sz = inst.size;
  auto area = [&](std::uint32_t i) {
    return static_cast<long double>(sz[i]) * static_cast<long double>(len[i]);
  };
  switch (order) {
    case Order::kSize:
      std::sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        if (inst.start[a] != inst.start[b]) return inst.start[a] < inst.start[b];
        if (inst.duration[a] != inst.duration[b]) return inst.duration[a] > inst.duration[b];
        return a < b;
      });
      break;
    case Order::kArea:
      std::sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
        const long double x = area(a), y = area(b);
        if (x != y) return x > y;
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    case Order::kLength:
      std::sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (len[a] != len[b]) return len[a] > len[b];
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    case Order::kStart: {
      std::vector<std::int32_t> start(n);
      for (std::uint32_t i = 0; i < n; ++i) start[i] = first_tick(inst, i);
      std::sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (start[a] != start[b]) return start[a] < start[b];
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    }
    case Order::kPressure:
    case Order::kPressureArea: {
      const std::vector<std::uint64_t> pr = pressures(inst);
      const bool by_area = order == Order::kPressureArea;
      std::sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (pr[a] != pr[b]) return pr[a] > pr[b];
        if (by_area) {
          const long double x = area(a), y = area(b);
          if (x != y) return x > y;
        }
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    }
  }
  return ids;
}

}  // namespace renaissance::planner::detail
