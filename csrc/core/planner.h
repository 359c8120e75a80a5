// planner.h - static memory planning (offline dynamic storage allocation).
//
// Given buffers with sizes and lifetimes, choose an offset for each so that
// two buffers whose lifetimes overlap never overlap in memory, and the plan
// size (the highest end offset) is as close as possible to LOAD, the peak over
// time of the bytes in use (no valid plan can be smaller; see load()).
//
// Invariants kept by every function here:
//   * A returned plan is valid: validate() of it returns an empty string.
//   * No global state. The search stops at a deterministic work count
//     derived from Options::budget_seconds or at the wall-clock budget,
//     whichever comes first (Result::stopped_by says which): when the work
//     count (or the lower bound, or running out of moves) stops it, the
//     result is a pure function of (Problem, Options), byte for byte; only
//     a search the clock stopped depends on the machine and its load.
//   * Offsets are sums of buffer sizes and fixed-buffer ends, so if every size
//     and fixed offset is a multiple of some alignment, so is every offset.
//   * Sizes are bounded: the total, sum of buffer sizes + highest fixed end
//     (offset + size), must be at most 2^63 (plan(), greedy_by_size() and
//     load() throw std::invalid_argument otherwise, naming the first buffer
//     or fixed buffer past it). Every offset + size of a plan is then at most
//     2^63, and sums of two such values cannot overflow 64 bits.
//
// Sources: best fit by decreasing size (TFLite ArenaPlanner /
// SimpleMemoryArena, XLA GlobalDecreasingSizeBestFitHeap); MiniMalloc
// (Moffitt, ASPLOS'24); idealloc (Lamprakos et al.).
//
// No torch headers here (see docs/design.md): this file is tested with plain data.
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
  // Budget of plan(), in seconds of wall time. plan() converts it to a work
  // count (the same input and budget give the same plan on any machine
  // where that count runs out first) and also stops at the wall clock:
  // plan() returns within about budget_seconds plus an O(N log N) part no
  // budget skips (see plan()). Every call may spend at least a floor of
  // about c * N log N work (N buffers and obstacles), whatever the budget;
  // 0 gives the best of the constructive heuristics that fit in that floor,
  // and no improvement search.
  double budget_seconds = 1.0;
  // The wall-clock part of the budget, in seconds: < 0 (default): the same
  // as budget_seconds; +infinity: no clock, so the work count alone stops
  // the search and the plan depends on (Problem, Options) only, on every
  // machine, however loaded (it then takes as long as the work takes).
  double clock_seconds = -1.0;
  std::uint64_t seed = 0;
  // Threads plan() may use, 1 or 2 (else std::invalid_argument). With 2
  // (default), on an instance the search runs over as a whole (up to 1,500
  // linear buffers; planner.cpp's kSearchMaxItems), the search's exact
  // schedule (planner_search.h: ExactSchedule, the branch and bound at the
  // lower bound) runs on a second thread beside the other phases, on the
  // same budget and deadline; the first of the two to reach its lower bound
  // (counted in work units, not wall time) gives the plan. With 1 the exact
  // schedule takes turns with the other phases on the calling thread. Either
  // way the plan depends on (Problem, Options) only while the work count
  // stops the search; 1 and 2 may give different plans. plan() waits for
  // the second thread until shortly after the deadline it stops at itself
  // (the clock off: until it ends); a thread the machine starves of CPU
  // past that is left to stop on its own, and the plan is the calling
  // thread's (stopped_by "clock"). On larger instances the second thread
  // runs the peak-first passes (planner_greedy.h: peak_first_order) beside
  // the improvement phases, under the same rule; with 1 they run among the
  // constructive passes, on the calling thread's work count.
  unsigned threads = 2;
};

struct Result {
  std::vector<std::uint64_t> offsets;  // one per Problem::buffers entry
  std::uint64_t size = 0;         // max over buffers and fixed of offset + size
  std::uint64_t load = 0;         // LOAD of the problem (see load())
  // Size of best fit by decreasing size (greedy_by_size()); 0 when plan()
  // could not finish that baseline within its budget (large instances).
  std::uint64_t greedy_size = 0;
  double seconds = 0.0;           // wall time spent in plan()
  std::string method;             // which strategy produced the returned offsets
  // The best lower bound plan() knows: LOAD, the obstacle bound
  // (planner_bound.h), or a height the exact search proved infeasible, + 1.
  std::uint64_t lower_bound = 0;
  // size == lower_bound: no valid plan is smaller (proved).
  bool optimal = false;
  // What ended the search: "bound" (the plan reached the lower bound),
  // "work" (the deterministic work count), "clock" (the wall-clock budget;
  // only then does the plan depend on the machine), "done" (nothing left to
  // try: budget 0, or every phase finished early).
  std::string stopped_by;
};

// LOAD: max over time of the bytes in use: the sizes of the live buffers
// plus the bytes covered by the live fixed obstacles, where obstacles that
// overlap one another count once (the union of their byte ranges at that
// time). So LOAD is a lower bound on the size of every valid plan.
// Throws std::invalid_argument naming the first bad buffer.
std::uint64_t load(const Problem& problem);

// Baseline: best fit by decreasing size (ties by earlier start, then longer
// lifetime, then index). It has no budget: its time grows with the number of
// buffers times the gaps each placement walks past, faster than linearly
// with long, interleaved lifetimes (on the reference machine about 1.5 s for
// 20,000 such buffers, 10-30 s for 100,000), about linearly with short ones
// (0.2-0.4 s for 100,000). plan() does not wait for it on large instances.
// Throws std::invalid_argument on a malformed problem.
Result greedy_by_size(const Problem& problem);

// The planner: the baseline and other constructive heuristics, then a search
// that repairs the buffers defining the peak, within the budget; returns the
// best valid plan. It stops early once the plan reaches a lower bound: LOAD,
// or with fixed obstacles a per-tick bound of the gaps they leave
// (planner_bound.h).
//
// Wall time: the heuristics and the search stop at the work count or at
// the wall clock, whichever comes first. First, right after building the
// instance, plan() makes the sweep's plan (planner_sweep.h: O(N log N)) and
// checks it; that is the part no budget skips (about 0.09 s of CPU for
// N = 100,000 on the reference machine, so a budget below that, or a
// process the machine gives a small share of a core, overruns by about
// that much; docs/benchmarks.md has the measured overruns). Every later
// phase polls a hard stop at the end of the budget at a fine grain (at
// least once per item, node or sort comparison; planner_stop.h) and can be
// interrupted anywhere (the stop is 0.05 s after budget_seconds): plan()
// then returns the best plan found before the stop if checking it ends
// within a grace (three times what the sweep's check took, at least
// 0.04 s), else the checked sweep, with stopped_by "clock". Before the
// hard stop, the search stops softly: one build time of the instance
// before budget_seconds, keeping time for the final check's and a sweep's
// work units at the rate of wall time per unit seen so far, and starting a
// step that does not look at the clock only when that rate says it ends in
// time (budget 0: at 2 * t_floor, t_floor the time the work floor of
// Options stands for, so that the constructive passes run). So plan()
// returns within about budget_seconds, on a loaded machine too. When the
// baseline cannot finish within its budget (large instances), the buffers
// it placed are kept and the rest placed by a sweep over time, or the
// sweep's plan is taken, whichever is lower; Result::greedy_size is then 0.
// Throws std::invalid_argument on a malformed problem.
Result plan(const Problem& problem, const Options& options = Options{});

// Empty string if `offsets` is a valid plan for `problem`; otherwise a
// message naming the first pair of buffers that collide (or the size
// mismatch, or an offset + size past 2^64 - 1). No limit on the total here;
// O(N log N). Throws std::invalid_argument on a malformed lifetime.
std::string validate(const Problem& problem,
                     const std::vector<std::uint64_t>& offsets);

}  // namespace renaissance::planner
