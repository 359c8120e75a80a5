// planner_search.cpp - canonical branch and bound (see planner_search.h).
//
// Invariants kept here: min_off_[i] is the lowest offset an unplaced item i
// can take (above every placed item overlapping it, clear of obstacles);
// floor_[t] never exceeds the lowest offset any unplaced item live at tick t
// can take; total_[t] is the sum of sizes of unplaced items live at t, and
// rem_ splits it by size class. Every change to min_off_ and floor_ is
// recorded on trail_ and undone in reverse.
#include "core/planner_search.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

namespace renaissance::planner::detail {

namespace {
// The failed-state table (CanonicalSearch::Failed, 32 bytes a slot): at
// most 2^18 slots, 8 MiB.
constexpr std::size_t kFailedSlotsMax = std::size_t{1} << 18;
// search_small's budget split over a whole instance (with the raise; the
// peak repair's sub-searches keep half and half). exact_used <= ratio *
// others gives the exact schedule ratio / (1 + ratio) of the work: half
// (1.0) for the first kLateUnits (3 s of budget at planner.cpp's 1.7e8
// units a second), two thirds (2.0) after. The exact schedule's searches
// keep their tables of failed states from round to round (one search per
// pre-order, see CanonicalSearch::solve), so a round with a doubled node
// limit goes on where the last one stopped instead of redoing it, and the
// work it needs for a plan at the bound is about the sum of its three
// pre-orders' single runs (MiniMalloc B: TAW finds LOAD in 168k nodes, 0.16
// s of work; E: TWA in 507k, 0.41 s). Before the tables were kept, the
// rounds redid their work and the exact schedule had a third of the first
// 3 s (half gave B +4.98%, D +5.92%, E +7.72% at 3 s; a third B at LOAD, D
// +5.40%, E +7.32%); with them, half gives B at LOAD within 1 s, D +5.40%
// and E +7.72% at 3 s, and E at LOAD within 10 s. The ladder and the raise
// find their plans early (D and E: within 0.2 s of work). The split depends
// on the work used so far only, never on the budget, so a longer budget
// runs a longer prefix of the same schedule.
constexpr std::uint64_t kLateUnits = 510'000'000;
constexpr double kEarlyRatio = 1.0;
constexpr double kLateRatio = 2.0;
// The raise's window: each pre-order's turn walks up from at most this many
// levels (0.5% of the bound each, so 4%) below the best height, not from the
// bound. A turn costs its levels times the round's node limit, and the levels
// far below the best plan almost never succeed at the limits a 1 s budget
// reaches; from the bound, every round paid for all of them (13 levels on
// MiniMalloc's D at +6.9%, 20-25 on packed_square's at +10-12%), so the limit
// doubled slowly and the levels just below the best plan, where a plan is
// found in thousands of nodes (D at +5.5%: 6k nodes with one pre-order; at
// +4%: 59k), were reached late or never (docs/benchmarks.md, issue 12's
// eleventh pass).
constexpr std::uint64_t kRaiseWindow = 8;
// The exact schedule's node limit grows by this factor a round (see
// search_small()).
constexpr long double kExactGrowth = 1.25L;
}  // namespace

CanonicalSearch::CanonicalSearch(const Instance& inst, const ObstacleMap& map)
    : inst_(inst), n_(inst.num_free), ticks_(inst.ticks), map_(map) {
  overlaps_.resize(n_);
  obstacles_.resize(n_);
  section_items_.resize(static_cast<std::size_t>(ticks_));
  // Sweep over pieces by start: every piece still active when another starts
  // overlaps it. Free and fixed pieces are kept apart, so that the work is
  // about the free-free and free-fixed pairs (fixed-fixed ones are never
  // looked at), and each buffer's obstacle list is merged whenever it has
  // doubled (its memory stays about its merged size).
  std::vector<Piece> by_lo = inst.pieces;
  std::sort(by_lo.begin(), by_lo.end(), [](const Piece& a, const Piece& b) {
    if (a.lo != b.lo) return a.lo < b.lo;
    return a.item < b.item;
  });
  std::vector<Piece> active_free, active_fixed;
  std::vector<std::size_t> merged(n_, 0);
  auto keep_overlapping = [](std::vector<Piece>& active, std::int32_t lo) {
    std::size_t w = 0;
    for (std::size_t i = 0; i < active.size(); ++i) {
      if (active[i].hi > lo) active[w++] = active[i];
    }
    active.resize(w);
  };
  auto add_obstacle = [&](std::uint32_t item, std::uint32_t fixed) {
    ++obstacle_pairs_;
    const std::uint64_t off = inst.fixed_offset[fixed - n_];
    std::vector<Span>& ob = obstacles_[item];
    ob.push_back({off, off + inst.size[fixed]});
    if (ob.size() > 2 * merged[item] + 16) {
      merge_spans(ob);
      merged[item] = ob.size();
    }
  };
  for (const Piece& p : by_lo) {
    poll(inst.stop);
    keep_overlapping(active_free, p.lo);
    if (p.item < n_) {
      for (const Piece& q : active_free) {
        overlaps_[p.item].push_back(q.item);
        overlaps_[q.item].push_back(p.item);
      }
      keep_overlapping(active_fixed, p.lo);
      for (const Piece& q : active_fixed) add_obstacle(p.item, q.item);
      active_free.push_back(p);
    } else {
      for (const Piece& q : active_free) add_obstacle(q.item, p.item);
      active_fixed.push_back(p);
    }
  }
  for (std::uint32_t i = 0; i < n_; ++i) {
    poll(inst.stop);
    std::vector<std::uint32_t>& o = overlaps_[i];
    std::sort(o.begin(), o.end());
    o.erase(std::unique(o.begin(), o.end()), o.end());
    merge_spans(obstacles_[i]);
    size_ += o.size() + obstacles_[i].size() * 2;
  }
  for (std::uint32_t i = 0; i < n_; ++i) {
    poll(inst.stop);
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      const Piece& p = inst.pieces[k];
      for (std::int32_t t = p.lo; t < p.hi; ++t) section_items_[t].push_back(i);
    }
  }
  classes_ = map_.empty() ? 1 : map_.classes();
  class_.assign(n_, 0);
  if (!map_.empty()) {
    for (std::uint32_t i = 0; i < n_; ++i) class_[i] = map_.class_of(inst.size[i]);
  }
  cache_.assign(classes_, kUnplaced);
  rank_.assign(n_, 0);
  off_.assign(n_, kUnplaced);
  initial_min_off_.assign(n_, 0);
  for (std::uint32_t i = 0; i < n_; ++i) initial_min_off_[i] = bump(i, 0);
  initial_total_.assign(static_cast<std::size_t>(ticks_), 0);
  initial_rem_.assign(static_cast<std::size_t>(ticks_) * classes_, 0);
  initial_floor_.assign(static_cast<std::size_t>(ticks_), 0);
  for (std::int32_t t = 0; t < ticks_; ++t) {
    poll(inst.stop);
    std::uint64_t m = kUnplaced;
    for (std::uint32_t i : section_items_[t]) {
      initial_total_[t] += inst.size[i];
      initial_rem_[static_cast<std::size_t>(t) * classes_ + class_[i]] += inst.size[i];
      m = std::min(m, initial_min_off_[i]);
    }
    initial_floor_[t] = m == kUnplaced ? 0 : m;
  }
  const std::size_t depth = 2 * static_cast<std::size_t>(n_) + 4;
  levels_.resize(depth);
  most_.assign(depth, 0);
  most_at_.assign(depth, 0);
  parts_.resize(depth);
  done_.resize(depth);
  points_.resize(depth);
  // cuts_ counts every piece's inner tick boundaries.
  initial_cuts_.assign(static_cast<std::size_t>(ticks_), 0);
  for (std::uint32_t i = 0; i < n_; ++i) {
    poll(inst.stop);
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      const Piece& p = inst.pieces[k];
      for (std::int32_t t = p.lo; t + 1 < p.hi; ++t) ++initial_cuts_[t];
    }
    initial_multi_ += inst.piece_count(i) > 1;
  }
  cuts_ = initial_cuts_;
  next_.assign(static_cast<std::size_t>(ticks_) + 1, 0);
  size_ += static_cast<std::uint64_t>(ticks_) * (8 + 2 * classes_) + 8 * n_;
}

std::uint64_t CanonicalSearch::bump(std::uint32_t item, std::uint64_t off) const {
  const std::uint64_t size = inst_.size[item];
  const std::vector<Span>& ob = obstacles_[item];
  // Merged spans: the first one ending after `off`, then the ones in the way.
  auto it = std::upper_bound(ob.begin(), ob.end(), off,
                             [](std::uint64_t v, const Span& s) { return v < s.end; });
  for (; it != ob.end() && it->off < off + size; ++it) off = it->end;
  return off;
}

bool CanonicalSearch::section_fits(std::int32_t t, std::uint64_t f, std::uint64_t& steps) {
  if (f > capacity_ || total_[t] > capacity_ - f) return false;
  const std::uint32_t profile = map_.profile(t);
  if (profile == ObstacleMap::kNone) return true;
  // Neighbouring ticks mostly share the profile and the floor: the free
  // ranges per class are cached for the last (profile, floor).
  if (profile != cache_profile_ || f != cache_floor_ || capacity_ != cache_capacity_) {
    cache_profile_ = profile;
    cache_floor_ = f;
    cache_capacity_ = capacity_;
    std::fill(cache_.begin(), cache_.end(), kUnplaced);
    steps += classes_;
  }
  // Largest class first: the bytes of classes >= c against the free ranges
  // long enough for class c. A class with nothing new to add passes when the
  // one above it did (its ranges are a superset).
  const std::uint64_t* rem = rem_.data() + static_cast<std::size_t>(t) * classes_;
  std::uint64_t need = 0;
  for (std::uint32_t c = classes_; c-- > 0;) {
    if (rem[c] == 0) continue;
    need += rem[c];
    if (cache_[c] == kUnplaced) {
      cache_[c] = map_.usable(profile, c, f, capacity_);
      steps += 2;  // two binary searches over a profile's few gaps
    }
    ++steps;
    if (need > cache_[c]) return false;
  }
  return true;
}

bool CanonicalSearch::check(const std::vector<Cand>& cur, std::uint64_t off,
                            std::int32_t lo, std::int32_t hi) {
  // Unallocated floor: the lowest offset any unplaced item live at t can
  // take. `cur` is sorted by offset, so the first item covering t gives it.
  // next_[t] skips ticks already settled (or with nothing left to place):
  // a union-find "next open tick" with path halving, so each piece walk
  // costs about the ticks it settles, not its length.
  std::int32_t open = 0;
  for (std::int32_t t = lo; t < hi; ++t) {
    const bool live = total_[t] > 0;
    open += live;
    next_[t] = live ? t : t + 1;
  }
  next_[hi] = hi;
  auto find = [&](std::int32_t t) {
    while (next_[t] != t) {
      next_[t] = next_[next_[t]];
      t = next_[t];
    }
    return t;
  };
  std::uint64_t visited = static_cast<std::uint64_t>(hi - lo);
  for (const Cand& c : cur) {
    if (open == 0) break;
    for (std::uint32_t k = inst_.piece_begin[c.item]; k < inst_.piece_begin[c.item + 1]; ++k) {
      const Piece& p = inst_.pieces[k];
      ++visited;
      for (std::int32_t t = find(std::max(p.lo, lo)); t < p.hi && t < hi; t = find(t + 1)) {
        next_[t] = t + 1;
        --open;
        visited += 2;
        if (!section_fits(t, std::max({floor_[t], off, c.off}), visited)) {
          charge(visited);
          return false;
        }
      }
    }
  }
  charge(visited);
  return true;
}

CanonicalSearch::Status CanonicalSearch::solve(
    std::uint64_t capacity, const std::vector<std::uint32_t>& preorder,
    std::uint64_t node_limit, Work& work, std::vector<std::uint64_t>& offsets,
    const OrderKeys* rerank) {
  capacity_ = capacity;
  rerank_ = rerank;
  part_t_.assign(n_, 0.0);
  node_limit_ = node_limit;
  nodes_ = 0;
  work_ = &work;
  for (std::uint32_t r = 0; r < preorder.size(); ++r) rank_[preorder[r]] = r;
  std::fill(off_.begin(), off_.end(), kUnplaced);
  // The state with nothing placed does not depend on the capacity or the
  // order: it is built once (constructor) and copied.
  total_ = initial_total_;
  rem_ = initial_rem_;
  min_off_ = initial_min_off_;
  floor_ = initial_floor_;
  trail_.clear();
  if (memo_) {
    // A failed state stays failed while the capacity is the same: its key
    // holds each candidate's rank, and whether the parts a split leaves can
    // be placed does not depend on their order. So the table is kept from
    // one call to the next at one capacity (a search run again with a
    // higher node limit meets every subtree it proved infeasible before at
    // that subtree's root), and starts empty at another. It is as large as
    // the node limit can fill; a kept one grows (rehashed) with the limit.
    std::size_t slots = 1024;
    while (slots < kFailedSlotsMax && slots < node_limit) slots <<= 1;
    const bool same = !failed_.empty() && capacity == memo_capacity_;
    if (!same) {
      failed_.assign(slots, Failed{});
      work.add(slots / 4);
      memo_capacity_ = capacity;
    } else if (slots > failed_.size()) {
      std::vector<Failed> old(slots, Failed{});
      old.swap(failed_);
      for (const Failed& f : old) {
        if (f.last_off != kUnplaced) *failed_slot(f.h1, f.h2) = f;
      }
      work.add(slots / 4 + old.size() / 2);
    }
  }
  memo_hits_ = 0;
  work.add(static_cast<std::uint64_t>(ticks_) * (2 + classes_) / 4 + n_);
  std::vector<Cand>& all = levels_[0];
  all.clear();
  for (std::uint32_t i = 0; i < n_; ++i) all.push_back({min_off_[i], rank_[i], i});
  Status status;
  // Time decomposition (see solve_parts) needs every unplaced item to be one
  // piece: with cyclic wrap-around it starts once the last two-piece item is
  // placed.
  cuts_ = initial_cuts_;
  multi_left_ = initial_multi_;
  work.add(static_cast<std::uint64_t>(ticks_));
  if (multi_left_ == 0) {
    std::vector<std::int32_t>& points = points_[0];
    points.clear();
    for (std::int32_t t = 0; t + 1 < ticks_; ++t) {
      if (cuts_[t] == 0) points.push_back(t + 1);
    }
    status = solve_parts(1, all, points, 0, ticks_);
  } else {
    status = dfs(1, all, 0, 0, 0, ticks_);
  }
  if (status == Status::kFound) {
    for (std::uint32_t i = 0; i < n_; ++i) offsets[i] = off_[i];
  }
  return status;
}

void CanonicalSearch::rerank(std::vector<Cand>& part) {
  const OrderKeys& k = *rerank_;
  std::uint64_t steps = 0;
  for (const Cand& c : part) {
    std::uint64_t t_max = 0;
    for (std::uint32_t q = inst_.piece_begin[c.item]; q < inst_.piece_begin[c.item + 1]; ++q) {
      const Piece& p = inst_.pieces[q];
      for (std::int32_t t = p.lo; t < p.hi; ++t) t_max = std::max(t_max, total_[t]);
      steps += static_cast<std::uint64_t>(p.hi - p.lo);
    }
    part_t_[c.item] = static_cast<double>(t_max) * k.t_scale[c.item];
  }
  std::sort(part.begin(), part.end(), [&](const Cand& x, const Cand& y) {
    for (char ch : k.keys) {
      const double* v = ch == 'W' ? k.w.data() : ch == 'A' ? k.a.data()
                      : ch == 'T' ? part_t_.data() : k.z.data();
      if (v[x.item] != v[y.item]) return v[x.item] > v[y.item];
    }
    return x.item < y.item;
  });
  for (std::uint32_t r = 0; r < part.size(); ++r) part[r].rank = r;
  charge(steps + 4 * part.size());
}

CanonicalSearch::Status CanonicalSearch::solve_parts(std::uint32_t depth,
                                                     const std::vector<Cand>& items,
                                                     std::vector<std::int32_t>& points,
                                                     std::int32_t lo, std::int32_t hi) {
  std::sort(points.begin(), points.end());
  std::vector<Cand>& part = parts_[depth];
  std::vector<std::uint32_t>& done = done_[depth];
  done.clear();
  std::size_t next_point = 0;
  std::int32_t a = lo;
  Status status = Status::kFound;
  while (a < hi) {
    while (next_point < points.size() && points[next_point] <= a) ++next_point;
    const std::int32_t b = next_point < points.size() ? points[next_point] : hi;
    part.clear();
    for (const Cand& c : items) {
      if (off_[c.item] != kUnplaced) continue;
      const Piece& p = inst_.pieces[inst_.piece_begin[c.item]];
      if (p.lo < b && a < p.hi) part.push_back(c);
    }
    charge(items.size());
    if (rerank_ != nullptr && part.size() > 1) rerank(part);
    if (!part.empty()) {
      status = dfs(depth, part, 0, 0, a, b);
      if (status != Status::kFound) break;
      for (const Cand& c : part) done.push_back(c.item);
    }
    a = b;
  }
  if (status != Status::kFound) {
    for (std::uint32_t i : done) off_[i] = kUnplaced;
  }
  return status;
}

void CanonicalSearch::state_key(const std::vector<Cand>& cur, std::int32_t lo, std::int32_t hi,
                                std::uint64_t& h1, std::uint64_t& h2) const {
  // Order-free sums of per-candidate hashes: equal sets give equal keys
  // whatever the order they were reached in.
  std::uint64_t a = 0, b = 0;
  for (const Cand& c : cur) {
    std::uint64_t s1 = (std::uint64_t{c.item} << 32 | c.rank) * 0x9e3779b97f4a7c15ull ^ c.off;
    std::uint64_t s2 = s1 ^ 0x6a09e667f3bcc909ull;
    a += mix(s1);
    b ^= mix(s2) + c.off * 0xc2b2ae3d27d4eb4full;
  }
  std::uint64_t r = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(lo)) << 32) |
                    static_cast<std::uint32_t>(hi);
  r ^= std::uint64_t{multi_left_} * 0xff51afd7ed558ccdull;
  std::uint64_t r2 = r + 0x1234567;
  h1 = a ^ mix(r);
  h2 = b + mix(r2);
}

CanonicalSearch::Failed* CanonicalSearch::failed_slot(std::uint64_t h1, std::uint64_t h2) {
  const std::size_t mask = failed_.size() - 1;
  const std::size_t base = static_cast<std::size_t>(h1) & mask & ~std::size_t{3};
  Failed* empty = nullptr;
  for (std::size_t k = 0; k < 4; ++k) {
    Failed& f = failed_[base + k];
    if (f.h1 == h1 && f.h2 == h2) return &f;
    if (empty == nullptr && f.last_off == kUnplaced) empty = &f;
  }
  // Full: replace one of the four, chosen by the other hash.
  return empty != nullptr ? empty : &failed_[base + (h2 & 3)];
}

CanonicalSearch::Status CanonicalSearch::dfs(std::uint32_t depth, const std::vector<Cand>& parent,
                                             std::uint64_t last_off, std::uint32_t last_rank,
                                             std::int32_t lo, std::int32_t hi) {
  if (nodes_ >= node_limit_ || work_->out()) return Status::kAborted;
  ++nodes_;
  // The section bounds with the floor each tick has without the candidates
  // (floor_[t], and last_off: nothing left goes below it in canonical
  // order) are necessary for check()'s, whose floors are at least these:
  // most nodes fail them (MiniMalloc E: 99%), and a pass over the ticks
  // costs far less than building the candidates' list first.
  {
    const std::uint64_t* total = total_.data();
    const std::uint64_t* floor = floor_.data();
    if (last_off > capacity_) return Status::kInfeasible;
    const std::uint64_t room = capacity_ - last_off;
    bool over = false;
    // The most bytes left at a tick, and one tick that has them: the
    // children's test reads it (see dfs_children()).
    std::uint64_t most = 0;
    std::int32_t most_at = lo;
    for (std::int32_t t = lo; t < hi; ++t) {
      const std::uint64_t f = floor[t];
      over |= total[t] > room || (f > capacity_ || total[t] > capacity_ - f);
      if (total[t] > most) {
        most = total[t];
        most_at = t;
      }
    }
    charge(8 + static_cast<std::uint64_t>(hi - lo) * 3 / 2);
    if (over) return Status::kInfeasible;
    most_[depth] = most;
    most_at_[depth] = most_at;
  }
  std::vector<Cand>& cur = levels_[depth];
  auto before = [](const Cand& a, const Cand& b) {
    return a.off != b.off ? a.off < b.off : a.rank < b.rank;
  };
  // The parent's list is mostly sorted; only the items whose minimum offset
  // rose since need sorting again, then one merge. One pass splits the
  // parent into the candidates whose offset stayed (kept, in the parent's
  // order, checked sorted as they come: a part pre-ordered again is not)
  // and those raised, into scratch sized once, and `cur` keeps its length
  // from the last node at this depth: no vector grows or is zero-filled per
  // node (12% of the search's time on MiniMalloc E). Ranks are distinct, so
  // the merge gives the list a full sort would: the same search, 17% faster.
  if (kept_.size() < parent.size()) kept_.resize(parent.size());
  if (raised_.size() < parent.size()) raised_.resize(parent.size());
  Cand* kp = kept_.data();
  Cand* rp = raised_.data();
  std::size_t nk = 0, nr = 0;
  bool sorted = true;
  for (const Cand& c : parent) {
    if (off_[c.item] != kUnplaced) continue;
    const std::uint64_t m = min_off_[c.item];
    if (m == c.off) {
      if (nk != 0 && before(c, kp[nk - 1])) sorted = false;
      kp[nk++] = c;
    } else {
      rp[nr++] = {m, c.rank, c.item};
    }
  }
  cur.resize(nk + nr);
  if (!sorted) {
    std::copy(kp, kp + nk, cur.begin());
    std::copy(rp, rp + nr, cur.begin() + static_cast<std::ptrdiff_t>(nk));
    std::sort(cur.begin(), cur.end(), before);
  } else {
    std::sort(rp, rp + nr, before);
    std::merge(kp, kp + nk, rp, rp + nr, cur.begin(), before);
  }
  if (cur.empty()) return Status::kFound;  // off_ holds the solution
  // The lowest top any candidate can have. `cur` is sorted by offset and a
  // top is above its offset, so no candidate from the first one at or above
  // the lowest top so far can lower it.
  std::uint64_t min_height = kUnplaced;
  for (const Cand& c : cur) {
    if (c.off >= min_height) break;
    min_height = std::min(min_height, c.off + inst_.size[c.item]);
  }
  charge(8 + 2 * cur.size() + static_cast<std::uint64_t>(hi - lo));
  if (!check(cur, last_off, lo, hi)) return Status::kInfeasible;
  // The subtree below is a function of this state (the candidates with
  // their offsets and ranks, the range) and of the canonical constraint:
  // a state that failed under a constraint no stronger than this one
  // fails again (this one's candidates are a subset of that one's).
  std::uint64_t h1 = 0, h2 = 0;
  Failed* slot = nullptr;
  if (memo_) {
    state_key(cur, lo, hi, h1, h2);
    charge(4 + cur.size());
    slot = failed_slot(h1, h2);
    if (slot->h1 == h1 && slot->h2 == h2 &&
        (slot->last_off < last_off || (slot->last_off == last_off && slot->last_rank <= last_rank))) {
      ++memo_hits_;
      return Status::kInfeasible;
    }
  }
  const Status result = dfs_children(depth, cur, min_height, last_off, last_rank, lo, hi);
  if (memo_ && result == Status::kInfeasible) {
    slot = failed_slot(h1, h2);
    if (slot->h1 != h1 || slot->h2 != h2 || slot->last_off == kUnplaced) {
      *slot = {h1, h2, last_off, last_rank};
    } else if (last_off < slot->last_off ||
               (last_off == slot->last_off && last_rank < slot->last_rank)) {
      slot->last_off = last_off;
      slot->last_rank = last_rank;
    }
  }
  return result;
}

CanonicalSearch::Status CanonicalSearch::dfs_children(std::uint32_t depth,
                                                      const std::vector<Cand>& cur,
                                                      std::uint64_t min_height,
                                                      std::uint64_t last_off,
                                                      std::uint32_t last_rank,
                                                      std::int32_t lo, std::int32_t hi) {

  for (std::size_t ci = 0; ci < cur.size(); ++ci) {
    const Cand c = cur[ci];
    if (c.off >= min_height) break;  // dominance (cur is sorted by offset)
    if (c.off < last_off || (c.off == last_off && c.rank < last_rank)) continue;
    const std::uint64_t size = inst_.size[c.item];
    const std::uint64_t top = c.off + size;
    if (top > capacity_) continue;

    // The child refuted before its placement is applied (and undone): the
    // spatial inference below, then the section bounds of dfs()'s first
    // test with the child's floors and totals (nothing left goes below
    // c.off; over c's ticks its top is a floor and its size is placed).
    // Most children fail here (MiniMalloc E: most nodes fail the section
    // bounds), so their apply and undo were most of the search's time.
    // Spatial inference: an unplaced item pushed so high that it no longer
    // fits under the capacity makes this placement a dead end. Hatless: the
    // child constrains no unplaced item (its siblings need not be tried).
    bool hatless = true;
    {
      bool refuted = false;
      std::uint64_t steps = 4;
      for (std::uint32_t j : overlaps_[c.item]) {
        if (off_[j] != kUnplaced) continue;
        hatless = false;
        if (min_off_[j] >= top) continue;
        const std::uint64_t raised = obstacles_[j].empty() ? top : bump(j, top);
        if (raised + inst_.size[j] > capacity_) {
          refuted = true;
          break;
        }
      }
      steps += overlaps_[c.item].size();
      if (refuted) {  // a dead end: not a node
        charge(steps);
        continue;
      }
      const std::uint64_t room = capacity_ - c.off;
      const std::uint64_t* total = total_.data();
      const std::uint64_t* floor = floor_.data();
      bool over = false;
      std::int32_t a = lo;
      const std::uint32_t k0 = inst_.piece_begin[c.item], k1 = inst_.piece_begin[c.item + 1];
      // The pieces in tick order (at most two).
      std::int32_t plo[2], phi[2];
      std::uint32_t np = 0;
      for (std::uint32_t k = k0; k < k1 && np < 2; ++k) {
        plo[np] = inst_.pieces[k].lo;
        phi[np] = inst_.pieces[k].hi;
        ++np;
      }
      if (np == 2 && plo[1] < plo[0]) {
        std::swap(plo[0], plo[1]);
        std::swap(phi[0], phi[1]);
      }
      // Outside c's ticks the node passed the same test with a floor no
      // higher (dfs()), so only `room` can fail there: when a tick with the
      // node's most bytes left is outside c, that one tick decides it.
      const std::int32_t most_at = most_at_[depth];
      bool most_inside = false;
      for (std::uint32_t q = 0; q < np; ++q) most_inside |= plo[q] <= most_at && most_at < phi[q];
      const bool scan_outside = most_inside;  // else that tick decides
      if (!scan_outside) over = most_[depth] > room;
      auto outside = [&](std::int32_t from, std::int32_t to) {
        for (std::int32_t t = from; t < to; ++t) over |= total[t] > room;
        steps += static_cast<std::uint64_t>(std::max(0, to - from));
      };
      for (std::uint32_t q = 0; q < np; ++q) {
        if (scan_outside) outside(a, std::max(a, std::min(plo[q], hi)));
        for (std::int32_t t = std::max(plo[q], lo); t < std::min(phi[q], hi); ++t) {
          const std::uint64_t f = std::max(floor[t], top);
          const std::uint64_t left = total[t] - size;
          over |= f > capacity_ || left > capacity_ - f;
        }
        steps += static_cast<std::uint64_t>(std::max(0, std::min(phi[q], hi) - std::max(plo[q], lo)));
        a = std::max(a, std::min(phi[q], hi));
      }
      if (scan_outside) outside(a, hi);
      charge(steps);
      if (over) {
        // The child node dfs() would have counted and refuted.
        if (nodes_ >= node_limit_ || work_->out()) return Status::kAborted;
        ++nodes_;
        if (hatless) break;
        continue;
      }
    }

    off_[c.item] = c.off;
    const std::size_t mark = trail_.size();
    // The raises the test above computed (none takes an item past the
    // capacity: it refuted those children).
    for (std::uint32_t j : overlaps_[c.item]) {
      if (off_[j] != kUnplaced || min_off_[j] >= top) continue;
      trail_.push_back({0, j, min_off_[j]});
      min_off_[j] = obstacles_[j].empty() ? top : bump(j, top);
    }
    std::vector<std::int32_t>& points = points_[depth];
    points.clear();
    for (std::uint32_t k = inst_.piece_begin[c.item]; k < inst_.piece_begin[c.item + 1]; ++k) {
      const Piece& p = inst_.pieces[k];
      for (std::int32_t t = p.lo; t < p.hi; ++t) {
        if (floor_[t] < top) {
          trail_.push_back({1, static_cast<std::uint32_t>(t), floor_[t]});
          floor_[t] = top;
        }
        total_[t] -= size;
        rem_[static_cast<std::size_t>(t) * classes_ + class_[c.item]] -= size;
        if (t + 1 < p.hi && --cuts_[t] == 0) points.push_back(t + 1);
      }
    }
    charge(overlaps_[c.item].size() + static_cast<std::uint64_t>(inst_.length(c.item)));
    const bool multi = inst_.piece_count(c.item) > 1;
    if (multi && --multi_left_ == 0) {
      // The last two-piece item: every free cut in [lo, hi) is now usable.
      points.clear();
      for (std::int32_t t = lo; t + 1 < hi; ++t) {
        if (cuts_[t] == 0) points.push_back(t + 1);
      }
      charge(static_cast<std::uint64_t>(hi - lo));
    } else if (multi_left_ > 0) {
      points.clear();
    }

    Status status = Status::kInfeasible;
    if (points.empty()) {
      status = dfs(depth + 1, cur, c.off, c.rank, lo, hi);
    } else {
      // Before the split, the section bounds over the whole of [lo, hi)
      // with this placement's offset as the floor (every item left is
      // placed at or above it in canonical order): each part alone starts
      // again from floor 0 and would check its ticks only once it is
      // reached, after the parts before it were solved (MiniMalloc checks
      // the whole partition before it decomposes).
      whole_.clear();
      for (const Cand& o : cur) {
        if (off_[o.item] == kUnplaced) whole_.push_back({min_off_[o.item], o.rank, o.item});
      }
      std::sort(whole_.begin(), whole_.end(), [](const Cand& a, const Cand& b) {
        return a.off != b.off ? a.off < b.off : a.rank < b.rank;
      });
      charge(2 * whole_.size());
      if (check(whole_, c.off, lo, hi)) status = solve_parts(depth + 1, cur, points, lo, hi);
    }

    for (std::uint32_t k = inst_.piece_begin[c.item]; k < inst_.piece_begin[c.item + 1]; ++k) {
      const Piece& p = inst_.pieces[k];
      for (std::int32_t t = p.lo; t < p.hi; ++t) {
        total_[t] += size;
        rem_[static_cast<std::size_t>(t) * classes_ + class_[c.item]] += size;
        if (t + 1 < p.hi) ++cuts_[t];
      }
    }
    if (multi) ++multi_left_;
    while (trail_.size() > mark) {
      const Change& ch = trail_.back();
      if (ch.kind == 0) {
        min_off_[ch.index] = ch.old;
      } else {
        floor_[ch.index] = ch.old;
      }
      trail_.pop_back();
    }
    if (status == Status::kFound) {
      // Keep the solution: undo only the bookkeeping, not the offsets.
      return status;
    }
    off_[c.item] = kUnplaced;
    if (status == Status::kAborted) return status;
    if (hatless) break;
  }
  return Status::kInfeasible;
}

// Pre-order by a key string over W (duration), A (area), T (max LOAD profile
// over the lifetime), Z (size); all descending, ties by item index. With a
// noise level, each key is scaled by a seeded factor in [1 - noise, 1].
OrderKeys order_keys(const Instance& inst, const char* keys, double noise, std::uint64_t& rng) {
  const std::uint32_t n = inst.num_free;
  OrderKeys k;
  k.keys = keys;
  k.w.resize(n);
  k.a.resize(n);
  k.z.resize(n);
  k.t_scale.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto jitter = [&]() {
      return noise > 0 ? 1.0 - noise * static_cast<double>(mix(rng) >> 11) * 0x1.0p-53 : 1.0;
    };
    k.w[i] = static_cast<double>(inst.duration[i]) * jitter();
    k.z[i] = static_cast<double>(inst.size[i]) * jitter();
    k.a[i] = static_cast<double>(inst.duration[i]) * static_cast<double>(inst.size[i]) * jitter();
    k.t_scale[i] = jitter();
  }
  return k;
}

std::vector<std::uint32_t> preorder(const Instance& inst, const std::vector<std::uint64_t>& total,
                                    const char* keys, double noise, std::uint64_t& rng) {
  const OrderKeys k = order_keys(inst, keys, noise, rng);
  return preorder(k, total);
}

std::vector<std::uint32_t> preorder(const OrderKeys& k, const std::vector<std::uint64_t>& total) {
  const auto n = static_cast<std::uint32_t>(k.w.size());
  std::vector<double> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = static_cast<double>(total[i]) * k.t_scale[i];
  std::vector<std::uint32_t> ids(n);
  for (std::uint32_t i = 0; i < n; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](std::uint32_t x, std::uint32_t y) {
    for (char c : k.keys) {
      const std::vector<double>& v = c == 'W' ? k.w : c == 'A' ? k.a : c == 'T' ? t : k.z;
      if (v[x] != v[y]) return v[x] > v[y];
    }
    return x < y;
  });
  return ids;
}

namespace {
// The Luby sequence 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, ... (i >= 1): restart
// lengths within a log factor of the best fixed one for any run-time
// distribution (Luby, Sinclair, Zuckerman 1993), and unbounded, so a hard
// instance eventually gets runs as long as the budget allows.
std::uint64_t luby(std::uint64_t i) {
  for (;;) {
    std::uint64_t k = 1;
    while ((std::uint64_t{1} << k) - 1 < i) ++k;
    if (i == (std::uint64_t{1} << k) - 1) return std::uint64_t{1} << (k - 1);
    i -= (std::uint64_t{1} << (k - 1)) - 1;
  }
}
}  // namespace

namespace {
constexpr const char* kKeys[] = {"WAT", "TAW", "TWA", "ZWA", "AWT"};
constexpr std::size_t kExactKeys = 3;  // MiniMalloc's default portfolio

// What every schedule of search_small starts from: the search over the
// instance (its state with nothing placed), the LOAD profile over each
// item's lifetime and the five fixed pre-orders (no noise, so no draw from
// the generator).
struct Portfolio {
  CanonicalSearch search;
  std::vector<std::uint64_t> total;
  std::vector<OrderKeys> keys;
  std::vector<std::vector<std::uint32_t>> orders;

  Portfolio(const Instance& inst, const ObstacleMap& map, Work& work)
      : search(inst, map), total(pressures(inst)) {
    // Building the search costs about a unit per (buffer, obstacle) pair
    // overlapping in time and per tick of every lifetime.
    work.add(search.obstacle_pairs());
    work.add(static_cast<std::uint64_t>(inst.pieces.size()) * 4 + inst.num_free);
    std::uint64_t unused = 0;
    for (const char* k : kKeys) {
      keys.push_back(order_keys(inst, k, 0.0, unused));
      orders.push_back(preorder(keys.back(), total));
    }
  }
};

// The height of a found plan (obstacles included).
std::uint64_t plan_height(const Instance& inst, const std::vector<std::uint64_t>& offs) {
  return std::max(detail::height(inst, offs), inst.fixed_top);
}
}  // namespace

struct ExactSchedule::State {
  const Instance& inst;
  std::vector<CanonicalSearch> searches;  // one per pre-order, tables kept
  std::vector<OrderKeys> keys;
  std::vector<std::vector<std::uint32_t>> orders;
  std::uint64_t round = 1;
  std::size_t k = 0;
  std::vector<std::uint64_t> offs;

  State(const Instance& i, const Portfolio& p, Work& work)
      : inst(i),
        searches(kExactKeys, p.search),
        keys(p.keys.begin(), p.keys.begin() + kExactKeys),
        orders(p.orders.begin(), p.orders.begin() + kExactKeys) {
    work.add(kExactKeys * p.search.size());
  }
};

ExactSchedule::ExactSchedule(const Instance& inst, const ObstacleMap& map, Work& work) {
  if (inst.num_free == 0) return;
  const Portfolio portfolio(inst, map, work);
  state_ = std::make_unique<State>(inst, portfolio, work);
}

ExactSchedule::ExactSchedule(std::unique_ptr<State> state) : state_(std::move(state)) {}
ExactSchedule::~ExactSchedule() = default;

bool ExactSchedule::turn(Work& work, std::uint64_t& lower_bound, std::uint64_t& height,
                         std::vector<std::uint64_t>& offsets, std::string& method) {
  if (!state_ || work.out() || height <= lower_bound) return true;
  State& st = *state_;
  // The node limit grows by kExactGrowth a round, not doubles: each
  // pre-order's search keeps its table of failed states, so a round goes on
  // where the last one stopped (its cost is the new nodes, not the limit),
  // and the pre-orders that do not find the plan spend about what the one
  // that does needs, not up to twice that (MiniMalloc E at LOAD: 1.62M nodes
  // instead of 2.27M; H 0.59M instead of 0.69M; B 0.49M instead of 0.43M).
  const long double grown = static_cast<long double>(st.inst.num_free) *
                            std::pow(kExactGrowth, static_cast<long double>(st.round));
  const std::uint64_t limit = grown >= 1e18L ? ~std::uint64_t{0} : static_cast<std::uint64_t>(grown);
  st.offs = initial_offsets(st.inst);
  const CanonicalSearch::Status status =
      st.searches[st.k].solve(lower_bound, st.orders[st.k], limit, work, st.offs, &st.keys[st.k]);
  if (status == CanonicalSearch::Status::kFound) {
    const std::uint64_t h = plan_height(st.inst, st.offs);
    if (h < height) {
      height = h;
      offsets = st.offs;
      method = "canonical_search";
    }
  } else if (status == CanonicalSearch::Status::kInfeasible) {
    lower_bound += 1;  // no plan at the bound
  }
  if (++st.k == kExactKeys) {
    st.k = 0;
    ++st.round;
  }
  return work.out() || height <= lower_bound;
}

void ExactSchedule::run(Work& work, std::uint64_t& lower_bound, std::uint64_t& height,
                        std::vector<std::uint64_t>& offsets, std::string& method) {
  while (!turn(work, lower_bound, height, offsets, method)) {
  }
}

void search_small(const Instance& inst, const ObstacleMap& map, std::uint64_t& lower_bound,
                  std::uint64_t seed, Work& work, std::uint64_t& height,
                  std::vector<std::uint64_t>& offsets, std::string& method, bool raise,
                  bool exact) {
  const std::uint32_t n = inst.num_free;
  if (n == 0 || height <= lower_bound) return;
  Portfolio portfolio(inst, map, work);
  // The exact schedule here (its searches copied from the portfolio's
  // before that one runs), or (exact false) on the caller's second thread.
  ExactSchedule exact_schedule(
      exact ? std::make_unique<ExactSchedule::State>(inst, portfolio, work) : nullptr);
  CanonicalSearch& search = portfolio.search;  // the raise's and the ladder's
  const std::vector<std::uint64_t>& total = portfolio.total;
  std::uint64_t rng = seed ^ 0x5eed5eed5eedull;
  const std::vector<OrderKeys>& fixed_keys = portfolio.keys;
  const std::vector<std::vector<std::uint32_t>>& fixed_orders = portfolio.orders;
  std::vector<std::uint64_t> offs;
  std::uint64_t& lb = lower_bound;  // raised when a capacity is proved infeasible
  const long double step = 0.005L;
  auto next_target = [&]() {
    // The highest lb * (1 + k * step) strictly below `height`.
    const long double ratio = static_cast<long double>(height - 1) / static_cast<long double>(lb);
    const auto k = static_cast<std::uint64_t>(std::floor((ratio - 1.0L) / step));
    const std::uint64_t cap = std::min<std::uint64_t>(
        height - 1,
        std::max(lb, static_cast<std::uint64_t>(static_cast<long double>(lb) * (1.0L + k * step))));
    // Within one step of the bound: halfway between it and the height.
    return cap > lb ? cap : lb + (height - 1 - lb) / 2;
  };
  // One run of the search; returns true when the whole search should stop
  // (budget spent, or the plan at the bound).
  auto attempt_with = [&](CanonicalSearch& s, std::uint64_t cap,
                          const std::vector<std::uint32_t>& order, const OrderKeys* keys,
                          std::uint64_t limit, bool& found) {
    found = false;
    offs = initial_offsets(inst);
    const CanonicalSearch::Status status = s.solve(cap, order, limit, work, offs, keys);
    if (status == CanonicalSearch::Status::kFound) {
      found = true;
      const std::uint64_t h = plan_height(inst, offs);
      if (h < height) {
        height = h;
        offsets = offs;
        method = "canonical_search";
      }
    } else if (status == CanonicalSearch::Status::kInfeasible) {
      lb = std::max(lb, cap + 1);
    }
    return work.out() || height <= lb;
  };
  auto attempt = [&](std::uint64_t cap, const std::vector<std::uint32_t>& order,
                     const OrderKeys* keys, std::uint64_t limit, bool& found) {
    return attempt_with(search, cap, order, keys, limit, found);
  };
  // Three schedules share the budget, the exact one half of the first
  // kLateUnits and two thirds after (half and half without the raise), the
  // other two the rest, each run next by whichever has used least of its
  // share:
  //  * exact: MiniMalloc's round robin at the lower bound: its three
  //    pre-orders, each part re-ordered as the search splits it, under a
  //    node limit growing 1.25x every round (ExactSchedule), so that a hard
  //    instance whose bound is reachable gets runs as long as the budget;
  //    each pre-order's search keeps its table of failed states, so a
  //    round goes on from where the last one stopped;
  //  * raise: the same pre-orders and doubling limits as a capacity-targeted
  //    decision search: "is there a plan of height H?" for H = the bound
  //    plus k steps (0.5% of the bound each), k the lowest level at most
  //    kRaiseWindow steps below the best height (1 when the best is closer
  //    to the bound), asked of each pre-order in turn, then H raised a step
  //    while below the best height, until one is found. A
  //    tight H lets the section bounds and spatial inference prune early,
  //    so a plan just above the optimum is often found in far fewer nodes
  //    than one with more slack (on MiniMalloc's D: 8k nodes at +5.5%,
  //    more than 250k at +10%), and the search times of neighbouring H
  //    differ by orders of magnitude, so the levels act as restarts;
  //  * ladder: restarts (search times are heavy-tailed) over the five fixed
  //    pre-orders and fresh seeded perturbations of them, node limits
  //    following the Luby sequence times n, each run one 0.5% step below
  //    the best height so far and descending while the order succeeds.
  std::uint64_t exact_used = 0, raise_used = 0, ladder_used = 0;
  std::uint64_t raise_round = 1, raise_k = 0, raise_level = 0;
  std::uint64_t ladder_round = 0, ladder_k = 0;
  const std::uint64_t base = std::max<std::uint64_t>(64, n);
  std::vector<std::uint32_t> order;
  auto round_limit = [&](std::uint64_t round) {
    return round >= 40 ? ~std::uint64_t{0} : std::uint64_t{n} << round;
  };
  // Level k >= 1 of the raise: the bound plus k steps, or kUnplaced once
  // that is not strictly between the bound and the best height.
  auto level_cap = [&](std::uint64_t k) {
    const auto cap = static_cast<std::uint64_t>(static_cast<long double>(lb) *
                                                (1.0L + static_cast<long double>(k) * step));
    return cap < height && cap > lb ? cap : kUnplaced;
  };
  // The level each pre-order's turn of the raise starts from: at most
  // kRaiseWindow levels below the best height (see kRaiseWindow).
  auto first_level = [&]() -> std::uint64_t {
    const long double ratio = static_cast<long double>(height - 1) / static_cast<long double>(lb);
    auto k = static_cast<std::uint64_t>(std::max(1.0L, std::floor((ratio - 1.0L) / step)));
    while (k > 1 && level_cap(k) == kUnplaced) --k;
    while (level_cap(k + 1) != kUnplaced) ++k;  // k: the highest level below the height
    return k > kRaiseWindow ? k - kRaiseWindow + 1 : 1;
  };
  const std::uint64_t start_used = work.used();
  for (;;) {
    if (work.out() || height <= lb) return;
    const std::uint64_t before = work.used();
    bool found = false;
    const bool ladder_open = height > lb + 1 && next_target() > lb;
    const bool raise_open = raise && level_cap(1) != kUnplaced;
    // The exact schedule gets half of the first kLateUnits of work and two
    // thirds after, the other two share the rest (see kLateUnits).
    const std::uint64_t others = (ladder_open ? ladder_used : 0) + (raise_open ? raise_used : 0);
    // exact_used <= r * others gives the exact schedule r / (1 + r).
    // The peak repair's sub-searches (no raise) keep half and half.
    const double ratio = !raise ? 1.0 : before - start_used < kLateUnits ? kEarlyRatio : kLateRatio;
    if (!exact && !ladder_open && !raise_open) return;
    if (exact && ((!ladder_open && !raise_open) ||
                  static_cast<double>(exact_used) <= ratio * static_cast<double>(others))) {
      const bool stop = exact_schedule.turn(work, lb, height, offsets, method);
      exact_used += work.used() - before;
      if (stop) return;
      continue;
    }
    if (raise_open && (!ladder_open || raise_used <= ladder_used)) {
      // Level by level, every pre-order at a level before the next one up
      // (the levels' search times differ between pre-orders by orders of
      // magnitude: MiniMalloc's challenging H at +3%, TWA 3,891 nodes, WAT and TAW
      // more than 200,000; walked pre-order by pre-order, a cheap plan at a
      // low level waited behind another pre-order's walk up every level). A
      // level at or above the best height (a lower plan was found
      // meanwhile), a find, or the last level ends the round: the next one
      // starts again below the best height with the node limit doubled.
      if (raise_level == 0) raise_level = first_level();
      const std::uint64_t cap = level_cap(raise_level);
      bool stop = false;
      if (cap != kUnplaced) {
        stop = attempt(cap, fixed_orders[raise_k], &fixed_keys[raise_k],
                       round_limit(raise_round), found);
      }
      raise_used += work.used() - before;
      if (stop) return;
      const bool failed = cap != kUnplaced && !found;  // the round goes on
      if (failed && ++raise_k < kExactKeys) continue;
      raise_k = 0;
      if (failed && level_cap(raise_level + 1) != kUnplaced) {
        ++raise_level;
        continue;
      }
      raise_level = 0;
      ++raise_round;
      continue;
    }
    const std::uint64_t limit = base * luby(ladder_round + 1);
    const std::size_t count = fixed_orders.size() + 6;
    if (ladder_k < fixed_orders.size()) {
      order = fixed_orders[ladder_k];
    } else {
      const double noise = 0.1 + 0.1 * static_cast<double>(mix(rng) % 5);
      order = preorder(inst, total, kKeys[mix(rng) % 3], noise, rng);
    }
    if (++ladder_k == count) {
      ladder_k = 0;
      ++ladder_round;
    }
    // Descend while this order keeps finding lower plans.
    bool stop = false;
    for (;;) {
      const std::uint64_t cap = next_target();
      if (cap <= lb) break;
      if ((stop = attempt(cap, order, nullptr, limit, found))) break;
      if (!found) break;
    }
    ladder_used += work.used() - before;
    if (stop) return;
  }
}

}  // namespace renaissance::planner::detail
