// planner.h - static memory planning (offline dynamic storage allocation).
//
// Given buffers with sizes and lifetimes, choose an offset for each so that
// two buffers whose lifetimes overlap never overlap in memory, and the plan
// size (the highest end offset) is as close as possible to LOAD, the peak over
// time of the sum of live sizes (no valid plan can be smaller).
//
// Invariants kept by every function here:
//   * A returned plan is valid: validate() of it returns an empty string.
//   * Results are a pure function of (Problem, Options): no global state,
//     and the search is bounded by a deterministic work budget derived from
//     Options::budget_seconds (the wall clock is only a safety cap).
//   * Offsets are sums of buffer sizes and fixed-buffer ends, so if every size
//     and fixed offset is a multiple of some alignment, so is every offset.
//
// Sources: best fit by decreasing size (TFLite ArenaPlanner /
// SimpleMemoryArena, XLA GlobalDecreasingSizeBestFitHeap); MiniMalloc
// (Moffitt, ASPLOS'24); idealloc (Lamprakos et al.).
//
// No torch headers here (see DESIGN.md): this file is tested with plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::planner {

// One buffer to place. Lifetime is [lower, upper) in a logical clock.
struct Buffer {
  std::uint64_t size = 0;  // bytes; a zero-size buffer gets offset 0
  std::int64_t lower = 0;  // first tick it is live
  std::int64_t upper = 0;  // first tick it is dead again (upper > lower)
};

// An obstacle that is already placed (for example a live persistent block in
// the segment the plan goes into). Same lifetime rules as Buffer.
struct FixedBuffer {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::int64_t lower = 0;
  std::int64_t upper = 0;
};

struct Problem {
  std::vector<Buffer> buffers;
  std::vector<FixedBuffer> fixed;
  // 0: linear time. > 0: cyclic time (a repeating training step). Each
  // lifetime must satisfy 0 <= lower < period and lower < upper <=
  // lower + period; a lifetime with upper > period wraps around:
  // it covers [lower, period) and [0, upper - period).
  std::int64_t period = 0;
};

struct Options {
  // Budget of the improvement search, in seconds. 0 gives the best of the
  // constructive heuristics only. The search converts this to a work count,
  // so the same input and budget give the same plan on any machine.
  double budget_seconds = 1.0;
  std::uint64_t seed = 0;
};

struct Result {
  std::vector<std::uint64_t> offsets;  // one per Problem::buffers entry
  std::uint64_t size = 0;         // max over buffers and fixed of offset + size
  std::uint64_t load = 0;         // LOAD of the problem (fixed buffers included)
  std::uint64_t greedy_size = 0;  // size of best fit by decreasing size
  double seconds = 0.0;           // wall time spent in plan()
  std::string method;             // which strategy produced the returned offsets
};

// LOAD: max over time of the sum of sizes of live buffers (fixed included).
// (Fixed obstacles that overlap one another count once each, so LOAD is no
// lower bound then; plan() uses its own bound, see planner_bound.h.)
// Throws std::invalid_argument naming the first bad buffer.
std::uint64_t load(const Problem& problem);

// Baseline: best fit by decreasing size (ties by earlier start, then longer
// lifetime, then index).
// Throws std::invalid_argument on a malformed problem.
Result greedy_by_size(const Problem& problem);

// The planner: constructive heuristics, then a search that repairs the
// buffers defining the peak, within the budget; returns the best valid plan.
// It stops early once the plan reaches a lower bound: LOAD, or with fixed
// obstacles a per-tick bound of the gaps they leave (planner_bound.h).
// Throws std::invalid_argument on a malformed problem.
Result plan(const Problem& problem, const Options& options = Options{});

// Empty string if `offsets` is a valid plan for `problem`; otherwise a
// message naming the first pair of buffers that collide (or the size
// mismatch).
std::string validate(const Problem& problem,
                     const std::vector<std::uint64_t>& offsets);

}  // namespace renaissance::planner
