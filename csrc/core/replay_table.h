// replay_table.h - the data of planned replay's fast path (issue 14): per
// trace position of one layout's phase, its planned range and its
// immediate spatial predecessors; per step, which positions are clean (their
// range was wholly free territory when the step began), which were freed in
// the step, and the fast path's live allocations by the spot (planned start)
// they stand at. The policy
// that uses it (who may serve what, when it is flushed) is in
// step_planner.cpp ("fast path") and arena.cpp (the replay lock); what each
// invariant rests on is in docs/design.md ("Planned replay, slot table").
//
// Invariants:
//   * ReplayRoute: for every planned position i, preds(i) is the set
//     { max { j < i : j planned, [off_j, off_j + size_j) holds x } :
//       x in [off_i, off_i + size_i) }, without duplicates (a painter's
//     sweep over the positions in trace order). Unplanned positions (sizes
//     0: served by the dynamic pool) have no range and no predecessors.
//   * ReplayRoute's spots: spot(i) == spot(j) exactly when planned
//     positions i and j start at the same offset; find_spot(off) is that
//     spot for every planned start and -1 for any other offset.
//   * FastSlots: a spot holds at most one position (the fast path's live
//     check: two live positions never overlap), and every live position is
//     among the ones entered since the last take_all() (a range of
//     positions its caller names).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace renaissance {

class ReplayRoute {
 public:
  // `offset[i]`, `size[i]`: position i's planned range in bytes from the
  // territory's base (size 0: not planned in territory).
  void build(const std::vector<std::size_t>& offset, const std::vector<std::size_t>& size);
  std::size_t positions() const { return pos_.size() - 1; }
  std::size_t offset(std::size_t i) const { return pos_[i].offset; }
  std::size_t size(std::size_t i) const { return pos_[i].size; }
  const std::uint32_t* preds_begin(std::size_t i) const { return preds_.data() + pos_[i].start; }
  const std::uint32_t* preds_end(std::size_t i) const { return preds_.data() + pos_[i + 1].start; }
  // Spots: the distinct starts of the planned positions, each numbered by
  // its slot in the read-only table below (so numbers lie in 0..spots()-1,
  // and some are unused). A free looks up its address's slot and, with the
  // same number, its spot's entry in FastSlots: the two loads hang on the
  // hash alone, not one on the other.
  std::size_t spots() const { return table_.size(); }
  // Position i's spot (planned positions only).
  std::uint32_t spot(std::size_t i) const { return pos_[i].spot; }
  // The spot starting at `offset`, or -1 (no planned position starts there).
  // Read-only open addressing built with the route: at most half full.
  std::int64_t find_spot(std::size_t offset) const {
    for (std::size_t i = home(offset);; i = (i + 1) & mask_) {
      const std::size_t key = table_[i];
      if (key == offset) return static_cast<std::int64_t>(i);
      if (key == kNoKey) return -1;
    }
  }
  // The highest end of a planned range (0: none).
  std::size_t top() const { return top_; }

  // What the route was built for (StepPlanner's cache key).
  const void* layout = nullptr;
  std::uint64_t generation = 0;

 private:
  // Per position, what the fast path reads of it together (one line, not
  // four arrays): its range, where its predecessors start in preds_, its
  // spot; one more entry at the end, whose `start` ends the last list.
  struct Position {
    std::size_t offset = 0, size = 0;
    std::uint32_t start = 0, spot = 0;
  };
  std::vector<Position> pos_{Position{}};
  std::vector<std::uint32_t> preds_;
  static constexpr std::size_t kNoKey = ~std::size_t(0);
  std::size_t home(std::size_t offset) const {
    return static_cast<std::size_t>(((offset >> 6) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  std::vector<std::size_t> table_{kNoKey};  // per slot: a planned start, or kNoKey
  std::size_t mask_ = 0, top_ = 0;
  unsigned shift_ = 63;
};

// The fast path's live allocations of one arming: per spot of the route
// (a distinct planned start), the position standing there now. Sized once
// per route; an allocation stores into its position's spot (no probing), a
// free finds the spot from the address with the route's read-only table.
// Only positions with a spot are entered. The positions entered since the
// last take_all() are a range the caller knows (the fast path's: served in
// position order since the last flush), so nothing lists them.
class FastSlots {
 public:
  // Room for `spots` spots, all empty (O(1) when the size is the same and
  // nothing is live).
  void reset(std::size_t spots);
  std::size_t size() const { return live_; }
  // Position `pos` now stands at spot `k` (no other live position is there:
  // the fast path's live check).
  void insert(std::uint32_t k, std::uint32_t pos) {
    at_[k] = pos + 1;
    ++live_;
  }
  // The position standing at spot `k`, removed; -1 when none.
  std::int64_t take(std::uint32_t k) {
    const std::uint32_t v = at_[k];
    if (v == 0) return -1;
    at_[k] = 0;
    --live_;
    return static_cast<std::int64_t>(v) - 1;
  }
  // Calls f(pos) for every live position, then empties the table, when
  // every position entered since the last take_all() is in [first, end):
  // O(end - first), so a flush costs what the fast path allocated, not the
  // layout's length.
  template <typename F>
  void take_all(const ReplayRoute& r, std::size_t first, std::size_t end, F f) {
    // Stops at the last live one (take() empties its own spot, so with
    // nothing live every spot is empty already).
    for (std::size_t pos = first; live_ != 0 && pos < end; ++pos) {
      if (r.size(pos) == 0) continue;  // no spot
      std::uint32_t& v = at_[r.spot(pos)];
      if (v == pos + 1) {
        f(static_cast<std::uint32_t>(pos));
        v = 0;
        --live_;
      }
    }
    live_ = 0;
  }

 private:
  std::vector<std::uint32_t> at_;  // per spot: position + 1, or 0
  std::size_t live_ = 0;
};

}  // namespace renaissance
