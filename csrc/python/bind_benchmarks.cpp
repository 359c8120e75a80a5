// bind_benchmarks.cpp - loops for benchmarks/test_bench_core.py. See bind.h.
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "python/bind.h"

namespace py = pybind11;

namespace renaissance {

// ---------------------------------------------------------------------------
// Benchmark loops: N allocate+free pairs (or N replayed steps) run here, in
// C++, without the GIL, so that a benchmark times the allocator and not the
// Python call around each pair (about 1 us, against tens of ns per pair).
// The same loops on malloc/free are the baseline. Each returns the XOR of
// the pointers it got, so the compiler cannot drop the pairs.
// ---------------------------------------------------------------------------

namespace {

// Called through volatile pointers: the compiler may not elide the pairs.
void* (*volatile g_bench_malloc)(std::size_t) = std::malloc;
void (*volatile g_bench_free)(void*) = std::free;

// Runs body(thread index) on `threads` threads (1: the calling thread); the
// first exception a thread threw is rethrown here once all have joined.
template <typename Body>
void on_threads(std::size_t threads, Body body) {
  if (threads <= 1) {
    body(0);
    return;
  }
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

void check_threads(std::size_t threads) {
  if (threads < 1 || threads > 256) throw py::value_error("threads must be in [1, 256]");
}

// A recorded step: ops[k] >= 0 allocates buffer ops[k] (sizes[ops[k]] bytes),
// ops[k] < 0 frees buffer -ops[k] - 1. Checked before anything runs.
void check_step(const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& ops) {
  std::vector<char> state(sizes.size(), 0);  // 0 never allocated, 1 live, 2 freed
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const std::int64_t op = ops[k];
    const std::int64_t i = op >= 0 ? op : -op - 1;
    if (i < 0 || static_cast<std::uint64_t>(i) >= sizes.size()) {
      throw py::value_error("ops[" + std::to_string(k) + "] names no buffer");
    }
    char& st = state[static_cast<std::size_t>(i)];
    if (op >= 0 ? st != 0 : st != 1) {
      throw py::value_error("ops[" + std::to_string(k) + "] allocates a buffer twice or frees one "
                            "that is not live");
    }
    st = op >= 0 ? 1 : 2;
  }
  for (char st : state) {
    if (st == 1) throw py::value_error("the step leaves a buffer live: free every buffer");
  }
}

// The two allocators the loops run on: an arena (with its stream and, for
// steps, begin_step/end_step around each run) and malloc/free.
struct ArenaOps {
  Arena& arena;
  StreamId stream = 0;
  bool mark_steps = false;
  std::uint64_t key = 0;
  void* alloc(std::size_t n) const { return arena.allocate(n, stream); }
  void release(void* p) const { arena.deallocate(p); }
  void begin() const {
    if (mark_steps) arena.begin_step(key);
  }
  void end() const {
    if (mark_steps) arena.end_step();
  }
};

struct MallocOps {
  void* alloc(std::size_t n) const {
    void* p = g_bench_malloc(n);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* p) const { g_bench_free(p); }
  void begin() const {}
  void end() const {}
};

// `pairs` alloc(size)+release pairs on each of `threads` threads, no GIL.
template <typename Ops>
std::uintptr_t run_pairs(const Ops& ops, std::size_t size, std::size_t pairs, std::size_t threads) {
  check_threads(threads);
  std::atomic<std::uintptr_t> acc{0};
  py::gil_scoped_release nogil;
  on_threads(threads, [&](std::size_t) {
    std::uintptr_t local = 0;
    for (std::size_t i = 0; i < pairs; ++i) {
      void* p = ops.alloc(size);
      local ^= to_int(p);
      ops.release(p);
    }
    acc ^= local;
  });
  return acc.load();
}

// The recorded step (see check_step) `steps` times, no GIL.
template <typename Ops>
std::uintptr_t run_steps(const Ops& ops, const std::vector<std::uint64_t>& sizes,
                         const std::vector<std::int64_t>& step, std::size_t steps) {
  check_step(sizes, step);
  std::vector<void*> ptrs(sizes.size(), nullptr);
  std::uintptr_t acc = 0;
  py::gil_scoped_release nogil;
  for (std::size_t s = 0; s < steps; ++s) {
    ops.begin();
    for (const std::int64_t op : step) {
      if (op >= 0) {
        void* p = ops.alloc(static_cast<std::size_t>(sizes[static_cast<std::size_t>(op)]));
        ptrs[static_cast<std::size_t>(op)] = p;
        acc ^= to_int(p);
      } else {
        ops.release(ptrs[static_cast<std::size_t>(-op - 1)]);
      }
    }
    ops.end();
  }
  return acc;
}

}  // namespace

void bind_benchmark_loops(py::module_& m) {
  m.def(
      "bench_pairs",
      [](Arena& a, std::size_t size, std::size_t pairs, std::size_t threads, StreamId stream) {
        return run_pairs(ArenaOps{a, stream}, size, pairs, threads);
      },
      py::arg("arena"), py::arg("size"), py::arg("pairs"), py::arg("threads") = 1,
      py::arg("stream") = 0,
      "Runs `pairs` allocate(size)+deallocate pairs on the arena, on each of `threads` threads "
      "(bytes; no GIL). For benchmarks.");
  m.def(
      "bench_malloc_pairs",
      [](std::size_t size, std::size_t pairs, std::size_t threads) {
        return run_pairs(MallocOps{}, size, pairs, threads);
      },
      py::arg("size"), py::arg("pairs"), py::arg("threads") = 1,
      "The same loop as bench_pairs on malloc/free: the baseline.");
  m.def(
      "bench_step",
      [](Arena& a, const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& ops,
         std::size_t steps, bool mark_steps, std::uint64_t key) {
        return run_steps(ArenaOps{a, 0, mark_steps, key}, sizes, ops, steps);
      },
      py::arg("arena"), py::arg("sizes"), py::arg("ops"), py::arg("steps") = 1,
      py::arg("mark_steps") = true, py::arg("key") = 0,
      "Runs a recorded step `steps` times on the arena: ops[k] >= 0 allocates buffer ops[k] "
      "(sizes[ops[k]] bytes), ops[k] < 0 frees buffer -ops[k]-1; with mark_steps, each run is "
      "one begin_step(key)/end_step(). Raises ValueError for ops that are not a step.");
  m.def(
      "bench_malloc_step",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& ops,
         std::size_t steps) { return run_steps(MallocOps{}, sizes, ops, steps); },
      py::arg("sizes"), py::arg("ops"), py::arg("steps") = 1,
      "bench_step's loop on malloc/free: the baseline.");
}

}  // namespace renaissance
