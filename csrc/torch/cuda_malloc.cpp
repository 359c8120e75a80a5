// cuda_malloc.cpp - see cuda_malloc.h. Lock order: cuda_allocator.cpp's top.
#include "torch/cuda_malloc.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "core/errors.h"
#include "torch/cuda_registry.h"

namespace renaissance::cuda::detail {
namespace {

using c10::DeviceIndex;
using c10::MempoolId_t;
namespace CCA = c10::cuda::CUDACachingAllocator;

[[noreturn]] void raise_oom(DeviceState& s, std::size_t size, const OutOfMemoryError& e) {
  DeviceStats st;
  std::size_t limit = 0;
  {
    std::lock_guard g(s.mu);
    st = s.stats_locked();
    limit = s.pool_config.max_reserved_bytes;
  }
  MemInfo mem;
  try {
    mem = s.device->mem_info();
  } catch (const std::exception&) {
    // Keep zeros: the message matters more than the numbers.
  }
  const auto allocated = static_cast<std::size_t>(st.allocated_bytes[0].current);
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes[0].current);
  std::vector<CCA::OutOfMemoryObserver> observers;
  {
    Registry& r = registry();
    std::lock_guard g(r.observers_mu);
    observers = r.oom_observers;
  }
  // As PyTorch: (device, the failed request, the limit or the device's total, free).
  for (auto& obs : observers) obs(s.index, size, limit ? limit : mem.total_bytes, mem.free_bytes);
  std::ostringstream os;
  os << "CUDA out of memory. Tried to allocate " << format_bytes(size) << " (" << size
     << " bytes). GPU " << s.index << " has a total capacity of " << format_bytes(mem.total_bytes)
     << " of which " << format_bytes(mem.free_bytes)
     << " is free. Of the allocated memory " << format_bytes(allocated)
     << " is allocated by PyTorch through torch_renaissance, and "
     << format_bytes(reserved - std::min(reserved, allocated))
     << " is reserved by torch_renaissance but unallocated. If reserved but unallocated memory "
        "is large, mark training steps (torch_renaissance.step()) so they are planned, and keep "
        "expandable_segments on. ("
     << e.what() << ")";
  TORCH_CHECK_WITH(OutOfMemoryError, false, os.str());
}


// The last resort before an out-of-memory error, as PyTorch's allocator
// does: the cached free blocks of pools created with use_on_oom (a MemPool
// that lends its memory), never more. Not for allocations a window routes
// to its own pool.
void* borrow_from_pools(DeviceState& s, std::size_t size, StreamId sid, int device,
                        cudaStream_t stream) {
  Registry& r = registry();
  std::lock_guard g(s.mu);
  if (s.route_locked(stream)) return nullptr;
  for (auto& [id, p] : s.pools) {
    if (!p.use_on_oom) continue;
    // Its free blocks only: growing the pool or trimming it (what a full
    // attempt may do) would change memory a live graph's replays write.
    if (void* ptr = p.arena->allocate_cached(size, sid)) {
      r.pointers.insert(ptr, Owner{p.arena.get(), id, device});
      return ptr;
    }
  }
  return nullptr;
}

// Destroys the pools releasePool left with a use count of 0 that hold no
// live or pending block (see DeviceState::release_due). Pools still waiting
// on another stream's use are looked at again next time. Raises DeviceError;
// the caller has the device current.
void settle_released_pools(DeviceState& s) {
  if (!s.release_due.exchange(false, std::memory_order_acq_rel)) return;
  std::vector<std::shared_ptr<Arena>> dead;  // destroyed after the lock is released
  std::lock_guard g(s.mu);
  try {
    if (!s.windows.empty()) {  // endAllocateToPool takes them when the last window closes
      s.release_due.store(true, std::memory_order_release);
      return;
    }
    dead = s.take_idle_pools_locked();
    for (auto& [id, p] : s.pools) {
      if (p.use_count <= 0 && p.arena->stats().pending_bytes.current > 0) {
        s.release_due.store(true, std::memory_order_release);
        break;
      }
    }
  } catch (...) {
    s.release_due.store(true, std::memory_order_release);
    throw;
  }
}

void release_pool_if_idle(int device, const MempoolId_t& id) {
  DeviceState* s = find_state(device);
  if (!s) return;
  std::unique_lock g(s->mu);
  auto it = s->pools.find(id);
  if (it == s->pools.end() || it->second.use_count > 0 || !s->windows.empty()) return;
  // Only now a CUDA call may come: taking the pool may query events, and
  // destroying it gives its memory back.
  DeviceScope scope(static_cast<DeviceIndex>(device));
  std::shared_ptr<Arena> dead = s->take_idle_pool_locked(id);
  g.unlock();
}  // `dead` is destroyed here, outside the lock, with the device current

}  // namespace

// Reports an error that must not escape (a destructor's call, a deferred
// clean-up) on stderr, once per process and kind.
void report_once(std::atomic<bool>& said, const char* what, const char* error) {
  if (said.exchange(true)) return;
  std::fprintf(stderr, "torch_renaissance: %s: %s (reported once; the work is retried later)\n",
               what, error);
}

void* malloc_on(std::size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  Registry& r = registry();
  try {
    DeviceState& s = state(device);
    DeviceScope scope(static_cast<DeviceIndex>(device));
    const StreamId sid = stream_id(stream);
    if (s.release_due.load(std::memory_order_acquire)) {
      // Not this allocation's business: a failure (e.g. a sticky CUDA error
      // of an earlier kernel) is reported, and the allocation goes on.
      static std::atomic<bool> said{false};
      try {
        settle_released_pools(s);
      } catch (const std::exception& e) {
        report_once(said, "destroying a released CUDA graph pool failed", e.what());
      }
    }
    // Serves the request from the newest window's pool that takes `stream`,
    // or from the default arena. hooks == nullptr: the cheap attempt only;
    // otherwise the arena's one out-of-memory ladder, which raises.
    void* borrowed = nullptr;  // the last resort registers its pointer itself
    auto place = [&](const OomHooks* hooks) -> void* {
      if (s.windows_open.load(std::memory_order_acquire) > 0) {
        std::unique_lock g(s.mu);
        if (const Window* w = s.route_locked(stream)) {
          const MempoolId_t id = w->id;
          Arena& pool = *s.pool_locked(id).arena;
          // Under s.mu: the pool's ladder runs without the glue's hooks.
          void* ptr = hooks ? pool.allocate(size, sid) : pool.try_allocate(size, sid);
          if (ptr) r.pointers.insert(ptr, Owner{&pool, id, device});
          return ptr;
        }
      }
      void* ptr = hooks ? s.arena->allocate(size, sid, *hooks) : s.arena->try_allocate(size, sid);
      if (ptr && ptr != borrowed) r.pointers.insert(ptr, Owner{s.arena.get(), kDefaultPool, device});
      return ptr;
    };
    if (void* ptr = place(nullptr)) return ptr;
    // The ladder runs once (num_alloc_retries += 1 at most). Its free-memory
    // hook gives back the pools no graph uses any more (PyTorch's
    // trigger_free_memory_callbacks); its last resort borrows from
    // use_on_oom pools. Both run outside the arena lock.
    OomHooks hooks;
    hooks.free_memory = [&s] {
      std::vector<std::shared_ptr<Arena>> dead;
      {
        std::lock_guard g(s.mu);
        s.release_unused_pools_locked(&dead);
      }
      return !dead.empty();
    };  // `dead` is destroyed outside s.mu: its memory goes back
    hooks.last_resort = [&] { return borrowed = borrow_from_pools(s, size, sid, device, stream); };
    try {
      return place(&hooks);
    } catch (const OutOfMemoryError& e) {
      raise_oom(s, size, e);
    }
  } catch (const DeviceError& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Frees `ptr`. strict: raise for a pointer we did not hand out (raw_delete);
// otherwise (deleters, which cannot throw) report it on stderr.
void free_pointer(void* ptr, bool strict) {
  if (!ptr) return;
  Owner o;
  if (!registry().pointers.take(ptr, &o)) {
    if (strict) {
      TORCH_CHECK(false, "torch_renaissance: cannot free ", ptr,
                  ": the CUDA allocator did not hand it out, or it was already freed");
    }
    std::fprintf(stderr, "torch_renaissance: ignoring free of %p, which the CUDA allocator "
                 "did not hand out\n", ptr);
    return;
  }
  // A free makes no CUDA call (stream uses become pending; events come at
  // boundaries), so the hot path and frees during interpreter exit need no
  // device switch; destroying an idle pool gives memory back and does.
  o.arena->deallocate(ptr);
  if (o.pool != kDefaultPool) release_pool_if_idle(o.device, o.pool);
}

void delete_cuda(void* ptr) {
  try {
    free_pointer(ptr, false);
  } catch (const std::exception& e) {
    // A deleter cannot throw; this only happens if memory was corrupted.
    std::fprintf(stderr, "torch_renaissance: error freeing CUDA memory: %s\n", e.what());
  }
}

void record_stream_on(void* ptr, cudaStream_t stream) {
  Owner o;
  if (!ptr || !registry().pointers.find(ptr, &o)) return;  // not ours: nothing to track
  o.arena->record_stream(ptr, stream_id(stream));
}

// torch.cuda.empty_cache() (the default id) empties the default arena and
// every pool nothing uses any more; a pool's id (~MemPool) empties that pool
// only when nothing uses it. The free blocks of a pool that a live CUDA graph
// holds are the graph's memory (its replays reuse what the capture freed):
// they are never given back, as in PyTorch's release_cached_blocks.
void empty_cache_all(const MempoolId_t& id) {
  for_each_state([&](DeviceState& s) {
    DeviceScope scope(static_cast<DeviceIndex>(s.index));
    std::vector<std::shared_ptr<Arena>> dead;  // destroyed after the lock is released
    if (id == kDefaultPool) s.arena->empty_cache();
    std::lock_guard g(s.mu);
    s.release_unused_pools_locked(&dead, id == kDefaultPool ? nullptr : &id);
    // Pools releasePool left: the default id has just emptied all of them
    // (unless a window is open); a pool's id (~MemPool) only that one, and
    // the rest wait for the next allocation.
    if (id == kDefaultPool && s.windows.empty()) {
      s.release_due.store(false, std::memory_order_release);
    }
  });
}

}  // namespace renaissance::cuda::detail
