// planner_improve.cpp - peak repair by iterated greedy (see planner_improve.h).
//
// Ruin and recreate around the peak: pick an item whose top defines (or
// nearly defines) the plan height, remove every item over its lifetime whose
// top lies above a random level, and re-place the removed ones with best fit
// while all the others keep their offsets.
//
// repair_peaks (see planner_improve.h) frees the buffers live where the plan
// comes near its height and re-plans them as a sub-problem in which all else
// is a fixed obstacle.
//
// Invariants kept here: only strictly lower valid plans replace the input;
// kept items never move, and removed items are re-placed by the Placer (or
// the canonical search) among the kept ones, so every candidate plan is
// valid; sub-problems are expressed in the instance's compressed ticks, with
// the same overlaps as the instance.
#include "core/planner_improve.h"

#include <algorithm>
#include <functional>
#include <tuple>

#include "core/planner_bound.h"
#include "core/planner_obstacles.h"
#include "core/planner_search.h"

namespace renaissance::planner::detail {
void improve(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed, Work& work,
             std::uint64_t& height, std::vector<std::uint64_t>& offsets, std::string& method) {
  const std::uint32_t n = inst.num_free;
  if (n < 2) return;
  Placer placer(inst);
  std::uint64_t rng = seed ^ 0x1e9a1b0a7dull;
  std::vector<std::uint64_t> cur = offsets, offs;
  std::uint64_t cur_height = height;
  std::vector<std::uint32_t> top, removed;
  std::vector<std::int32_t> mark(static_cast<std::size_t>(inst.ticks) + 1, 0);
  std::vector<std::int32_t> marked(static_cast<std::size_t>(inst.ticks) + 1, 0);
  // A round costs about one reset of the tree plus a few placements; stop
  // when the budget cannot pay for another one.
  std::uint64_t round_cost = 0;
  for (std::uint64_t round = 0; height > lower_bound; ++round) {
    if (work.out() || (round_cost > 0 && !work.affords(round_cost))) return;
    const std::uint64_t before = work.used();
    // The items defining the peak: their tops are within a small band of
    // the current height.
    const std::uint64_t band = std::max<std::uint64_t>(1, (cur_height - lower_bound) / 4 + 1);
    top.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (i % 256 == 0) poll(inst.stop);
      if (cur[i] + inst.size[i] + band > cur_height) top.push_back(i);
    }
    if (top.empty()) return;
    // Ruin: pick one of them, and clear the region above a random level over
    // its lifetime (itself included); every other item keeps its offset.
    const std::uint32_t pivot = top[mix(rng) % top.size()];
    // marked[t]: the pivot's ticks before t (a prefix count, so that an
    // item's overlap with the pivot costs O(1) per piece, not its length).
    std::fill(mark.begin(), mark.end(), 0);
    for (std::uint32_t k = inst.piece_begin[pivot]; k < inst.piece_begin[pivot + 1]; ++k) {
      mark[inst.pieces[k].lo] += 1;
      mark[inst.pieces[k].hi] -= 1;
    }
    for (std::int32_t t = 0, inside = 0; t < inst.ticks; ++t) {
      if (t % 256 == 0) poll(inst.stop);
      inside += mark[t];
      marked[t + 1] = marked[t] + (inside > 0 ? 1 : 0);
    }
    const double u = 0.5 + 0.5 * static_cast<double>(mix(rng) >> 11) * 0x1.0p-53;
    const auto level = static_cast<std::uint64_t>(static_cast<double>(cur_height) * u);
    offs = cur;
    removed.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (i % 256 == 0) poll(inst.stop);
      if (cur[i] + inst.size[i] <= level) continue;
      bool hit = false;
      for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1] && !hit; ++k) {
        hit = marked[inst.pieces[k].hi] != marked[inst.pieces[k].lo];
      }
      if (hit) {
        removed.push_back(i);
        offs[i] = kUnplaced;
      }
    }
    work.add(n + static_cast<std::uint64_t>(inst.ticks));
    // Recreate: best fit, biggest (or longest) first.
    const bool by_size = round % 2 == 0;
    std::sort(removed.begin(), removed.end(),
              Stop::polled(inst.stop, [&](std::uint32_t a, std::uint32_t b) {
                if (by_size && inst.size[a] != inst.size[b]) return inst.size[a] > inst.size[b];
                if (inst.duration[a] != inst.duration[b]) {
                  return inst.duration[a] > inst.duration[b];
                }
                if (inst.size[a] != inst.size[b]) return inst.size[a] > inst.size[b];
                return a < b;
              }));
    placer.reset(offs);
    work.add(250 * static_cast<std::uint64_t>(n));  // the reset (about 1 us an item)
    std::uint64_t placed = 0;
    if (!placer.try_place(removed, offs, Fit::kBest, work, placed)) return;  // out of budget
    const std::uint64_t h = std::max(placed, inst.fixed_top);
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

namespace {

// Sub-problems over more buffers than this are cut down (see repair_peaks).
constexpr std::uint32_t kMaxFreed = 320;
// Sub-problems up to this many buffers get the canonical search after the
// best-fit passes.
constexpr std::uint32_t kSearchFreed = 1500;
// A sub-problem keeps at most this many obstacles per freed buffer (the
// floor rises until it does; see make_sub).
constexpr std::size_t kObstaclesPerFreed = 8;
// Each sub-problem gets at most this fraction of what is left.
constexpr std::uint64_t kSlices = 6;
// Neighbourhoods, from small to large: the peak ticks are those where the
// plan's top is within `band` (a fraction of the height) of the height, then
// widened by `radius` (a fraction of the ticks) on each side. The last one,
// the top band (band < 0), only on instances of at most kMaxFreed buffers:
// a quarter to half of the buffers, those with the highest tops over every
// tick. On small hard instances (MiniMalloc's, packed_square's) the plan's
// top is a plateau (MiniMalloc's D: at the height over 75% of the time), so
// a window at the peak frees only part of what holds it up; the top band
// re-plans all of it (docs/benchmarks.md, issue 12's tenth pass).
struct Stage {
  double band;
  double radius;
};
constexpr Stage kStages[] = {{0.0, 0.0},   {0.005, 0.0}, {0.0, 0.02}, {0.01, 0.05},
                             {0.02, 0.1},  {0.04, 0.2},  {-1.0, -1.0}};
constexpr std::size_t kNumStages = sizeof(kStages) / sizeof(kStages[0]);

std::uint64_t hash_marks(const std::vector<char>& marks) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the marked indices
  for (std::size_t i = 0; i < marks.size(); ++i) {
    if (!marks[i]) continue;
    h = (h ^ i) * 1099511628211ull;
  }
  return h;
}

// A free item's lifetime in compressed ticks, as one (lower, upper) under
// period inst.ticks: a two-piece item is [lo, ticks) + [0, hi) (cyclic
// wrap-around). Returns false for any other shape (never built by Instance).
bool tick_lifetime(const Instance& inst, std::uint32_t item, std::int64_t& lower,
                   std::int64_t& upper) {
  const Piece* p = &inst.pieces[inst.piece_begin[item]];
  if (inst.piece_count(item) == 1) {
    lower = p[0].lo;
    upper = p[0].hi;
    return true;
  }
  if (inst.piece_count(item) != 2) return false;
  const Piece& first = p[0].hi == inst.ticks ? p[0] : p[1];
  const Piece& second = p[0].hi == inst.ticks ? p[1] : p[0];
  if (first.hi != inst.ticks || second.lo != 0 || second.hi >= first.lo) return false;
  lower = first.lo;
  upper = inst.ticks + second.hi;
  return true;
}

struct SubProblem {
  Problem problem;
  std::vector<std::uint32_t> items;  // sub buffer k -> instance item
  std::uint64_t floor = 0;           // sub offset 0 is this instance offset
};

// The sub-problem freeing the items marked in `freed`: everything else that
// overlaps them in time becomes a fixed obstacle. Its time is cut only where
// a freed item starts or ends: a freed item live anywhere between two such
// cuts is live across all of it, so an obstacle is stretched to the cuts
// around it without changing which placements are valid (and obstacles that
// become equal are merged).
SubProblem make_sub(const Instance& inst, const std::vector<std::uint64_t>& offsets,
                    const std::vector<char>& freed, std::uint64_t ceiling,
                    std::uint64_t floor_cap, std::size_t max_obstacles,
                    std::vector<std::int32_t>& cuts) {
  SubProblem sub;
  sub.problem.period = inst.multi_piece ? inst.ticks : 0;
  cuts.clear();
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    if (i % 256 == 0) poll(inst.stop);
    if (!freed[i]) continue;
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      cuts.push_back(inst.pieces[k].lo);
      cuts.push_back(inst.pieces[k].hi);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // Which gaps between cuts have a freed item live: exactly those inside a
  // freed piece (cuts include every freed piece's ends).
  std::vector<char> live(cuts.size(), 0);
  auto cut_index = [&](std::int32_t t) {
    return static_cast<std::size_t>(std::lower_bound(cuts.begin(), cuts.end(), t) - cuts.begin());
  };
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    if (i % 256 == 0) poll(inst.stop);
    if (!freed[i]) continue;
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      const Piece& p = inst.pieces[k];
      for (std::size_t c = cut_index(p.lo); cuts[c] < p.hi; ++c) live[c] = 1;
    }
  }
  for (std::uint32_t i = 0; i < inst.num_items; ++i) {
    poll(inst.stop);
    if (i < inst.num_free && freed[i]) {
      Buffer b;
      b.size = inst.size[i];
      tick_lifetime(inst, i, b.lower, b.upper);
      sub.problem.buffers.push_back(b);
      sub.items.push_back(i);
      continue;
    }
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      const Piece& p = inst.pieces[k];
      // The cut gaps the piece touches: [a, b) in cut indices.
      std::size_t a = cut_index(p.lo);
      if ((a == cuts.size() || cuts[a] > p.lo) && a > 0) --a;
      std::size_t b = std::min(cut_index(p.hi), cuts.size() - 1);
      // Keep only the stretch that meets a freed item.
      while (a < b && !live[a]) ++a;
      while (b > a && !live[b - 1]) --b;
      if (a >= b || cuts[a] >= p.hi || cuts[b] <= p.lo) continue;
      // Clipped at the ceiling: a sub-plan is only used when every freed
      // item ends at or below it, and such an item meets the clipped
      // obstacle exactly when it meets the whole one.
      if (offsets[i] >= ceiling) continue;
      FixedBuffer f;
      f.offset = offsets[i];
      f.size = std::min(inst.size[i], ceiling - offsets[i]);
      f.lower = cuts[a];
      f.upper = cuts[b];
      sub.problem.fixed.push_back(f);
    }
  }
  // The floor: the freed items stay at or above it (sub offsets are
  // relative to it), so the obstacles ending at or below it drop out and
  // the rest are clipped to start at it. It is the lowest level that leaves
  // at most max_obstacles of them, and never above floor_cap (the lowest
  // freed offset, so the current placement stays possible).
  std::uint64_t floor = 0;
  std::vector<FixedBuffer>& fixed = sub.problem.fixed;
  if (fixed.size() > max_obstacles && max_obstacles > 0) {
    std::vector<std::uint64_t> ends(fixed.size());
    for (std::size_t k = 0; k < fixed.size(); ++k) ends[k] = fixed[k].offset + fixed[k].size;
    std::nth_element(ends.begin(), ends.begin() + static_cast<std::ptrdiff_t>(max_obstacles - 1),
                     ends.end(), std::greater<std::uint64_t>());
    floor = std::min(floor_cap, ends[max_obstacles - 1]);
  }
  sub.floor = floor;
  if (floor > 0) {
    std::size_t w = 0;
    for (const FixedBuffer& f0 : fixed) {
      const std::uint64_t end = f0.offset + f0.size;
      if (end <= floor) continue;
      FixedBuffer f = f0;
      f.offset = std::max(f.offset, floor) - floor;
      f.size = end - floor - f.offset;
      fixed[w++] = f;
    }
    fixed.resize(w);
  }
  auto key = [](const FixedBuffer& f) {
    return std::make_tuple(f.lower, f.upper, f.offset, f.size);
  };
  std::sort(sub.problem.fixed.begin(), sub.problem.fixed.end(),
            [&](const FixedBuffer& x, const FixedBuffer& y) { return key(x) < key(y); });
  sub.problem.fixed.erase(
      std::unique(sub.problem.fixed.begin(), sub.problem.fixed.end(),
                  [&](const FixedBuffer& x, const FixedBuffer& y) { return key(x) == key(y); }),
      sub.problem.fixed.end());
  return sub;
}

}  // namespace

namespace {

// Whether repair_peaks can work on this instance and plan: two or more free
// items, some ticks, a plan above the bound, and size sums far from the
// 64-bit limit Instance checks (a sub-problem repeats a kept item once per
// piece).
bool repairable(const Instance& inst, std::uint64_t lower_bound, std::uint64_t height) {
  const std::uint32_t n = inst.num_free;
  if (n < 2 || inst.ticks <= 0 || height <= lower_bound) return false;
  for (std::uint32_t i = 0; i < n; ++i) {
    std::int64_t lo = 0, hi = 0;
    if (!tick_lifetime(inst, i, lo, hi)) return false;  // (never: see tick_lifetime)
  }
  std::uint64_t total = inst.fixed_top;
  for (std::uint32_t i = 0; i < inst.num_items; ++i) {
    if (inst.size[i] > (std::uint64_t{1} << 60) - total) return false;
    total += inst.size[i];
  }
  return true;
}

// The state of repair_peaks (see planner_improve.h) and its steps: a round
// computes the plan's top per tick (compute_top), picks the freed set of
// its stage (choose_freed, with free_at), and re-plans it as a sub-problem
// (solve_region).
class PeakRepair {
 public:
  PeakRepair(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed, Work& work,
             std::uint64_t& height, std::vector<std::uint64_t>& offsets, std::string& method)
      : inst_(inst), lower_bound_(lower_bound), work_(work), height_(height),
        offsets_(offsets), method_(method), n_(inst.num_free), T_(inst.ticks),
        rng_(seed ^ 0x9ea4c0ffeeull), top_(static_cast<std::size_t>(T_)),
        sum_(static_cast<std::size_t>(T_) + 1), hot_(static_cast<std::size_t>(T_)),
        window_(hot_.size()), freed_(n_), cur_(offsets) {
    while (leaves_ < static_cast<std::size_t>(T_)) leaves_ *= 2;
    tags_.assign(2 * leaves_, 0);
    while ((std::size_t{1} << log_leaves_) < leaves_) ++log_leaves_;
  }

  void run() {
    bool top_valid = false;  // top_ describes cur_ (recomputed only after cur_ changed)
    std::vector<std::uint64_t> failed;  // freed sets that gave nothing at this height
    std::size_t stage = 0, skipped = 0;
    // The top band (the last stage) only on small instances.
    const std::size_t stages = n_ <= kMaxFreed ? kNumStages : kNumStages - 1;
    // Units of the last round outside its sub-search (which looks at the
    // clock): a round starts only when the clock fits that much.
    std::uint64_t fixed_cost = 0;
    while (height_ > lower_bound_ && !work_.out() && work_.fits_clock(fixed_cost)) {
      const std::uint64_t round_start = work_.used();
      if (!top_valid) {
        compute_top();
        top_valid = true;
      }
      const std::uint32_t count = choose_freed(kStages[stage]);
      // A freed set that already failed at this height is skipped (until
      // every stage in a row has been, then all are tried again with fresh
      // seeds).
      const std::uint64_t key = hash_marks(freed_);
      if (std::find(failed.begin(), failed.end(), key) != failed.end()) {
        stage = (stage + 1) % stages;
        if (++skipped >= stages) {
          failed.clear();
          skipped = 0;
        }
        continue;
      }
      skipped = 0;
      std::uint64_t searched = 0;
      const bool progress = solve_region(count, searched);
      if (progress) top_valid = false;
      fixed_cost = work_.used() - round_start - searched;
      if (progress) {
        failed.clear();
        stage = 0;
      } else {
        failed.push_back(key);
        stage = (stage + 1) % stages;
      }
    }
  }

 private:
  // Marks the free items live at a tick of `mask` within [from, to);
  // returns how many.
  std::uint32_t free_at(const std::vector<char>& mask, std::int32_t from, std::int32_t to) {
    sum_[0] = 0;
    for (std::int32_t t = 0; t < T_; ++t) {
      if (t % 256 == 0) poll(inst_.stop);
      sum_[t + 1] = sum_[t] + (t >= from && t < to && mask[t] ? 1 : 0);
    }
    std::uint32_t count = 0;
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (i % 256 == 0) poll(inst_.stop);
      freed_[i] = 0;
      for (std::uint32_t k = inst_.piece_begin[i]; k < inst_.piece_begin[i + 1]; ++k) {
        if (sum_[inst_.pieces[k].hi] != sum_[inst_.pieces[k].lo]) freed_[i] = 1;
      }
      count += freed_[i];
    }
    work_.add(static_cast<std::uint64_t>(T_) + 2 * n_);
    return count;
  }

  // The plan's top per tick: each piece raises the canonical nodes of its
  // ticks in a bottom-up segment tree, then the maxima are pushed down to
  // the leaves (O(pieces log T + T), whatever the lifetimes' lengths).
  void compute_top() {
    std::fill(tags_.begin(), tags_.end(), 0);
    for (std::uint32_t i = 0; i < inst_.num_items; ++i) {
      if (i % 64 == 0) poll(inst_.stop);
      const std::uint64_t end = cur_[i] + inst_.size[i];
      for (std::uint32_t k = inst_.piece_begin[i]; k < inst_.piece_begin[i + 1]; ++k) {
        std::size_t l = leaves_ + static_cast<std::size_t>(inst_.pieces[k].lo);
        std::size_t r = leaves_ + static_cast<std::size_t>(inst_.pieces[k].hi);
        for (; l < r; l >>= 1, r >>= 1) {
          if (l & 1) {
            tags_[l] = std::max(tags_[l], end);
            ++l;
          }
          if (r & 1) {
            --r;
            tags_[r] = std::max(tags_[r], end);
          }
        }
      }
    }
    for (std::size_t v = 1; v < leaves_; ++v) {
      if (v % 256 == 0) poll(inst_.stop);
      tags_[2 * v] = std::max(tags_[2 * v], tags_[v]);
      tags_[2 * v + 1] = std::max(tags_[2 * v + 1], tags_[v]);
    }
    for (std::int32_t t = 0; t < T_; ++t) top_[t] = tags_[leaves_ + static_cast<std::size_t>(t)];
    work_.add(inst_.pieces.size() * (4 + 2 * log_leaves_) + 3 * leaves_);
  }

  // The freed set of stage `st` (freed_; returns its size): every item live
  // in the window of this stage; too many, and it is cut to one run of the
  // window, then to the items with the highest tops over that run. The top
  // band: a drawn quarter to half of the items, the highest tops.
  std::uint32_t choose_freed(const Stage& st) {
    if (st.band < 0) return choose_top_band();
    const std::uint64_t threshold =
        height_ - static_cast<std::uint64_t>(st.band * static_cast<double>(height_));
    const auto radius = static_cast<std::int32_t>(st.radius * static_cast<double>(T_));
    sum_[0] = 0;
    for (std::int32_t t = 0; t < T_; ++t) {
      if (t % 256 == 0) poll(inst_.stop);
      hot_[t] = top_[t] >= threshold;
      sum_[t + 1] = sum_[t] + hot_[t];
    }
    for (std::int32_t t = 0; t < T_; ++t) {
      window_[t] = sum_[std::min(T_, t + radius + 1)] != sum_[std::max(0, t - radius)];
    }
    std::uint32_t count = free_at(window_, 0, T_);
    if (count <= kMaxFreed) return count;
    runs_.clear();
    for (std::int32_t t = 0; t < T_; ++t) {
      if (window_[t] && (t == 0 || !window_[t - 1])) runs_.push_back(t);
    }
    const std::int32_t a = runs_[mix(rng_) % runs_.size()];
    std::int32_t b = a;
    while (b < T_ && window_[b]) ++b;
    count = free_at(window_, a, b);
    if (count <= kMaxFreed) return count;
    // Still too many: the top of the column over that run, the items with
    // the highest tops.
    chosen_.clear();
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (freed_[i]) chosen_.push_back(i);
    }
    auto higher = [&](std::uint32_t x, std::uint32_t y) {
      const std::uint64_t tx = cur_[x] + inst_.size[x], ty = cur_[y] + inst_.size[y];
      return tx != ty ? tx > ty : x < y;
    };
    // How many: from a quarter of kMaxFreed to all of it, drawn, so that
    // rounds on the same run free different stacks.
    const std::size_t keep = kMaxFreed / 4 + mix(rng_) % (kMaxFreed - kMaxFreed / 4 + 1);
    std::partial_sort(chosen_.begin(), chosen_.begin() + static_cast<std::ptrdiff_t>(keep),
                      chosen_.end(), Stop::polled(inst_.stop, higher));
    for (std::size_t k = keep; k < chosen_.size(); ++k) freed_[chosen_[k]] = 0;
    count = static_cast<std::uint32_t>(std::min(keep, chosen_.size()));
    work_.add(4 * chosen_.size() + 16);
    return count;
  }

  // The top band (see kStages): from a quarter to half of the items (at
  // least 2), drawn, those with the highest tops (ties by index).
  std::uint32_t choose_top_band() {
    chosen_.resize(n_);
    for (std::uint32_t i = 0; i < n_; ++i) chosen_[i] = i;
    auto higher = [&](std::uint32_t x, std::uint32_t y) {
      const std::uint64_t tx = cur_[x] + inst_.size[x], ty = cur_[y] + inst_.size[y];
      return tx != ty ? tx > ty : x < y;
    };
    const std::size_t lo = std::max<std::size_t>(2, n_ / 4);
    const std::size_t hi = std::max<std::size_t>(lo, n_ / 2);
    const std::size_t keep = std::min<std::size_t>(n_, lo + mix(rng_) % (hi - lo + 1));
    std::partial_sort(chosen_.begin(), chosen_.begin() + static_cast<std::ptrdiff_t>(keep),
                      chosen_.end(), Stop::polled(inst_.stop, higher));
    std::fill(freed_.begin(), freed_.end(), 0);
    for (std::size_t k = 0; k < keep; ++k) freed_[chosen_[k]] = 1;
    work_.add(4 * static_cast<std::uint64_t>(n_) + 16);
    return static_cast<std::uint32_t>(keep);
  }

  // Re-plans the `count` freed items as a sub-problem with everything else
  // fixed; keeps the sub-plan (in cur_, and in the caller's plan when the
  // height drops) when the freed region's top drops. Returns whether it
  // did; `searched` gets the units of its share (the sub-search's budget).
  bool solve_region(std::uint32_t count, std::uint64_t& searched) {
    // The freed items' highest top now: a sub-plan is kept when it is
    // strictly lower (every freed item ends at or below `ceiling`), so the
    // obstacles above the ceiling drop out (see make_sub).
    std::uint64_t region_top = 0;
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (i % 256 == 0) poll(inst_.stop);
      if (freed_[i]) region_top = std::max(region_top, cur_[i] + inst_.size[i]);
    }
    work_.add(n_);
    if (count < 2 || region_top == 0) return false;
    bool progress = false;
    const std::uint64_t ceiling = region_top - 1;
    std::uint64_t lowest = kUnplaced;
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (freed_[i]) lowest = std::min(lowest, cur_[i]);
    }
    const SubProblem sub =
        make_sub(inst_, cur_, freed_, ceiling, lowest, kObstaclesPerFreed * count, cuts_);
    const std::uint64_t base = sub.floor;
    Instance sub_inst(sub.problem);
    sub_inst.stop = inst_.stop;
    // Building it: make_sub walks every item (a few binary searches each),
    // the Instance sorts the sub-problem's pieces, and the obstacle map
    // copies the live obstacles at every tick where they change (at most
    // their summed lengths).
    std::uint64_t obstacle_ticks = 0;
    for (std::uint32_t k = sub_inst.piece_begin[sub_inst.num_free]; k < sub_inst.pieces.size();
         ++k) {
      obstacle_ticks += static_cast<std::uint64_t>(sub_inst.pieces[k].hi - sub_inst.pieces[k].lo);
    }
    work_.add(24 * static_cast<std::uint64_t>(inst_.num_items) + 4 * cuts_.size() +
              80 * static_cast<std::uint64_t>(sub_inst.num_items) +
              std::min<std::uint64_t>(obstacle_ticks, std::uint64_t{1} << 21) +
              static_cast<std::uint64_t>(T_));
    // A slice of what is left; the search stops earlier when it reaches the
    // sub-problem's bound.
    Work child = work_.child(std::max<std::uint64_t>(work_.left() / kSlices, 4000000));
    const ObstacleMap sub_map(sub_inst);
    std::uint64_t sub_lb = detail::lower_bound(sub_inst, sub_map, &child);
    if (sub_lb + base < region_top) {
      // The current placement of the freed items, at region_top (above the
      // clipped obstacles: only a height to beat).
      sub_offs_ = initial_offsets(sub_inst);
      for (std::uint32_t k = 0; k < sub_inst.num_free; ++k) {
        sub_offs_[k] = cur_[sub.items[sub_inst.buffer_of[k]]] - base;
      }
      std::uint64_t sub_h = region_top - base;
      std::string sub_method;
      Placer placer(sub_inst);
      for (const Order order : {Order::kSize, Order::kLength, Order::kPressureArea}) {
        if (child.out()) break;
        offs_ = initial_offsets(sub_inst);
        placer.reset(offs_);
        const std::uint64_t h =
            std::max(placer.place(make_order(sub_inst, order), offs_, Fit::kBest, child),
                     sub_inst.fixed_top);
        if (h < sub_h) {
          sub_h = h;
          sub_offs_ = offs_;
        }
        if (sub_h <= sub_lb) break;
      }
      if (sub_h > sub_lb && !child.out() && sub_inst.num_free <= kSearchFreed) {
        search_small(sub_inst, sub_map, sub_lb, mix(rng_), child, sub_h, sub_offs_, sub_method);
      }
      if (sub_h + base < region_top) {
        for (std::uint32_t k = 0; k < sub_inst.num_free; ++k) {
          cur_[sub.items[sub_inst.buffer_of[k]]] = sub_offs_[k] + base;
        }
        const std::uint64_t h = std::max(detail::height(inst_, cur_), inst_.fixed_top);
        work_.add(n_);
        if (h < height_) {
          height_ = h;
          offsets_ = cur_;
          method_ = "peak_search";
        }
        progress = true;
      }
    }
    searched = child.used();
    work_.absorb(child);
    return progress;
  }

  const Instance& inst_;
  const std::uint64_t lower_bound_;
  Work& work_;
  std::uint64_t& height_;
  std::vector<std::uint64_t>& offsets_;
  std::string& method_;
  const std::uint32_t n_;
  const std::int32_t T_;
  std::uint64_t rng_;
  std::vector<std::uint64_t> top_;    // per tick: the plan's top (compute_top)
  std::size_t leaves_ = 1;            // segment tree of compute_top
  std::uint32_t log_leaves_ = 0;
  std::vector<std::uint64_t> tags_;
  std::vector<std::uint32_t> sum_;    // prefix counts over ticks (scratch)
  std::vector<char> hot_, window_;    // per tick (choose_freed)
  std::vector<std::int32_t> cuts_, runs_;
  std::vector<std::uint32_t> chosen_;
  std::vector<char> freed_;           // per free item: in this round's sub-problem
  std::vector<std::uint64_t> cur_;    // the plan being repaired
  std::vector<std::uint64_t> sub_offs_, offs_;
};

}  // namespace

void repair_peaks(const Instance& inst, std::uint64_t lower_bound, std::uint64_t seed,
                  Work& work, std::uint64_t& height, std::vector<std::uint64_t>& offsets,
                  std::string& method) {
  if (!repairable(inst, lower_bound, height)) return;
  PeakRepair(inst, lower_bound, seed, work, height, offsets, method).run();
}

}  // namespace renaissance::planner::detail
