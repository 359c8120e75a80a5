// cuda_bindings.cpp - see cuda_bindings.h. Errors follow bindings.cpp's
// mapping (DeviceError -> RuntimeError); install() after CUDA initialization
// raises RuntimeError.
#include "python/cuda_bindings.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "core/cuda_device.h"
#include "python/arena_config.h"
#include "torch/cuda_allocator.h"

namespace py = pybind11;
using namespace renaissance;

void bind_cuda(py::module_& m) {
  py::class_<CudaDevice, Device, std::shared_ptr<CudaDevice>>(m, "CudaDevice")
      .def(py::init<int>(), py::arg("index") = 0)
      .def_property_readonly("index", &CudaDevice::index)
      .def_property_readonly("vmm_status", &CudaDevice::vmm_status)
      .def_static("device_count", &CudaDevice::device_count);

  m.def(
      "cuda_install", [](const py::kwargs& kw) { cuda::install(arena_config_from_kwargs(kw)); },
      "Make torch_renaissance the allocator behind torch.cuda (before CUDA is initialized).");
  m.def(
      "cuda_configure",
      [](const py::kwargs& kw) { return cuda::configure(arena_config_from_kwargs(kw)); },
      "Configure CUDA arenas created from now on; False once one exists.");
  m.def("cuda_arena", &cuda::arena, py::arg("device"),
        "The default arena of a CUDA device (created on first use).");
  m.def("cuda_vmm_status", &cuda::vmm_status, py::arg("device") = 0);
  m.def("cuda_private_pool_count", &cuda::private_pool_count, py::arg("device") = 0);
}
