// debug.h - the TR_DEBUG build level, as mimalloc's MI_DEBUG.
//
//   TR_DEBUG=0  release (the default): no checks beyond those of the API.
//   TR_DEBUG=1  O(1) assertions where an invariant is kept (TR_ASSERT): a stat
//               going below zero, a negative reserved total, ...; plus the
//               lock-order checker (lock_order.h).
//   TR_DEBUG=2  as 1 (reserved for checks linear in one structure).
//   TR_DEBUG=3  as 2, and Arena::check_invariants() after every public
//               operation that goes through Arena::Op (every mutating call
//               that changes blocks or stats), under the arena's lock.
//
// A failed check prints what broke and where, then aborts: a debug build
// stops at the first broken invariant instead of running on from corrupt
// state. Build with `TORCH_RENAISSANCE_DEBUG=3 pip install ...` (setup.py) or
// `make test-debug` (a level-3 build in build/debug3, then the core tests).
#pragma once

#ifndef TR_DEBUG
#define TR_DEBUG 0
#endif

#include <cstdint>

namespace renaissance {
namespace debug {

constexpr int kLevel = TR_DEBUG;

// Prints "torch_renaissance: TR_DEBUG assertion failed: <what> (<file>:<line>)"
// to stderr and aborts.
[[noreturn]] void assertion_failed(const char* what, const char* file, int line) noexcept;

// Number of level-3 invariant checks run in this process (0 below level 3);
// tests use it to see that the hook runs.
std::uint64_t invariant_checks() noexcept;
void count_invariant_check() noexcept;

}  // namespace debug
}  // namespace renaissance

#if TR_DEBUG >= 1
#define TR_ASSERT(cond)                                                       \
  do {                                                                        \
    if (!(cond)) ::renaissance::debug::assertion_failed(#cond, __FILE__, __LINE__); \
  } while (0)
#else
#define TR_ASSERT(cond) \
  do {                  \
  } while (0)
#endif
