// planner_instance.h - the planner's normalized, internal view of a Problem.
//
// Invariants kept here:
//   * An Instance is only ever built from a well-formed Problem: the
//     constructor throws std::invalid_argument naming the first bad buffer
//     (or fixed buffer) and builds nothing otherwise.
//   * Every item has 1 or 2 pieces, each a non-empty half-open range of
//     compressed ticks [lo, hi) with 0 <= lo < hi <= ticks. Two items overlap
//     in time exactly when the original lifetimes overlap (cyclic lifetimes
//     that wrap are split into their two parts, so this holds for them too).
//   * Items [0, num_free) are the buffers to place (zero-size buffers are left
//     out: they never collide and get offset 0); items [num_free, num_items)
//     are the fixed obstacles with non-zero size, at fixed_offset.
//   * The total (highest fixed end + every buffer size) is at most
//     kMaxTotal = 2^63 (checked at construction, else std::invalid_argument):
//     every offset + size the planner computes is at most the total, and a
//     sum of two such values still fits in 64 bits.
//   * live[t] counts the free buffers live at tick t plus the union of the
//     fixed obstacles' ranges live at t (overlapping obstacles count once),
//     so load = max live is a lower bound on any valid plan's size.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner.h"
#include "core/planner_stop.h"

namespace renaissance::planner::detail {

// SplitMix64: a small, seedable generator that gives the same numbers on
// every platform (the searches must be deterministic).
inline std::uint64_t mix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Largest total a problem may have (see above).
constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 63;
// Marks an item without an offset yet in offsets vectors. No placed item
// can have it as offset (offsets are below kMaxTotal); nothing uses it as a
// height.
constexpr std::uint64_t kUnplaced = ~std::uint64_t{0};

// Checks one lifetime (throws std::invalid_argument naming `what` `index`)
// and writes its 1 or 2 parts, in original time, to lo[] / hi[]; returns the
// number of parts. A cyclic lifetime with upper > period wraps around.
int split_lifetime(std::int64_t lower, std::int64_t upper, std::int64_t period,
                   const char* what, std::size_t index, std::int64_t lo[2],
                   std::int64_t hi[2]);
// Checks the period and the entry count.
void check_period(const Problem& problem);
// Checks every fixed end and the total against kMaxTotal (throws
// std::invalid_argument naming the first entry over it); returns the max
// fixed end.
std::uint64_t check_sizes(const Problem& problem);

struct Piece {
  std::int32_t lo = 0;
  std::int32_t hi = 0;
  std::uint32_t item = 0;
};

class Instance {
 public:
  explicit Instance(const Problem& problem);

  std::uint32_t num_free = 0;   // placeable items
  std::uint32_t num_items = 0;  // placeable + fixed
  std::int32_t ticks = 0;       // number of elementary time intervals
  bool multi_piece = false;     // some item has two pieces (cyclic wrap)

  std::vector<std::uint64_t> size;          // per item
  std::vector<std::uint32_t> piece_begin;   // per item, plus one sentinel
  std::vector<Piece> pieces;                // grouped by item
  std::vector<std::uint32_t> buffer_of;     // free item -> Problem buffer index
  std::vector<std::uint64_t> fixed_offset;  // per fixed item (item - num_free)
  std::vector<std::int64_t> start;          // per item: lower, original time
  std::vector<std::int64_t> duration;       // per item: upper - lower

  std::vector<std::uint64_t> live;  // per tick: live bytes (obstacles merged)
  std::uint64_t load = 0;           // max of live
  std::uint64_t fixed_top = 0;      // max end of a fixed obstacle
  // The hard stop every phase working on this instance polls (none: never
  // stops). plan() sets it after building; sub-instances inherit it.
  Stop* stop = nullptr;

  std::uint32_t piece_count(std::uint32_t item) const {
    return piece_begin[item + 1] - piece_begin[item];
  }
  const Piece& piece(std::uint32_t item, std::uint32_t k) const {
    return pieces[piece_begin[item] + k];
  }
  // Total length in ticks of an item's pieces.
  std::int64_t length(std::uint32_t item) const;
};

// A byte range [off, end) of memory.
struct Span {
  std::uint64_t off, end;
};

}  // namespace renaissance::planner::detail
