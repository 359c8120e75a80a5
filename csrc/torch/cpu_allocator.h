// cpu_allocator.h - the c10::Allocator for the CPU device that routes every
// CPU tensor allocation to a torch_renaissance Arena (HostDevice backend).
//
// Invariants:
//   * Installed at most once per process; the arena then lives until the
//     process exits (tensors may be freed during interpreter shutdown).
//   * Tensors allocated before the install keep their own deleter; ours only
//     ever sees pointers it handed out.
//   * Arena errors become c10 errors: OutOfMemoryError ->
//     c10::OutOfMemoryError (torch.OutOfMemoryError in Python).
#pragma once

#include <memory>

#include "core/arena.h"

namespace renaissance {

// Installs the CPU allocator with `config` if none is installed yet and
// returns the arena. If one is installed, returns it unchanged (the Python
// layer compares configurations and warns or raises).
std::shared_ptr<Arena> install_cpu_allocator(const ArenaConfig& config);

}  // namespace renaissance
