// replay_loop.cpp - planned replay's cost per allocate+free pair, measured in
// a C++ loop (for callgrind and perf, which cannot see through Python well):
// a step of N allocations (seeded sizes 512 B - 1 MiB, log-uniform, most
// buffers freed soon, some late; the kind of step benchmarks/test_bench_core.py
// replays) is recorded twice, planned, then replayed `steps` times; the same
// operations on malloc/free run beside it.
//
// Build and run: `make bench-replay` (build/replay_loop [steps=200]
// [buffers=1000] [malloc=1] [budget=0.05]; the Makefile has the compile
// line). Under callgrind, take the difference of two step counts with
// malloc=0 (the malloc/free rounds left out) and budget=0 (the planner's
// clock-free plan: the same work in both runs) to remove the recording and
// the plan.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/arena.h"
#include "core/host_device.h"

using namespace renaissance;
using Clock = std::chrono::steady_clock;

namespace {

struct Step {
  std::vector<std::size_t> sizes;
  std::vector<long> ops;  // >= 0: allocate buffer ops[k]; < 0: free buffer -ops[k]-1
};

Step make_step(int n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::exponential_distribution<double> life8(1.0 / 8);
  Step s;
  std::map<long, std::vector<long>> due;
  for (int i = 0; i < n; ++i) {
    s.sizes.push_back(512 * static_cast<std::size_t>(std::llround(std::pow(2.0, 11 * u(rng)))));
    s.ops.push_back(i);
    const long life = u(rng) < 0.9 ? 1 + static_cast<long>(life8(rng))
                                   : static_cast<long>(u(rng) * n);
    due[i + life].push_back(i);
    if (auto it = due.find(i); it != due.end()) {
      for (long j : it->second) s.ops.push_back(-j - 1);
      due.erase(it);
    }
  }
  for (auto& [t, js] : due) {
    for (long j : js) s.ops.push_back(-j - 1);
  }
  return s;
}

template <typename Alloc, typename Free>
double run(const Step& s, int steps, Alloc alloc, Free release, bool mark, Arena* arena) {
  std::vector<void*> ptrs(s.sizes.size());
  const auto t0 = Clock::now();
  for (int k = 0; k < steps; ++k) {
    if (mark) arena->begin_step(0);
    for (long op : s.ops) {
      if (op >= 0) {
        ptrs[static_cast<std::size_t>(op)] = alloc(s.sizes[static_cast<std::size_t>(op)]);
      } else {
        release(ptrs[static_cast<std::size_t>(-op - 1)]);
      }
    }
    if (mark) arena->end_step();
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  return ns / (static_cast<double>(steps) * static_cast<double>(s.sizes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int n = argc > 2 ? std::atoi(argv[2]) : 1000;
  const bool with_malloc = argc > 3 ? std::atoi(argv[3]) != 0 : true;
  const double budget = argc > 4 ? std::atof(argv[4]) : 0.05;
  const Step s = make_step(n, 0);
  ArenaConfig cfg;
  cfg.plan_budget_seconds = budget;
  Arena arena(std::make_shared<HostDevice>(), cfg);
  auto a = [&](std::size_t b) { return arena.allocate(b); };
  auto f = [&](void* p) { arena.deallocate(p); };
  run(s, 3, a, f, true, &arena);  // steps 1 and 2 recorded and planned, 3 replays
  double best = 1e300, best_malloc = 1e300;
  const int rounds = steps >= 20 ? 10 : 1;
  for (int r = 0; r < rounds; ++r) {
    best = std::min(best, run(s, std::max(1, steps / rounds), a, f, true, &arena));
    if (!with_malloc) continue;
    best_malloc = std::min(best_malloc, run(s, std::max(1, steps / rounds),
                                            [](std::size_t b) { return std::malloc(b); },
                                            [](void* p) { std::free(p); }, false, nullptr));
  }
  const PlanStats ps = arena.plan_stats();
  arena.check_invariants();
  if (!with_malloc) best_malloc = 0.0;  // not run
  std::printf("replay: %.1f ns per pair (best of %d rounds), malloc/free %.1f; hits %lld of %lld, "
              "conflicts %lld, misses %lld\n",
              best, rounds, best_malloc, static_cast<long long>(ps.last_step_hits),
              static_cast<long long>(ps.last_step_allocations),
              static_cast<long long>(ps.planned_conflicts), static_cast<long long>(ps.planned_misses));
  return 0;
}
