// territory_index.h - the index of a segment's free territory blocks by
// address (Segment::plan_free): which free block starts at an address, and
// which one holds an address (the free block with the highest start at or
// below it). Replay asks the second once per planned allocation and the
// free path changes the index once or three times per planned free, so it
// must make no heap allocation there: a std::map made one node per free
// block and was 281 of the ~2,260 instructions of a replayed allocate+free
// pair (docs/design.md, "Planned replay's cost").
//
// How: the start addresses of the free blocks are bits of a bitmap over the
// segment, one bit per `unit` bytes (the arena's rounding unit: every block
// starts at a multiple of it from the segment's base, block.h), with summary
// levels above it (a bit per non-zero word of the level below), so the
// highest set bit at or below a position is found in one word per level
// (at most ceil(log64(bits)) levels: 4 for a 64 GiB segment of 512 B units).
// The blocks themselves are found through a LiveMap (open addressing, no
// allocation but its doubling). Memory: one bit per unit of the highest
// address indexed (a 64 GiB territory of 512 B units: 16 MiB, 1/4096 of it),
// kept until clear().
//
// Invariants (check() verifies them; Arena::check_invariants calls it):
//   * A block is indexed iff its start's bit is set, and then the map holds
//     it under its start address.
//   * Every summary bit is set iff the word below it is non-zero.
//   * Every indexed start is a multiple of `unit` from the base.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/debug.h"
#include "core/live_map.h"

namespace renaissance {

struct Block;

class TerritoryIndex {
 public:
  // The segment's base and the unit every start is a multiple of (a power
  // of two). Set once before the first insert (Arena, new segments).
  void set_origin(const char* base, std::size_t unit) {
    base_ = base;
    shift_ = 0;
    while ((std::size_t(1) << shift_) < unit) ++shift_;
  }

  std::size_t size() const { return blocks_.size(); }
  bool empty() const { return blocks_.size() == 0; }

  // The block starting at `p` must not be indexed.
  void insert(char* p, Block* b) {
    TR_ASSERT(base_ != nullptr && p >= base_);  // set_origin first (the arena, at each new segment)
    const std::size_t u = unit_of(p);
    if (levels_.empty() || u >= bits_) grow(u + 1);
    set_bit(u);
    blocks_.insert(p, b);
  }
  // Removes the block starting at `p` (a no-op when none is indexed: the
  // map's erase is one then, and clearing a clear bit changes no summary,
  // as a summary bit is set only above a non-zero word).
  void erase(char* p) {
    blocks_.erase(p);
    if (!levels_.empty() && p >= base_ && unit_of(p) < bits_) clear_bit(unit_of(p));
  }
  // The indexed block starting at `p`, or nullptr.
  Block* find(const char* p) const { return blocks_.find(p); }
  // The indexed block with the highest start <= p, or nullptr.
  Block* holding(const char* p) const {
    if (levels_.empty() || p < base_) return nullptr;
    std::size_t u = static_cast<std::size_t>(p - base_) >> shift_;
    if (u >= bits_) u = bits_ - 1;
    const std::size_t at = highest_at_or_below(0, u);
    if (at == kNone) return nullptr;
    return blocks_.find(base_ + (at << shift_));
  }
  // Empties it and gives its memory back.
  void clear() {
    levels_.clear();
    levels_.shrink_to_fit();
    blocks_ = LiveMap();
    bits_ = 0;
  }
  // Whether the invariants above hold (O(bits / 64 + blocks)).
  bool check() const;

 private:
  static constexpr std::size_t kNone = ~std::size_t(0);

  std::size_t unit_of(const char* p) const { return static_cast<std::size_t>(p - base_) >> shift_; }
  void grow(std::size_t bits);
  void set_bit(std::size_t u) {
    for (std::size_t l = 0; l < levels_.size(); ++l) {
      std::uint64_t& w = levels_[l][u >> 6];
      const bool was_zero = w == 0;
      w |= std::uint64_t(1) << (u & 63);
      if (!was_zero) return;
      u >>= 6;
    }
  }
  void clear_bit(std::size_t u) {
    for (std::size_t l = 0; l < levels_.size(); ++l) {
      std::uint64_t& w = levels_[l][u >> 6];
      w &= ~(std::uint64_t(1) << (u & 63));
      if (w != 0) return;
      u >>= 6;
    }
  }
  // The highest set bit <= u of level l, or kNone.
  std::size_t highest_at_or_below(std::size_t l, std::size_t u) const {
    const std::vector<std::uint64_t>& level = levels_[l];
    const std::size_t w = u >> 6;
    const std::uint64_t m = level[w] & (~std::uint64_t(0) >> (63 - (u & 63)));
    if (m) return (w << 6) + 63 - static_cast<std::size_t>(__builtin_clzll(m));
    if (w == 0) return kNone;
    std::size_t below;  // the highest non-zero word of this level below w
    if (l + 1 < levels_.size()) {
      below = highest_at_or_below(l + 1, w - 1);
      if (below == kNone) return kNone;
    } else {
      below = w - 1;  // the top level is one word: w is 0 there
      while (level[below] == 0) {
        if (below == 0) return kNone;
        --below;
      }
    }
    return (below << 6) + 63 - static_cast<std::size_t>(__builtin_clzll(level[below]));
  }

  const char* base_ = nullptr;
  unsigned shift_ = 0;            // log2(unit)
  std::size_t bits_ = 0;          // positions level 0 covers
  std::vector<std::vector<std::uint64_t>> levels_;  // [0]: a bit per unit; the last: one word
  LiveMap blocks_;                // start address -> block
};

}  // namespace renaissance
