// arena_config.h - the arena configuration from Python keyword arguments
// (the keys of torch_renaissance.allocator.Config.arena_kwargs()), shared by
// the CPU bindings and the CUDA bindings. Raises ValueError for an unknown
// key or a bad value.
#pragma once

#include <pybind11/pybind11.h>

#include "core/arena.h"

namespace renaissance {

ArenaConfig arena_config_from_kwargs(const pybind11::kwargs& kw);

}  // namespace renaissance
