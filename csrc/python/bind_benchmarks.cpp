// bind_benchmarks.cpp - loops for benchmarks/test_bench_core.py. See bind.h.
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
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

// A threaded stress run (tests/test_free_cache.py): `threads` threads, each
// `ops` seeded operations: allocate (a tag written into the block), free one
// of its own blocks, give one to another thread, or free what others gave it.
// A shared map of live ranges catches a block handed out twice (an overlap
// with a live range) and each free checks its block's tag. Thread 0 also
// checks the arena's invariants while the others run. At the end every
// thread frees what it holds. Returns (allocations, requested bytes,
// cross-thread frees); raises RuntimeError on the first violation.
std::tuple<std::int64_t, std::int64_t, std::int64_t> stress_threads(Arena& arena,
                                                                    std::size_t threads,
                                                                    std::size_t ops,
                                                                    std::uint64_t seed) {
  check_threads(threads);
  static constexpr std::size_t kSizes[] = {1,          64,           100,       512,
                                           4 << 10,    64 << 10,     100 << 10, 1 << 20,
                                           (1 << 20) + 1, 3 << 20};
  struct Live {
    std::size_t size;
    std::uint64_t tag;
  };
  std::mutex mu;  // guards live, mailboxes and first_error
  std::map<std::uintptr_t, Live> live;
  std::vector<std::vector<std::pair<void*, std::uint64_t>>> mailbox(threads);
  std::string first_error;
  std::atomic<std::int64_t> allocs{0}, requested{0}, given{0};
  std::atomic<std::size_t> finished{0};
  auto fail = [&](const std::string& m) {
    std::lock_guard<std::mutex> g(mu);
    if (first_error.empty()) first_error = m;
  };
  auto enter = [&](void* p, std::size_t size, std::uint64_t tag) {
    const auto a = to_int(p);
    std::lock_guard<std::mutex> g(mu);
    auto it = live.lower_bound(a);
    if (it != live.end() && it->first < a + size) {
      if (first_error.empty()) first_error = "a block was handed out while a live block overlaps it";
    }
    if (it != live.begin() && std::prev(it)->first + std::prev(it)->second.size > a) {
      if (first_error.empty()) first_error = "a block was handed out inside a live block";
    }
    live[a] = Live{size, tag};
  };
  auto leave = [&](void* p, std::uint64_t tag) {
    std::uint64_t seen = 0;
    std::lock_guard<std::mutex> g(mu);
    auto it = live.find(to_int(p));
    if (it == live.end() || it->second.tag != tag) {
      if (first_error.empty()) first_error = "a freed pointer was not live with its tag";
      return;
    }
    std::memcpy(&seen, p, sizeof seen);
    if (seen != tag && first_error.empty()) first_error = "a live block was overwritten (handed out twice)";
    live.erase(it);
  };
  py::gil_scoped_release nogil;
  on_threads(threads, [&](std::size_t t) {
    std::mt19937_64 rng(seed * 1000003 + t);
    std::vector<std::pair<void*, std::uint64_t>> mine;
    std::uint64_t counter = 0;
    auto take_mail = [&] {
      std::vector<std::pair<void*, std::uint64_t>> got;
      {
        std::lock_guard<std::mutex> g(mu);
        got.swap(mailbox[t]);
      }
      for (auto [p, tag] : got) {
        leave(p, tag);
        arena.deallocate(p);
      }
    };
    for (std::size_t k = 0; k < ops; ++k) {
      const unsigned r = static_cast<unsigned>(rng() % 100);
      if (r < 45 || mine.empty()) {
        // Mostly small sizes: the fronts' path.
        const std::size_t size = kSizes[rng() % 10 < 8 ? rng() % 7 : 7 + rng() % 3];
        void* p = arena.allocate(size, 0);
        const std::uint64_t tag = (static_cast<std::uint64_t>(t) << 48) | ++counter;
        std::memcpy(p, &tag, sizeof tag);
        enter(p, size, tag);
        mine.emplace_back(p, tag);
        allocs += 1;
        requested += static_cast<std::int64_t>(size);
      } else if (r < 85) {
        const std::size_t i = rng() % mine.size();
        auto [p, tag] = mine[i];
        mine[i] = mine.back();
        mine.pop_back();
        leave(p, tag);
        arena.deallocate(p);
      } else if (r < 95 && threads > 1) {
        const std::size_t to = (t + 1 + rng() % (threads - 1)) % threads;
        std::lock_guard<std::mutex> g(mu);
        mailbox[to].push_back(mine.back());
        mine.pop_back();
        given += 1;
      } else {
        take_mail();
      }
      if (t == 0 && k % 257 == 0) {
        try {
          arena.check_invariants();  // with the other threads' fronts in use
        } catch (const std::exception& e) {
          fail(e.what());
        }
      }
    }
    // Nothing is given after every thread got here; then each frees its own.
    ++finished;
    while (finished.load() < threads) std::this_thread::yield();
    take_mail();
    for (auto [p, tag] : mine) {
      leave(p, tag);
      arena.deallocate(p);
    }
  });
  if (!first_error.empty()) throw std::runtime_error("stress_threads: " + first_error);
  if (!live.empty()) throw std::runtime_error("stress_threads: blocks left live");
  return {allocs.load(), requested.load(), given.load()};
}


}  // namespace

void bind_benchmark_loops(py::module_& m) {
  m.def("stress_threads", &stress_threads, py::arg("arena"), py::arg("threads"), py::arg("ops"),
        py::arg("seed") = 0,
        "A threaded stress run for tests (see bind_benchmarks.cpp): returns (allocations, requested "
        "bytes, blocks freed by another thread); raises RuntimeError on a block handed out "
        "twice or a broken invariant.");
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
