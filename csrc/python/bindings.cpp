// bindings.cpp - pybind11 bindings of the core (devices, arena, planner) and
// of the torch glue (the CPU allocator). Pointers cross as Python ints.
//
// Error mapping: OutOfMemoryError -> torch.OutOfMemoryError,
// InvalidPointerError -> InvalidPointerError (a ValueError),
// DeviceError -> RuntimeError, std::invalid_argument -> ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/arena.h"
#include "core/host_device.h"
#include "core/planner.h"
#include "core/sim_device.h"
#include "python/arena_config.h"
#include "torch/cpu_allocator.h"
#ifdef TR_WITH_CUDA
#include "python/cuda_bindings.h"  // void bind_cuda(pybind11::module_&)
#endif

namespace py = pybind11;
using namespace renaissance;

namespace {

void* to_ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
std::uintptr_t to_int(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

py::dict stat_dict(const Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_dict(const StatArray& a) {
  py::dict d;
  d["all"] = stat_dict(a[0]);
  d["small_pool"] = stat_dict(a[1]);
  d["large_pool"] = stat_dict(a[2]);
  return d;
}

// The nested dict of torch/csrc/cuda/Module.cpp (memoryStats), plus a
// "renaissance" sub-dict for what PyTorch has no name for.
py::dict stats_dict(const DeviceStats& s, const PlanStats& p) {
  py::dict d;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["max_split_size"] = -1;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["allocation"] = stat_array_dict(s.allocation);
  d["segment"] = stat_array_dict(s.segment);
  d["active"] = stat_array_dict(s.active);
  d["inactive_split"] = stat_array_dict(s.inactive_split);
  d["allocated_bytes"] = stat_array_dict(s.allocated_bytes);
  d["reserved_bytes"] = stat_array_dict(s.reserved_bytes);
  d["active_bytes"] = stat_array_dict(s.active_bytes);
  d["inactive_split_bytes"] = stat_array_dict(s.inactive_split_bytes);
  d["requested_bytes"] = stat_array_dict(s.requested_bytes);
  d["oversize_allocations"] = stat_dict(s.oversize_allocations);
  d["oversize_segments"] = stat_dict(s.oversize_segments);
  py::dict r;
  r["pending_bytes"] = stat_dict(s.pending_bytes);
  r["events_recorded"] = s.events_recorded;
  r["event_queries"] = s.event_queries;
  r["steps"] = p.steps;
  r["planned_steps"] = p.planned_steps;
  r["planned_requests"] = p.requests;
  r["planned_hits"] = p.hits;
  r["planned_misses"] = p.misses;
  r["planned_conflicts"] = p.conflicts;
  r["plans"] = p.plans;
  r["variants"] = p.variants;
  r["layouts"] = p.layouts;
  r["plan_bytes"] = p.plan_bytes;
  // Three different LOADs, each with its own name: the step's LOAD plus the
  // persistent bytes live at plan time (old name load_bytes, kept as an alias
  // for one release), the glossary's LOAD of the step alone (step_load_bytes);
  // plan_over_step_load_and_obstacles is computed in torch_renaissance/stats.py.
  r["step_and_persistent_load_bytes"] = p.load_bytes;
  r["load_bytes"] = p.load_bytes;  // alias of step_and_persistent_load_bytes
  r["step_load_bytes"] = p.step_load_bytes;
  r["layout_load_bytes"] = p.layout_load_bytes;
  r["phases"] = p.phases;
  r["pinned_bytes"] = p.pinned_bytes;
  r["plan_bound_bytes"] = p.plan_bound_bytes;
  r["greedy_bytes"] = p.greedy_bytes;
  r["obstacle_bytes"] = p.obstacle_bytes;
  r["plan_seconds"] = p.plan_seconds;
  r["last_step_allocations"] = p.last_step_allocations;
  r["last_step_hits"] = p.last_step_hits;
  r["last_step_same_address"] = p.last_step_same_address;
  r["last_step_comparable"] = p.last_step_comparable;
  d["renaissance"] = r;
  return d;
}

const char* state_name(BlockState s) {
  switch (s) {
    case BlockState::kAllocated:
      return "active_allocated";
    case BlockState::kPending:
      return "active_pending_free";
    case BlockState::kFree:
    case BlockState::kCached:  // snapshots report cached blocks as free
      break;
  }
  return "inactive";
}

// Segments in the shape of torch.cuda.memory._snapshot()["segments"].
py::list snapshot_list(const std::vector<SegmentInfo>& segs, int device) {
  py::list out;
  for (const SegmentInfo& s : segs) {
    py::dict d;
    d["device"] = device;
    d["address"] = s.address;
    d["total_size"] = s.total_size;
    d["allocated_size"] = s.allocated_size;
    d["active_size"] = s.active_size;
    d["requested_size"] = s.requested_size;
    d["stream"] = s.stream;
    d["segment_type"] = s.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["expandable"] = s.expandable;
    d["plan_top"] = s.plan_top;
    d["persistent"] = s.persistent;
    py::list blocks;
    for (const BlockInfo& b : s.blocks) {
      py::dict bd;
      bd["address"] = b.address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested;
      bd["state"] = state_name(b.state);
      bd["planned"] = b.planned;
      bd["in_territory"] = b.in_territory;
      bd["stream"] = b.stream;
      blocks.append(bd);
    }
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
}

planner::Problem problem_from(const std::vector<std::uint64_t>& sizes,
                              const std::vector<std::int64_t>& lowers,
                              const std::vector<std::int64_t>& uppers, std::int64_t period,
                              const std::vector<std::tuple<std::uint64_t, std::uint64_t,
                                                           std::int64_t, std::int64_t>>& fixed) {
  if (sizes.size() != lowers.size() || sizes.size() != uppers.size()) {
    throw py::value_error("sizes, lowers and uppers must have the same length");
  }
  planner::Problem p;
  p.period = period;
  p.buffers.reserve(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    p.buffers.push_back(planner::Buffer{sizes[i], lowers[i], uppers[i]});
  }
  for (const auto& [off, size, lo, up] : fixed) {
    p.fixed.push_back(planner::FixedBuffer{off, size, lo, up});
  }
  return p;
}

py::dict result_dict(const planner::Result& r) {
  py::dict d;
  d["offsets"] = r.offsets;
  d["size"] = r.size;
  d["load"] = r.load;
  d["greedy_size"] = r.greedy_size;
  d["seconds"] = r.seconds;
  d["method"] = r.method;
  d["lower_bound"] = r.lower_bound;
  d["optimal"] = r.optimal;
  d["stopped_by"] = r.stopped_by;
  return d;
}

using FixedList = std::vector<std::tuple<std::uint64_t, std::uint64_t, std::int64_t, std::int64_t>>;

}  // namespace

// Loops for benchmarks/test_bench_core.py, defined at the end of this file.
void bind_benchmark_loops(py::module_& m);

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_renaissance compiled core: device backends, arena, planner, torch glue";
  bind_config(m);  // config_keys(), default_arena_config(), arena_config_of()
  m.attr("debug_level") = debug::kLevel;  // TR_DEBUG (core/debug.h)
  m.def("debug_invariant_checks", [] { return debug::invariant_checks(); },
        "Arena invariant checks run by the TR_DEBUG=3 hook in this process (0 below level 3).");

  static py::exception<InvalidPointerError> invalid_pointer(m, "InvalidPointerError",
                                                             PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemoryError& e) {
      py::object oom = py::module_::import("torch").attr("OutOfMemoryError");
      PyErr_SetString(oom.ptr(), e.what());
    } catch (const InvalidPointerError& e) {
      PyErr_SetString(invalid_pointer.ptr(), e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<Device, std::shared_ptr<Device>>(m, "Device")
      .def_property_readonly("name", &Device::name)
      .def_property_readonly("alignment", &Device::alignment)
      .def_property_readonly("is_device_memory", &Device::is_device_memory)
      .def("create_event", &Device::create_event)
      .def("destroy_event", &Device::destroy_event, py::arg("event"))
      .def("record_event", &Device::record_event, py::arg("event"), py::arg("stream"))
      .def("query_event", &Device::query_event, py::arg("event"))
      .def("synchronize_event", &Device::synchronize_event, py::arg("event"))
      .def("stream_wait_event", &Device::stream_wait_event, py::arg("stream"), py::arg("event"));

  py::class_<HostDevice, Device, std::shared_ptr<HostDevice>>(m, "HostDevice").def(py::init<>());

  py::class_<SimWait>(m, "SimWait")
      .def_readonly("stream", &SimWait::stream)
      .def_readonly("event", &SimWait::event)
      .def_readonly("event_stream", &SimWait::event_stream)
      .def_readonly("event_position", &SimWait::event_position);

  py::class_<SimDevice, Device, std::shared_ptr<SimDevice>>(m, "SimDevice")
      .def(py::init<std::size_t, std::size_t>(), py::arg("capacity_bytes") = 0,
           py::arg("alignment") = 512)
      .def("new_stream", &SimDevice::new_stream)
      .def_property_readonly("num_streams", &SimDevice::num_streams)
      .def("enqueue", &SimDevice::enqueue, py::arg("stream"), py::arg("units") = 1)
      .def("advance", &SimDevice::advance, py::arg("stream"), py::arg("units"))
      .def("run_all", &SimDevice::run_all)
      .def("enqueued", &SimDevice::enqueued)
      .def("completed", &SimDevice::completed)
      .def("waits", &SimDevice::waits)
      .def_property_readonly("events_recorded", &SimDevice::events_recorded)
      .def_property_readonly("event_queries", &SimDevice::event_queries)
      .def_property_readonly("host_synchronizations", &SimDevice::host_synchronizations)
      .def_property_readonly("live_events", &SimDevice::live_events)
      .def_property_readonly("used_bytes", &SimDevice::used_bytes)
      .def("set_address_ranges", &SimDevice::set_address_ranges);

  py::class_<Arena, std::shared_ptr<Arena>>(m, "Arena")
      .def(py::init([](std::shared_ptr<Device> d, const py::kwargs& kw) {
             return std::make_shared<Arena>(std::move(d), arena_config_from_kwargs(kw));
           }),
           py::arg("device"))
      .def(
          "allocate",
          [](Arena& a, std::size_t size, StreamId stream) { return to_int(a.allocate(size, stream)); },
          py::arg("size"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>())
      .def(
          "deallocate", [](Arena& a, std::uintptr_t p) { a.deallocate(to_ptr(p)); }, py::arg("ptr"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "record_stream", [](Arena& a, std::uintptr_t p, StreamId s) { a.record_stream(to_ptr(p), s); },
          py::arg("ptr"), py::arg("stream"))
      .def("empty_cache", &Arena::empty_cache, py::call_guard<py::gil_scoped_release>())
      .def("sync_point", &Arena::sync_point, py::call_guard<py::gil_scoped_release>())
      .def("set_persistent_hint", &Arena::set_persistent_hint, py::arg("on"))
      .def("begin_step", &Arena::begin_step, py::arg("key") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("end_step", &Arena::end_step, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("in_step", &Arena::in_step)
      .def("stats", [](const Arena& a) { return stats_dict(a.stats(), a.plan_stats()); })
      .def("last_step",
           [](const Arena& a) {
             const StepRecord r = a.last_step();
             py::list entries;
             for (const TraceRecord& e : r.entries) {
               py::dict d;
               d["size"] = e.size;
               d["stream"] = e.stream;
               d["alloc_time"] = e.alloc_time;
               d["free_time"] = e.free_time < 0 ? py::object(py::none()) : py::int_(e.free_time);
               d["address"] = e.address;
               d["streams_used"] = e.streams_used;
               entries.append(d);
             }
             py::dict out;
             out["step"] = r.step;
             out["end_time"] = r.end_time;
             out["entries"] = entries;
             return out;
           })
      .def("last_plan",
           [](const Arena& a) {
             auto [p, offsets] = a.last_plan();
             py::list sizes, lowers, uppers, fixed;
             for (const auto& b : p.buffers) {
               sizes.append(b.size);
               lowers.append(b.lower);
               uppers.append(b.upper);
             }
             for (const auto& f : p.fixed) fixed.append(py::make_tuple(f.offset, f.size, f.lower, f.upper));
             py::dict d;
             d["sizes"] = sizes;
             d["lowers"] = lowers;
             d["uppers"] = uppers;
             d["period"] = p.period;
             d["fixed"] = fixed;
             d["offsets"] = offsets;
             return d;
           })
      .def("reset_peak_stats", &Arena::reset_peak_stats)
      .def("reset_accumulated_stats", &Arena::reset_accumulated_stats)
      .def(
          "snapshot", [](const Arena& a, int device) { return snapshot_list(a.snapshot(), device); },
          py::arg("device") = 0)
      .def("largest_free_block", &Arena::largest_free_block)
      .def("block_size", [](const Arena& a, std::uintptr_t p) { return a.block_size(to_ptr(p)); })
      .def("check_invariants", &Arena::check_invariants)
      .def("flush_cache", &Arena::flush_cache, py::call_guard<py::gil_scoped_release>(),
           "Frees the blocks of the free cache for real (merged with their free neighbours and "
           "indexed for best fit); stats do not change.")
      .def_property_readonly(
          "cached_bytes", [](const Arena& a) { return a.cache_info().bytes; },
          "Bytes in the free cache now (freed blocks kept for reuse).")
      .def_property_readonly(
          "cached_blocks", [](const Arena& a) { return a.cache_info().blocks; },
          "Blocks in the free cache now.")
      .def("set_capturing", &Arena::set_capturing, py::arg("capturing"))
      .def_property_readonly("rounding", &Arena::rounding)
      .def_property_readonly("device", [](Arena& a) { return a.device().name(); });

  m.def(
      "plan",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& lowers,
         const std::vector<std::int64_t>& uppers, std::int64_t period, const FixedList& fixed,
         double budget_seconds, std::uint64_t seed, double clock_seconds) {
        planner::Problem p = problem_from(sizes, lowers, uppers, period, fixed);
        planner::Options o;
        o.budget_seconds = budget_seconds;
        o.clock_seconds = clock_seconds;
        o.seed = seed;
        planner::Result r;
        {
          py::gil_scoped_release nogil;
          r = planner::plan(p, o);
        }
        return result_dict(r);
      },
      py::arg("sizes"), py::arg("lowers"), py::arg("uppers"), py::arg("period") = 0,
      py::arg("fixed") = FixedList{}, py::arg("budget_seconds") = 1.0, py::arg("seed") = 0,
      py::arg("clock_seconds") = -1.0);
  m.def(
      "greedy_by_size",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& lowers,
         const std::vector<std::int64_t>& uppers, std::int64_t period, const FixedList& fixed) {
        return result_dict(planner::greedy_by_size(problem_from(sizes, lowers, uppers, period, fixed)));
      },
      py::arg("sizes"), py::arg("lowers"), py::arg("uppers"), py::arg("period") = 0,
      py::arg("fixed") = FixedList{});
  m.def(
      "load",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& lowers,
         const std::vector<std::int64_t>& uppers, std::int64_t period, const FixedList& fixed) {
        return planner::load(problem_from(sizes, lowers, uppers, period, fixed));
      },
      py::arg("sizes"), py::arg("lowers"), py::arg("uppers"), py::arg("period") = 0,
      py::arg("fixed") = FixedList{});
  m.def(
      "validate",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& lowers,
         const std::vector<std::int64_t>& uppers, const std::vector<std::uint64_t>& offsets,
         std::int64_t period, const FixedList& fixed) {
        return planner::validate(problem_from(sizes, lowers, uppers, period, fixed), offsets);
      },
      py::arg("sizes"), py::arg("lowers"), py::arg("uppers"), py::arg("offsets"),
      py::arg("period") = 0, py::arg("fixed") = FixedList{});

  m.def(
      "install_cpu",
      [](const py::kwargs& kw) { return install_cpu_allocator(arena_config_from_kwargs(kw)); },
      "Install the arena as PyTorch's CPU allocator (once per process).");
  bind_benchmark_loops(m);
#ifdef TR_WITH_CUDA
  bind_cuda(m);
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}

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
