// planner.cpp - public entry points of the static memory planner.
//
// Invariants kept here (see planner.h):
//   * plan() and greedy_by_size() only return plans that pass the same sweep
//     check validate() runs; a plan that would not (a planner bug) is never
//     returned: the sweep's plan (planner_sweep.h, independent of the rest)
//     is returned instead, and if even that failed, std::logic_error is
//     thrown.
//   * Every pass and the improvement search stop at a work count derived
//     from Options::budget_seconds (at least a floor of c * N log N) or at
//     the wall-clock deadline, whichever comes first; Result::stopped_by
//     says which. Unless the clock stopped them, results depend only on
//     (Problem, Options). Phase decisions (which pass runs, how the budget
//     is split) look at the work count only, never at the clock.
//   * What no budget bounds is O(N log N): building the instance, the
//     sweep's plan and its check, made first (on the reference machine,
//     about 0.1 s together for N = 100,000). Every phase after that polls
//     the hard stop at the end of the budget (planner_stop.h) and may be
//     interrupted anywhere; plan() then returns the best plan found before
//     the stop if its check fits in a short grace, else the sweep's.
//   * Malformed problems throw std::invalid_argument naming the first bad
//     buffer (see planner_instance.cpp).
#include "core/planner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "core/planner_bound.h"
#include "core/planner_greedy.h"
#include "core/planner_improve.h"
#include "core/planner_instance.h"
#include "core/planner_obstacles.h"
#include "core/planner_search.h"
#include "core/planner_sweep.h"

namespace renaissance::planner {
namespace {

using detail::Fit;
using detail::Instance;
using detail::kUnplaced;
using detail::Order;
using detail::Placer;
using detail::Stop;
using detail::Work;

// Work units per second of budget. On the reference machine (2-core x86-64)
// a unit is about 4 ns of work (a few simple inner-loop steps); about 30% of
// the budget is left for the parts not counted (building the instance, the
// final check) and for noise.
constexpr double kUnitsPerSecond = 1.7e8;
// How long past the soft deadline plan() waits for the search's second
// thread (Options::threads) before it returns without it. The thread polls
// the deadline about every 0.4 ms of its work, so only a thread the machine
// starves of CPU is later (a breaker measured 149 ms with two busy loops on
// the 2 cores).
constexpr std::chrono::milliseconds kThreadGrace{20};
// Every call may spend at least this much work, whatever its budget (0
// included): kFloorUnits + kFloorUnitsPerItem * N * log2(N + 2) units for N
// buffers and obstacles. It pays for the constructive passes of small
// instances (all of them, as before the budget was capped); on large ones it
// is the c * n log n part of the time guarantee (planner.h).
constexpr double kFloorUnits = 4e6;
constexpr double kFloorUnitsPerItem = 12;
// What the fallback after a baseline cut short costs (two sweeps,
// planner_sweep.h), per N * log2(N + 2): the baseline stops this much short
// of the work limit.
constexpr double kSweepUnitsPerItem = 8;
// The wall clock: the search stops at budget_seconds less an allowance for
// what follows it (the final check, the last sweep), in two parts: a fixed
// one, kTailPerBuild times the time the instance took to build (at least
// kTailSecondsMin), and kTailUnitsPerItem * N * log2(N + 2) units (the check
// costs about 3 of them per N log N on the reference machine, the sweep
// about 4) converted to seconds at the rate of wall time per unit seen so
// far, so that on a loaded machine (a slower rate) the search stops
// earlier; with budget 0 (or an explicit clock_seconds), never before
// kFloorClockFactor times the time the work floor stands for (so budget 0
// still gets its constructive passes).
constexpr double kTailUnitsPerItem = 5;
constexpr double kTailSecondsMin = 0.004;
constexpr double kTailPerBuild = 1.0;
constexpr double kFloorClockFactor = 2.0;
// The baseline (best fit by decreasing size) takes about 9 to 25 times as
// long as building the instance (measured: 9x on a 92,447-buffer training
// step, 24x on a 30,000-buffer XLA-like instance), one sweep about as long
// as the build. When the wall clock leaves less than kBaselineBuilds builds'
// time, the baseline cannot finish and its fallback sweep, with the final
// check, would run past the deadline (the budget overruns of issue 12 on
// large instances at small budgets under load): the sweep alone makes the
// plan then, before the deadline. A clock decision, so that plan depends on
// the machine. A build's time here is the smaller of the build's and the
// first sweep's (pace_seconds in plan_with_stop).
constexpr double kBaselineBuilds = 8.0;
// The hard stop (planner_stop.h) comes kHardSlackSeconds after the end of
// the budget, so that the soft deadline (Work) normally ends the search and
// the final check runs as before. After the hard stop, the best plan found
// before it is checked in a grace of kGraceChecks times what the sweep's
// check took (the same work at about the same load), at least
// kGraceMinSeconds (a process on a loaded machine waits milliseconds for a
// core), and returned only if that check ends in time. A grace capped at a
// few tens of milliseconds returned the sweep's plan under heavy load where
// the best plan was much lower (tests/test_varlen.py's steady peak, 1.29x
// LOAD, on a process given a seventh of a core): the check of the plan
// returned is part of what no budget skips, as the sweep's is.
constexpr double kHardSlackSeconds = 0.05;
constexpr double kGraceMinSeconds = 0.04;
constexpr double kGraceChecks = 3.0;
// Instances up to this many buffers get the branch and bound search.
constexpr std::uint32_t kSearchMaxItems = 1500;
// ... and only when the (buffer, obstacle) pairs overlapping in time that it
// records stay below this, and so do the buffers' lifetimes in ticks, summed
// (its setup walks them).
constexpr std::uint64_t kSearchMaxObstaclePairs = 4000000;
constexpr std::uint64_t kSearchMaxTicks = std::uint64_t{1} << 24;
// Work units per pair of buffers overlapping in time that the search's
// setup (CanonicalSearch's overlap lists) takes: 30-90 ns a pair measured
// (1,950 to 4,049 buffers), a unit being about 4 ns.
constexpr std::uint64_t kSetupUnitsPerPair = 8;
// Cyclic instances (lifetimes that wrap) get the search up to this many buffers:
// a wrapping buffer is live at both ends of the period, so the constructive
// passes place it as a long-lived one, and peak repair and ruin and recreate
// cannot move it (it holds the plan's top at every tick); the search places
// it with the peak's buffers. It reached LOAD at 1 s up to 5,344 buffers;
// at 7,662-7,744 it found nothing in 1 s and took the passes' work
// (docs/benchmarks.md, issue 12's cyclic pass).
constexpr std::uint32_t kCyclicSearchMaxItems = 6000;
// There the constructive passes stop at this fraction of the work count
// (instead of half), and without obstacles the search gets this share of
// what is left before ruin and recreate and the peak repair.
constexpr double kCyclicPassShare = 0.3;
constexpr double kCyclicSearchShare = 0.7;
// With fixed obstacles, instances up to this many items (buffers and
// obstacles) get the peak repair by sub-search; larger ones the ruin and
// recreate of improve() (a sub-problem there can hold about every item as an
// obstacle).
constexpr std::uint32_t kRepairMaxItems = 20000;
// With fixed obstacles, the share of the search budget (what is left after
// the constructive passes) that the branch and bound gets; the peak repair
// by sub-search (planner_improve.h) gets the rest.
constexpr double kObstacleSearchShare = 0.5;
// Without obstacles, up to kSearchMaxItems linear buffers: the share of the
// budget left after the constructive passes that the search over the whole
// instance gets; the peak repair by sub-search gets the rest. On hard
// instances (MiniMalloc's set and packed_square's) the search's ladder and
// raise find their plans early and then stall, and its exact schedule needs
// seconds; the peak repair (its windows, and on small instances its top
// band, each re-planned with everything else fixed and kept when its top
// drops) goes on lowering the plan from there: at 1 s of work 9 of 13 such
// instances plan lower, the other 4 equal (docs/benchmarks.md, issue 12's
// tenth pass). With 70%, MiniMalloc's E still reaches LOAD within 10 s.
constexpr double kSmallSearchShare = 0.7;
// Without obstacles and too large for the search, the share of the budget
// left after the constructive passes that ruin and recreate (improve()) gets;
// the peak repair by sub-search gets the rest.
constexpr double kImproveShare = 0.3;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The best plan so far: the first plan offered is always taken (whatever
// its height: no sentinel height), later ones only when strictly lower.
struct Best {
  bool has_plan = false;
  std::uint64_t height = 0;
  std::vector<std::uint64_t> offsets;
  std::string method;

  bool offer(std::uint64_t h, const std::vector<std::uint64_t>& offs, const char* how) {
    if (has_plan && h >= height) return false;
    has_plan = true;
    height = h;
    offsets = offs;
    method = how;
    return true;
  }
};

// The peak-first passes (detail::peak_first_order), by best fit. Over 48
// instances (the shared traces, the generated ones, MiniMalloc's challenging
// set, the IOPDDL/SOMAS traces from outside), these three pairs of orders
// were the ones that took the large instances the later phases leave above
// LOAD to it: SOMAS pangu 2.6B +0.758% -> LOAD (by size then start; no other
// pass or phase closed its 40 MiB hole at the peak, at any budget), IOPDDL
// S 1 +0.237% -> +0.020% and Y 1 +0.356% -> LOAD (by length then size), a
// generated 9,233-buffer training step +0.165% -> LOAD (docs/benchmarks.md,
// issue 12's eighteenth pass).
struct PeakPass {
  Order clique, rest;
  const char* name;
};
constexpr PeakPass kPeakPasses[] = {
    {Order::kLength, Order::kSize, "peak_first_by_length_then_size"},
    {Order::kSize, Order::kStart, "peak_first_by_size_then_start"},
    {Order::kLength, Order::kSizeClass, "peak_first_by_length_then_size_class"},
};

// The peak-first passes on `work`, each plan kept when strictly lower than
// `height`; stops at `lower_bound`, and at a pass the work count (or the
// clock) cuts short, which is dropped. The second thread's job, and the
// calling thread's when no thread could be started.
void run_peak_passes(const Instance& inst, Work& work, std::uint64_t lower_bound,
                     std::uint64_t& height, std::vector<std::uint64_t>& offsets,
                     std::string& method) {
  Placer placer(inst);
  for (const PeakPass& pass : kPeakPasses) {
    if (std::max(height, inst.fixed_top) <= lower_bound || work.out()) return;
    std::vector<std::uint64_t> offs = detail::initial_offsets(inst);
    placer.reset(offs);
    std::uint64_t h = 0;
    if (!placer.try_place(detail::peak_first_order(inst, pass.clique, pass.rest), offs,
                          Fit::kBest, work, h)) {
      return;
    }
    if (h < height) {
      height = h;
      offsets = std::move(offs);
      method = pass.name;
    }
  }
}

// One job on a second thread, beside the phases on the calling thread
// (Options::threads): the search's exact schedule (detail::ExactSchedule),
// or, on instances too large for the search over the whole instance, the
// peak-first passes (kPeakPasses), which then take no work from the peak
// repair (run among the constructive passes, at 0.25 s they took 37% of
// the work count of a 20,000-buffer training step that the peak repair had
// taken to LOAD, and it stayed at +0.306%; a breaker counted 6 of 30 such
// seeds higher). Each side has
// its own work count: the thread's budget is what the caller's had left
// when it started, with the same deadline, and a copy of the hard stop.
// Each side records the root-budget unit count at which it reached its
// lower bound (done()), and each stops once its own count passes the
// other's (Work::set_rival): the plan returned is then a function of the
// two counts, not of which thread ran faster (see take()).
//
// The thread owns what it reads (a copy of the instance and of its
// obstacle map, and the schedule built on them, in a shared State), so
// that the caller never has to wait for it past the deadline: a thread the
// machine starved of CPU (its polls come late) is left to stop at its next
// poll, and its plan is not used.
class SecondThread {
 public:
  enum class Job { kExact, kPeakFirst };
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};
  using Clock = std::chrono::steady_clock;

  // Builds the exact schedule (kExact) on the calling thread (charged to
  // `work`), then starts the thread. Throws std::system_error when no
  // thread can be started: the caller then runs the job itself.
  SecondThread(Job job, const Instance& inst, const detail::ObstacleMap& map, Work& work,
               const Stop& stop, std::uint64_t lower_bound, const Best& best)
      : state_(std::make_shared<State>(job, inst, map, work, stop, lower_bound, best)) {
    thread_ = std::thread([state = state_] { run(*state); });
  }
  SecondThread(const SecondThread&) = delete;
  SecondThread& operator=(const SecondThread&) = delete;
  // Unwinding past it (the hard stop, an error): the thread stops at its
  // next poll; it is waited for only when it has already ended.
  ~SecondThread() {
    if (!thread_.joinable()) return;
    state_->main_done.store(0);
    if (finished()) {
      thread_.join();
    } else {
      thread_.detach();
    }
  }
  // The count the calling side's Work stops at (its rival).
  const std::atomic<std::uint64_t>* done() const { return &state_->done; }

  // The calling side is done: `main_total` is its unit count at its lower
  // bound (kNever when it did not reach it). Waits for the thread until
  // `deadline`, then gives `best` the thread's plan when the thread reached
  // its bound first (fewer units; a tie goes to the calling side) or,
  // neither having reached it, when the thread's plan is strictly lower;
  // raises `lower_bound` to what the thread proved; rethrows the thread's
  // error. Returns false when the thread had not ended by the deadline (it
  // is left to stop; nothing of it is used).
  bool take(std::uint64_t main_total, Clock::time_point deadline, Best& best,
            std::uint64_t& lower_bound) {
    State& s = *state_;
    s.main_done.store(main_total);
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      if (!s.ended.wait_until(lock, deadline, [&] { return s.finished; })) {
        lock.unlock();
        s.main_done.store(0);
        thread_.detach();
        return false;
      }
    }
    thread_.join();
    if (s.error) std::rethrow_exception(s.error);
    lower_bound = std::max(lower_bound, s.lower_bound);
    const std::uint64_t thread_total = s.done.load();
    const bool thread_first = thread_total != kNever && thread_total < main_total;
    if (thread_first || (main_total == kNever && s.height < best.height)) {
      best = Best{true, s.height, s.offsets, s.method};
    }
    return true;
  }

 private:
  struct State {
    Job job;
    Instance inst;
    detail::ObstacleMap map;
    std::optional<detail::ExactSchedule> schedule;  // kExact
    Work work;
    Stop stop;
    std::uint64_t lower_bound;
    std::uint64_t height;
    std::vector<std::uint64_t> offsets;
    std::string method;
    std::atomic<std::uint64_t> done{kNever};
    std::atomic<std::uint64_t> main_done{kNever};
    std::exception_ptr error;
    std::mutex mutex;
    std::condition_variable ended;
    bool finished = false;  // under mutex

    State(Job j, const Instance& i, const detail::ObstacleMap& m, Work& parent, const Stop& s,
          std::uint64_t lb, const Best& best)
        : job(j),
          inst(i),
          map(m),
          schedule(j == Job::kExact ? std::make_optional<detail::ExactSchedule>(inst, map, parent)
                                    : std::nullopt),
          work(parent.child(parent.left())),
          stop(s),
          lower_bound(lb),
          height(best.height),
          offsets(best.offsets),
          method(best.method) {
      inst.stop = nullptr;  // the thread polls its own Work and Stop only
      work.set_stop(&stop);
      work.set_rival(&main_done);
    }
  };

  static void run(State& s) {
    try {
      if (s.job == Job::kExact) {
        s.schedule->run(s.work, s.lower_bound, s.height, s.offsets, s.method);
      } else {
        run_peak_passes(s.inst, s.work, s.lower_bound, s.height, s.offsets, s.method);
      }
      if (std::max(s.height, s.inst.fixed_top) <= s.lower_bound) s.done.store(s.work.total());
    } catch (const Stop::Reached&) {
      // The hard stop: its plan so far is complete and valid; take() may
      // still use it.
    } catch (...) {
      s.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.finished = true;
    }
    s.ended.notify_all();
  }

  bool finished() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->finished;
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
};

// Max over a range of counts, with range add (lazy, top-down).
class CoverTree {
 public:
  explicit CoverTree(std::size_t size)
      : size_(std::max<std::size_t>(size, 1)), max_(4 * size_, 0), add_(4 * size_, 0) {}
  void add(std::size_t l, std::size_t r, int delta) { add(1, 0, size_, l, r, delta); }
  int max(std::size_t l, std::size_t r) const { return max(1, 0, size_, l, r); }

 private:
  void add(std::size_t v, std::size_t lo, std::size_t hi, std::size_t l, std::size_t r,
           int delta) {
    if (r <= lo || hi <= l) return;
    if (l <= lo && hi <= r) {
      add_[v] += delta;
      max_[v] += delta;
      return;
    }
    const std::size_t m = lo + (hi - lo) / 2;
    add(2 * v, lo, m, l, r, delta);
    add(2 * v + 1, m, hi, l, r, delta);
    max_[v] = add_[v] + std::max(max_[2 * v], max_[2 * v + 1]);
  }
  int max(std::size_t v, std::size_t lo, std::size_t hi, std::size_t l, std::size_t r) const {
    if (r <= lo || hi <= l) return std::numeric_limits<int>::min();
    if (l <= lo && hi <= r) return max_[v];
    const std::size_t m = lo + (hi - lo) / 2;
    return add_[v] + std::max(max(2 * v, lo, m, l, r), max(2 * v + 1, m, hi, l, r));
  }

  std::size_t size_;
  std::vector<int> max_, add_;
};

// Sweep check on original times: live buffers ordered by offset must be
// pairwise disjoint; a new one only needs checking against its neighbours.
// Live fixed obstacles (which may overlap one another) are counted per
// elementary range of their offsets and ends: a buffer collides with one
// exactly when some elementary range it covers has a live obstacle. O(N log N)
// for N buffers and obstacles.
std::string sweep_check(const Problem& problem, const std::vector<std::uint64_t>& offsets,
                        detail::Stop* stop = nullptr) {
  if (offsets.size() != problem.buffers.size()) {
    return "plan has " + std::to_string(offsets.size()) + " offsets for " +
           std::to_string(problem.buffers.size()) + " buffers";
  }
  detail::check_period(problem);
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
    if (i % 256 == 0) detail::poll(stop);
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
      return (fixed ? "fixed buffer " + std::to_string(i - n) : "buffer " + std::to_string(i)) +
             ": offset + size overflows 64 bits";
    }
    for (int k = 0; k < parts; ++k) {
      events.push_back({lo[k], 1, static_cast<std::uint32_t>(i)});
      events.push_back({hi[k], 0, static_cast<std::uint32_t>(i)});
    }
  }
  std::sort(events.begin(), events.end(),
            detail::Stop::polled(stop, [](const Event& a, const Event& b) {
              if (a.t != b.t) return a.t < b.t;
              if (a.kind != b.kind) return a.kind < b.kind;
              return a.id < b.id;
            }));
  auto name = [&](std::uint32_t id) {
    return id >= n ? "fixed buffer " + std::to_string(id - n) : "buffer " + std::to_string(id);
  };
  auto range = [&](std::uint32_t id) {
    return "[" + std::to_string(off[id]) + ", " + std::to_string(off[id] + size[id]) + ")";
  };
  // Elementary ranges of the obstacles: [x[j], x[j + 1]).
  std::vector<std::uint64_t> x;
  for (std::size_t i = n; i < off.size(); ++i) {
    if (size[i] == 0) continue;
    x.push_back(off[i]);
    x.push_back(off[i] + size[i]);
  }
  std::sort(x.begin(), x.end());
  x.erase(std::unique(x.begin(), x.end()), x.end());
  CoverTree cover(x.size());
  // Elementary ranges meeting [a, b): j with x[j] < b and x[j + 1] > a.
  auto elementary = [&](std::uint64_t a, std::uint64_t b) {
    const auto first = std::upper_bound(x.begin(), x.end(), a) - x.begin();
    const auto last = std::lower_bound(x.begin(), x.end(), b) - x.begin();
    return std::make_pair(static_cast<std::size_t>(std::max<std::ptrdiff_t>(first - 1, 0)),
                          static_cast<std::size_t>(last));
  };
  std::set<std::pair<std::uint64_t, std::uint32_t>> live, live_fixed;
  // A live buffer overlapping [off[id], off[id] + size[id]): live buffers are
  // disjoint, so the first one at or above the start and the one before it
  // are the only candidates.
  // `lowest` names the lowest such buffer when two are.
  auto collides = [&](std::uint32_t id, bool lowest) -> std::int64_t {
    const std::uint64_t a = off[id], b = off[id] + size[id];
    const auto it = live.lower_bound({a, 0});
    const bool above = it != live.end() && it->first < b;
    if (above && !lowest) return it->second;
    if (it != live.begin()) {
      const auto prev = std::prev(it);
      if (off[prev->second] + size[prev->second] > a) return prev->second;
    }
    return above ? static_cast<std::int64_t>(it->second) : -1;
  };
  for (const Event& e : events) {
    detail::poll(stop);
    const bool fixed = e.id >= n;
    if (e.kind == 0) {
      (fixed ? live_fixed : live).erase({off[e.id], e.id});
      if (fixed) {
        const auto r = elementary(off[e.id], off[e.id] + size[e.id]);
        cover.add(r.first, r.second, -1);
      }
      continue;
    }
    const std::int64_t other = collides(e.id, fixed);
    if (!fixed) {
      const auto r = elementary(off[e.id], off[e.id] + size[e.id]);
      if (!x.empty() && r.first < r.second && cover.max(r.first, r.second) > 0) {
        // Name the obstacle (the error path only: a scan is fine).
        for (const auto& f : live_fixed) {
          if (f.first >= off[e.id] + size[e.id]) break;
          if (off[f.second] + size[f.second] > off[e.id]) {
            return name(e.id) + " " + range(e.id) + " collides with " + name(f.second) + " " +
                   range(f.second) + " at time " + std::to_string(e.t);
          }
        }
      }
      if (other >= 0) {
        const auto o = static_cast<std::uint32_t>(other);
        return name(std::min(o, e.id)) + " " + range(std::min(o, e.id)) + " collides with " +
               name(std::max(o, e.id)) + " " + range(std::max(o, e.id)) + " at time " +
               std::to_string(e.t);
      }
      live.insert({off[e.id], e.id});
    } else {
      if (other >= 0) {
        const auto o = static_cast<std::uint32_t>(other);
        return name(o) + " " + range(o) + " collides with " + name(e.id) + " " + range(e.id) +
               " at time " + std::to_string(e.t);
      }
      live_fixed.insert({off[e.id], e.id});
      const auto r = elementary(off[e.id], off[e.id] + size[e.id]);
      cover.add(r.first, r.second, 1);
    }
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

// The sweep's plan (planner_sweep.h) over the whole instance: plan() makes
// it first and checks it, so that it always has a valid plan to return
// when the hard stop interrupts a later phase; it is also the baseline's
// fallback and the last candidate (the same plan, made once).
struct SweepPlan {
  std::vector<std::uint64_t> offsets;  // per item (fixed ones at their offsets)
  std::uint64_t height = 0;
};

SweepPlan make_sweep(const Instance& inst) {
  SweepPlan s;
  s.offsets = detail::initial_offsets(inst);
  s.height = detail::sweep_best_fit(inst, s.offsets);
  return s;
}

// Best fit by decreasing size, on `work` less `reserve` units. Gives up
// (returns false) once that is spent; then the items it placed, with the
// rest placed by the sweep above them, and the sweep alone (`sweep`; made
// here when null) are offered instead (planner_sweep.h; `reserve` is about
// their cost). The wall clock is kept the same way: the baseline keeps
// time for `reserve` more units of tail (at the rate seen so far;
// Work::reserve_tail).
bool run_greedy(const Instance& inst, Placer& placer, Work& work, std::uint64_t reserve,
                std::uint64_t tail_units, bool sweep_only, const SweepPlan* sweep, Best& best) {
  auto offer_sweep = [&] {
    if (sweep != nullptr) {
      best.offer(sweep->height, sweep->offsets, "sweep_best_fit");
    } else {
      const SweepPlan own = make_sweep(inst);
      best.offer(own.height, own.offsets, "sweep_best_fit");
    }
  };
  std::vector<std::uint64_t> offs = detail::initial_offsets(inst);
  if (sweep_only) {
    work.add(reserve);
    work.expire();
    offer_sweep();
    return false;
  }
  placer.reset(offs);
  std::uint64_t h = 0;
  Work share = work.child(work.left() > reserve ? work.left() - reserve : 0);
  share.reserve_tail(tail_units + reserve);
  const bool done =
      placer.try_place(detail::make_order(inst, Order::kSize), offs, Fit::kBest, share, h);
  work.absorb(share);
  if (done) {
    best.offer(h, offs, "greedy_by_size");
    return true;
  }
  work.add(reserve);
  // Both fallbacks when there is time (the baseline stopped early enough
  // for them, unless the machine slowed down since); else only one: the
  // baseline completed by the sweep when the baseline placed most items,
  // else the sweep alone.
  std::size_t placed = 0;
  for (std::uint32_t i = 0; i < inst.num_free; ++i) placed += offs[i] != kUnplaced;
  const bool late = share.expired() && !work.time_for(2 * reserve);  // a margin of 2
  if (!late || 2 * placed >= inst.num_free) {
    best.offer(detail::sweep_best_fit_above(inst, detail::height(inst, offs), offs), offs,
               "greedy_by_size_then_sweep");
  }
  if (!late || 2 * placed < inst.num_free) offer_sweep();
  return false;
}

struct Constructive {
  Order order;
  Fit fit;
  const char* name;
  // Runs whenever the work count can pay for it, outside the passes' share
  // (plan_with_stop).
  bool exempt = false;
  // And its work does not count against that share either: the passes after
  // it are admitted as if it had not run.
  bool uncounted = false;
  // Peak first (detail::peak_first_order): the peak tick's items in
  // `order`, then the others in `rest`.
  bool peak_first = false;
  Order rest = Order::kSize;
};

// A peak-first pass (detail::peak_first_order), by best fit.
Constructive peak_first(Order clique, Order rest, const char* name) {
  Constructive c{clique, Fit::kBest, name, /*exempt=*/true};
  c.peak_first = true;
  c.rest = rest;
  return c;
}

// Above this many buffers, the portfolio's first-fit passes are first fit
// by size and by size class, each admitted at a quarter of a best-fit pass's
// cost (first fit stops at the first gap that fits: a quarter to a seventh
// of best fit's work on XLA-style buffers, about as much on training
// steps). On linear instances first fit by size runs before the baseline,
// on at most a quarter of the work count (plan_with_stop), and the best-fit
// passes after it are admitted as if it had not run: on XLA-style buffers it was
// the best pass (30,000 to 60,000 buffers: +0.85% to +2.07% over LOAD, where
// best fit by size was +1.97% to +5.9%), and last in the list it never ran on
// 60,000 of them at 2 s (the baseline had used the passes' share) and at 6 s
// neither (a best-fit pass had): the plan was the baseline's.
// docs/benchmarks.md, issue 12's thirteenth pass.
constexpr std::uint32_t kCheapFirstFit = 10000;

// The constructive portfolio, most useful first. Large instances get the
// best-fit passes (each pass there costs tens of milliseconds), and two
// first-fit passes (see kCheapFirstFit). Cyclic instances (an alternating layout's two phases)
// above kSearchMaxItems buffers get best fit by length class first: it took
// the generated two-phase steps from +2.0-9.6% over LOAD to +0.25% or less
// (docs/benchmarks.md); on linear ones it found nothing the others did not,
// and its work cost IOPDDL S 1 the later phases' plan at 1 s (+0.24% ->
// +1.22%). Then first fit by end (the buffers that die last first): where
// the logits-sized buffers around the loss topped every other pass's plan
// (alternating_step 4,000-16,000 buffers, 4 of 30 seeds: +3.8% to +11.3% at
// 0.25 s, the 8,000-buffer ones at 1 s too) it gives +0.026-0.053%; one seed
// of the 30 got worse at 0.25 s (+4.82% -> +5.65%, the later phases' work),
// none at 1 s (docs/benchmarks.md, issue 12's sixteenth pass). Smaller
// instances get the search over the whole instance, and keep the plans they
// had (a 300-buffer looped step's plan by length class left 45 of its 154
// positions to the locked path in tests/test_replay_fast_livein.py).
// With `peak`, last, the peak-first passes (kPeakPasses), each exempt from
// the passes' share: plan_with_stop asks for them with a budget above 0
// when they do not run on the second thread (one thread, or an instance the
// search over the whole instance covers, whose exact schedule has that
// thread).
std::vector<Constructive> portfolio(std::uint32_t n, bool cyclic, bool peak) {
  std::vector<Constructive> p;
  if (cyclic && n > kSearchMaxItems) {
    p.push_back({Order::kLengthClass, Fit::kBest, "best_fit_by_length_class", true});
    p.push_back({Order::kEnd, Fit::kFirst, "first_fit_by_end", true});
  } else if (n > kCheapFirstFit) {
    // With a budget, plan_with_stop runs this one before the baseline and
    // skips it here; with budget 0 it runs here, first of the passes.
    p.push_back({Order::kSize, Fit::kFirst, "first_fit_by_size", true, true});
  }
  p.insert(p.end(), {{Order::kLength, Fit::kBest, "best_fit_by_length"},
                     {Order::kPressureArea, Fit::kBest, "best_fit_by_pressure_area"},
                     {Order::kSizeClass, Fit::kBest, "best_fit_by_size_class"}});
  if (n <= 20000) {
    p.push_back({Order::kStart, Fit::kBest, "best_fit_by_start"});
    p.push_back({Order::kPressure, Fit::kBest, "best_fit_by_pressure"});
  }
  if (n <= kCheapFirstFit) {
    p.push_back({Order::kSize, Fit::kFirst, "first_fit_by_size"});
    p.push_back({Order::kSizeClass, Fit::kFirst, "first_fit_by_size_class"});
  }
  if (n <= 20000) p.push_back({Order::kArea, Fit::kBest, "best_fit_by_area"});
  if (n <= kCheapFirstFit) {
    p.push_back({Order::kArea, Fit::kFirst, "first_fit_by_area"});
    p.push_back({Order::kLength, Fit::kFirst, "first_fit_by_length"});
    p.push_back({Order::kPressureArea, Fit::kFirst, "first_fit_by_pressure_area"});
    p.push_back({Order::kPressure, Fit::kFirst, "first_fit_by_pressure"});
  } else {
    if (cyclic) p.push_back({Order::kSize, Fit::kFirst, "first_fit_by_size"});
    p.push_back({Order::kSizeClass, Fit::kFirst, "first_fit_by_size_class"});
  }
  if (peak) {
    for (const PeakPass& pass : kPeakPasses) p.push_back(peak_first(pass.clique, pass.rest, pass.name));
  }
  return p;
}

// Over the pieces [lo[k], hi[k]), the pieces of a set overlapping each
// (the set given by its sorted starts and ends): those starting before hi
// minus those ending at or before lo; summed, in O(K log S). Stops counting
// past `cap`.
std::uint64_t overlapping(const std::vector<std::int32_t>& lo, const std::vector<std::int32_t>& hi,
                          const std::vector<std::int32_t>& starts,
                          const std::vector<std::int32_t>& ends, std::uint64_t cap) {
  std::uint64_t count = 0;
  for (std::size_t k = 0; k < lo.size() && count <= cap; ++k) {
    const auto s = std::lower_bound(starts.begin(), starts.end(), hi[k]) - starts.begin();
    const auto e = std::upper_bound(ends.begin(), ends.end(), lo[k]) - ends.begin();
    count += static_cast<std::uint64_t>(s - e);
  }
  return count;
}

// The free pieces' and the obstacles' [lo, hi), split.
struct PieceRanges {
  std::vector<std::int32_t> free_lo, free_hi, fixed_lo, fixed_hi;
  explicit PieceRanges(const Instance& inst) {
    for (const detail::Piece& p : inst.pieces) {
      const bool free = p.item < inst.num_free;
      (free ? free_lo : fixed_lo).push_back(p.lo);
      (free ? free_hi : fixed_hi).push_back(p.hi);
    }
  }
};

std::vector<std::int32_t> sorted(std::vector<std::int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Pairs (free buffer, obstacle) overlapping in time; stops counting past
// `cap`.
std::uint64_t obstacle_pairs(const PieceRanges& r, std::uint64_t cap) {
  if (r.fixed_lo.empty()) return 0;
  return overlapping(r.free_lo, r.free_hi, sorted(r.fixed_lo), sorted(r.fixed_hi), cap);
}

// Pairs of free pieces overlapping in time; stops counting past `cap`. The
// search's setup (CanonicalSearch) lists, for every buffer, the buffers it
// overlaps: about this many entries, twice.
std::uint64_t free_pairs(const PieceRanges& r, std::uint64_t cap) {
  // Each piece counts itself, and each pair is seen from both ends.
  const std::uint64_t n = r.free_lo.size();
  const std::uint64_t twice_and_self =
      overlapping(r.free_lo, r.free_hi, sorted(r.free_lo), sorted(r.free_hi), 2 * cap + n);
  return (twice_and_self - std::min(twice_and_self, n)) / 2;
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
  Best best;
  run_greedy(inst, placer, work, 0, 0, false, nullptr, best);
  Result r = make_result(problem, inst, best, 0);
  r.greedy_size = r.size;
  if (!sweep_check(problem, r.offsets).empty()) {
    throw std::logic_error("planner: greedy_by_size produced an invalid plan (bug)");
  }
  r.seconds = seconds_since(t0);
  return r;
}

namespace detail {

Result plan_with_stop(const Problem& problem, const Options& options, Stop* forced) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!(options.budget_seconds >= 0.0) || !std::isfinite(options.budget_seconds)) {
    throw std::invalid_argument("planner: budget_seconds must be finite and >= 0");
  }
  if (std::isnan(options.clock_seconds)) {
    throw std::invalid_argument("planner: clock_seconds must not be NaN");
  }
  if (options.threads != 1 && options.threads != 2) {
    throw std::invalid_argument("planner: threads must be 1 or 2, got " +
                                std::to_string(options.threads));
  }
  Instance inst(problem);
  const double items = static_cast<double>(inst.num_items);
  const double floor_units = kFloorUnits + kFloorUnitsPerItem * items * std::log2(items + 2);
  const double units =
      std::min(std::max(options.budget_seconds * kUnitsPerSecond, floor_units), 1e18);
  const auto limit = static_cast<std::uint64_t>(units);
  const double build_seconds = seconds_since(t0);
  // The plan that can always be returned: the sweep (O(N log N), no budget
  // skips it), checked now. Everything after it polls the hard stop and may
  // be interrupted anywhere; this plan is returned then.
  const auto sweep_start = std::chrono::steady_clock::now();
  const SweepPlan sweep = make_sweep(inst);
  const double sweep_seconds = seconds_since(sweep_start);
  Best safe;
  safe.offer(sweep.height, sweep.offsets, "sweep_best_fit");
  Result safe_result = make_result(problem, inst, safe, 0);
  const auto check_start = std::chrono::steady_clock::now();
  if (!sweep_check(problem, safe_result.offsets).empty()) {
    throw std::logic_error("planner: produced an invalid plan (bug)");
  }
  const double check_seconds = seconds_since(check_start);
  // How slow, or loaded, the machine is right now: the build and the sweep
  // each take about one build's time; the smaller of the two, so that one
  // wait for a core in either (a few milliseconds each, on a machine with
  // more runnable threads than cores) does not stand for the whole call.
  // Taken from the build alone, one such wait in a 0.4 ms build put a
  // 2,220-buffer step plan in sweep-only mode (below) at 0.25 s: 20.7%
  // over LOAD instead of at it.
  const double pace_seconds = std::min(build_seconds, sweep_seconds);
  // The tail (the final check, a last sweep) is kept in two parts: the
  // deadline is kTailPerBuild times that time before the budget's end (both
  // sort and sweep every piece), and every phase keeps time for
  // kTailUnitsPerItem * N log N units more at the rate of wall time per unit
  // seen so far (Work::reserve_tail), so that it adapts to the load as the
  // search goes.
  const double tail = std::max(kTailSecondsMin, kTailPerBuild * pace_seconds);
  const auto tail_units =
      static_cast<std::uint64_t>(kTailUnitsPerItem * items * std::log2(items + 2));
  const double wall = options.clock_seconds < 0 ? options.budget_seconds : options.clock_seconds;
  // A deadline a century away stands for "no clock" (+infinity).
  // Budget 0 keeps the constructive passes of the work floor; any other
  // budget is a wall-clock promise.
  constexpr double kNoClock = 3.15e9;
  const double clock = std::min(
      options.budget_seconds > 0 && options.clock_seconds < 0
          ? std::max(wall - tail, 0.0)
          : std::max(wall - tail, kFloorClockFactor * floor_units / kUnitsPerSecond),
      kNoClock);
  auto at = [&](double seconds) {
    return t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(seconds));
  };
  // The hard stop: the end of the wall-clock budget (the soft deadline of
  // Work plus the tail it keeps) and kHardSlackSeconds, or the test's stop.
  // With the clock off, none.
  Stop own =
      clock < kNoClock ? Stop(at(std::max(wall, clock + tail) + kHardSlackSeconds)) : Stop();
  Stop& stop = forced != nullptr ? *forced : own;
  inst.stop = &stop;

  std::uint64_t lower_bound = inst.load;
  std::uint64_t greedy_height = 0;
  bool greedy_done = false;
  Best best;  // the best plan so far (unchecked)
  Result r;
  try {
    Work work(limit, at(clock));
    work.reserve_tail(tail_units);
    work.set_stop(&stop);
    // First LOAD and the fixed top (with obstacles merged: the cheap part of
    // planner_bound.h, on an empty budget).
    const detail::ObstacleMap map(inst);
    Work no_work = work.child(0);
    lower_bound = detail::lower_bound(inst, map, &no_work);

    // The baseline, best fit by decreasing size. On a large instance it may
    // not finish within the work limit: then the sweep (planner_sweep.h, about
    // n log n) completes it or replaces it, and there is no budget left for
    // more passes.
    Placer placer(inst);
    const auto reserve =
        static_cast<std::uint64_t>(kSweepUnitsPerItem * items * std::log2(items + 2));
    const bool sweep_only = options.budget_seconds > 0 && options.clock_seconds < 0 &&
                            clock - build_seconds < kBaselineBuilds * pace_seconds;
    // Large linear instances: first fit by size before the baseline, on at
    // most a quarter of the work count (see kCheapFirstFit). Its plan stands
    // when the baseline is cut short (100,000 XLA-style buffers at 2 s: the
    // baseline needs 1.4 times the work count, first fit a fifth of it).
    // It is offered after the baseline, so that a tie keeps the baseline's
    // name, and the passes' share is counted as if it had not run.
    const bool first_fit_first = options.budget_seconds > 0 && !sweep_only &&
                                 !inst.multi_piece && inst.num_free > kCheapFirstFit;
    std::vector<std::uint64_t> ff_offsets;
    std::uint64_t ff_height = 0, ff_used = 0;
    bool ff_done = false;
    const char* ff_name = "first_fit_by_size";
    if (first_fit_first) {
      Work ff = work.child(work.left() / 4);
      ff.reserve_tail(tail_units + reserve);
      ff_offsets = detail::initial_offsets(inst);
      placer.reset(ff_offsets);
      ff_done = placer.try_place(detail::make_order(inst, Order::kSize), ff_offsets, Fit::kFirst,
                                 ff, ff_height);
      ff_used = ff.used();
      work.absorb(ff);
      if (!ff_done && !work.expired() && work.time_for(2 * reserve)) {
        // Cut short by its quarter (not by the clock): the sweep completes
        // it, as it does a baseline cut short (run_greedy), so that its work
        // is not lost (100,000 XLA-style buffers at 1 s: first fit needs a
        // third more than its quarter).
        work.add(reserve);
        ff_used += reserve;
        ff_height = detail::sweep_best_fit_above(inst, detail::height(inst, ff_offsets), ff_offsets);
        ff_done = true;
        ff_name = "first_fit_by_size_then_sweep";
      }
    }
    greedy_done = run_greedy(inst, placer, work, reserve, tail_units, sweep_only, &sweep, best);
    greedy_height = greedy_done ? best.height : 0;
    if (ff_done) best.offer(ff_height, ff_offsets, ff_name);
    work.absorb(no_work);
    std::vector<std::uint64_t> offs;

    // Constructive portfolio, stopping at the lower bound; a pass runs when
    // the budget can pay for it (the baseline's cost; a quarter of it for a
    // large instance's first-fit passes), else it is skipped and a cheaper
    // one may still run; a pass cut short by the budget is dropped.
    const std::uint64_t pass_cost = work.used() - no_work.used() - ff_used;
    bool cut = !greedy_done;  // some phase was stopped by the budget
    // A cyclic instance too large for the search over it otherwise
    // (kCyclicSearchMaxItems).
    const bool cyclic_search = inst.multi_piece && inst.num_free > kSearchMaxItems &&
                               inst.num_free <= kCyclicSearchMaxItems;
    const std::uint64_t pass_limit =
        cyclic_search ? static_cast<std::uint64_t>(kCyclicPassShare * static_cast<double>(limit))
                      : limit / 2;
    // The peak-first passes: on a second thread beside the improvement
    // phases where the exact schedule does not use it (instances too large
    // for the search over the whole instance), else among the passes.
    // Neither with budget 0 (the planner's floor, run under the arena's
    // lock: budget-0 plans stay as they were).
    const bool peak_passes = options.budget_seconds > 0;
    const bool peak_thread =
        peak_passes && options.threads >= 2 && inst.num_free > kSearchMaxItems && !cyclic_search;
    // The uncounted passes' work (Constructive::uncounted; first fit run
    // before the baseline is one).
    std::uint64_t uncounted_used = ff_used;
    if (greedy_done) {
      for (const Constructive& c :
           portfolio(inst.num_free, inst.multi_piece, peak_passes && !peak_thread)) {
        if (std::max(best.height, inst.fixed_top) <= lower_bound) break;
        if (c.uncounted && first_fit_first) continue;  // it ran before the baseline
        const std::uint64_t cost =
            c.fit == Fit::kFirst && inst.num_free > kCheapFirstFit ? pass_cost / 4 : pass_cost;
        // Large instances: the passes get half of the work count at most
        // (large cyclic ones less), so that the search and the peak repair
        // get the rest; the pass by length class (cyclic instances only,
        // portfolio()) runs whenever the work count can pay for it (at
        // 0.25 s the baseline left no room in that half on 13,000-19,000
        // generated two-phase buffers, and the plan was greedy's,
        // +6.8-10.6%).
        if (work.left() < cost || work.out() ||
            (inst.num_free > kSearchMaxItems && !c.exempt &&
             work.used() - uncounted_used + cost > pass_limit)) {
          cut = true;
          continue;
        }
        const std::uint64_t pass_start = work.used();
        offs = detail::initial_offsets(inst);
        placer.reset(offs);
        std::uint64_t h = 0;
        const std::vector<std::uint32_t> order = c.peak_first
                                                     ? detail::peak_first_order(inst, c.order, c.rest)
                                                     : detail::make_order(inst, c.order);
        if (!placer.try_place(order, offs, c.fit, work, h)) {
          cut = true;
          break;
        }
        if (c.uncounted) uncounted_used += work.used() - pass_start;
        best.offer(h, offs, c.name);
      }
    }

    // With obstacles, the per-tick gap bound (planner_bound.h) before the
    // search, on at most a quarter of what is left (cut short, it is only
    // weaker).
    if (std::max(best.height, inst.fixed_top) > lower_bound && inst.num_items > inst.num_free) {
      Work bound_work = work.child(work.left() / 4);
      lower_bound = std::max(lower_bound, detail::lower_bound(inst, map, &bound_work));
      work.absorb(bound_work);
    }

    // Improvement search within the work budget (none with budget 0, nor
    // after a baseline cut short: then the budget is spent). With obstacles
    // that leave gaps a buffer fits in, the search over the whole instance
    // gets a share of it and the peak repair by sub-search the rest;
    // otherwise the search and then peak repair by ruin and recreate.
    if (options.budget_seconds > 0 && greedy_done &&
        std::max(best.height, inst.fixed_top) > lower_bound && !work.out()) {
      cut = true;  // every improvement phase runs until the budget is spent
      const bool obstacles = inst.num_items > inst.num_free && map.has_gaps();
      bool search = inst.num_free <= kSearchMaxItems || cyclic_search;
      // Ruin and recreate over the whole plan on a share, then the peak
      // repair on the rest (the phases of a large instance).
      auto improve_then_repair = [&] {
        Work first = work.child(
            static_cast<std::uint64_t>(static_cast<double>(work.left()) * kImproveShare));
        detail::improve(inst, lower_bound, options.seed, first, best.height, best.offsets,
                        best.method);
        work.absorb(first);
        detail::repair_peaks(inst, lower_bound, options.seed, work, best.height, best.offsets,
                             best.method);
      };
      // The second thread (Options::threads): the exact schedule, started
      // right before the search over the whole instance (without a thread,
      // the search runs it), or the peak-first passes, started here (without
      // a thread, they ran among the passes); joined after the phases.
      std::unique_ptr<SecondThread> second_thread;
      auto start_second_thread = [&](SecondThread::Job job) {
        if (options.threads < 2) return;
        try {
          second_thread =
              std::make_unique<SecondThread>(job, inst, map, work, stop, lower_bound, best);
        } catch (const std::system_error&) {
          return;  // no thread: the caller runs the job
        }
        work.set_rival(second_thread->done());
      };
      if (peak_thread) {
        start_second_thread(SecondThread::Job::kPeakFirst);
        if (!second_thread) {
          // No thread could be started: the passes run here, first.
          run_peak_passes(inst, work, lower_bound, best.height, best.offsets, best.method);
        }
      }
      // The search over the whole instance on `share` of the work left,
      // its exact schedule on the second thread when there is one.
      auto search_whole = [&](double share) {
        start_second_thread(SecondThread::Job::kExact);
        Work part =
            work.child(static_cast<std::uint64_t>(static_cast<double>(work.left()) * share));
        detail::search_small(inst, map, lower_bound, options.seed, part, best.height,
                             best.offsets, best.method, /*raise=*/true,
                             /*exact=*/second_thread == nullptr);
        work.absorb(part);
      };
      if (search) {
        std::uint64_t ticks = 0;
        for (std::uint32_t i = 0; i < inst.num_free; ++i) {
          ticks += static_cast<std::uint64_t>(inst.length(i));
        }
        const PieceRanges ranges(inst);
        search = ticks <= kSearchMaxTicks &&
                 obstacle_pairs(ranges, kSearchMaxObstaclePairs) <= kSearchMaxObstaclePairs;
        if (search) {
          // Its setup must fit the work count and the clock (at the rate
          // so far). Dense instances have millions of overlapping pairs: on
          // random cyclic ones (4,049 buffers over a period of 22 ticks, 4.3
          // million pairs) the setup alone took 0.4 s, uncounted, and a
          // 0.25 s budget ran 0.06-0.09 s over; such an instance gets the
          // phases of a large instance instead.
          const std::uint64_t cap = work.left() / kSetupUnitsPerPair + 1;
          const std::uint64_t setup = kSetupUnitsPerPair * free_pairs(ranges, cap);
          search = setup <= work.left() && work.time_for(setup);
        }
      }
      if (obstacles && inst.num_items <= kRepairMaxItems) {
        if (search) {
          search_whole(kObstacleSearchShare);
        }
        detail::repair_peaks(inst, lower_bound, options.seed, work, best.height, best.offsets,
                             best.method);
      } else if (search && cyclic_search) {
        // A large cyclic instance: the search on a share, then the phases
        // of a large instance (below) on the rest.
        search_whole(kCyclicSearchShare);
        improve_then_repair();
      } else if (search) {
        // The search over the whole instance on kSmallSearchShare of what
        // is left, then the peak repair on the rest (ruin and recreate
        // after it, when the repair stops early).
        search_whole(kSmallSearchShare);
        detail::repair_peaks(inst, lower_bound, options.seed, work, best.height, best.offsets,
                             best.method);
        detail::improve(inst, lower_bound, options.seed, work, best.height, best.offsets,
                        best.method);
      } else {
        // Too large for the search over the whole instance: ruin and
        // recreate over the whole plan first, then the peak repair by
        // sub-search (windows at the peak, each solved with everything else
        // fixed) on the rest.
        improve_then_repair();
      }
      if (second_thread) {
        // Waited for until a little past the deadline the thread stops at
        // itself (the clock off: until it ends): only a thread the machine
        // starves of CPU is later, and then the plan is the caller's, as
        // when the clock stops the search.
        const bool at_bound = std::max(best.height, inst.fixed_top) <= lower_bound;
        const bool taken = second_thread->take(at_bound ? work.total() : SecondThread::kNever,
                                               work.deadline() + kThreadGrace, best, lower_bound);
        work.set_rival(nullptr);
        if (!taken) work.expire();
      }
    }

    // The sweep is cheap (O(N log N)) and now and then lower than every pass
    // (long, interleaved lifetimes): it replaces the plan when strictly lower.
    if (greedy_done && std::max(best.height, inst.fixed_top) > lower_bound && !work.expired() &&
        work.fits_clock(reserve / 2)) {
      best.offer(sweep.height, sweep.offsets, "sweep_best_fit");
    }

    r = make_result(problem, inst, best,
                    greedy_done ? std::max(greedy_height, inst.fixed_top) : 0);
    // The check (polling the hard stop too). The sweep's plan was checked
    // already; a plan that fails (a planner bug) is never returned: the
    // sweep's is, instead.
    if (r.offsets != safe_result.offsets && !sweep_check(problem, r.offsets, &stop).empty()) {
      const std::uint64_t greedy_size = r.greedy_size;
      r = safe_result;
      r.greedy_size = greedy_size;
      r.method += " (fallback)";
    }
    r.stopped_by = work.expired() ? "clock" : cut ? "work" : "done";
  } catch (const Stop::Reached&) {
    // The hard stop: the phase it interrupted is dropped. The best plan
    // before it is returned when checking it fits in a short grace (see
    // kGraceMinSeconds); else the checked sweep.
    r = safe_result;
    r.greedy_size = greedy_done ? std::max(greedy_height, inst.fixed_top) : 0;
    r.stopped_by = "clock";
    if (best.has_plan && best.offsets != sweep.offsets) {
      Best last = best;
      last.height = detail::height(inst, best.offsets);  // never trusted after a stop
      Result cand = make_result(problem, inst, last, r.greedy_size);
      Stop grace = forced != nullptr
                       ? Stop()
                       : Stop(std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(std::max(
                                      kGraceChecks * check_seconds, kGraceMinSeconds))));
      try {
        if (cand.size < r.size && sweep_check(problem, cand.offsets, &grace).empty()) {
          cand.stopped_by = "clock";
          r = std::move(cand);
        }
      } catch (const Stop::Reached&) {
        // No time to check it: the sweep's plan stays.
      }
    }
  }
  r.lower_bound = std::max(lower_bound, inst.fixed_top);
  r.optimal = r.size <= r.lower_bound;
  if (r.optimal) r.stopped_by = "bound";
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace detail

Result plan(const Problem& problem, const Options& options) {
  return detail::plan_with_stop(problem, options, nullptr);
}

}  // namespace renaissance::planner
