// cuda_registry.h - the glue's process-wide state: the configuration of new
// arenas, one DeviceState per CUDA device (cuda_pools.h), memory fractions,
// the installed allocator, the pointer table and the OOM observers.
//
// Invariants:
//   * The registry is constructed on first use and never destroyed
//     (no_destructor.h): tensors freed during interpreter shutdown still
//     find their arena.
//   * A device's state is created once, under Registry::mu, on the first
//     call that names that device (state()), and lives for the process;
//     find_state() reads it without a lock (an acquire load of a pointer
//     published with release).
//   * `config` applies to device states created after it is set; a state
//     created while a memory fraction is set for its device starts with
//     that limit.
//   * Locks: Registry::mu is level 1 (core/lock_order.h), taken before any
//     device state; observers_mu is a leaf (observers are copied out and
//     called with no lock held).
// Compiled only with TR_WITH_CUDA.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/lock_order.h"
#include "torch/cuda_pointer_table.h"
#include "torch/cuda_pools.h"

namespace renaissance::cuda::detail {

inline constexpr int kMaxDevices = 256;

struct Registry {
  lock_order::Mutex<lock_order::kRegistry> mu;
  ArenaConfig config;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices{};
  std::vector<std::unique_ptr<DeviceState>> owned;
  std::map<int, double> fractions;  // set_per_process_memory_fraction, by device
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;  // set by install()
  PointerTable pointers;
  lock_order::Mutex<lock_order::kLeaf> observers_mu;
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> oom_observers;
};

Registry& registry();

// The state of `device` if it exists, else nullptr (no lock, no CUDA call).
DeviceState* find_state(int device);

// The state of `device`, created on first use. Raises DeviceError.
DeviceState& state(int device);

// The reserved-bytes limit of a device: the install limit (0: none) and
// fraction * total memory (bytes), whichever is smaller.
std::size_t effective_limit(std::size_t install_limit, double fraction, std::size_t total);

// Calls f(DeviceState&) for every device state that exists, in index order.
template <typename F>
void for_each_state(F f) {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (DeviceState* s = find_state(i)) f(*s);
  }
}

}  // namespace renaissance::cuda::detail
