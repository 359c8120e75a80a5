// planner_work.h - the work budget every planner strategy shares: a
// deterministic work count and a wall-clock deadline, whichever comes first.
//
// Invariants kept here:
//   * While only the count stops a search, everything the planner does is a
//     pure function of its input (the count never reads the clock).
//   * A child budget's use is absorbed by its parent, and a child that
//     expired expires its parent: no phase can spend past the root budget.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/planner_stop.h"

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
  // Units counted since the root budget began: the ancestors' when this
  // child was made plus this budget's own.
  std::uint64_t total() const { return base_ + used_; }
  // A second thread's finish (planner.cpp: the exact schedule beside the
  // other phases): the root-budget unit count at which it reached its lower
  // bound, ~0 while it has not. Once total() passes it, out() is true for
  // good: that thread's plan is the one returned, whatever this one finds
  // after, so stopping changes nothing and keeps the result a function of
  // the two work counts. Children inherit it.
  void set_rival(const std::atomic<std::uint64_t>* rival) { rival_ = rival; }
  std::uint64_t left() const { return used_ >= limit_ ? 0 : limit_ - used_; }
  // True once the work count is spent, or the deadline passed or is too
  // near for the reserved tail (see reserve_tail()).
  // Polls the hard stop too (set_stop()), which throws once it is reached.
  bool out() {
    poll(stop_);
    if (used_ >= limit_) return true;
    if (rival_ != nullptr && total() > rival_->load(std::memory_order_relaxed)) {
      limit_ = used_;
      return true;
    }
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
  // The hard stop out() polls (planner_stop.h); children inherit it.
  void set_stop(Stop* stop) { stop_ = stop; }
  Stop* stop() const { return stop_; }
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
  Stop* stop_ = nullptr;
  const std::atomic<std::uint64_t>* rival_ = nullptr;
};

}  // namespace renaissance::planner::detail
