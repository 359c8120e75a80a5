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
//   * A bin's key changes only when it is empty (Front::set_key), and the
//     direct map names, for each key it covers, the one bin with that key
//     (or none): a direct lookup and the probe window find the same bin.
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

#include "core/asym_fence.h"
#include "core/live_map.h"

namespace renaissance {

class Arena;
struct Block;

// The bins of a free cache (the arena's shared one and each front): N bins of
// blocks of one key (rounded size, stream, ...), a key's bin lying among the
// `probes` bins from its home (linear probing, wrapping). A bin keeps its key
// when it empties, so a key that comes back finds its bin at the first probe;
// an empty bin is given another key only when no bin of the window has the
// new key. So a key has at most one bin in its window (take_bin may stop at
// the first bin of its key).
namespace bins {

// The bin of `key`'s blocks, or nullptr where it has none (or none cached).
template <typename Bin, std::size_t N, typename SameKey>
inline Bin* take_bin(Bin (&bins)[N], std::size_t home, std::size_t probes, SameKey same_key) {
  static_assert((N & (N - 1)) == 0, "bin counts are powers of two");
  for (std::size_t probe = 0, i = home; probe < probes; ++probe, i = (i + 1) & (N - 1)) {
    Bin& bin = bins[i];
    if (same_key(bin)) return bin.count ? &bin : nullptr;
  }
  return nullptr;
}

// The bin a block of `key` goes to: its key's bin while that has room, else
// (no bin of the key in the window) the first empty bin, given the key by
// `set_key`; nullptr where the key's bin is full or no bin is free.
template <std::size_t Depth, typename Bin, std::size_t N, typename SameKey, typename SetKey>
inline Bin* put_bin(Bin (&bins)[N], std::size_t home, std::size_t probes, SameKey same_key,
                    SetKey set_key) {
  static_assert((N & (N - 1)) == 0, "bin counts are powers of two");
  Bin* empty = nullptr;
  for (std::size_t probe = 0, i = home; probe < probes; ++probe, i = (i + 1) & (N - 1)) {
    Bin& bin = bins[i];
    if (same_key(bin)) return bin.count < Depth ? &bin : nullptr;
    if (bin.count == 0 && !empty) empty = &bin;
  }
  if (empty) set_key(*empty);
  return empty;
}

}  // namespace bins

// The fences of the front lock: core/asym_fence.h.

// The lock of a front. Its own thread enters and leaves the fast path
// (enter_fast/leave_fast: a flag store, a compiler barrier and a load, no
// atomic read-modify-write); every other use (the arena's slow paths, on
// any thread) takes lock()/unlock(), a spin lock that, taken from another
// thread than the owner, also waits until the owner is out of the fast path.
// That is a Dekker pair made asymmetric: the owner stores `busy_` then
// loads `locked_`; a locker sets `locked_`, runs the heavy fence, then loads
// `busy_`; the heavy fence guarantees that at least one of them sees the
// other's store, so the two never both go on. The owner taking its own lock
// needs no fence: it is never inside its fast path then (program order).
class FrontLock {
 public:
  // The thread whose fast path this lock guards (set once, before the front
  // is published to that thread).
  void set_owner(std::thread::id owner) noexcept { owner_ = owner; }

  // Owner only. True: inside the fast path until leave_fast(); false: a
  // locker holds the front (take the slow path).
  bool enter_fast() noexcept {
    busy_.store(true, std::memory_order_relaxed);
    asym::light_fence();
    if (locked_.load(std::memory_order_acquire)) {
      busy_.store(false, std::memory_order_release);
      return false;
    }
    return true;
  }
  void leave_fast() noexcept { busy_.store(false, std::memory_order_release); }

  void lock() noexcept {
    acquire_flag();
    if (std::this_thread::get_id() != owner_) {
      asym::heavy_fence();
      wait_owner_out();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

  // lock() in two halves, so that many fronts are locked with one heavy
  // fence: acquire_flag() on each, asym::heavy_fence() once, then
  // wait_owner_out() on each (lock_all below).
  void acquire_flag() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void wait_owner_out() const noexcept {
    while (busy_.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  bool owned_by_caller() const noexcept { return std::this_thread::get_id() == owner_; }

 private:
  std::atomic<bool> locked_{false};  // held by a locker (lock())
  std::atomic<bool> busy_{false};    // the owner is inside its fast path
  std::thread::id owner_;
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

// The owner's fast section (FrontLock::enter_fast); `entered()` false: take
// the slow path.
class FastSection {
 public:
  explicit FastSection(FrontLock& l) noexcept : l_(l), in_(l.enter_fast()) {}
  ~FastSection() {
    if (in_) l_.leave_fast();
  }
  bool entered() const noexcept { return in_; }
  FastSection(const FastSection&) = delete;
  FastSection& operator=(const FastSection&) = delete;

 private:
  FrontLock& l_;
  bool in_;
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

  // The direct map (mimalloc's pages_direct): for the default stream's
  // sizes of fewer than kDirect units (rounded >> unit_shift, the arena's
  // rounding unit), the index + 1 of the bin of that key, 0 where no bin has
  // it. So the fast paths find such a key's bin with one byte load instead of
  // a hash and a probe. Kept equal to the bins' keys by set_key, the only
  // place a bin's key changes (Arena::check_front_locked checks it). It
  // covers every size a front serves (<= 1 MiB) for units of 64 B and more
  // (16 KiB a front); other keys take the probe window.
  static constexpr std::size_t kDirect = (std::size_t(1) << 20) / 64 + 1;
  static_assert(kBins < 255, "a direct entry is a bin index + 1 in a byte");
  std::uint8_t direct[kDirect] = {};
  unsigned unit_shift = 0;  // log2 of the arena's rounding unit (set before use)

  // The block the fast path handed out last: its address, block and bin.
  // Its free (the common last-in, first-out pattern: a temporary freed
  // before the next allocation) then needs neither the held map's hash
  // and probe nor the block's size and the direct map to find its bin, so
  // the address the caller passes is only compared, never a step of the
  // loads that lead to the bin (Arena::front_hand_out sets it; 156 -> 135
  // instructions a 512 B pair, docs/benchmarks.md). Valid while last_ptr is set:
  // last_block is held and live here, of last_bin's key. Cleared
  // (forget_last) when that free is served or refused, when a block leaves
  // `held` (a drop, a fold, a release), and when a bin takes another key
  // (set_key); Arena::check_front_locked checks it.
  const void* last_ptr = nullptr;
  Block* last_block = nullptr;
  Bin* last_bin = nullptr;
  void forget_last() noexcept { last_ptr = nullptr; }

  // The block a free put on top of its bin last, when its key is in the
  // direct map: its address, block, bin and booked requested bytes. The
  // next allocation of that request (last in, first out) returns next_ptr
  // without the loads that lead from the size to the block (the direct
  // map's byte, the bin's count, the top slot), which made the address the
  // caller gets wait on four loads in a row. Never trusted: it is served
  // only while next_bin's top block is next_block, next_block->ptr is
  // next_ptr, its booked requested bytes are the request's and the bin's
  // key is the request's (Arena::front_allocate_direct), exactly what the
  // direct map's path would hand out; so nothing needs to clear it.
  const void* next_ptr = nullptr;
  Block* next_block = nullptr;
  Bin* next_bin = nullptr;
  std::size_t next_req = 0;

  static std::size_t bin_home(std::size_t rounded, std::uint64_t stream) {
    // Fibonacci hashing of the size (its low 6 bits are zero) and stream.
    const std::uint64_t x = (static_cast<std::uint64_t>(rounded) >> 6) + 0x9E3779B9ull * stream;
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 59);  // kBins == 32
  }
  // The direct map's entry of a key, or nullptr for a key it does not cover.
  std::uint8_t* direct_entry(std::size_t rounded, std::uint64_t stream) noexcept {
    const std::size_t c = rounded >> unit_shift;
    return stream == 0 && c < kDirect ? &direct[c] : nullptr;
  }
  // The bin of key (rounded, stream) when it has a cached block, or nullptr.
  Bin* take_bin(std::size_t rounded, std::uint64_t stream) noexcept {
    if (const std::uint8_t* d = direct_entry(rounded, stream)) {
      if (*d == 0) return nullptr;
      Bin* bin = &bins[*d - 1];
      return bin->count ? bin : nullptr;
    }
    return bins::take_bin(bins, bin_home(rounded, stream), kProbes, [&](const Bin& x) {
      return x.size == rounded && x.stream == stream;
    });
  }
  // The bin a block of key (rounded, stream) goes to (bins::put_bin), or
  // nullptr where the key's bin is full or none is free in its window.
  Bin* put_bin(std::size_t rounded, std::uint64_t stream) noexcept {
    if (const std::uint8_t* d = direct_entry(rounded, stream)) {
      if (*d != 0) {
        Bin* bin = &bins[*d - 1];
        return bin->count < kDepth ? bin : nullptr;
      }
    }
    return put_bin_hashed(rounded, stream);
  }

 private:
  // put_bin without a direct entry: the probe window, where a new bin is
  // keyed (out of line: the fast path's common case does not get here).
  Bin* put_bin_hashed(std::size_t rounded, std::uint64_t stream) noexcept;
  void set_key(Bin& bin, std::size_t rounded, std::uint64_t stream) noexcept;
};

// Locks every front of a list with one heavy fence (FrontLock::lock in two
// halves), and unlocks them in reverse order.
void lock_fronts(const std::vector<std::shared_ptr<Front>>& fronts) noexcept;
void unlock_fronts(const std::vector<std::shared_ptr<Front>>& fronts) noexcept;

namespace front_tls {
// The last front the calling thread looked up: trivially destructible and,
// with GCC/Clang, `__thread` in the initial-exec model (no TLS wrapper and
// no __tls_get_addr call on the fast path; 16 bytes of the static TLS
// surplus glibc keeps for dlopen()ed libraries).
struct LastFront {
  std::uint64_t serial;  // 0: none (arena serials start at 1)
  Front* front;
};
#if defined(__GNUC__) && defined(__linux__)
extern __thread LastFront t_last_front __attribute__((tls_model("initial-exec")));
#else
extern thread_local LastFront t_last_front;
#endif
Front* find_slow(std::uint64_t serial) noexcept;
// The calling thread's front of the arena with this serial, or nullptr.
inline Front* find(std::uint64_t serial) noexcept {
  if (t_last_front.serial == serial) return t_last_front.front;
  return find_slow(serial);
}
// The thread's last front when it is this arena's, else nullptr (the fast
// paths' lookup: no call).
inline Front* find_last(std::uint64_t serial) noexcept {
  return t_last_front.serial == serial ? t_last_front.front : nullptr;
}
// Registers a front as the calling thread's (the arena holds it too); false
// (nothing registered) once the thread is exiting. At thread exit every
// front registered here goes back to its arena (Arena::retire_front), if the
// arena still exists.
bool adopt(std::shared_ptr<Front> f);
}  // namespace front_tls

}  // namespace renaissance
