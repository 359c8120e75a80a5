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

Placer::Placer(const Instance& inst) : inst_(inst), tree_(inst.ticks) {}

void Placer::reset(const std::vector<std::uint64_t>& offsets) {
  tree_.clear();
  for (std::uint32_t i = 0; i < inst_.num_items; ++i) {
    poll(inst_.stop);
    if (offsets[i] != kUnplaced) commit(i, offsets[i]);
  }
  tree_.take_touches();  // a reset is charged by its caller
}

void Placer::commit(std::uint32_t item, std::uint64_t offset) {
  const Span s{offset, offset + inst_.size[item]};
  for (std::uint32_t k = inst_.piece_begin[item]; k < inst_.piece_begin[item + 1]; ++k) {
    tree_.insert(inst_.pieces[k].lo, inst_.pieces[k].hi, s);
  }
}

namespace {

// First span in [first, last) ending after `x` (spans are sorted and
// disjoint, so their ends are sorted too): exponential then binary search,
// cheap when the answer is near `first`.
const Span* skip_covered(const Span* first, const Span* last, std::uint64_t x) {
  std::size_t step = 1;
  const Span* lo = first;
  while (lo + step < last && (lo + step)->end <= x) {
    lo += step;
    step *= 2;
  }
  const Span* hi = lo + step < last ? lo + step + 1 : last;
  return std::upper_bound(lo, hi, x, [](std::uint64_t v, const Span& sp) { return v < sp.end; });
}

}  // namespace

std::uint64_t Placer::find_offset(std::uint32_t item, Fit fit, Work& work) {
  lists_.clear();
  for (std::uint32_t k = inst_.piece_begin[item]; k < inst_.piece_begin[item + 1]; ++k) {
    tree_.collect(inst_.pieces[k].lo, inst_.pieces[k].hi, lists_);
  }
  // Walk the union of the sorted lists in offset order, tracking the gaps:
  // a k-way merge on a loser tree over the lists' current spans, keyed by
  // offset (an exhausted list has key ~0, above any offset: offsets stay
  // below 2^63, see planner_instance.h). A current span that ends at or
  // below the covered prefix [0, cur) adds nothing: its list skips past
  // every such span at once (an exponential search). The gaps seen, hence
  // the offset chosen, are those of a plain merge.
  const std::size_t k = lists_.size();
  std::size_t leaves = 1;
  while (leaves < k) leaves *= 2;
  constexpr std::uint64_t kDone = ~std::uint64_t{0};
  keys_.assign(leaves, kDone);
  for (std::size_t i = 0; i < k; ++i) keys_[i] = lists_[i].first->off;
  // loser_[v] (v in [1, leaves)) is the list that lost the match at node v
  // (leaves at [leaves, 2 leaves)); the first tournament is played bottom up,
  // with each node's winner in winners_.
  loser_.resize(leaves);
  winners_.resize(2 * leaves);
  for (std::size_t i = 0; i < leaves; ++i) winners_[leaves + i] = static_cast<std::uint32_t>(i);
  for (std::size_t v = leaves; v-- > 1;) {
    const std::uint32_t x = winners_[2 * v], y = winners_[2 * v + 1];
    const bool y_wins = keys_[y] < keys_[x];
    winners_[v] = y_wins ? y : x;
    loser_[v] = y_wins ? x : y;
  }
  std::uint32_t top = leaves > 1 ? winners_[1] : 0;
  const std::uint64_t* key = keys_.data();
  std::uint32_t* loser = loser_.data();
  const std::uint64_t need = inst_.size[item];
  std::uint64_t cur = 0;
  std::uint64_t best = 0, best_gap = 0;
  bool found = false;
  std::uint64_t steps = 0, skipped = 0;
  while (key[top] != kDone) {
    OccupancyTree::List& list = lists_[top];
    const Span s = *list.first;
    ++steps;
    if (s.end <= cur) {
      const Span* next = skip_covered(list.first, list.second, cur);
      skipped += static_cast<std::uint64_t>(next - list.first) - 1;
      list.first = next;
    } else {
      ++list.first;
      if (s.off > cur) {
        const std::uint64_t gap = s.off - cur;
        if (gap >= need && (!found || gap < best_gap)) {
          found = true;
          best_gap = gap;
          best = cur;
          if (fit == Fit::kFirst || gap == need) break;
        }
      }
      cur = s.end;
    }
    std::uint64_t kw = list.first == list.second ? kDone : list.first->off;
    keys_[top] = kw;
    // Replay the matches from the leaf to the root (branch-free selects; the
    // winner's key travels along, so the chain is compare and select only).
    std::uint32_t w = top;
    for (std::size_t v = (top + leaves) >> 1; v > 0; v >>= 1) {
      const std::uint32_t l = loser[v];
      const std::uint64_t kl = key[l];
      const bool l_wins = kl < kw;
      loser[v] = l_wins ? w : l;
      w = l_wins ? l : w;
      kw = l_wins ? kl : kw;
    }
    top = w;
  }
  // Units (see planner.cpp) are about 4 ns: a merge step costs about 7, a
  // span skipped over about 1, the tree walk and the commit about 170 while
  // the tree fits in the cache; beyond that each node the walk or the commit
  // touches costs about a cache miss more.
  const std::uint64_t touched = tree_.take_touches();
  work.add(170 + 7 * steps + skipped + (tree_.large() ? 4 * touched : 0));
  return found ? best : cur;
}

std::uint64_t Placer::place(const std::vector<std::uint32_t>& order,
                            std::vector<std::uint64_t>& offsets, Fit fit,
                            Work& work) {
  for (std::uint32_t item : order) {
    poll(inst_.stop);
    offsets[item] = find_offset(item, fit, work);
    commit(item, offsets[item]);
  }
  return height(inst_, offsets);
}

bool Placer::try_place(const std::vector<std::uint32_t>& order,
                       std::vector<std::uint64_t>& offsets, Fit fit, Work& work,
                       std::uint64_t& h) {
  for (std::uint32_t item : order) {
    if (work.out()) return false;
    offsets[item] = find_offset(item, fit, work);
    commit(item, offsets[item]);
  }
  h = height(inst_, offsets);
  return true;
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

// Max of inst.live over each item's pieces, with a sparse table.
std::vector<std::uint64_t> pressures(const Instance& inst) {
  const std::int32_t T = inst.ticks;
  std::vector<std::vector<std::uint64_t>> table{inst.live};
  for (std::int32_t w = 1; 2 * w <= T; w *= 2) {
    const std::vector<std::uint64_t>& prev = table.back();
    std::vector<std::uint64_t> next(static_cast<std::size_t>(T - 2 * w + 1));
    for (std::size_t i = 0; i < next.size(); ++i) {
      if (i % 256 == 0) poll(inst.stop);
      next[i] = std::max(prev[i], prev[i + w]);
    }
    table.push_back(std::move(next));
  }
  std::vector<std::uint64_t> out(inst.num_free, 0);
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    poll(inst.stop);
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

namespace {

std::int32_t first_tick(const Instance& inst, std::uint32_t item) {
  std::int32_t t = inst.ticks;
  for (std::uint32_t k = inst.piece_begin[item]; k < inst.piece_begin[item + 1]; ++k) {
    t = std::min(t, inst.pieces[k].lo);
  }
  return t;
}

// floor(log2 v) for v >= 1, 0 for v == 0: the size and length classes.
int floor_log2(std::uint64_t v) {
  int k = 0;
  while (k < 63 && (v >> (k + 1)) != 0) ++k;
  return k;
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
  // Every comparison polls the hard stop (a sort of 100,000 items takes
  // milliseconds).
  auto sort = [&](auto less) { std::sort(ids.begin(), ids.end(), Stop::polled(inst.stop, less)); };
  switch (order) {
    case Order::kSize:
      sort([&](std::uint32_t a, std::uint32_t b) {
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        if (inst.start[a] != inst.start[b]) return inst.start[a] < inst.start[b];
        if (inst.duration[a] != inst.duration[b]) return inst.duration[a] > inst.duration[b];
        return a < b;
      });
      break;
    case Order::kArea:
      sort([&](std::uint32_t a, std::uint32_t b) {
        const long double x = area(a), y = area(b);
        if (x != y) return x > y;
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    case Order::kLength:
      sort([&](std::uint32_t a, std::uint32_t b) {
        if (len[a] != len[b]) return len[a] > len[b];
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    case Order::kStart: {
      std::vector<std::int32_t> start(n);
      for (std::uint32_t i = 0; i < n; ++i) start[i] = first_tick(inst, i);
      sort([&](std::uint32_t a, std::uint32_t b) {
        if (start[a] != start[b]) return start[a] < start[b];
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    }
    case Order::kSizeClass: {
      // Within a class, sizes differ by less than 4x, and the longer
      // lifetime goes first: with sizes over many orders of magnitude and
      // long lifetimes (XLA-style buffers), exact size order interleaves
      // long and short buffers of nearly the same size and leaves holes
      // under the long ones that nothing fits in later.
      std::vector<std::uint8_t> cls(n);
      for (std::uint32_t i = 0; i < n; ++i) cls[i] = static_cast<std::uint8_t>(floor_log2(sz[i]) / 2);
      sort([&](std::uint32_t a, std::uint32_t b) {
        if (cls[a] != cls[b]) return cls[a] > cls[b];
        if (inst.duration[a] != inst.duration[b]) return inst.duration[a] > inst.duration[b];
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    }
    case Order::kLengthClass: {
      // Long-lived buffers first, and within a class (durations within a
      // factor of 2) those that die together next to each other, so that
      // their holes open as one. A loop that keeps its previous output has
      // two copies of each output tensor in its alternating (two-phase)
      // plan, of one size and about one length: by length or by size they
      // are placed side by side, and when one phase's outputs die (just
      // before the loss's backward, the step's peak) they leave a hole of
      // one tensor's size under each of the other phase's, which nothing at
      // the peak fits in (alternating_step seed 25: 87 holes of 256-512 KiB,
      // +4.07% over LOAD; by end, +0.25%).
      std::vector<std::uint8_t> cls(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        cls[i] = static_cast<std::uint8_t>(floor_log2(static_cast<std::uint64_t>(inst.duration[i])));
      }
      sort([&](std::uint32_t a, std::uint32_t b) {
        if (cls[a] != cls[b]) return cls[a] > cls[b];
        const std::int64_t ea = inst.start[a] + inst.duration[a], eb = inst.start[b] + inst.duration[b];
        if (ea != eb) return ea < eb;
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    }
    case Order::kEnd:
      // The buffers that die last first (a cyclic instance's wrapping ones
      // before all others), each at the lowest gap that fits (first fit:
      // planner.cpp's portfolio), so that what dies together lies together
      // from the top of time down.
      sort([&](std::uint32_t a, std::uint32_t b) {
        const std::int64_t ea = inst.start[a] + inst.duration[a], eb = inst.start[b] + inst.duration[b];
        if (ea != eb) return ea > eb;
        if (sz[a] != sz[b]) return sz[a] > sz[b];
        return a < b;
      });
      break;
    case Order::kPressure:
    case Order::kPressureArea: {
      const std::vector<std::uint64_t> pr = pressures(inst);
      const bool by_area = order == Order::kPressureArea;
      sort([&](std::uint32_t a, std::uint32_t b) {
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

std::vector<std::uint32_t> peak_first_order(const Instance& inst, Order clique, Order rest) {
  const std::int32_t peak = static_cast<std::int32_t>(
      std::max_element(inst.live.begin(), inst.live.end()) - inst.live.begin());
  std::vector<char> at_peak(inst.num_free, 0);
  for (std::uint32_t i = 0; i < inst.num_free; ++i) {
    for (std::uint32_t k = 0; k < inst.piece_count(i); ++k) {
      const Piece& p = inst.piece(i, k);
      if (p.lo <= peak && peak < p.hi) at_peak[i] = 1;
    }
  }
  std::vector<std::uint32_t> ids;
  ids.reserve(inst.num_free);
  for (std::uint32_t i : make_order(inst, clique)) {
    if (at_peak[i]) ids.push_back(i);
  }
  for (std::uint32_t i : make_order(inst, rest)) {
    if (!at_peak[i]) ids.push_back(i);
  }
  return ids;
}

}  // namespace renaissance::planner::detail
