// arena_bench.cpp - the core's allocate+free hot path against malloc/free.
//
// Build and run (benchmarks/bench_core.py does both):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/cpp/arena_bench.cpp csrc/core/{arena,step_planner,
//       stream_events,stats,host_device,sim_device,planner*}.cpp -o /tmp/arena_bench
// Prints one line per size: size, ns per pair for the arena and for malloc/free.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/host_device.h"

namespace {

// Called through volatile pointers: the compiler may not elide the pairs.
void* (*volatile g_malloc)(std::size_t) = std::malloc;
void (*volatile g_free)(void*) = std::free;

template <typename Alloc, typename Free>
double ns_per_pair(std::size_t size, std::size_t iters, Alloc alloc, Free release) {
  // Keep a few blocks live so the pool is not trivially empty.
  std::vector<void*> keep;
  for (int i = 0; i < 16; ++i) keep.push_back(alloc(size));
  for (std::size_t i = 0; i < iters / 10; ++i) release(alloc(size));  // warm up
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < iters; ++i) {
    void* p = alloc(size);
    // Touch the pointer so the pair cannot be optimized away.
    if (reinterpret_cast<std::uintptr_t>(p) == 1) std::abort();
    release(p);
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (void* p : keep) release(p);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t iters = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000000;
  renaissance::Arena arena(std::make_shared<renaissance::HostDevice>(), renaissance::ArenaConfig{});
  std::printf("size_bytes,arena_ns,malloc_ns\n");
  for (std::size_t size : {std::size_t(512), std::size_t(64) << 10, std::size_t(4) << 20}) {
    const double a = ns_per_pair(size, iters, [&](std::size_t n) { return arena.allocate(n); },
                                 [&](void* p) { arena.deallocate(p); });
    const double m = ns_per_pair(size, iters, [](std::size_t n) { return g_malloc(n); },
                                 [](void* p) { g_free(p); });
    std::printf("%zu,%.1f,%.1f\n", size, a, m);
  }
  return 0;
}
