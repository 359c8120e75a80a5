// cuda_pools.h - one CUDA device's arenas: its default arena and its private
// pools (CUDA graph capture pools and torch.cuda.MemPool), the
// beginAllocateToPool windows that route allocations to them, and the stats
// of the pools already destroyed.
//
// Invariants:
//   * The default arena lives for the process. A private pool is created by
//     pool_locked (beginAllocateToPool / createOrIncrefPool) and removed only
//     when its use count is 0, no window is open and it holds no live or
//     pending block; its stats are then folded into `retired`
//     (cuda_stats.h), so the device's totals never go back.
//   * While a window is open (windows_open > 0), every arena of the device is
//     in capture mode (no event recorded, queried or synchronized, no memory
//     given back), and a pool created meanwhile starts in it; no pool is
//     destroyed.
//   * Private pools do no step planning (they serve captures and scopes).
//   * A pool with a positive use count never gives memory back; a use_on_oom
//     pool lends only its cached free blocks (cuda_malloc.cpp).
//   * Every *_locked method runs with DeviceState::mu held (lock level 2,
//     core/lock_order.h) and may call into the arenas (level 3). An arena
//     taken out of the device is returned, to be destroyed by the caller
//     after mu is released (destruction gives memory back to the device).
// Compiled only with TR_WITH_CUDA.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/cuda_device.h"
#include "core/lock_order.h"

namespace renaissance::cuda::detail {

using Filter = std::function<bool(cudaStream_t)>;

struct PoolEntry {
  std::shared_ptr<Arena> arena;
  int use_count = 0;
  bool use_on_oom = false;  // MemPool(use_on_oom=True): lends its free blocks before an OOM
};

// Makes `device` current for the scope the way PyTorch does (c10's
// CUDAGuard), so that CudaDevice's own guard finds it current and switches
// nothing. c10 goes back with MaybeSetDevice, which creates no CUDA context
// on a device that has none (a raw cudaSetDevice would, since CUDA 12: a
// helper thread still on device 0 must not put a context there).
using DeviceScope = c10::cuda::CUDAGuard;

struct Window {  // one open beginAllocateToPool
  c10::MempoolId_t id;
  Filter filter;
};

class DeviceState {
 public:
  DeviceState(int index, ArenaConfig config);

  const int index;
  const std::shared_ptr<CudaDevice> device;
  ArenaConfig pool_config;                  // guarded by mu (the limit changes)
  const std::shared_ptr<StatsGroup> group;  // device-wide peaks of all arenas below
  const std::shared_ptr<Arena> arena;       // the default pool; lives for the process

  std::atomic<int> windows_open{0};  // fast check on the allocation path
  // Set by releasePool (which makes no CUDA call): pools whose use count
  // went to 0 are destroyed at the next allocation or emptyCache of the
  // device (settle_released_pools).
  std::atomic<bool> release_due{false};
  lock_order::Mutex<lock_order::kDeviceState> mu;  // guards everything below
  std::map<c10::MempoolId_t, PoolEntry> pools;
  std::vector<Window> windows;
  DeviceStats retired;  // stats of destroyed pools

  // The pool of `id`, created (with a use count of 0) when missing.
  PoolEntry& pool_locked(const c10::MempoolId_t& id);

  // The pool an allocation on `stream` goes to while windows are open, or
  // nullptr for the default arena. The newest matching window wins.
  const Window* route_locked(cudaStream_t stream) const;

  // Every arena changes mode even if one fails (giving back memory held
  // during a capture can raise); the first error is raised afterwards.
  void set_capturing_locked(bool on);

  // Removes pool `id` if its use count is 0, no window is open and it holds
  // no live or pending block; returns its arena for the caller to destroy
  // outside the lock (destruction gives its memory back to the device).
  std::shared_ptr<Arena> take_idle_pool_locked(const c10::MempoolId_t& id);

  // Gives back the cached memory of every pool (or only `only`) that no
  // graph or MemPool uses any more (use count 0; nothing while a window is
  // open), and moves those that hold nothing live to `dead`, for the caller
  // to destroy outside the lock. A pool with live blocks (e.g. a cuBLAS
  // workspace allocated during a capture and kept for the process) keeps
  // only those.
  void release_unused_pools_locked(std::vector<std::shared_ptr<Arena>>* dead,
                                   const c10::MempoolId_t* only = nullptr);

  // Every idle pool (see take_idle_pool_locked), taken out of the device.
  std::vector<std::shared_ptr<Arena>> take_idle_pools_locked();

  // The device's stats: the sum of its arenas and retired pools, with the
  // StatsGroup's peaks. `per_pool`, when given, receives each private
  // pool's reserved bytes.
  DeviceStats stats_locked(std::vector<std::pair<c10::MempoolId_t, StatArray>>* per_pool = nullptr);

  // Applies a reserved-bytes limit (0: none) to every arena of the device.
  void set_limit_locked(std::size_t bytes);

 private:
  std::shared_ptr<Arena> take_if_idle_locked(std::map<c10::MempoolId_t, PoolEntry>::iterator it);
};

}  // namespace renaissance::cuda::detail
