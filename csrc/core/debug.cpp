// debug.cpp - the failure path of TR_ASSERT and the level-3 check counter
// (debug.h).
#include "core/debug.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace renaissance {
namespace debug {
namespace {
std::atomic<std::uint64_t> checks{0};
}  // namespace

void assertion_failed(const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "torch_renaissance: TR_DEBUG assertion failed: %s (%s:%d)\n", what, file,
               line);
  std::fflush(stderr);
  std::abort();
}

std::uint64_t invariant_checks() noexcept { return checks.load(std::memory_order_relaxed); }

void count_invariant_check() noexcept { checks.fetch_add(1, std::memory_order_relaxed); }

}  // namespace debug
}  // namespace renaissance
