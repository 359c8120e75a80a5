// planner_search.h - exact-style branch and bound over canonical solutions,
// for small, hard instances (after MiniMalloc, Moffitt ASPLOS'24; this is an
// independent implementation).
//
// A canonical solution places buffers in non-decreasing offset order, each at
// the lowest offset above every already placed buffer it overlaps in time
// (and clear of fixed obstacles). Every plan can be pushed down into a
// canonical one no higher, so searching canonical solutions only loses
// nothing. The search branches on which buffer goes next and prunes with:
//   * canonical order: offsets never decrease; at equal offsets the
//     pre-order rank increases;
//   * dominance: no buffer goes at or above the lowest top any unplaced
//     buffer could reach (that buffer would fit below it);
//   * section bounds: in each tick, the remaining sizes there must fit
//     between the floor (lowest offset any remaining buffer there can take)
//     and the capacity; with obstacles, per size class: the remaining bytes
//     of buffers of size >= L must fit into the free ranges above the floor
//     that are at least L long (see planner_obstacles.h). They are tested
//     first with the floors a tick has without looking at the candidates
//     (the placed tops over it and the canonical constraint), for each
//     child before its placement is applied: most children fail that test,
//     and it costs a pass over the ticks instead of a placement, its undo
//     and a sorted candidate list;
//   * failed states: the subtree below a node is a function of its
//     candidates (item, lowest offset, rank), its time range and the
//     canonical constraint (last offset, rank); a table of states proved
//     infeasible (two 64-bit hashes, lossy, kept from one solve() to the
//     next while the capacity stays the same) prunes a state
//     met again under a constraint no weaker than the one it failed under
//     (placements that differ below but leave the unplaced buffers the same
//     lowest offsets);
//   * hatless pruning: when a placed buffer constrains nothing unplaced, its
//     siblings need not be tried;
//   * before a placement splits the time range into parts (solve_parts),
//     the section bounds over the whole range with its offset as the floor
//     (as MiniMalloc checks its partition before it decomposes): each part
//     alone restarts from floor 0 and is reached only after the parts
//     before it are solved.
//
// Invariants kept here:
//   * A solution returned by solve() is valid and its height is at most the
//     capacity asked for; offsets are 0, fixed ends, or ends of placed buffers.
//   * The search is deterministic: the node limit (counted in the shared Work
//     budget) bounds it, never the clock alone; all state is undone on
//     backtrack through an explicit trail.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/planner_greedy.h"
#include "core/planner_instance.h"
#include "core/planner_obstacles.h"

namespace renaissance::planner::detail {

// The keys of a static pre-order (see preorder()): per free item, the values
// of W (duration), A (area), Z (size), and a factor for T, each already
// scaled by the seeded noise. T itself is the max over the item's ticks of
// the bytes still to place there, so it can be recomputed as the search
// goes (MiniMalloc re-sorts each part it splits off by the totals left).
struct OrderKeys {
  std::string keys;
  std::vector<double> w, a, z, t_scale;
};
OrderKeys order_keys(const Instance& inst, const char* keys, double noise, std::uint64_t& rng);

class CanonicalSearch {
 public:
  enum class Status { kFound, kInfeasible, kAborted };

  CanonicalSearch(const Instance& inst, const ObstacleMap& map);

  // Looks for a plan of height <= capacity. `preorder` lists the free items
  // (tie-break order). On kFound, `offsets` holds the plan (fixed included).
  // With `rerank`, each part the search splits off (see solve_parts) is
  // pre-ordered again by those keys, T from the bytes left to place.
  Status solve(std::uint64_t capacity, const std::vector<std::uint32_t>& preorder,
               std::uint64_t node_limit, Work& work,
               std::vector<std::uint64_t>& offsets, const OrderKeys* rerank = nullptr);

  // (Free piece, fixed piece) pairs overlapping in time, seen when built.
  std::uint64_t obstacle_pairs() const { return obstacle_pairs_; }
  // About the words a copy of this search holds: its overlap and obstacle
  // lists, and per tick its profile (so a copy costs about that much work).
  std::uint64_t size() const { return size_; }
  // Nodes visited by the last solve().
  std::uint64_t nodes() const { return nodes_; }
  // States the last solve() found in its table of failed ones.
  std::uint64_t memo_hits() const { return memo_hits_; }
  // The table of failed states (on by default; off only to compare).
  void set_failure_memo(bool on) { memo_ = on; }


 private:
  struct Cand {
    std::uint64_t off;
    std::uint32_t rank;
    std::uint32_t item;
  };
  struct Change {
    std::uint32_t kind;  // 0: min offset of an item, 1: floor of a section
    std::uint32_t index;
    std::uint64_t old;
  };

  // A search state that was proved to have no completion (see dfs()):
  // two independent 64-bit hashes of the candidates (item, offset, rank)
  // and the range, and the weakest canonical constraint (offset, rank) it
  // failed under.
  struct Failed {
    std::uint64_t h1 = 0, h2 = 0;
    std::uint64_t last_off = kUnplaced;
    std::uint32_t last_rank = 0;
  };
  void state_key(const std::vector<Cand>& cur, std::int32_t lo, std::int32_t hi,
                 std::uint64_t& h1, std::uint64_t& h2) const;
  Failed* failed_slot(std::uint64_t h1, std::uint64_t h2);

  Status dfs(std::uint32_t depth, const std::vector<Cand>& parent, std::uint64_t last_off,
             std::uint32_t last_rank, std::int32_t lo, std::int32_t hi);
  Status dfs_children(std::uint32_t depth, const std::vector<Cand>& cur, std::uint64_t min_height,
                      std::uint64_t last_off, std::uint32_t last_rank, std::int32_t lo,
                      std::int32_t hi);
  // Solves the parts of [lo, hi) between `points` (ticks no unplaced item
  // crosses) one after the other; they share no item, so any failing part
  // fails the whole.
  Status solve_parts(std::uint32_t depth, const std::vector<Cand>& items,
                     std::vector<std::int32_t>& points, std::int32_t lo, std::int32_t hi);
  std::uint64_t bump(std::uint32_t item, std::uint64_t off) const;
  // Pre-orders a part again by rerank_'s keys (ranks 0, 1, ... in `part`).
  void rerank(std::vector<Cand>& part);
  bool check(const std::vector<Cand>& cur, std::uint64_t off, std::int32_t lo, std::int32_t hi);
  // The section bound of tick t above floor f (see above); adds its work
  // to `steps`.
  bool section_fits(std::int32_t t, std::uint64_t f, std::uint64_t& steps);
  // Counts search steps into the shared budget: the loops here are tight
  // (about 1.3 ns a step), a third of a unit.
  void charge(std::uint64_t steps) {
    pending_ += steps;
    work_->add(pending_ / 3);
    pending_ %= 3;
  }

  const Instance& inst_;
  std::uint32_t n_ = 0;
  std::int32_t ticks_ = 0;
  std::vector<std::vector<std::uint32_t>> overlaps_;      // free-free
  std::vector<std::vector<Span>> obstacles_;              // per item, merged
  std::vector<std::vector<std::uint32_t>> section_items_; // per tick
  const ObstacleMap& map_;              // obstacles per tick
  std::uint32_t classes_ = 1;           // size classes (1 without obstacles)
  std::vector<std::uint32_t> class_;    // per free item

  // Search state.
  std::uint64_t capacity_ = 0;
  std::uint64_t node_limit_ = 0;
  std::uint64_t nodes_ = 0;
  Work* work_ = nullptr;
  std::uint64_t pending_ = 0;
  std::vector<std::uint32_t> rank_;
  std::vector<std::uint64_t> off_;
  std::vector<std::uint64_t> min_off_;
  std::vector<std::uint64_t> floor_;
  std::vector<std::uint64_t> total_;
  std::vector<std::uint64_t> rem_;  // [t * classes_ + c]: unplaced bytes of class c at t
  // section_fits' cache: usable bytes per class for one (profile, floor).
  std::vector<std::uint64_t> cache_;
  std::uint32_t cache_profile_ = ObstacleMap::kNone;
  std::uint64_t cache_floor_ = 0, cache_capacity_ = 0;
  std::vector<Change> trail_;
  std::vector<std::vector<Cand>> levels_;  // per depth: candidates
  // Per depth: the most bytes left at a tick of the node's range, and a tick
  // that has them (dfs() for dfs_children()).
  std::vector<std::uint64_t> most_;
  std::vector<std::int32_t> most_at_;
  std::vector<Cand> kept_, raised_;        // scratch for the merge
  std::vector<Cand> whole_;                // scratch: the check before a split
  std::vector<std::vector<Cand>> parts_;   // per depth: items of one part
  std::vector<std::vector<std::uint32_t>> done_;  // per depth: solved parts
  std::vector<std::vector<std::int32_t>> points_;  // per depth: new cuts
  std::vector<std::uint32_t> cuts_;  // per tick t: unplaced items over t|t+1
  std::uint32_t multi_left_ = 0;     // unplaced two-piece items
  // The search state with nothing placed (see solve()).
  std::vector<std::uint32_t> initial_cuts_;
  std::uint32_t initial_multi_ = 0;
  std::vector<std::uint64_t> initial_total_, initial_rem_, initial_min_off_, initial_floor_;
  std::vector<Failed> failed_;       // lossy table, direct mapped, 4-way
  std::uint64_t memo_capacity_ = 0;  // the capacity failed_ holds states for
  bool memo_ = true;
  std::uint64_t memo_hits_ = 0;
  std::vector<std::int32_t> next_;  // check(): next tick not yet settled
  const OrderKeys* rerank_ = nullptr;
  std::vector<double> part_t_;      // solve_parts(): T per item of a part
  std::uint64_t obstacle_pairs_ = 0;
  std::uint64_t size_ = 0;
};

// search_small: two schedules over the canonical search share the budget
// (the exact one half of it; with the raise below, half of the first 3 s
// of work and two thirds after; whichever has used less of its share runs
// next): MiniMalloc's round robin at the lower
// bound (its WAT, TAW, TWA pre-orders, each part re-ordered as the search
// splits it, node limits n * 1.25^round without cap; each pre-order's
// search keeps its table of failed states, so a round does not redo the
// subtrees the last one proved infeasible), and a ladder with
// restarts (five fixed pre-orders and seeded perturbations of them, node
// limits n times the Luby sequence), each run one 0.5% step below the best
// height so far (halfway to the bound when closer), descending while the
// order keeps succeeding. Improves (height, offsets, method) in place until
// the Work budget is out; a capacity proved infeasible raises
// `lower_bound` (so the caller can report a plan at it as optimal).
//
// preorder: free items sorted by the keys in `keys`, each descending: W (duration),
// A (area = size x duration), T (`total`: max LOAD profile over the
// lifetime), Z (size); ties by index. With noise > 0 each key value is scaled
// by a factor drawn from [1 - noise, 1] with the seeded generator `rng`.
std::vector<std::uint32_t> preorder(const Instance& inst, const std::vector<std::uint64_t>& total,
                                    const char* keys, double noise, std::uint64_t& rng);

std::vector<std::uint32_t> preorder(const OrderKeys& keys, const std::vector<std::uint64_t>& total);

//
// With `raise` (the search over a whole instance), a third schedule shares
// the budget: the capacity-targeted raise, upward from at most 4% below the
// best height, every pre-order at a level before the next level up (see
// planner_search.cpp). The peak repair's sub-searches run
// without it: their windows are small and usually reach their bound with the
// other two. With `exact` false the exact schedule does not run here (the
// caller runs an ExactSchedule on another thread) and the others share the
// budget.
void search_small(const Instance& inst, const ObstacleMap& map, std::uint64_t& lower_bound,
                  std::uint64_t seed, Work& work, std::uint64_t& height,
                  std::vector<std::uint64_t>& offsets, std::string& method, bool raise = false,
                  bool exact = true);

// search_small's exact schedule on its own: MiniMalloc's round robin at the
// lower bound over the WAT, TAW and TWA pre-orders (each part re-ordered as
// the search splits it), each pre-order's search keeping its table of failed
// states from round to round, node limits n * 1.25^round. plan() runs it on
// a second thread beside the other schedules (Options::threads).
//
// Built on the calling thread (building polls the instance's stop and
// charges `work`); run() may then go on another thread: it reads the
// instance (which must outlive it) and nothing else shared, and polls only
// the Work it is given. Deterministic: the same instance and work count give
// the same plan.
class ExactSchedule {
 public:
  ExactSchedule(const Instance& inst, const ObstacleMap& map, Work& work);
  ~ExactSchedule();

  // One pre-order's turn at `lower_bound`: a plan found lowers `height`
  // (and sets `offsets`, `method`) when it is lower; a proof that there is
  // none raises `lower_bound` by one. Returns true when the schedule is
  // done: the budget is out or height <= lower_bound.
  bool turn(Work& work, std::uint64_t& lower_bound, std::uint64_t& height,
            std::vector<std::uint64_t>& offsets, std::string& method);
  // Turns until done.
  void run(Work& work, std::uint64_t& lower_bound, std::uint64_t& height,
           std::vector<std::uint64_t>& offsets, std::string& method);

 private:
  struct State;
  // search_small's, on its own portfolio (none: turn() is done at once).
  explicit ExactSchedule(std::unique_ptr<State> state);
  friend void search_small(const Instance&, const ObstacleMap&, std::uint64_t&, std::uint64_t,
                           Work&, std::uint64_t&, std::vector<std::uint64_t>&, std::string&, bool,
                           bool);
  std::unique_ptr<State> state_;
};

}  // namespace renaissance::planner::detail
