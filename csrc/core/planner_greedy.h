// planner_greedy.h - constructive placement: best fit / first fit in a
// given order, orderings, and the work budget shared by all strategies.
//
// Invariants kept here:
//   * Placement never moves an already placed item and never creates a
//     collision: each new offset is the start of a free gap among the placed
//     items overlapping it in time (fixed obstacles included), or the top of
//     them, so it is 0, a fixed end or a sum of sizes on top of those.
//   * Everything is deterministic: ties break by item index, and the work
//     counter decides when a search stops, unless the wall-clock deadline
//     of the Work budget comes first (see Work).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/planner_instance.h"

namespace renaissance::planner::detail {

// Work budget: a deterministic work count and a wall-clock deadline,
// whichever comes first. While only the count stops a search, everything is
// a pure function of the input; the deadline makes the budget a promise of
// wall time (on a loaded machine it stops the search earlier, and the plan
// then depends on the machine). The clock is read every kPollUnits units of
// work or every 64 polls, whichever comes first.
class Work {
 public:
  using Clock = std::chrono::steady_clock;
  Work(std::uint64_t limit, Clock::time_point deadline)
      : limit_(limit), deadline_(deadline), origin_(Clock::now()) {}
  Work(std::uint64_t limit, double cap_seconds)
      : Work(limit, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(cap_seconds))) {}
  void add(std::uint64_t units) { used_ += units; }
  std::uint64_t used() const { return used_; }
  std::uint64_t left() const { return used_ >= limit_ ? 0 : limit_ - used_; }
  // True once the work count is spent, or the deadline passed or is too
  // near for the reserved tail (see reserve_tail()).
  bool out() {
    if (used_ >= limit_) return true;
    if (used_ >= next_poll_ || ++polls_ % 64 == 0) {
      next_poll_ = used_ + kPollUnits;
      if (!fits_clock(0)) return true;
    }
    return false;
  }
  // Keeps time before the deadline for `units` of work that follows this
  // budget and does not look at the clock (the final check, a fallback
  // sweep), at the rate seen so far (see fits_clock()). Children inherit it.
  void reserve_tail(std::uint64_t units) { tail_units_ = units; }
  // True when the deadline (not the work count) stopped this budget.
  bool expired() const { return expired_; }
  // Whether a step of about `units` that does not look at the clock (a
  // rebuild, a sweep) can still end before the deadline, at the rate this
  // budget (its ancestors included) has run at so far: wall seconds since
  // the root budget began per unit counted. So a loaded machine (a slower
  // rate) stops earlier, and the deadline is overrun by the error of that
  // prediction, not by a whole step. A refusal is a clock stop: it is
  // sticky and expired() reports it, as when the deadline passes.
  bool fits_clock(std::uint64_t units) {
    if (expired_) return false;
    if (time_for(units)) return true;
    limit_ = used_;
    expired_ = true;
    return false;
  }
  // A clock stop decided without looking at the rate (plan(): too little
  // time left for the baseline): sticky, as in fits_clock().
  void expire() {
    limit_ = used_;
    expired_ = true;
  }
  // The prediction alone (see fits_clock()), whether or not this budget
  // has expired; changes nothing.
  bool time_for(std::uint64_t units) const {
    const Clock::time_point now = Clock::now();
    const std::uint64_t total = base_ + used_;
    const double elapsed = std::chrono::duration<double>(now - origin_).count();
    // Before kRateUnits have been counted the rate is not known yet: only
    // the deadline itself counts.
    const double predicted =
        total < kRateUnits ? 0.0
                           : elapsed * static_cast<double>(units + tail_units_) /
                                 static_cast<double>(total);
    return now + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(predicted)) <= deadline_;
  }
  // Both: the work count has `units` left and the clock fits them.
  bool affords(std::uint64_t units) { return left() >= units && fits_clock(units); }
  // A budget of at most `units` out of what is left here, with the same
  // deadline; its use is charged back with absorb().
  Work child(std::uint64_t units) const {
    Work w(*this);
    w.base_ = base_ + used_;
    w.used_ = 0;
    w.polls_ = 0;
    w.next_poll_ = kPollUnits;
    w.limit_ = std::min(units, left());
    return w;
  }
  // The same, with a deadline no later than `deadline`.
  Work child(std::uint64_t units, Clock::time_point deadline) const {
    Work w = child(units);
    w.deadline_ = std::min(deadline_, deadline);
    return w;
  }
  Clock::time_point deadline() const { return deadline_; }
  void absorb(const Work& child) {
    used_ += child.used_;
    if (child.expired_) {
      limit_ = used_;
      expired_ = true;
    }
  }

 private:
  static constexpr std::uint64_t kPollUnits = std::uint64_t{1} << 16;  // about 0.4 ms
  static constexpr std::uint64_t kRateUnits = std::uint64_t{1} << 20;  // about 6 ms
  std::uint64_t used_ = 0;
  std::uint64_t limit_;
  std::uint64_t polls_ = 0;
  std::uint64_t next_poll_ = kPollUnits;
  bool expired_ = false;
  Clock::time_point deadline_;
  Clock::time_point origin_;  // when the root budget began
  std::uint64_t base_ = 0;    // units the ancestors had used when this child was made
  std::uint64_t tail_units_ = 0;  // work after this budget that the deadline must leave time for
};

enum class Fit { kBest, kFirst };

struct Span {
  std::uint64_t off, end;
};

// Segment tree over ticks. Node v keeps two merged (disjoint, sorted) lists
// of memory ranges: own, the ranges of pieces whose canonical cover includes
// v, and sub, the union of own over v's subtree. The ranges used by items
// overlapping [lo, hi) are then the union of own on the boundary paths and
// sub on the canonical nodes of [lo, hi): O(log T) lists, each already
// merged, so a query costs about the number of holes, not the number of
// overlapping items (Placer::find_offset merges them, skipping runs of
// spans already covered).
class OccupancyTree {
 public:
  explicit OccupancyTree(std::int32_t ticks);
  void clear();
  void insert(std::int32_t lo, std::int32_t hi, Span s);
  // Appends the lists holding the ranges used over [lo, hi): each list is
  // sorted and merged; ranges in different lists may overlap.
  using List = std::pair<const Span*, const Span*>;
  void collect(std::int32_t lo, std::int32_t hi, std::vector<List>& out) const;
  // Nodes visited by insert() and collect() since the last call.
  std::uint64_t take_touches() {
    const std::uint64_t t = touches_;
    touches_ = 0;
    return t;
  }
  // True when the nodes outgrow the cache (then a visit costs about a miss).
  bool large() const { return nodes_.size() > kCacheNodes; }

 private:
  void insert(std::uint32_t v, std::int32_t l, std::int32_t r, std::int32_t lo,
              std::int32_t hi, Span s);
  void collect(std::uint32_t v, std::int32_t l, std::int32_t r, std::int32_t lo,
               std::int32_t hi, std::vector<List>& out) const;
  static void add(std::vector<Span>& list, Span s);

  struct Node {
    std::vector<Span> own, sub;  // together: one cache line per node
  };
  static constexpr std::size_t kCacheNodes = std::size_t{1} << 18;
  std::int32_t ticks_;
  std::vector<Node> nodes_;
  mutable std::uint64_t touches_ = 0;
  std::vector<std::uint32_t> dirty_;
};

class Placer {
 public:
  explicit Placer(const Instance& inst);

  // Resets the tree to the items placed in `offsets` (fixed obstacles and
  // any free item already placed).
  void reset(const std::vector<std::uint64_t>& offsets);

  // Best (or first) fitting offset for `item` among the placed items.
  std::uint64_t find_offset(std::uint32_t item, Fit fit, Work& work);
  void commit(std::uint32_t item, std::uint64_t offset);

  // Places `order` one by one on top of `offsets` (reset() first); returns
  // the plan height (max end of all placed items, fixed included). Runs to
  // the end whatever the budget (callers bound it).
  std::uint64_t place(const std::vector<std::uint32_t>& order,
                      std::vector<std::uint64_t>& offsets, Fit fit, Work& work);
  // The same, but gives up (returns false; `offsets` then holds a partial
  // plan) once `work` is out before an item; on success sets `height`.
  bool try_place(const std::vector<std::uint32_t>& order, std::vector<std::uint64_t>& offsets,
                 Fit fit, Work& work, std::uint64_t& height);

 private:
  const Instance& inst_;
  OccupancyTree tree_;
  std::vector<OccupancyTree::List> lists_;
  // find_offset's merge scratch (a loser tree over lists_).
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> loser_, winners_;
};

// Offsets vector with fixed obstacles in place and free items unplaced.
std::vector<std::uint64_t> initial_offsets(const Instance& inst);
std::uint64_t height(const Instance& inst, const std::vector<std::uint64_t>& offsets);

// Static orderings of the free items.
enum class Order {
  kSize,      // size desc, then start asc, duration desc (the baseline)
  kArea,      // size x length desc
  kLength,    // length desc, then size desc
  kStart,     // start asc, then size desc
  kPressure,  // max LOAD profile over lifetime desc, then size desc
  kPressureArea,  // pressure desc, then area desc
};
std::vector<std::uint32_t> make_order(const Instance& inst, Order order);
// Per free item: max of inst.live over its pieces.
std::vector<std::uint64_t> pressures(const Instance& inst);

}  // namespace renaissance::planner::detail
