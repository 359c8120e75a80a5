// planner_sweep.cpp - the sweep fallback placement (see planner_sweep.h).
//
// Invariants kept here: the free list holds maximal free blocks below `top`
// (none touches another or `top`), indexed by offset and by (length,
// offset); a range is handed out only from a free block or from `top`, and
// returned to the list only once its item is dead, so live items never
// overlap.
#include "core/planner_sweep.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/planner_greedy.h"
#include "core/planner_obstacles.h"

namespace renaissance::planner::detail {
namespace {

// Free blocks below `top`, maximal (none touches another or the top):
// indexed by start and by end (hash maps, for merging on free) and by
// (length, start) (an ordered set, for best fit).
class FreeList {
 public:
  explicit FreeList(std::uint64_t top, std::size_t expected) : top_(top) {
    end_of_.reserve(expected);
    start_of_.reserve(expected);
  }

  // Best fit: the shortest free block that holds `size` (lowest offset among
  // equals), else the top.
  std::uint64_t take(std::uint64_t size) {
    const auto it = by_size_.lower_bound({size, 0});
    if (it == by_size_.end()) {
      const std::uint64_t off = top_;
      top_ += size;
      return off;
    }
    const std::uint64_t len = it->first, off = it->second;
    auto node = by_size_.extract(it);
    end_of_.erase(off);
    if (len > size) {
      // The rest of the block stays free: reuse the set's node for it.
      node.value() = {len - size, off + size};
      by_size_.insert(std::move(node));
      end_of_.emplace(off + size, off + len);
      start_of_[off + len] = off + size;
    } else {
      start_of_.erase(off + len);
    }
    return off;
  }

  // Returns [a, b) (not free before) to the list, merging with neighbours.
  void give(std::uint64_t a, std::uint64_t b) {
    const auto next = end_of_.find(b);
    if (next != end_of_.end()) {
      const std::uint64_t end = next->second;
      by_size_.erase({end - b, b});
      end_of_.erase(next);
      start_of_.erase(end);
      b = end;
    }
    const auto prev = start_of_.find(a);
    if (prev != start_of_.end()) {
      const std::uint64_t start = prev->second;
      by_size_.erase({a - start, start});
      start_of_.erase(prev);
      end_of_.erase(start);
      a = start;
    }
    if (b == top_) {
      top_ = a;
    } else {
      insert(a, b);
    }
  }

  // A free block below the top (used to seed the gaps between obstacles).
  void insert(std::uint64_t a, std::uint64_t b) {
    end_of_.emplace(a, b);
    start_of_.emplace(b, a);
    by_size_.insert({b - a, a});
  }

 private:
  std::uint64_t top_;
  std::unordered_map<std::uint64_t, std::uint64_t> end_of_;    // start -> end
  std::unordered_map<std::uint64_t, std::uint64_t> start_of_;  // end -> start
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (length, start)
};

// Places `items` (free items) by the sweep on `free`.
void sweep(const Instance& inst, const std::vector<std::uint32_t>& items, FreeList& free,
           std::vector<std::uint64_t>& offsets) {
  // Items live at every tick (a wrapped lifetime counts as one) go first and
  // stay; the others are allocated at their first tick, larger ones first,
  // and freed at their end (ends of a tick before its starts). Keys are
  // copied next to the item so that the sorts stay in the cache.
  struct Key {
    std::int32_t tick;
    std::uint32_t item;
    std::uint64_t size;
  };
  std::vector<Key> always, starts, ends;
  for (std::uint32_t i : items) {
    poll(inst.stop);
    const Piece& p = inst.piece(i, 0);
    if (inst.piece_count(i) > 1 || (p.lo == 0 && p.hi == inst.ticks)) {
      always.push_back({0, i, inst.size[i]});
    } else {
      starts.push_back({p.lo, i, inst.size[i]});
      ends.push_back({p.hi, i, inst.size[i]});
    }
  }
  auto first_larger = [](const Key& a, const Key& b) {
    if (a.tick != b.tick) return a.tick < b.tick;
    return a.size != b.size ? a.size > b.size : a.item < b.item;
  };
  const auto polled = Stop::polled(inst.stop, first_larger);
  std::sort(always.begin(), always.end(), polled);
  std::sort(starts.begin(), starts.end(), polled);
  std::sort(ends.begin(), ends.end(), polled);
  for (const Key& k : always) {
    poll(inst.stop);
    offsets[k.item] = free.take(k.size);
  }
  std::size_t e = 0;
  for (const Key& k : starts) {
    poll(inst.stop);
    for (; e < ends.size() && ends[e].tick <= k.tick; ++e) {
      const std::uint64_t off = offsets[ends[e].item];
      free.give(off, off + ends[e].size);
    }
    offsets[k.item] = free.take(k.size);
  }
}

}  // namespace

std::uint64_t sweep_best_fit(const Instance& inst, std::vector<std::uint64_t>& offsets) {
  const std::uint32_t n = inst.num_free;
  // Obstacles hold their (merged) ranges for the whole horizon.
  std::vector<Span> spans;
  for (std::uint32_t i = n; i < inst.num_items; ++i) {
    const std::uint64_t off = inst.fixed_offset[i - n];
    spans.push_back({off, off + inst.size[i]});
  }
  merge_spans(spans);
  FreeList free(spans.empty() ? 0 : spans.back().end, n + spans.size());
  std::uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.off > at) free.insert(at, s.off);
    at = s.end;
  }
  std::vector<std::uint32_t> items(n);
  for (std::uint32_t i = 0; i < n; ++i) items[i] = i;
  sweep(inst, items, free, offsets);
  return height(inst, offsets);
}

std::uint64_t sweep_best_fit_above(const Instance& inst, std::uint64_t base,
                                   std::vector<std::uint64_t>& offsets) {
  std::vector<std::uint32_t> items;
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    if (offsets[i] == kUnplaced) items.push_back(i);
  }
  FreeList free(base, items.size());
  sweep(inst, items, free, offsets);
  return height(inst, offsets);
}

}  // namespace renaissance::planner::detail
