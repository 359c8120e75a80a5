// bind.h - the bind_* functions of the extension _C, one per concept; each
// adds its classes and functions to the module. bindings.cpp's
// PYBIND11_MODULE calls them in this order (config, errors, devices, arena,
// planner, CPU allocator, benchmark loops, CUDA).
//
// Conventions shared by all of them: pointers cross as Python ints; errors
// are mapped by bind_errors (OutOfMemoryError -> torch.OutOfMemoryError,
// InvalidPointerError -> _C.InvalidPointerError (a ValueError), DeviceError
// -> RuntimeError, std::invalid_argument -> ValueError); calls that may wait
// on a device or run long release the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace renaissance {

inline void* to_ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
inline std::uintptr_t to_int(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// A Python int taken as a size, a pointer or a stream id (0 .. 2**64 - 1),
// with a one-line error naming the call and the argument instead of
// pybind's list of overloads: TypeError for a bool or a non-integer,
// ValueError below 0 or above 2**64 - 1. Needs the GIL.
std::uint64_t to_uint64(const pybind11::handle& value, const char* call, const char* name);

// bindings.cpp: the exception translator and _C.InvalidPointerError.
void bind_errors(pybind11::module_& m);
// bind_devices.cpp: Device, HostDevice, SimWait, SimDevice.
void bind_devices(pybind11::module_& m);
// bind_arena.cpp: Arena (stats in torch.cuda.memory_stats()'s shape,
// snapshots in torch.cuda.memory._snapshot()'s).
void bind_arena(pybind11::module_& m);
// bind_planner.cpp: plan, greedy_by_size, load, validate.
void bind_planner(pybind11::module_& m);
// bindings.cpp: install_cpu (the arena as PyTorch's CPU allocator).
void bind_cpu_allocator(pybind11::module_& m);
// bind_benchmarks.cpp: the allocate/free and step loops of benchmarks/.
void bind_benchmark_loops(pybind11::module_& m);

}  // namespace renaissance
