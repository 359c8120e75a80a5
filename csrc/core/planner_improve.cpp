// planner_improve.cpp - peak repair by iterated greedy (see planner_improve.h).
//
// Ruin and recreate around the peak: pick an item whose top defines (or
// nearly defines) the plan height, remove every item over its lifetime whose
// top lies above a random level, and re-place the removed ones with best fit
// while all the others keep their offsets.
//
// Invariants kept here: only strictly lower valid plans replace the input;
// kept items never move, and removed items are re-placed by the Placer among
// the kept ones, so every candidate plan is valid.
#include "core/planner_improve.h"

#include <algorithm>

namespace renaissance::planner::detail {
namespace {

std::uint64_t mix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void improve(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed, Work& work,
             std::uint64_t& height, std::vector<std::uint64_t>& offsets, std::string& method) {
  const std::uint32_t n = inst.num_free;
  if (n < 2) return;
  Placer placer(inst);
  std::uint64_t rng = seed ^ 0x1e9a1b0a7dull;
  std::vector<std::uint64_t> cur = offsets, offs;
  std::uint64_t cur_height = height;
  std::vector<std::uint32_t> top, removed;
  std::vector<char> mark(static_cast<std::size_t>(inst.ticks), 0);
  // A round costs about one reset of the tree plus a few placements; stop
  // when the budget cannot pay for another one.
  std::uint64_t round_cost = 0;
  for (std::uint64_t round = 0; height > lower_bound; ++round) {
    if (work.out() || (round_cost > 0 && work.left() < round_cost)) return;
    const std::uint64_t before = work.used();
    // The items defining the peak: their tops are within a small band of
    // the current height.
    const std::uint64_t band = std::max<std::uint64_t>(1, (cur_height - lower_bound) / 4 + 1);
    top.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (cur[i] + inst.size[i] + band > cur_height) top.push_back(i);
    }
    if (top.empty()) return;
    // Ruin: pick one of them, and clear the region above a random level over
    // its lifetime (itself included); every other item keeps its offset.
    const std::uint32_t pivot = top[mix(rng) % top.size()];
    std::fill(mark.begin(), mark.end(), 0);
    for (std::uint32_t k = inst.piece_begin[pivot]; k < inst.piece_begin[pivot + 1]; ++k) {
      for (std::int32_t t = inst.pieces[k].lo; t < inst.pieces[k].hi; ++t) mark[t] = 1;
    }
    const double u = 0.5 + 0.5 * static_cast<double>(mix(rng) >> 11) * 0x1.0p-53;
    const auto level = static_cast<std::uint64_t>(static_cast<double>(cur_height) * u);
    offs = cur;
    removed.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (cur[i] + inst.size[i] <= level) continue;
      bool hit = false;
      for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1] && !hit; ++k) {
        for (std::int32_t t = inst.pieces[k].lo; t < inst.pieces[k].hi; ++t) {
          if (mark[t]) {
            hit = true;
            break;
          }
        }
      }
      if (hit) {
        removed.push_back(i);
        offs[i] = kUnplaced;
      }
    }
    work.add(n + static_cast<std::uint64_t>(inst.ticks));
    // Recreate: best fit, biggest (or longest) first.
    const bool by_size = round % 2 == 0;
    std::sort(removed.begin(), removed.end(), [&](std::uint32_t a, std::uint32_t b) {
      if (by_size && inst.size[a] != inst.size[b]) return inst.size[a] > inst.size[b];
      if (inst.duration[a] != inst.duration[b]) return inst.duration[a] > inst.duration[b];
      if (inst.size[a] != inst.size[b]) return inst.size[a] > inst.size[b];
      return a < b;
    });
    placer.reset(offs);
    work.add(250 * static_cast<std::uint64_t>(n));  // the reset (about 1 us an item)
    const std::uint64_t h = std::max(placer.place(removed, offs, Fit::kBest, work), inst.fixed_top);
    round_cost = work.used() - before;
    if (h <= cur_height) {  // accept sideways moves: they reshape the plan
      cur.swap(offs);
      cur_height = h;
      if (h < height) {
        height = h;
        offsets = cur;
        method = "peak_repair";
      }
    }
  }
}

}  // namespace renaissance::planner::detail
