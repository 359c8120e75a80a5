// asym_fence.cpp - see asym_fence.h.
#include "core/asym_fence.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace renaissance::asym {

namespace {

#if defined(__linux__) && defined(__NR_membarrier)
long sys_membarrier(int cmd) noexcept { return syscall(__NR_membarrier, cmd, 0, 0); }

// Registers the process for expedited private membarriers; false where the
// kernel has none (then the light fence is a full fence).
bool register_membarrier() noexcept {
  const long cmds = sys_membarrier(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return false;
  return sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}
#else
bool register_membarrier() noexcept { return false; }
#endif

}  // namespace

bool g_light_is_compiler_barrier = register_membarrier();

bool expedited_barrier(MembarrierCall call) noexcept {
#if defined(__linux__) && defined(__NR_membarrier)
  if (call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
  return call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
#else
  (void)call;
  return false;
#endif
}

void heavy_fence() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
#if defined(__linux__) && defined(__NR_membarrier)
  if (g_light_is_compiler_barrier && !expedited_barrier(&sys_membarrier)) {
    const int err = errno;
    std::fprintf(stderr,
                 "torch_renaissance: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after "
                 "registering again (%s); the fronts' fast paths rely on it, so going on could "
                 "hand one block to two threads: aborting\n",
                 std::strerror(err));
    std::abort();
  }
#endif
}

}  // namespace renaissance::asym
