// lock_order.h - the lock levels of the CUDA glue and the core, and a
// checker of their order for debug builds.
//
// Invariants:
//   * Every mutex of the glue and of the arena machinery has a level; a
//     thread takes locks in strictly increasing level only:
//       registry (1) -> device state (2) -> arena (3) -> stats group (4),
//     and a leaf (5: a pointer-table shard, the observer list, CudaDevice's
//     handle table) is taken last and nothing is taken while it is held.
//     Two locks of one level are never held together (two arenas, two
//     device states).
//   * The arena's own mutex stays a std::mutex: its Op (the lock of every
//     call that changes the arena) declares the level with Held<kArena>;
//     read-only arena calls take it bare and call nothing under it.
//   * Mutex<L> is a std::mutex (BasicLockable: std::lock_guard<Mutex<L>>,
//     std::unique_lock<Mutex<L>>). Compiled with TR_LOCK_ORDER_CHECK (the
//     fake-CUDA tests of make check-cuda are), each thread keeps the levels
//     it holds and lock() throws std::logic_error naming both locks when the
//     order above would break, before waiting on the mutex: a deadlock the
//     order prevents shows up as an error in the test that takes that path.
//     Without it, Mutex<L> costs what std::mutex costs.
#pragma once

#include <mutex>

namespace renaissance::lock_order {

enum Level : int {
  kRegistry = 1,
  kDeviceState = 2,
  kArena = 3,
  kStatsGroup = 4,
  kLeaf = 5,
};

#ifdef TR_LOCK_ORDER_CHECK
// Record that the calling thread takes / released a lock of `level`;
// acquire() throws std::logic_error when the order would break.
void acquire(Level level, const void* mutex);
void release(Level level, const void* mutex);
// Locks the calling thread holds now (for tests).
int held_count();
#endif

template <Level L>
class Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() {
#ifdef TR_LOCK_ORDER_CHECK
    acquire(L, this);
    try {
      mu_.lock();
    } catch (...) {
      release(L, this);
      throw;
    }
#else
    mu_.lock();
#endif
  }
  bool try_lock() {
#ifdef TR_LOCK_ORDER_CHECK
    acquire(L, this);
    if (mu_.try_lock()) return true;
    release(L, this);
    return false;
#else
    return mu_.try_lock();
#endif
  }
  void unlock() {
    mu_.unlock();
#ifdef TR_LOCK_ORDER_CHECK
    release(L, this);
#endif
  }

 private:
  std::mutex mu_;
};

// Declares, for its lifetime, that the calling thread holds a lock of level
// L that is a plain std::mutex (the arena's, taken right after): checked
// like Mutex<L>::lock() in debug builds, nothing otherwise. Construct it
// before locking the mutex and destroy it after unlocking.
template <Level L>
class Held {
 public:
#ifdef TR_LOCK_ORDER_CHECK
  explicit Held(const void* mutex) : mutex_(mutex) { acquire(L, mutex_); }
  ~Held() { release(L, mutex_); }
#else
  explicit Held(const void*) {}
#endif
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
#ifdef TR_LOCK_ORDER_CHECK
  const void* mutex_;
#endif
};

}  // namespace renaissance::lock_order
