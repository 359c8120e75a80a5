// stop_test.cpp - the hard stop (core/planner_stop.h): plan() interrupted at
// any poll still returns a valid plan.
//
// Each instance is first planned with a stop that never fires (the clock
// off), which counts the polls P that plan made. Then it is planned again
// stopped at poll k (Stop::after_polls): for every k in [1, P] when P is at
// most 3,000, else for the first and last 40 and a seeded sample, on small
// instances (linear, cyclic, with obstacles; budget 0 and a small one) and
// on one of 1,700 buffers (above the canonical search's 1,500, so that ruin
// and recreate and the peak repair are interrupted too). Every such plan
// must be valid by a reference check written here (pairwise, on original
// times), report its size, LOAD and bounds consistently and say
// stopped_by "clock" (or "bound" when it is optimal); a stop past the last
// poll must change nothing.
#include "test_util.h"

#include "core/planner_stop.h"

namespace plan_test {
namespace {

using renaissance::planner::detail::plan_with_stop;
using renaissance::planner::detail::Stop;

// Reference validity check on original times (no tick compression, no
// sweep): every pair of buffers, and every buffer and obstacle, that share a
// tick must be disjoint in memory. O(n^2) with a time pre-filter.
bool reference_valid(const Problem& p, const std::vector<std::uint64_t>& off) {
  if (off.size() != p.buffers.size()) return false;
  auto live_ticks = [&](std::int64_t lower, std::int64_t upper) {
    return ticks_of(lower, upper, p.period);
  };
  std::vector<std::vector<std::int64_t>> ticks(p.buffers.size());
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].size > 0) ticks[i] = live_ticks(p.buffers[i].lower, p.buffers[i].upper);
  }
  auto disjoint = [](std::uint64_t a, std::uint64_t as, std::uint64_t b, std::uint64_t bs) {
    return a + as <= b || b + bs <= a;
  };
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& x = p.buffers[i];
    if (x.size == 0) continue;
    if (off[i] > (std::uint64_t{1} << 63)) return false;
    for (std::size_t j = i + 1; j < p.buffers.size(); ++j) {
      const Buffer& y = p.buffers[j];
      if (y.size == 0 || disjoint(off[i], x.size, off[j], y.size)) continue;
      if (share_tick(ticks[i], ticks[j])) return false;
    }
    for (const FixedBuffer& f : p.fixed) {
      if (f.size == 0 || disjoint(off[i], x.size, f.offset, f.size)) continue;
      if (share_tick(ticks[i], live_ticks(f.lower, f.upper))) return false;
    }
  }
  return true;
}

// Linear time only, for the large case: buffers sorted by start, each
// compared with the later-starting ones it overlaps in time.
bool reference_valid_linear(const Problem& p, const std::vector<std::uint64_t>& off) {
  if (off.size() != p.buffers.size() || !p.fixed.empty() || p.period != 0) return false;
  std::vector<std::size_t> ids(p.buffers.size());
  std::iota(ids.begin(), ids.end(), std::size_t{0});
  std::sort(ids.begin(), ids.end(),
            [&](std::size_t a, std::size_t b) { return p.buffers[a].lower < p.buffers[b].lower; });
  for (std::size_t a = 0; a < ids.size(); ++a) {
    const Buffer& x = p.buffers[ids[a]];
    if (x.size == 0) continue;
    for (std::size_t b = a + 1; b < ids.size() && p.buffers[ids[b]].lower < x.upper; ++b) {
      const Buffer& y = p.buffers[ids[b]];
      if (y.size == 0) continue;
      const std::uint64_t ox = off[ids[a]], oy = off[ids[b]];
      if (!(ox + x.size <= oy || oy + y.size <= ox)) return false;
    }
  }
  return true;
}

void check_stopped(const Problem& p, const pl::Result& r, const pl::Result& full, bool large,
                   std::uint64_t k, const char* what) {
  CHECK(large ? reference_valid_linear(p, r.offsets) : reference_valid(p, r.offsets),
        "%s: stopped at poll %llu: invalid plan (method %s)", what,
        static_cast<unsigned long long>(k), r.method.c_str());
  CHECK(r.size == plan_size(p, r.offsets), "%s: stopped at poll %llu: size %llu, plan %llu", what,
        static_cast<unsigned long long>(k), static_cast<unsigned long long>(r.size),
        static_cast<unsigned long long>(plan_size(p, r.offsets)));
  CHECK(r.load == full.load, "%s: stopped at poll %llu: load", what,
        static_cast<unsigned long long>(k));
  CHECK(r.load <= r.lower_bound && r.lower_bound <= r.size && r.lower_bound <= full.size,
        "%s: stopped at poll %llu: lower bound %llu", what, static_cast<unsigned long long>(k),
        static_cast<unsigned long long>(r.lower_bound));
  CHECK(r.optimal == (r.size == r.lower_bound), "%s: optimal flag", what);
  CHECK(r.stopped_by == (r.optimal ? "bound" : "clock"), "%s: stopped at poll %llu: stopped_by %s",
        what, static_cast<unsigned long long>(k), r.stopped_by.c_str());
  // The best plan before the stop is kept (its check fits: no clock here),
  // and the baseline is in it once done.
  CHECK(r.greedy_size == 0 || r.greedy_size == full.greedy_size, "%s: greedy_size", what);
  CHECK(r.greedy_size == 0 || r.size <= r.greedy_size, "%s: stopped at poll %llu: above greedy",
        what, static_cast<unsigned long long>(k));
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].size == 0) CHECK(r.offsets[i] == 0, "%s: zero-size offset", what);
  }
}

// Plans `p` unstopped (counting polls P), then stopped at poll k for every
// k in [1, P] when P <= kEvery, else for the first and last kEdge polls and
// `sampled` drawn ones. Returns P.
constexpr std::uint64_t kEvery = 3000;
constexpr std::uint64_t kEdge = 40;

std::uint64_t stop_everywhere(const Problem& p, const pl::Options& o, bool large, Gen& g,
                              int sampled, const char* what) {
  Stop never;
  const pl::Result full = plan_with_stop(p, o, &never);
  const std::uint64_t polls = never.polls();
  CHECK(!never.reached() && full.stopped_by != "clock", "%s: unstopped run stopped", what);
  std::vector<std::uint64_t> points;
  if (polls <= kEvery) {
    for (std::uint64_t k = 1; k <= polls; ++k) points.push_back(k);
  } else {
    for (std::uint64_t k = 1; k <= kEdge; ++k) {
      points.push_back(k);
      points.push_back(polls + 1 - k);
    }
    for (int s = 0; s < sampled; ++s) {
      points.push_back(1 + static_cast<std::uint64_t>(g.uni(0, static_cast<std::int64_t>(polls) - 1)));
    }
  }
  points.push_back(polls + 1);  // past the last poll: nothing changes
  for (const std::uint64_t k : points) {
    Stop stop = Stop::after_polls(k);
    const pl::Result r = plan_with_stop(p, o, &stop);
    if (k > polls) {
      CHECK(!stop.reached() && r.offsets == full.offsets && r.method == full.method &&
                r.stopped_by == full.stopped_by,
            "%s: a stop after the last poll (%llu) changed the plan", what,
            static_cast<unsigned long long>(polls));
      continue;
    }
    CHECK(stop.reached(), "%s: stop at poll %llu of %llu never reached", what,
          static_cast<unsigned long long>(k), static_cast<unsigned long long>(polls));
    check_stopped(p, r, full, large, k, what);
  }
  return polls;
}

// With the exact schedule on a second thread (Options::threads 2) the hard
// stop of the calling thread still ends plan() anywhere with a valid plan.
// The calling thread's poll count is not fixed there (it stops once its
// work count passes the second thread's finish, which it sees when the
// thread has stored it), so the stops are drawn from the unstopped run's
// count and a stop never reached must leave the plan as it was unstopped.
void stop_with_second_thread(const Problem& p, pl::Options o, Gen& g, int sampled,
                             const char* what) {
  o.threads = 2;
  Stop never;
  const pl::Result full = plan_with_stop(p, o, &never);
  const std::uint64_t polls = never.polls();
  for (int s = 0; s < sampled; ++s) {
    const auto k = 1 + static_cast<std::uint64_t>(g.uni(0, static_cast<std::int64_t>(polls)));
    Stop stop = Stop::after_polls(k);
    const pl::Result r = plan_with_stop(p, o, &stop);
    if (stop.reached()) {
      check_stopped(p, r, full, false, k, what);
    } else {
      CHECK(r.offsets == full.offsets && r.stopped_by == full.stopped_by,
            "%s: two threads: a stop at poll %llu never reached changed the plan", what,
            static_cast<unsigned long long>(k));
    }
  }
}

}  // namespace

void test_stop_everywhere(int iterations) {
  Gen g(2027);
  std::uint64_t total = 0;
  // Small instances: linear, cyclic, with obstacles; budget 0 (constructive
  // passes) and a small budget (the search), clock off.
  const int small = std::max(4, iterations / 4);
  for (int it = 0; it < small; ++it) {
    const bool cyclic = it % 3 == 1;
    const int fixed = it % 4 == 2 ? static_cast<int>(g.uni(1, 4)) : 0;
    Problem p = it % 4 == 3 ? obstacle_problem(g, static_cast<int>(g.uni(4, 24)), g.uni(4, 20),
                                               cyclic, static_cast<int>(g.uni(1, 6)), 0)
                            : g.problem(static_cast<int>(g.uni(2, 30)), g.uni(2, 20), cyclic,
                                        fixed, 0);
    pl::Options o;
    o.budget_seconds = it % 2 == 0 ? 0.0 : 0.002;
    o.clock_seconds = kNoClock;
    o.seed = static_cast<std::uint64_t>(it);
    o.threads = 1;  // one thread: its poll count is a function of the input
    total += stop_everywhere(p, o, false, g, 60, "small instance");
    if (it % 2 == 1) stop_with_second_thread(p, o, g, 20, "small instance");
  }
  // One instance over 1,500 buffers (ruin and recreate, peak repair), a
  // sample of its polls.
  const Problem big = step_random_frees(g, 1700);
  pl::Options o;
  o.budget_seconds = 0.02;
  o.clock_seconds = kNoClock;
  o.threads = 1;
  total += stop_everywhere(big, o, true, g, std::max(20, iterations), "1,700 buffers");
  // With two threads the second one runs the peak-first passes there.
  stop_with_second_thread(big, o, g, std::max(8, iterations / 20), "1,700 buffers");
  CHECK(total > 1000, "too few polls (%llu): phases do not poll", static_cast<unsigned long long>(total));
}

}  // namespace plan_test
