// free_cache.h - the per-thread front of an arena (issue 14): recently freed
// blocks that a thread takes back, and the blocks it was given that it frees,
// without the arena's mutex (tcmalloc's per-thread cache, mimalloc's
// thread-local heap). The policy that uses it is in arena.cpp ("per-thread
// front"); docs/design.md says how every arena invariant is kept.
//
// Invariants (checked by Arena::check_invariants and the tests):
//   * A front is changed only with its own lock held. What it shares with
//     the arena (which blocks it holds, a block's `front` link and its
//     booked `requested`) changes only with the arena's lock AND its lock
//     held, so either lock is enough to read it. Lock order: arena, then
//     fronts in the order of Arena::fronts_; a thread never takes the arena
//     lock while it holds a front's.
//   * Every block in `held` is in the arena's books as allocated (state
//     kAllocated, in the live map, counted by every stat), its `front` is
//     this front, it lies in the small pool of its stream outside planned
//     territory, with no stream use. It is either live (handed out, its
//     caller's size in `front_req`) or cached (in exactly one bin).
//   * `acc` is what the front's own allocations and frees changed since the
//     last fold, so the true value of every stat is the arena's books plus
//     the folds of all fronts; the books are never below it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/live_map.h"

namespace renaissance {

class Arena;
struct Block;

// A lock for a front: taken by its thread on every fast allocation and free
// (uncontended: one atomic exchange) and by the arena's slow paths, rarely.
class FrontLock {
 public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

class FrontGuard {
 public:
  explicit FrontGuard(FrontLock& l) noexcept : l_(l) { l_.lock(); }
  ~FrontGuard() { l_.unlock(); }
  FrontGuard(const FrontGuard&) = delete;
  FrontGuard& operator=(const FrontGuard&) = delete;

 private:
  FrontLock& l_;
};

// Whether the arena a front belongs to still exists: a thread that exits
// after its arena was destroyed has nothing to give back.
struct FrontRegistry {
  std::mutex mu;           // held while a thread exit gives a front back
  Arena* arena = nullptr;  // null once the arena is gone (written under mu)
  std::atomic<bool> alive{true};  // the same, readable without mu
};

struct Front {
  static constexpr std::size_t kBins = 32;    // probed linearly from bin_home
  static constexpr std::size_t kProbes = 4;
  static constexpr std::size_t kDepth = 16;   // blocks per bin
  static constexpr std::size_t kMaxBytes = std::size_t(8) << 20;  // cached, in all bins

  struct Bin {
    std::size_t size = 0;  // rounded bytes of its blocks
    std::uint64_t stream = 0;
    std::size_t count = 0;
    Block* blocks[kDepth] = {};
  };
  // Changes of the small pool's stats since the last fold (arena.cpp,
  // fold_front_locked): allocations and frees the front served.
  struct Counters {
    std::int64_t allocs = 0, frees = 0;            // blocks
    std::int64_t alloc_bytes = 0, free_bytes = 0;  // block sizes
    std::int64_t req_alloc = 0, req_free = 0;      // requested bytes
    bool any() const { return allocs || frees; }
  };

  FrontLock lock;
  std::uint64_t arena_serial = 0;
  std::shared_ptr<FrontRegistry> registry;
  LiveMap held;  // every block it holds, live or cached
  Bin bins[kBins];
  // Live blocks handed out for fewer bytes than their booked `requested`:
  // a fold books their caller's size (duplicates allowed; when full, the
  // front serves no such request until the next fold).
  static constexpr std::size_t kDirty = 64;
  Block* dirty[kDirty] = {};
  std::size_t dirty_count = 0;
  std::size_t cached_blocks = 0, cached_bytes = 0;
  Counters acc;

  static std::size_t bin_home(std::size_t rounded, std::uint64_t stream) {
    // Fibonacci hashing of the size (its low 6 bits are zero) and stream.
    const std::uint64_t x = (static_cast<std::uint64_t>(rounded) >> 6) + 0x9E3779B9ull * stream;
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 59);  // kBins == 32
  }
};

namespace front_tls {
// The calling thread's front of the arena with this serial, or nullptr.
Front* find(std::uint64_t serial) noexcept;
// Registers a front as the calling thread's (the arena holds it too); false
// (nothing registered) once the thread is exiting. At thread exit every
// front registered here goes back to its arena (Arena::retire_front), if the
// arena still exists.
bool adopt(std::shared_ptr<Front> f);
}  // namespace front_tls

}  // namespace renaissance
