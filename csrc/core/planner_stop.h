// planner_stop.h - the planner's hard stop: the wall-clock budget's end,
// polled at a fine grain by every phase, so that plan() can stop anywhere.
//
// Invariants kept here:
//   * poll() costs an increment and a compare; the clock is read once every
//     kPollsPerRead polls. Every loop of the planner that can run for more
//     than a few microseconds polls at least once per item (or per node, per
//     sort comparison), so between two clock reads there are at most
//     kPollsPerRead items' work: well under a millisecond of CPU.
//   * Once the stop is reached, poll() throws Stop::Reached (and keeps
//     throwing): plan() catches it and returns the plan it had checked
//     before (planner.cpp). Nothing that catches it may use the state the
//     interrupted phase was changing.
//   * A default Stop never stops (clock off), and never reads the clock.
//   * Stop::after_polls(k) stops at the k-th poll, whatever the clock: the
//     tests interrupt plan() at every point this way, deterministically.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

#include "core/planner.h"

namespace renaissance::planner::detail {

class Stop {
 public:
  using Clock = std::chrono::steady_clock;
  // Thrown by poll() once the stop is reached.
  struct Reached {};

  // Never stops.
  Stop() = default;
  // Stops at `deadline` (wall clock).
  explicit Stop(Clock::time_point deadline)
      : deadline_(deadline), clocked_(true), next_(kPollsPerRead) {}
  // Stops at poll number `k` (1 = the first poll), whatever the clock.
  static Stop after_polls(std::uint64_t k) {
    Stop s;
    s.next_ = k;
    return s;
  }

  void poll() {
    if (++count_ >= next_) slow();
  }
  // Polls made so far.
  std::uint64_t polls() const { return count_; }
  // True once poll() has thrown.
  bool reached() const { return reached_; }

  // A comparison wrapped so that every call polls (for sorts over every item).
  template <class Less>
  struct Polled {
    Stop* stop;
    Less less;
    template <class A, class B>
    bool operator()(const A& a, const B& b) {
      if (stop != nullptr) stop->poll();
      return less(a, b);
    }
  };
  template <class Less>
  static Polled<Less> polled(Stop* stop, Less less) {
    return Polled<Less>{stop, less};
  }

 private:
  static constexpr std::uint64_t kPollsPerRead = 256;

  void slow() {
    if (reached_ || !clocked_ || Clock::now() >= deadline_) {
      reached_ = true;
      next_ = 0;  // every later poll throws again
      throw Reached{};
    }
    next_ = count_ + kPollsPerRead;
  }

  Clock::time_point deadline_{};
  bool clocked_ = false;
  bool reached_ = false;
  std::uint64_t count_ = 0;
  std::uint64_t next_ = std::numeric_limits<std::uint64_t>::max();
};

// Polls `stop` when there is one (most functions take an optional stop).
inline void poll(Stop* stop) {
  if (stop != nullptr) stop->poll();
}

// plan() (planner.h) with the hard stop `stop` instead of the one its wall
// clock sets (null: that one). The tests stop plan() at every poll this way
// (Stop::after_polls); polls count from after the first, checked sweep.
Result plan_with_stop(const Problem& problem, const Options& options, Stop* stop);

}  // namespace renaissance::planner::detail
