// bindings.cpp - the extension module _C: PYBIND11_MODULE calls one bind_*
// function per concept (bind.h; python/arena_config.h for the config table,
// python/cuda_bindings.h for CUDA), and defines the two small ones here: the
// error mapping and the CPU allocator's install.
//
// Error mapping: OutOfMemoryError -> torch.OutOfMemoryError,
// InvalidPointerError -> InvalidPointerError (a ValueError),
// DeviceError -> RuntimeError, std::invalid_argument -> ValueError.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <string>

#include "core/debug.h"
#include "core/errors.h"
#include "python/arena_config.h"
#include "python/bind.h"
#include "torch/cpu_allocator.h"
#ifdef TR_WITH_CUDA
#include "python/cuda_bindings.h"  // void bind_cuda(pybind11::module_&)
#endif

namespace py = pybind11;

namespace renaissance {

void bind_errors(py::module_& m) {
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
}

std::uint64_t to_uint64(const py::handle& value, const char* call, const char* name) {
  PyObject* v = value.ptr();
  const std::string type_name = Py_TYPE(v)->tp_name;
  if (PyBool_Check(v)) {
    throw py::type_error(std::string(call) + ": " + name + " must be an int, not bool");
  }
  // PyNumber_Index: ints and what defines __index__ (numpy integers).
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v));
  if (!index) {
    // Not an integer (TypeError); anything else __index__ raised
    // (KeyboardInterrupt, MemoryError, its own error) goes on as it is.
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
    PyErr_Clear();
    throw py::type_error(std::string(call) + ": " + name + " must be an int, not " + type_name);
  }
  const std::string text = py::str(index);
  if (PyObject_RichCompareBool(index.ptr(), py::int_(0).ptr(), Py_LT) == 1) {
    throw py::value_error(std::string(call) + ": " + name + " must be >= 0, got " + text);
  }
  const unsigned long long out = PyLong_AsUnsignedLongLong(index.ptr());
  if (out == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(std::string(call) + ": " + name + " " + text +
                          " does not fit in 64 bits");
  }
  return static_cast<std::uint64_t>(out);
}

void bind_cpu_allocator(py::module_& m) {
  m.def(
      "install_cpu",
      [](const py::kwargs& kw) { return install_cpu_allocator(arena_config_from_kwargs(kw)); },
      "Install the arena as PyTorch's CPU allocator (once per process).");
}

}  // namespace renaissance

PYBIND11_MODULE(_C, m) {
  using namespace renaissance;
  m.doc() = "torch_renaissance compiled core: device backends, arena, planner, torch glue";
  bind_config(m);  // config_keys(), default_arena_config(), arena_config_of()
  m.attr("debug_level") = debug::kLevel;  // TR_DEBUG (core/debug.h)
  m.def("debug_invariant_checks", [] { return debug::invariant_checks(); },
        "Arena invariant checks run by the TR_DEBUG=3 hook in this process (0 below level 3).");
  bind_errors(m);
  bind_devices(m);
  bind_arena(m);
  bind_planner(m);
  bind_cpu_allocator(m);
  bind_benchmark_loops(m);
#ifdef TR_WITH_CUDA
  bind_cuda(m);
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
