// arena_config.h - the arena configuration from Python keyword arguments
// (the keys of core/config.h's table, the same as
// torch_renaissance.config.Config.arena_kwargs() gives), shared by the CPU
// bindings and the CUDA bindings, and the table itself for Python.
#pragma once

#include <pybind11/pybind11.h>

#include "core/config.h"

namespace renaissance {

// Raises ValueError naming the key for an unknown key, a value of the wrong
// Python type (exact types: a float for a byte count or a string for a flag
// is a mistake to report, not to round or coerce), a value outside the key's
// range, or a key given together with its alias (max_reserved_mb and
// max_reserved_bytes).
ArenaConfig arena_config_from_kwargs(const pybind11::kwargs& kw);

// _C.config_keys(): the table as a list of dicts (name, type, unit, default,
// min, max, choices, alias_of, factor, doc), and _C.default_arena_config():
// ArenaConfig{}'s value of every key that is not an alias, as text.
void bind_config(pybind11::module_& m);

}  // namespace renaissance
