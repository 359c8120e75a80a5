// bind_planner.cpp - the offline planner for Python: plan, greedy_by_size,
// load and validate on a problem given as parallel lists (sizes, lowers,
// uppers) plus fixed buffers. Planning releases the GIL. See bind.h.
#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "core/planner.h"
#include "python/bind.h"

namespace py = pybind11;

namespace renaissance {
namespace {

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

void bind_planner(py::module_& m) {
  m.def(
      "plan",
      [](const std::vector<std::uint64_t>& sizes, const std::vector<std::int64_t>& lowers,
         const std::vector<std::int64_t>& uppers, std::int64_t period, const FixedList& fixed,
         double budget_seconds, std::uint64_t seed, double clock_seconds,
         const py::object& threads) {
        // 1 or 2, as an int (not a bool, a float or a string): one line
        // naming the value, not pybind's conversion error.
        const bool whole = py::isinstance<py::int_>(threads) && !py::isinstance<py::bool_>(threads);
        if (!whole || (!threads.equal(py::int_(1)) && !threads.equal(py::int_(2)))) {
          throw py::value_error("planner: threads must be 1 or 2, got " +
                                std::string(py::repr(threads)));
        }
        planner::Problem p = problem_from(sizes, lowers, uppers, period, fixed);
        planner::Options o;
        o.budget_seconds = budget_seconds;
        o.clock_seconds = clock_seconds;
        o.seed = seed;
        o.threads = threads.cast<unsigned>();
        planner::Result r;
        {
          py::gil_scoped_release nogil;
          r = planner::plan(p, o);
        }
        return result_dict(r);
      },
      py::arg("sizes"), py::arg("lowers"), py::arg("uppers"), py::arg("period") = 0,
      py::arg("fixed") = FixedList{}, py::arg("budget_seconds") = 1.0, py::arg("seed") = 0,
      py::arg("clock_seconds") = -1.0, py::arg("threads") = 2);
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
}

}  // namespace renaissance
