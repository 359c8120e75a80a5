// planner_bound.cpp - the obstacle-aware lower bound (see planner_bound.h).
//
// Invariants kept here: every value returned is at most the height of any
// valid plan. Per tick t the bound is top_t + T_t, where top_t is the highest
// end of an obstacle live at t and T_t the least top bin [top_t, H) that the
// relaxation of planner_bound.h needs; ticks whose optimistic estimate
// (top_t + live buffer bytes) cannot beat the running bound are skipped.
#include "core/planner_bound.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "core/planner_obstacles.h"

namespace renaissance::planner::detail {
namespace {

// Gaps wider than this many granules are not knapsacked: the capacity
// rounded down to the granule is used (still a valid cap, only weaker). On
// the arena's runtime problems a larger limit never raised the bound.
constexpr std::uint64_t kMaxKnapsackBits = std::uint64_t{1} << 10;

// Reachable subset sums (in granules) of a multiset, up to a capacity.
class SubsetSums {
 public:
  SubsetSums() = default;
  // Empties the set (only the sum 0 reachable) for capacity `cap`; the
  // storage is reused.
  void reset(std::uint64_t cap) {
    cap_ = cap;
    words_.assign(cap / 64 + 1, 0);
    words_[0] = 1;
  }
  // Adds `count` copies of an item of `units` granules (binary splitting:
  // copies 1, 2, 4, ... as single items); returns the words touched.
  std::uint64_t add(std::uint64_t units, std::uint64_t count) {
    if (units == 0 || units > cap_) return 0;
    count = std::min(count, cap_ / units);
    std::uint64_t steps = 0;
    for (std::uint64_t k = 1; count > 0; k *= 2) {
      const std::uint64_t take = std::min(k, count);
      shift_or(units * take);
      steps += words_.size();
      count -= take;
    }
    return steps;
  }
  // Largest reachable sum <= cap.
  std::uint64_t best() const {
    for (std::size_t w = words_.size(); w-- > 0;) {
      std::uint64_t x = words_[w];
      if (w + 1 == words_.size() && cap_ % 64 != 63) x &= (std::uint64_t{2} << (cap_ % 64)) - 1;
      if (x != 0) {
        std::uint64_t bit = 63;
        while ((x >> bit) == 0) --bit;
        return 64 * w + bit;
      }
    }
    return 0;
  }

 private:
  void shift_or(std::uint64_t by) {
    const std::size_t ws = by / 64, bs = by % 64;
    for (std::size_t w = words_.size(); w-- > ws;) {
      std::uint64_t x = words_[w - ws] << bs;
      if (bs != 0 && w > ws) x |= words_[w - ws - 1] >> (64 - bs);
      words_[w] |= x;
    }
  }
  std::uint64_t cap_ = 0;
  std::vector<std::uint64_t> words_;
};

// Scratch space of top_bin(), reused from tick to tick.
struct TopBinScratch {
  struct Gap {
    std::uint64_t cap = 0;
    std::uint64_t count = 0;  // gaps of this capacity
    std::uint64_t best = 0;   // granules; once it reaches cap / granule, final
  };
  std::vector<Gap> groups, open, plain;
  std::vector<SubsetSums> dp;  // dp[k] belongs to open[k]
};

// The least top bin for one tick: `sizes` are the live buffer sizes with
// their counts, largest first; `gaps` the free ranges below the obstacles'
// top. For each threshold s (a live size), the buffers of size >= s must fit
// into the eligible gaps, each taking at most the largest subset sum of those
// buffers it can hold, plus the top bin. Subset sums are counted in granules
// of the gcd of the sizes >= s (rebuilt when that gcd drops); gaps of equal
// capacity share one. Adds the work done to `steps`.
std::uint64_t top_bin(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& sizes,
                      std::vector<std::uint64_t>& gaps, TopBinScratch& x, std::uint64_t& steps) {
  std::sort(gaps.begin(), gaps.end(), std::greater<>());
  steps += sizes.size() + gaps.size();
  x.groups.clear();
  for (std::uint64_t c : gaps) {
    if (!x.groups.empty() && x.groups.back().cap == c) {
      ++x.groups.back().count;
    } else {
      x.groups.push_back({c, 1, 0});
    }
  }
  std::uint64_t all = 0;  // a gap that takes every live buffer needs no knapsack
  for (const auto& z : sizes) all += z.first * z.second;
  x.open.clear();
  x.plain.clear();
  std::uint64_t granule = 0, a = 0, t = 0;
  std::size_t gi = 0;
  for (std::size_t si = 0; si < sizes.size(); ++si) {
    const std::uint64_t s = sizes[si].first;
    a += s * sizes[si].second;
    const std::uint64_t g_new = std::gcd(granule, s);
    // Gaps that fit this size open now.
    std::size_t first_new = x.open.size();
    for (; gi < x.groups.size() && x.groups[gi].cap >= s; ++gi) x.plain.push_back(x.groups[gi]);
    if (g_new != granule) {
      // Re-knapsack every gap small enough in the new granule.
      granule = g_new;
      for (const auto& g : x.open) x.plain.push_back(g);
      x.open.clear();
      first_new = 0;
    }
    std::size_t w = 0;
    for (std::size_t k = 0; k < x.plain.size(); ++k) {
      const TopBinScratch::Gap g = x.plain[k];
      if (g.cap < all && g.cap / granule <= kMaxKnapsackBits) {
        if (x.dp.size() <= x.open.size()) x.dp.emplace_back();
        x.dp[x.open.size()].reset(g.cap / granule);
        x.open.push_back({g.cap, g.count, 0});
      } else {
        x.plain[w++] = g;
      }
    }
    x.plain.resize(w);
    // New knapsacks first take the larger sizes already seen.
    for (std::size_t k = first_new; k < x.open.size(); ++k) {
      for (std::size_t j = 0; j < si; ++j) {
        steps += x.dp[k].add(sizes[j].first / granule, sizes[j].second);
      }
      x.open[k].best = x.dp[k].best();
    }
    std::uint64_t g = 0;
    for (const auto& p : x.plain) g += p.count * std::min(p.cap / granule * granule, a);
    for (std::size_t k = 0; k < x.open.size(); ++k) {
      auto& gap = x.open[k];
      if (gap.best < gap.cap / granule) {  // not yet full
        steps += x.dp[k].add(s / granule, sizes[si].second);
        gap.best = x.dp[k].best();
      }
      g += gap.count * gap.best * granule;
    }
    if (a > g) t = std::max({t, s, a - g});
  }
  return t;
}

}  // namespace

std::uint64_t lower_bound(const Instance& inst, const ObstacleMap& map, Work* work) {
  if (inst.num_free == 0) return inst.fixed_top;
  if (inst.num_items == inst.num_free) return inst.load;
  if (map.empty()) return std::max(inst.load, inst.fixed_top);
  const std::int32_t T = inst.ticks;
  // Live bytes of free buffers per tick (inst.live also counts the
  // obstacles).
  std::vector<std::uint64_t> items(static_cast<std::size_t>(T) + 1, 0);
  std::vector<std::vector<std::uint32_t>> starts(items.size()), ends(items.size());
  for (const Piece& p : inst.pieces) {
    poll(inst.stop);
    if (p.item >= inst.num_free) continue;
    starts[p.lo].push_back(p.item);
    ends[p.hi].push_back(p.item);
    items[p.lo] += inst.size[p.item];
    items[p.hi] -= inst.size[p.item];  // wraps; the prefix sum below fixes it
  }
  std::uint64_t bound = std::max(inst.load, inst.fixed_top);
  for (std::int32_t t = 1; t < T; ++t) items[t] += items[t - 1];
  if (work != nullptr) work->add(4 * inst.pieces.size() + static_cast<std::uint64_t>(T));
  // Ticks that may raise the bound, most promising first (optimistic
  // estimate: the obstacles' top plus every live buffer on top of it). They
  // are evaluated in growing batches, each by one sweep that rebuilds the
  // live sizes (size -> count, largest first), until no estimate is left
  // above the bound.
  std::vector<std::uint64_t> est(static_cast<std::size_t>(T), 0);
  std::vector<std::int32_t> order;
  for (std::int32_t t = 0; t < T; ++t) {
    if (t % 256 == 0) poll(inst.stop);
    const std::uint32_t profile = map.profile(t);
    if (profile == ObstacleMap::kNone) continue;
    est[t] = map.top(profile) + items[t];
    if (est[t] > bound) order.push_back(t);
  }
  std::sort(order.begin(), order.end(), Stop::polled(inst.stop, [&](std::int32_t a, std::int32_t b) {
    return est[a] != est[b] ? est[a] > est[b] : a < b;
  }));
  if (work != nullptr) work->add(order.size() * 8 + static_cast<std::uint64_t>(T));
  std::vector<char> pick(static_cast<std::size_t>(T), 0);
  std::map<std::uint64_t, std::uint64_t, std::greater<>> live;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sizes;
  std::vector<std::uint64_t> gaps;
  TopBinScratch scratch;
  std::size_t pos = 0, batch = 8;
  while (pos < order.size() && est[order[pos]] > bound) {
    if (work != nullptr && work->out()) break;
    std::int32_t last = -1;
    for (std::size_t k = 0; k < batch && pos < order.size() && est[order[pos]] > bound;
         ++k, ++pos) {
      pick[order[pos]] = 1;
      last = std::max(last, order[pos]);
    }
    batch *= 4;
    live.clear();
    for (std::int32_t t = 0; t <= last; ++t) {
      poll(inst.stop);
      for (std::uint32_t item : ends[t]) {
        auto it = live.find(inst.size[item]);
        if (--it->second == 0) live.erase(it);
      }
      for (std::uint32_t item : starts[t]) ++live[inst.size[item]];
      if (work != nullptr) work->add(8 * (starts[t].size() + ends[t].size()));
      if (!pick[t]) continue;
      pick[t] = 0;
      if (est[t] <= bound) continue;
      const std::uint32_t profile = map.profile(t);
      sizes.assign(live.begin(), live.end());
      gaps.clear();
      std::uint64_t cur = 0;
      for (const Span& s : map.spans(profile)) {
        if (s.off > cur) gaps.push_back(s.off - cur);
        cur = s.end;
      }
      std::uint64_t steps = 0;
      bound = std::max(bound, map.top(profile) + top_bin(sizes, gaps, scratch, steps));
      // A step is one 64-bit word of a subset-sum shift (well under 1 ns);
      // the rest is about a unit per span and a few per size and gap.
      if (work != nullptr) {
        work->add(steps / 8 + map.spans(profile).size() + 8 * (sizes.size() + gaps.size()) + 64);
      }
    }
  }
  return bound;
}

}  // namespace renaissance::planner::detail
