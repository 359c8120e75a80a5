// bind_arena.cpp - the Arena for Python: its calls, its stats as the nested
// dict of torch.cuda.memory_stats() (plus a "renaissance" sub-dict), its
// last step and plan, and snapshots in torch.cuda.memory._snapshot()'s
// shape. See bind.h.
#include <pybind11/stl.h>

#include <memory>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "python/arena_config.h"
#include "python/bind.h"

namespace py = pybind11;

namespace renaissance {
namespace {

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
  // PyTorch counts here the requests refused up front by its
  // per_process_memory_fraction + throw_on_cudamalloc_oom policy; the arena has
  // no such policy (a request over max_reserved_bytes first empties the cache,
  // then raises OutOfMemoryError, counted in num_ooms).
  d["num_oom_rejections"] = 0;
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
  r["planned_requests"] = p.planned_requests;
  r["planned_hits"] = p.planned_hits;
  r["planned_misses"] = p.planned_misses;
  r["planned_conflicts"] = p.planned_conflicts;
  r["planned_fast_hits"] = p.planned_fast_hits;
  r["planned_reordered"] = p.planned_reordered;
  r["planned_grown"] = p.planned_grown;
  r["planned_unserved"] = p.planned_unserved;
  r["plans"] = p.plans;
  r["give_ups"] = p.give_ups;
  r["given_up"] = p.given_up;
  r["variants"] = p.variants;
  r["layouts"] = p.layouts;
  r["plan_bytes"] = p.plan_bytes;
  // Three different LOADs, each with its own name: the step's LOAD plus the
  // persistent bytes live at plan time (old name load_bytes, kept as an alias
  // for one release), the glossary's LOAD of the step alone (step_load_bytes);
  // plan_over_step_load_and_obstacles is computed in torch_renaissance/stats.py.
  r["step_and_persistent_load_bytes"] = p.load_bytes;
  r["load_bytes"] = p.load_bytes;  // alias of step_and_persistent_load_bytes
  // The largest of them over every layout kept (steps of other keys too).
  r["largest_load_bytes"] = p.largest_load_bytes;
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
  r["same_address"] = p.same_address;
  r["comparable"] = p.comparable;
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

}  // namespace

void bind_arena(py::module_& m) {
  py::class_<Arena, std::shared_ptr<Arena>>(m, "Arena")
      .def(py::init([](std::shared_ptr<Device> d, const py::kwargs& kw) {
             return std::make_shared<Arena>(std::move(d), arena_config_from_kwargs(kw));
           }),
           py::arg("device"))
      // Arguments are converted with the GIL held (to_uint64's one-line
      // errors), then released around the arena call.
      .def(
          "allocate",
          [](Arena& a, const py::object& size, const py::object& stream) {
            const std::uint64_t n = to_uint64(size, "Arena.allocate()", "size");
            const StreamId s = to_uint64(stream, "Arena.allocate()", "stream");
            py::gil_scoped_release no_gil;
            return to_int(a.allocate(n, s));
          },
          py::arg("size"), py::arg("stream") = 0)
      .def(
          "deallocate",
          [](Arena& a, const py::object& ptr) {
            void* p = to_ptr(to_uint64(ptr, "Arena.deallocate()", "ptr"));
            py::gil_scoped_release no_gil;
            a.deallocate(p);
          },
          py::arg("ptr"))
      .def(
          "record_stream",
          [](Arena& a, const py::object& ptr, const py::object& stream) {
            a.record_stream(to_ptr(to_uint64(ptr, "Arena.record_stream()", "ptr")),
                            to_uint64(stream, "Arena.record_stream()", "stream"));
          },
          py::arg("ptr"), py::arg("stream"))
      .def("empty_cache", &Arena::empty_cache, py::call_guard<py::gil_scoped_release>())
      .def("sync_point", &Arena::sync_point, py::call_guard<py::gil_scoped_release>())
      .def("set_persistent_hint", &Arena::set_persistent_hint, py::arg("on"))
      // Checked: begin twice / end without begin raise RuntimeError, unchanged.
      .def("begin_step", &Arena::begin_step_checked, py::arg("key") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("end_step", &Arena::end_step_checked, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("in_step", &Arena::in_step)
      .def("stats", [](const Arena& a) { return stats_dict(a.stats(), a.plan_stats()); })
      .def("last_step",
           [](const Arena& a) {
             const StepRecord r = a.last_step();
             py::list entries;
             for (const TraceEntry& e : r.entries) {
               py::dict d;
               d["size"] = e.size;
               d["stream"] = e.stream;
               d["alloc_time"] = e.alloc_time;
               d["free_time"] = e.free_time < 0 ? py::object(py::none()) : py::int_(e.free_time);
               d["address"] = e.address;
               d["streams_used"] = r.streams_used(e);
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
             d["stopped_by"] = a.last_plan_stopped_by();
             return d;
           })
      .def("reset_peak_stats", &Arena::reset_peak_stats)
      .def("reset_accumulated_stats", &Arena::reset_accumulated_stats)
      .def(
          "snapshot", [](const Arena& a, int device) { return snapshot_list(a.snapshot(), device); },
          py::arg("device") = 0)
      .def("largest_free_block", &Arena::largest_free_block)
      .def(
          "block_size",
          [](const Arena& a, const py::object& ptr) {
            return a.block_size(to_ptr(to_uint64(ptr, "Arena.block_size()", "ptr")));
          },
          py::arg("ptr"))
      .def("check_invariants", &Arena::check_invariants)
      .def("flush_cache", &Arena::flush_cache, py::call_guard<py::gil_scoped_release>(),
           "Frees the blocks of the free cache for real (merged with their free neighbours and "
           "indexed for best fit); stats do not change.")
      .def_property_readonly(
          "cached_bytes", [](const Arena& a) { return a.cache_info().bytes; },
          "Bytes in the free cache now (freed blocks kept for reuse).")
      .def_property_readonly(
          "cached_blocks", [](const Arena& a) { return a.cache_info().blocks; },
          "Blocks in the free cache now (the shared cache and every thread's front).")
      .def("set_fronts", &Arena::set_fronts, py::arg("on"), py::call_guard<py::gil_scoped_release>(),
           "Per-thread fronts on (the default for arenas of their own) or off (folded first).")
      .def_property_readonly("front_count", &Arena::front_count,
                             "Per-thread fronts the arena has now (one per thread that used it).")
      .def("set_capturing", &Arena::set_capturing, py::arg("capturing"))
      .def_property_readonly("rounding", &Arena::rounding)
      .def_property_readonly("device", [](Arena& a) { return a.device().name(); });
}

}  // namespace renaissance
