// pair_loop.cpp - the dynamic hot path's cost per allocate+free pair of one
// size, in a C++ loop (for callgrind and perf): an arena with planning off
// (the calling thread's front in front of the dynamic pool, 16 other blocks
// of the size live, as benchmarks/test_bench_core.py's "hot path" groups),
// and the same loop on malloc/free.
//
// Build and run: `make bench-pairs` (build/pair_loop [pairs=1000000]
// [size=512] [malloc=1]). Under callgrind, take the difference of two pair
// counts with malloc=0 to remove the set-up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/host_device.h"

using namespace renaissance;
using Clock = std::chrono::steady_clock;

namespace {

// Through volatile pointers: the compiler may not drop a malloc/free pair.
void* (*volatile g_malloc)(std::size_t) = std::malloc;
void (*volatile g_free)(void*) = std::free;

template <typename Alloc, typename Free>
double run(std::size_t pairs, std::size_t size, Alloc alloc, Free release) {
  const auto t0 = Clock::now();
  for (std::size_t k = 0; k < pairs; ++k) release(alloc(size));
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  return ns / static_cast<double>(pairs);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t pairs = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const std::size_t size = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 512;
  const bool with_malloc = argc > 3 ? std::atoi(argv[3]) != 0 : true;
  ArenaConfig cfg;
  cfg.planning = false;
  Arena arena(std::make_shared<HostDevice>(), cfg);
  std::vector<void*> kept;
  for (int i = 0; i < 16; ++i) kept.push_back(arena.allocate(size));
  auto a = [&](std::size_t b) { return arena.allocate(b); };
  auto f = [&](void* p) { arena.deallocate(p); };
  const int rounds = pairs >= 100000 ? 10 : 1;
  double best = 1e300, best_malloc = 0.0;
  for (int r = 0; r < rounds; ++r) {
    best = std::min(best, run(pairs / rounds, size, a, f));
    if (!with_malloc) continue;
    const double m = run(pairs / rounds, size, [](std::size_t b) { return g_malloc(b); },
                         [](void* p) { g_free(p); });
    best_malloc = r == 0 ? m : std::min(best_malloc, m);
  }
  for (void* p : kept) arena.deallocate(p);
  arena.check_invariants();
  std::printf("pairs of %zu B: arena %.1f ns per pair (best of %d rounds), malloc/free %.1f\n",
              size, best, rounds, best_malloc);
  return 0;
}
