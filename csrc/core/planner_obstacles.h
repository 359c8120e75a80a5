// planner_obstacles.h - the fixed obstacles of an instance, per tick, as the
// free gaps they leave.
//
// Obstacles usually change far less often than buffers (a training step's
// persistent blocks live for the whole period), so ticks with the same live
// obstacles share one profile: the obstacles merged into disjoint spans, the
// free gaps between them below their top, and per size class the suffix sums
// of the gaps wide enough for that class.
//
// Size classes: thresholds L_0 < L_1 < ... (L_0 the smallest free item size,
// the others the smallest item sizes that do not fit some gap); an item's
// class is the largest j with size >= L_j. A gap narrower than L_j can hold
// no item of class >= j, which is what usable() counts.
//
// Invariants kept here: spans and gaps of a profile are disjoint and sorted;
// bytes() and usable() are exact for what they describe (usable() counts a
// free range only when its length is at least L_j), so every bound built on
// them is valid; the map is a pure function of the instance.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner_greedy.h"
#include "core/planner_instance.h"

namespace renaissance::planner::detail {

class ObstacleMap {
 public:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};

  explicit ObstacleMap(const Instance& inst);

  // No obstacle live anywhere, or (rarely) too many obstacle changes to
  // describe: every use then treats the instance as free of obstacles, so
  // what it derives is only weaker.
  bool empty() const { return profiles_.empty(); }
  // Profile of the obstacles live at `tick`, or kNone when there are none.
  std::uint32_t profile(std::int32_t tick) const {
    return profile_of_.empty() ? kNone : profile_of_[static_cast<std::size_t>(tick)];
  }
  std::uint32_t classes() const { return static_cast<std::uint32_t>(thresholds_.size()); }
  std::uint32_t class_of(std::uint64_t size) const;
  std::uint64_t top(std::uint32_t profile) const { return profiles_[profile].top; }

  // Obstacle bytes of `profile` in [from, to).
  std::uint64_t bytes(std::uint32_t profile, std::uint64_t from, std::uint64_t to) const;
  // Free bytes of `profile` in [from, to) that lie in maximal free ranges
  // (clipped to [from, to)) at least threshold(cls) long.
  std::uint64_t usable(std::uint32_t profile, std::uint32_t cls, std::uint64_t from,
                       std::uint64_t to) const;
  // True when some profile leaves a free range below its top that the
  // smallest buffer fits in: without one, obstacles only raise the floor.
  bool has_gaps() const;
  // Merged obstacle spans of `profile`, sorted.
  const std::vector<Span>& spans(std::uint32_t profile) const { return profiles_[profile].spans; }

 private:
  struct Profile {
    std::vector<Span> spans;           // merged obstacles, sorted
    std::vector<std::uint64_t> below;  // below[k]: bytes of spans[0, k)
    std::vector<Span> gaps;            // free ranges below top, sorted
    std::vector<std::uint64_t> suffix; // [cls * (gaps + 1) + g]: usable in gaps[g, end)
    std::uint64_t top = 0;
  };
  std::uint64_t bytes_below(const Profile& p, std::uint64_t x) const;

  std::vector<Profile> profiles_;
  std::vector<std::uint32_t> profile_of_;  // per tick
  std::vector<std::uint64_t> thresholds_;
};

// Merges spans (sorted by offset on return) into disjoint ones; touching
// spans are joined.
void merge_spans(std::vector<Span>& spans);

}  // namespace renaissance::planner::detail
