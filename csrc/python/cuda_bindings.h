// cuda_bindings.h - pybind11 bindings of the CUDA backend and the allocator
// behind torch.cuda (CUDA builds only; called from bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_cuda(pybind11::module_& m);
