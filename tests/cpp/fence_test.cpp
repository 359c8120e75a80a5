// fence_test.cpp - the heavy asymmetric fence (core/asym_fence.h): the
// expedited barrier is retried once after registering again, and a barrier
// that still fails is reported (false), never taken for one that ran.
// Built and run by `make test-cpp`.
#include <linux/membarrier.h>

#include <cstdio>
#include <vector>

#include "core/asym_fence.h"

using namespace renaissance;

namespace {

int g_failures = 0;
// A model of the kernel: the barrier runs only while the process is
// registered (else EPERM); registering succeeds unless g_register_ok is
// false; g_fail_barriers more barriers fail whatever the registration (a
// seccomp filter, say).
std::vector<int> g_calls;  // the commands the fake received, in order
bool g_registered = true;
bool g_register_ok = true;
int g_fail_barriers = 0;

long fake(int cmd) noexcept {
  g_calls.push_back(cmd);
  if (cmd == MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
    if (!g_registered) return -1;
    if (g_fail_barriers > 0) {
      --g_fail_barriers;
      return -1;
    }
    return 0;
  }
  if (cmd == MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
    g_registered = g_register_ok;
    return g_register_ok ? 0 : -1;
  }
  return -1;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what);
    ++g_failures;
  }
}

void reset(bool registered, bool register_ok, int fail_barriers) {
  g_calls.clear();
  g_registered = registered;
  g_register_ok = register_ok;
  g_fail_barriers = fail_barriers;
}

}  // namespace

int main() {
  constexpr int kBarrier = MEMBARRIER_CMD_PRIVATE_EXPEDITED;
  constexpr int kRegister = MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED;

  // A registered process: one call.
  reset(true, true, 0);
  check(asym::expedited_barrier(&fake), "a working barrier is reported as run");
  check(g_calls == std::vector<int>{kBarrier}, "a working barrier is called once");

  // The registration was lost (EPERM): register again, retry, success.
  reset(false, true, 0);
  check(asym::expedited_barrier(&fake), "the retry after registering runs the barrier");
  check(g_calls == (std::vector<int>{kBarrier, kRegister, kBarrier}),
        "barrier, register, barrier in that order");

  // The retry fails as well: reported, not taken for a barrier that ran.
  reset(true, true, 2);
  check(!asym::expedited_barrier(&fake), "a retry that fails is reported as failed");
  check(g_calls.size() == 3, "one retry only");
  reset(false, false, 0);
  check(!asym::expedited_barrier(&fake), "a registration that fails is reported as failed");

  // The real fence on this machine: returns (no abort) whichever mode the
  // kernel gave at load time.
  asym::heavy_fence();
  asym::light_fence();
  std::printf("fence_test: %s (the light fence is %s here)\n", g_failures ? "FAILED" : "ok",
              asym::g_light_is_compiler_barrier ? "a compiler barrier" : "a full fence");
  return g_failures ? 1 : 0;
}
