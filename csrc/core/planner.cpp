// planner.cpp - public entry points of the static memory planner.
//
// Invariants kept here (see planner.h):
//   * plan() and greedy_by_size() only return plans that pass the same sweep
//     check validate() runs; a plan that would not (a planner bug) is never
//     returned: the baseline is returned instead, and if even that failed,
//     std::logic_error is thrown.
//   * Results depend only on (Problem, Options): the improvement search is
//     bounded by a work count derived from Options::budget_seconds; the wall
//     clock is a safety cap at several times the budget.
//   * Malformed problems throw std::invalid_argument naming the first bad
//     buffer (see planner_instance.cpp).
#include "core/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include "core/planner_bound.h"
#include "core/planner_greedy.h"
#include "core/planner_improve.h"
#include "core/planner_instance.h"
#include "core/planner_obstacles.h"
#include "core/planner_search.h"

namespace renaissance::planner {
namespace {

using detail::Fit;
using detail::Instance;
using detail::kUnplaced;
using detail::Order;
using detail::Placer;
using detail::Work;

// Work units per second of budget. On the reference machine (2-core x86-64)
// a unit is about 4 ns of work (a few simple inner-loop steps); about 30% of
// the budget is left for the parts not counted (building the instance, the
// final check) and for noise.
constexpr double kUnitsPerSecond = 1.7e8;
// The wall-clock safety cap: this many times the budget, plus a margin.
constexpr double kCapFactor = 2.0;
constexpr double kCapMargin = 0.25;
// Instances up to this many buffers get the branch and bound search.
constexpr std::uint32_t kSearchMaxItems = 1500;
// With fixed obstacles, the share of the search budget (what is left after
// the constructive passes) that the branch and bound gets; the peak repair
// by sub-search (planner_improve.h) gets the rest.
constexpr double kObstacleSearchShare = 0.5;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Best {
  std::uint64_t height = kUnplaced;
  std::vector<std::uint64_t> offsets;
  std::string method;

  bool offer(std::uint64_t h, const std::vector<std::uint64_t>& offs, const char* how) {
    if (h >= height) return false;
    height = h;
    offsets = offs;
    method = how;
    return true;
  }
};

// Sweep check on original times: live buffers ordered by offset must be
// pairwise disjoint; a new one only needs checking against its neighbours.
std::string sweep_check(const Problem& problem, const std::vector<std::uint64_t>& offsets) {
  if (offsets.size() != problem.buffers.size()) {
    return "plan has " + std::to_string(offsets.size()) + " offsets for " +
           std::to_string(problem.buffers.size()) + " buffers";
  }
  detail::check_period(problem);
  detail::check_sizes(problem);
  struct Event {
    std::int64_t t;
    int kind;  // 0: end, 1: start (ends first: lifetimes are half-open)
    std::uint32_t id;  // buffers [0, n), fixed [n, n + m)
  };
  const std::size_t n = problem.buffers.size();
  std::vector<Event> events;
  std::vector<std::uint64_t> off(n + problem.fixed.size()), size(off.size());
  std::int64_t lo[2], hi[2];
  for (std::size_t i = 0; i < off.size(); ++i) {
    const bool fixed = i >= n;
    const std::int64_t lower = fixed ? problem.fixed[i - n].lower : problem.buffers[i].lower;
    const std::int64_t upper = fixed ? problem.fixed[i - n].upper : problem.buffers[i].upper;
    size[i] = fixed ? problem.fixed[i - n].size : problem.buffers[i].size;
    off[i] = fixed ? problem.fixed[i - n].offset : offsets[i];
    const int parts = detail::split_lifetime(lower, upper, problem.period,
                                             fixed ? "fixed buffer" : "buffer",
                                             fixed ? i - n : i, lo, hi);
    if (size[i] == 0) continue;
    if (off[i] > std::numeric_limits<std::uint64_t>::max() - size[i]) {
      return "buffer " + std::to_string(i) + ": offset + size overflows 64 bits";
    }
    for (int k = 0; k < parts; ++k) {
      events.push_back({lo[k], 1, static_cast<std::uint32_t>(i)});
      events.push_back({hi[k], 0, static_cast<std::uint32_t>(i)});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.t != b.t) return a.t < b.t;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.id < b.id;
  });
  auto name = [&](std::uint32_t id) {
    return id >= n ? "fixed buffer " + std::to_string(id - n) : "buffer " + std::to_string(id);
  };
  auto range = [&](std::uint32_t id) {
    return "[" + std::to_string(off[id]) + ", " + std::to_string(off[id] + size[id]) + ")";
  };
  // Fixed obstacles may overlap each other (they are given, not planned);
  // they are kept in their own set and only checked against buffers.
  std::set<std::pair<std::uint64_t, std::uint32_t>> live, live_fixed;
  auto collides = [&](const std::set<std::pair<std::uint64_t, std::uint32_t>>& s,
                      std::uint32_t id) -> std::int64_t {
    const std::uint64_t a = off[id], b = off[id] + size[id];
    auto it = s.lower_bound({a, 0});
    if (it != s.end() && it->first < b) return it->second;
    if (it != s.begin()) {
      --it;
      if (off[it->second] + size[it->second] > a) return it->second;
    }
    return -1;
  };
  for (const Event& e : events) {
    const bool fixed = e.id >= n;
    auto& own = fixed ? live_fixed : live;
    if (e.kind == 0) {
      own.erase({off[e.id], e.id});
      continue;
    }
    if (!fixed) {
      // Fixed obstacles may overlap one another, so the neighbour check is
      // not enough among them: scan those live ones below the end.
      for (const auto& f : live_fixed) {
        if (f.first >= off[e.id] + size[e.id]) break;
        if (off[f.second] + size[f.second] > off[e.id]) {
          return name(e.id) + " " + range(e.id) + " collides with " + name(f.second) + " " +
                 range(f.second) + " at time " + std::to_string(e.t);
        }
      }
      const std::int64_t other = collides(live, e.id);
      if (other >= 0) {
        const auto o = static_cast<std::uint32_t>(other);
        return name(std::min(o, e.id)) + " " + range(std::min(o, e.id)) + " collides with " +
               name(std::max(o, e.id)) + " " + range(std::max(o, e.id)) + " at time " +
               std::to_string(e.t);
      }
    } else {
      for (const auto& b : live) {
        if (b.first >= off[e.id] + size[e.id]) break;
        if (off[b.second] + size[b.second] > off[e.id]) {
          return name(b.second) + " " + range(b.second) + " collides with " + name(e.id) + " " +
                 range(e.id) + " at time " + std::to_string(e.t);
        }
      }
    }
    own.insert({off[e.id], e.id});
  }
  return {};
}

Result make_result(const Problem& problem, const Instance& inst, const Best& best,
                   std::uint64_t greedy_size) {
  Result r;
  r.offsets.assign(problem.buffers.size(), 0);
  for (std::uint32_t i = 0; i < inst.num_free; ++i) r.offsets[inst.buffer_of[i]] = best.offsets[i];
  r.size = std::max(best.height, inst.fixed_top);
  r.load = inst.load;
  r.greedy_size = greedy_size;
  r.method = best.method;
  return r;
}

Best run_greedy(const Instance& inst, Placer& placer, Work& work) {
  Best best;
  std::vector<std::uint64_t> offs = detail::initial_offsets(inst);
  placer.reset(offs);
  const std::uint64_t h = placer.place(detail::make_order(inst, Order::kSize), offs, Fit::kBest, work);
  best.offer(h, offs, "greedy_by_size");
  return best;
}

struct Constructive {
  Order order;
  Fit fit;
  const char* name;
};

// The constructive portfolio, most useful first. Large instances get the
// best-fit passes only (each pass there costs tens of milliseconds).
std::vector<Constructive> portfolio(std::uint32_t n) {
  std::vector<Constructive> p = {
      {Order::kLength, Fit::kBest, "best_fit_by_length"},
      {Order::kPressureArea, Fit::kBest, "best_fit_by_pressure_area"},
      {Order::kArea, Fit::kBest, "best_fit_by_area"},
  };
  if (n <= 20000) {
    p.push_back({Order::kStart, Fit::kBest, "best_fit_by_start"});
    p.push_back({Order::kPressure, Fit::kBest, "best_fit_by_pressure"});
  }
  if (n <= 10000) {
    p.push_back({Order::kSize, Fit::kFirst, "first_fit_by_size"});
    p.push_back({Order::kArea, Fit::kFirst, "first_fit_by_area"});
    p.push_back({Order::kLength, Fit::kFirst, "first_fit_by_length"});
    p.push_back({Order::kPressureArea, Fit::kFirst, "first_fit_by_pressure_area"});
    p.push_back({Order::kPressure, Fit::kFirst, "first_fit_by_pressure"});
  }
  return p;
}

}  // namespace

std::uint64_t load(const Problem& problem) { return Instance(problem).load; }

std::string validate(const Problem& problem, const std::vector<std::uint64_t>& offsets) {
  return sweep_check(problem, offsets);
}

Result greedy_by_size(const Problem& problem) {
  const auto t0 = std::chrono::steady_clock::now();
  const Instance inst(problem);
  Placer placer(inst);
  Work work(std::numeric_limits<std::uint64_t>::max(), 1e9);
  const Best best = run_greedy(inst, placer, work);
  Result r = make_result(problem, inst, best, 0);
  r.greedy_size = r.size;
  if (!sweep_check(problem, r.offsets).empty()) {
    throw std::logic_error("planner: greedy_by_size produced an invalid plan (bug)");
  }
  r.seconds = seconds_since(t0);
  return r;
}

Result plan(const Problem& problem, const Options& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!(options.budget_seconds >= 0.0) || !std::isfinite(options.budget_seconds)) {
    throw std::invalid_argument("planner: budget_seconds must be finite and >= 0");
  }
  const Instance inst(problem);
  const std::uint64_t limit =
      static_cast<std::uint64_t>(std::min(options.budget_seconds * kUnitsPerSecond, 1e18));
  Work work(limit, options.budget_seconds * kCapFactor + kCapMargin);
  // First LOAD and the fixed top (with obstacles merged: the cheap part of
  // planner_bound.h, on an empty budget).
  Work no_work = work.child(0);
  std::uint64_t lower_bound = detail::lower_bound(inst, &no_work);

  Placer placer(inst);
  Best best = run_greedy(inst, placer, work);
  const std::uint64_t greedy_height = best.height;
  work.absorb(no_work);

  // Constructive portfolio, stopping at the lower bound. With a budget, a
  // pass runs only while the budget can pay for one (the baseline's cost);
  // with budget 0 all of them run, and no search.
  const std::uint64_t pass_cost = work.used() - no_work.used();
  std::vector<std::uint64_t> offs;
  for (const Constructive& c : portfolio(inst.num_free)) {
    if (std::max(best.height, inst.fixed_top) <= lower_bound) break;
    if (options.budget_seconds > 0 && work.left() < pass_cost) break;
    offs = detail::initial_offsets(inst);
    placer.reset(offs);
    const std::uint64_t h = placer.place(detail::make_order(inst, c.order), offs, c.fit, work);
    best.offer(h, offs, c.name);
  }

  // With obstacles, the per-tick gap bound (planner_bound.h) before the
  // search, on at most a quarter of what is left (cut short, it is only
  // weaker).
  if (std::max(best.height, inst.fixed_top) > lower_bound && inst.num_items > inst.num_free) {
    Work bound_work = work.child(work.left() / 4);
    lower_bound = std::max(lower_bound, detail::lower_bound(inst, &bound_work));
    work.absorb(bound_work);
  }

  // Improvement search within the work budget. With obstacles that leave
  // gaps a buffer fits in, the search over the whole instance gets a share
  // of it and the peak repair by sub-search the rest; otherwise the search
  // and then peak repair by ruin and recreate.
  const bool obstacles = inst.num_items > inst.num_free && detail::ObstacleMap(inst).has_gaps();
  if (std::max(best.height, inst.fixed_top) > lower_bound && !work.out()) {
    if (obstacles) {
      if (inst.num_free <= kSearchMaxItems) {
        Work share = work.child(
            static_cast<std::uint64_t>(static_cast<double>(work.left()) * kObstacleSearchShare));
        detail::search_small(inst, lower_bound, options.seed, share, best.height, best.offsets,
                             best.method);
        work.absorb(share);
      }
      detail::repair_peaks(inst, lower_bound, options.seed, work, best.height, best.offsets,
                           best.method);
    } else {
      if (inst.num_free <= kSearchMaxItems) {
        detail::search_small(inst, lower_bound, options.seed, work, best.height, best.offsets,
                             best.method);
      }
      detail::improve(inst, lower_bound, options.seed, work, best.height, best.offsets,
                      best.method);
    }
  }

  Result r = make_result(problem, inst, best, std::max(greedy_height, inst.fixed_top));
  if (!sweep_check(problem, r.offsets).empty()) {
    // A planner bug: fall back to the baseline rather than return it.
    Work w(std::numeric_limits<std::uint64_t>::max(), 1e9);
    const Best base = run_greedy(inst, placer, w);
    r = make_result(problem, inst, base, std::max(greedy_height, inst.fixed_top));
    r.method += " (fallback)";
    if (!sweep_check(problem, r.offsets).empty()) {
      throw std::logic_error("planner: produced an invalid plan (bug)");
    }
  }
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace renaissance::planner
