// plan_lock_latency.cpp - an allocation's worst latency on another thread
// while a step is planned (issue 18 item 3), measured in C++ so that neither
// Python's GIL nor its interpreter is in the number.
//
// The main thread records a step of N buffers twice (seeded sizes 64 KiB -
// 8 MiB, interleaved frees, as benchmarks/bench_plan_lock.py and
// tests/territory_scenarios.py); the second end_step() plans it with the
// default budget while a second thread allocates and frees 4 KiB in a loop,
// timing each pair (steady_clock, ns). The control row runs the same loop
// while the main thread spins for as long without touching the arena: the
// machine's scheduling noise floor, which bounds what any lock design can
// show here. "pairs > 1 ms" counts the pairs over the target on both
// sides: with planning outside the lock the two counts are alike (a thread
// descheduled by the OS), while a lock held through the plan shows one pair
// as long as the whole plan.
//
// Build and run: `make bench-lock` (build/plan_lock_latency [buffers=1200]
// [repeat=3]; the Makefile has the compile line).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "core/host_device.h"

using namespace renaissance;
using Clock = std::chrono::steady_clock;

namespace {

void record_step(Arena& arena, int n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> size(1, 128);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  arena.begin_step();
  std::vector<void*> live;
  for (int i = 0; i < n; ++i) {
    live.push_back(arena.allocate(static_cast<std::size_t>(size(rng)) * 64 * 1024));
    while (!live.empty() && coin(rng) < 0.45) {
      std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
      const std::size_t k = pick(rng);
      arena.deallocate(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (void* p : live) arena.deallocate(p);
}

struct Row {
  double window_ms = 0;
  double worst_us = 0;
  double p99_us = 0;
  std::size_t pairs = 0;
  std::size_t over_1ms = 0;  // pairs that took more than 1 ms
};

// Runs `work` on this thread while another thread times 4 KiB pairs.
template <class Work>
Row measure(Arena& arena, Work work) {
  std::atomic<bool> stop{false}, started{false};
  std::vector<std::int64_t> lat;
  lat.reserve(1 << 22);
  std::thread other([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const auto t0 = Clock::now();
      void* p = arena.allocate(4096);
      arena.deallocate(p);
      const auto t1 = Clock::now();
      if (started.load(std::memory_order_relaxed) && lat.size() < lat.capacity()) {
        lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  started = true;
  const auto t0 = Clock::now();
  work();
  const auto t1 = Clock::now();
  stop = true;
  other.join();
  Row r;
  r.window_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  r.pairs = lat.size();
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    r.worst_us = lat.back() / 1e3;
    r.p99_us = lat[lat.size() * 99 / 100] / 1e3;
    r.over_1ms = static_cast<std::size_t>(
        lat.end() - std::upper_bound(lat.begin(), lat.end(), std::int64_t{1000000}));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int buffers = argc > 1 ? std::atoi(argv[1]) : 1200;
  const int repeat = argc > 2 ? std::atoi(argv[2]) : 3;
  std::printf("| seed | end_step (plans) ms | worst alloc+free us | p99 us | pairs | pairs > 1 ms | "
              "control: worst us | control: pairs > 1 ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int seed = 0; seed < repeat; ++seed) {
    Arena arena(std::make_shared<HostDevice>(), ArenaConfig{});
    record_step(arena, buffers, static_cast<unsigned>(seed));
    arena.end_step();
    record_step(arena, buffers, static_cast<unsigned>(seed));  // same sizes: end_step plans
    const std::int64_t plans = arena.plan_stats().plans;
    const Row r = measure(arena, [&] { arena.end_step(); });
    if (arena.plan_stats().plans != plans + 1) {
      std::fprintf(stderr, "seed %d: the step was not planned\n", seed);
      return 1;
    }
    const auto spin = std::chrono::duration<double, std::milli>(r.window_ms);
    const Row c = measure(arena, [&] {
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(spin);
      while (Clock::now() < until) {
      }
    });
    std::printf("| %d | %.1f | %.1f | %.2f | %zu | %zu | %.1f | %zu |\n", seed, r.window_ms, r.worst_us,
                r.p99_us, r.pairs, r.over_1ms, c.worst_us, c.over_1ms);
  }
  return 0;
}
