// asym_fence.h - process-wide asymmetric fences (Linux membarrier(2), as
// folly's asymmetric_thread_fence_light/_heavy).
//
// The light fence costs a hot path nothing but a compiler barrier; the heavy
// one makes every other thread of the process pass a full memory barrier (an
// IPI to the CPUs running them). Used by the fronts' lock (free_cache.h): an
// owner's fast path runs the light fence, every other thread that takes the
// front runs the heavy one.
//
// Invariants:
//   * Decided once, at load time (before any thread can enter a fast path):
//     where the kernel has no expedited private membarrier, or the
//     registration fails, both fences are full fences.
//   * A heavy fence either ran the barrier on every other thread or the
//     process stops (std::abort with a message): a heavy fence that silently
//     did nothing would let a locker and an owner's fast path both go on.
//     The barrier fails only without a registration (EPERM; exec() drops it,
//     and drops this library with it), so the heavy fence registers once more
//     and retries before it gives up.
#pragma once

#include <atomic>

namespace renaissance::asym {

extern bool g_light_is_compiler_barrier;  // membarrier(PRIVATE_EXPEDITED) is registered

inline void light_fence() noexcept {
  if (g_light_is_compiler_barrier) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

void heavy_fence() noexcept;

// The membarrier(2) system call with one command (flags 0, cpu 0); returns
// its result (0, or -1 with errno set).
using MembarrierCall = long (*)(int cmd) noexcept;

// The expedited private barrier through `call`: true when it ran, retried
// once after registering again when the first try fails. False when the
// retry fails too (then no barrier ran). Exposed so that tests can give a
// failing `call`; heavy_fence() uses the real system call.
bool expedited_barrier(MembarrierCall call) noexcept;

}  // namespace renaissance::asym
