// cuda_allocator.cpp - the CUDAAllocator subclass behind torch.cuda and the
// public API of cuda_allocator.h (see there for the invariants). The glue is
// one concept a file:
//   cuda_stats.*          our stats and snapshot segments in c10's shapes;
//   cuda_pools.*          one device's arenas: default arena, private pools,
//                         beginAllocateToPool windows;
//   cuda_pointer_table.h  which arena handed out each live pointer;
//   cuda_registry.*       process-wide state: device states, config,
//                         fractions, observers;
//   cuda_malloc.*         the allocation path (routing, OOM ladder, frees);
//   cuda_allocator.cpp    this file: PyTorch's CUDAAllocator interface;
//   cuda_pluggable.cpp    the C symbols for CUDAPluggableAllocator.
//
// Lock order (core/lock_order.h; checked at run time in builds with
// TR_LOCK_ORDER_CHECK, which make check-cuda's fake-CUDA tests use). A
// thread takes locks only in this order, never two of one level:
//   1. the registry (Registry::mu): device states, install, fractions;
//   2. a device state (DeviceState::mu): its pools, windows, retired stats;
//   3. an arena (Arena::mu_, inside every Arena call);
//   4. the device's stats group (StatsGroup::mu_, inside Arena calls);
//   leaves, last, with nothing taken under them: a pointer-table shard
//   (PointerTable::Shard::mu), the OOM observer list (Registry::observers_mu)
//   and CudaDevice's handle table.
// So: no arena call while a shard or the observer list is held; no glue
// lock from code the arena calls back (observers and warnings run with no
// lock held); a device state is never locked while an arena is.
//
// Compiles against PyTorch 2.11 and 2.13 (the CUDAAllocator interface
// differs between them: 2.13 adds pure virtual attachOomRejectionObserver,
// which the method below overrides by signature where it exists, and more
// fields in DeviceStats / AllocatorConfigInfo, which are left at their
// defaults).
#include "torch/cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_device.h"
#include "core/cuda_stream.h"
#include "core/errors.h"
#include "torch/cuda_malloc.h"
#include "torch/cuda_registry.h"
#include "torch/cuda_stats.h"

namespace renaissance::cuda {
using namespace detail;

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::MempoolId_t;

// --- the CUDAAllocator -----------------------------------------------------------

class RenaissanceCudaAllocator final : public CCA::CUDAAllocator {
 public:
  c10::DataPtr allocate(size_t size) override {
    DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* p = malloc_on(size, device, stream);
    return {p, p, &delete_cuda, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_cuda; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  void* raw_alloc(size_t nbytes) override {
    DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc_on(nbytes, device, stream);
  }
  void raw_delete(void* ptr) override {
    try {
      free_pointer(ptr, true);
    } catch (const InvalidPointerError& e) {
      TORCH_CHECK(false, e.what());
    }
  }

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_.store(true, std::memory_order_release);
  }
  bool initialized() override { return initialized_.load(std::memory_order_acquire); }

  double getMemoryFraction(DeviceIndex device) override {
    Registry& r = registry();
    std::lock_guard g(r.mu);
    auto it = r.fractions.find(device);
    return it == r.fractions.end() ? 1.0 : it->second;
  }
  void setMemoryFraction(double fraction, DeviceIndex device) override {
    // As in PyTorch, the limit applies from now on: memory reserved beyond
    // it stays until freed and emptied, and growth past it is refused.
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "invalid fraction: ", fraction,
                ". Please set within [0, 1].");
    // The registry's lock is held throughout, so that concurrent calls
    // leave the stored fraction and the applied limit in agreement.
    Registry& r = registry();
    std::lock_guard g(r.mu);
    DeviceState* s = find_state(device);
    if (s) {
      DeviceScope scope(device);
      std::size_t total = 0;
      try {
        total = s->device->mem_info().total_bytes;
      } catch (const std::exception& e) {
        TORCH_CHECK(false, e.what());
      }
      std::lock_guard gs(s->mu);
      s->set_limit_locked(effective_limit(r.config.max_reserved_bytes, fraction, total));
    }
    r.fractions[device] = fraction;
  }

  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex device) override {
    std::vector<CCA::StreamSegmentSize> out;
    if (DeviceState* s = find_state(device)) {
      for (const auto& seg : s->arena->snapshot()) {
        if (seg.expandable) out.emplace_back(to_stream(seg.stream), !seg.is_large, seg.total_size);
      }
    }
    return out;
  }

  void emptyCache(MempoolId_t mempool_id) override {
    if (mempool_id == kDefaultPool) {
      empty_cache_all(mempool_id);
      return;
    }
    // A pool's id comes from ~MemPool (after releasePool), a destructor:
    // nothing may escape; what fails is retried at the next allocation.
    static std::atomic<bool> said{false};
    try {
      empty_cache_all(mempool_id);
    } catch (const std::exception& e) {
      for_each_state([](DeviceState& s) { s.release_due.store(true, std::memory_order_release); });
      report_once(said, "emptying a released MemPool failed", e.what());
    } catch (...) {
      for_each_state([](DeviceState& s) { s.release_due.store(true, std::memory_order_release); });
      report_once(said, "emptying a released MemPool failed", "unknown error");
    }
  }
  void enable(bool value) override {
    if (!value) {
      TORCH_WARN_ONCE("torch_renaissance always caches CUDA memory (its arenas are the cache): "
                      "caching_allocator_enable(False) / PYTORCH_NO_CUDA_MEMORY_CACHING change "
                      "nothing; use PyTorch's allocator to run without caching (e.g. under "
                      "compute-sanitizer)");
    }
    enabled_ = value;
  }
  bool isEnabled() const override { return enabled_; }

  void cacheInfo(DeviceIndex device, size_t* largestBlock) override {
    // cuDNN sizes its benchmark workspaces with this: the largest block we
    // could hand out without asking the device, or failing that, what the
    // device has free (an expandable segment can grow into it).
    DeviceState& s = checked_state(device);
    DeviceScope scope(device);
    std::size_t best = 0;
    {
      std::lock_guard g(s.mu);
      best = s.arena->largest_free_block();
      for (auto& [id, p] : s.pools) best = std::max(best, p.arena->largest_free_block());
    }
    if (*largestBlock == 0) {
      try {
        *largestBlock = s.device->mem_info().free_bytes;
      } catch (const std::exception& e) {
        TORCH_CHECK(false, e.what());
      }
    }
    *largestBlock = std::max(*largestBlock, best);
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    Owner o;
    TORCH_CHECK(registry().pointers.find(ptr, &o), "torch_renaissance: ", ptr,
                " is not a live allocation of the CUDA allocator");
    if (size) *size = o.arena->block_size(ptr);
    return ptr;
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &delete_cuda) return;  // not ours
    record_stream_on(ptr.get(), stream.stream());
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex device) override {
    DeviceState* s = find_state(device);
    if (!s) return {};
    DeviceStats st;
    std::vector<std::pair<MempoolId_t, StatArray>> per_pool;
    {
      std::lock_guard g(s->mu);
      st = s->stats_locked(&per_pool);
    }
    return to_c10(st, per_pool);
  }
  void resetAccumulatedStats(DeviceIndex device) override {
    if (DeviceState* s = find_state(device)) {
      std::lock_guard g(s->mu);
      s->arena->reset_accumulated_stats();
      for (auto& [id, p] : s->pools) p.arena->reset_accumulated_stats();
      s->retired.reset_accumulated();
    }
  }
  void resetPeakStats(DeviceIndex device) override {
    if (DeviceState* s = find_state(device)) {
      std::lock_guard g(s->mu);
      s->arena->reset_peak_stats();
      for (auto& [id, p] : s->pools) p.arena->reset_peak_stats();
      s->retired.reset_peak();
      s->group->reset_peak();
    }
  }

  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool /*include_traces*/) override {
    CCA::SnapshotInfo out;
    int devices = 0;
    for_each_state([&](DeviceState& s) {
      devices = std::max(devices, s.index + 1);
      std::vector<std::pair<MempoolId_t, std::shared_ptr<Arena>>> arenas;
      {
        std::lock_guard g(s.mu);
        if (mempool_id == kDefaultPool) arenas.emplace_back(kDefaultPool, s.arena);
        for (auto& [id, p] : s.pools) {
          if (mempool_id == kDefaultPool || id == mempool_id) arenas.emplace_back(id, p.arena);
        }
      }
      for (auto& [id, a] : arenas) {
        for (const auto& seg : a->snapshot()) out.segments.push_back(to_c10(seg, s.index, id));
      }
    });
    out.device_traces.resize(static_cast<std::size_t>(std::max(devices, device_count_)));
    out.config_metadata = config_info();
    return out;
  }

  // CUDA graphs and MemPools --------------------------------------------------
  void beginAllocateToPool(DeviceIndex device, MempoolId_t mempool_id, Filter filter) override {
    DeviceState& s = checked_state(device);
    std::lock_guard g(s.mu);
    ++s.pool_locked(mempool_id).use_count;
    s.windows.push_back(Window{mempool_id, std::move(filter)});
    if (s.windows.size() == 1) s.set_capturing_locked(true);
    s.windows_open.store(static_cast<int>(s.windows.size()), std::memory_order_release);
  }
  void endAllocateToPool(DeviceIndex device, MempoolId_t mempool_id) override {
    DeviceState& s = checked_state(device);
    DeviceScope scope(device);  // leaving capture mode may give memory back
    std::vector<std::shared_ptr<Arena>> dead;
    std::lock_guard g(s.mu);
    for (auto it = s.windows.rbegin(); it != s.windows.rend(); ++it) {
      if (it->id == mempool_id) {
        s.windows.erase(std::next(it).base());
        break;
      }
    }
    s.windows_open.store(static_cast<int>(s.windows.size()), std::memory_order_release);
    if (s.windows.empty()) {
      try {
        s.set_capturing_locked(false);
      } catch (const DeviceError& e) {
        TORCH_CHECK(false, e.what());
      }
      // Pools released during the capture (e.g. a re-captured graph's old
      // pool whose outputs were overwritten) can go now.
      dead = s.take_idle_pools_locked();
    }
  }
  // PyTorch calls this from ~CUDAGraph and ~MemPool, destructors that must
  // not throw. As PyTorch's own releasePool, it makes no CUDA call: it only
  // drops a use; a pool nobody uses any more is destroyed at the next
  // allocation or emptyCache of the device (its blocks freed with a stream
  // use need event queries, and destroying it gives memory back). Nothing
  // escapes (a failure is reported on stderr once).
  void releasePool(DeviceIndex device, MempoolId_t mempool_id) noexcept override {
    static std::atomic<bool> said{false};
    try {
      DeviceState* s = find_state(device);
      if (!s) return;
      std::lock_guard g(s->mu);
      auto it = s->pools.find(mempool_id);
      if (it == s->pools.end()) return;
      if (it->second.use_count > 0) --it->second.use_count;
      if (it->second.use_count == 0) s->release_due.store(true, std::memory_order_release);
    } catch (const std::exception& e) {
      report_once(said, "releasePool failed", e.what());
    } catch (...) {
      report_once(said, "releasePool failed", "unknown error");
    }
  }
  int getPoolUseCount(DeviceIndex device, MempoolId_t mempool_id) override {
    DeviceState* s = find_state(device);
    if (!s) return 0;
    std::lock_guard g(s->mu);
    auto it = s->pools.find(mempool_id);
    return it == s->pools.end() ? 0 : it->second.use_count;
  }
  void createOrIncrefPool(DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator || allocator.get() == this,
                "torch_renaissance serves torch.cuda.MemPool itself: a MemPool with its own "
                "allocator (", allocator ? allocator->name() : std::string(),
                ") is not supported while torch_renaissance is installed for CUDA");
    DeviceState& s = checked_state(device);
    std::lock_guard g(s.mu);
    ++s.pool_locked(mempool_id).use_count;
  }
  // MemPool(use_on_oom=True): its free blocks serve allocations outside it
  // that would otherwise fail (see borrow_from_pools).
  void setUseOnOOM(DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    DeviceState* s = find_state(device);
    if (!s) return;
    std::lock_guard g(s->mu);
    auto it = s->pools.find(mempool_id);
    if (it != s->pools.end()) it->second.use_on_oom = use_on_oom;
  }
  void setNoSplit(DeviceIndex, MempoolId_t) override {}         // blocks are split as usual

  // Not supported -------------------------------------------------------------
  CCA::ShareableHandle shareIpcHandle(void*) override {
    TORCH_CHECK(false, "torch_renaissance does not support CUDA IPC (sharing CUDA tensors "
                       "between processes); use PyTorch's allocator for that process");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "torch_renaissance does not support CUDA IPC (opening CUDA tensors "
                       "shared by another process); use PyTorch's allocator for that process");
  }
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(DeviceIndex, MempoolId_t) override {
    TORCH_CHECK(false, "torch_renaissance does not support allocator checkpoints (the CUDA "
                       "graph trees of torch.compile mode='reduce-overhead' or 'max-autotune'); "
                       "set torch._inductor.config.triton.cudagraph_trees = False (plain CUDA "
                       "graphs work), or capture with torch.cuda.graph");
  }
  CCA::CheckpointDelta setCheckpointPoolState(DeviceIndex,
                                              std::shared_ptr<CCA::AllocatorState>) override {
    TORCH_CHECK(false, "torch_renaissance does not support allocator checkpoints (the CUDA "
                       "graph trees of torch.compile mode='reduce-overhead' or 'max-autotune'); "
                       "set torch._inductor.config.triton.cudagraph_trees = False");
  }

  // History and observers -------------------------------------------------------
  void recordHistory(bool enabled, CCA::CreateContextFn, size_t, CCA::RecordContext, bool,
                     const std::vector<std::string>&) override {
    if (enabled) {
      TORCH_WARN_ONCE("torch_renaissance records no allocation history: memory snapshots show "
                      "its segments and blocks, without stack traces or a trace of events");
    }
  }
  bool isHistoryEnabled() override { return false; }  // recordHistory records nothing
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    Registry& r = registry();
    std::lock_guard g(r.observers_mu);
    r.oom_observers.push_back(std::move(observer));
  }
  // Overrides CUDAAllocator::attachOomRejectionObserver where it exists
  // (PyTorch >= 2.12); we never reject an allocation ahead of trying it.
  virtual void attachOomRejectionObserver(
      std::function<void(int64_t, size_t, size_t, size_t)> /*observer*/) {}
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker) override {
    // ProcessGroupNCCL's buffer-registration hooks (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK)
    // attach here and expect segment events, which we do not emit.
    TORCH_WARN_ONCE("torch_renaissance emits no allocator trace events: trackers attached with "
                    "attachAllocatorTraceTracker (e.g. NCCL's tensor-registration hook) are "
                    "never called");
  }

  // Copies ------------------------------------------------------------------------
  // `dev` may read and write memory of `dev_to_access`: enables peer access
  // and, as PyTorch's addPeerAccess does for expandable segments, grants
  // `dev` access to what our address ranges on `dev_to_access` map, now and
  // later (memory mapped with cuMemMap is not covered by
  // cudaDeviceEnablePeerAccess).
  void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
    {
      c10::cuda::CUDAGuard guard(dev);
      const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        C10_CUDA_CHECK(err);
      }
    }
    try {
      DeviceScope scope(dev_to_access);
      checked_state(dev_to_access).device->add_peer_access(dev);
    } catch (const DeviceError& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // Memory mapped with cuMemMap is reachable from another device only with
    // peer access; without it the peer copy routes through the host.
    if (p2p_enabled || dstDevice == srcDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }
  std::string name() override { return "torch_renaissance"; }

 private:
  static DeviceState& checked_state(DeviceIndex device) {
    try {
      return state(device);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, e.what());
    }
  }

  static CCA::AllocatorConfigInfo config_info() {
    CCA::AllocatorConfigInfo info{};
    Registry& r = registry();
    std::lock_guard g(r.mu);
    info.garbage_collection_threshold = 0.0;
    info.max_split_size = std::numeric_limits<std::size_t>::max();
    info.expandable_segments = r.config.expandable_segments;
    info.last_allocator_settings = "torch_renaissance";
    return info;
  }

  std::atomic<bool> initialized_{false};
  int device_count_ = 0;
  bool enabled_ = true;
};

}  // namespace

// --- public API ---------------------------------------------------------------------

bool configure(const ArenaConfig& config) {
  Registry& r = registry();
  std::lock_guard g(r.mu);
  if (!r.owned.empty()) return false;
  r.config = config;
  return true;
}

void install(const ArenaConfig& config) {
  Registry& r = registry();
  std::unique_lock g(r.mu);
  if (r.allocator) return;
  CCA::CUDAAllocator* current = CCA::allocator.load();
  if (current && current->initialized()) {
    throw std::runtime_error(
        "torch_renaissance.install('cuda') must run before CUDA is initialized: PyTorch's CUDA "
        "allocator ('" + current->name() + "') is already in use in this process. Call "
        "torch_renaissance.install('cuda') before the first CUDA tensor (and before calls that "
        "initialize CUDA, like torch.cuda.current_device()), or set TORCH_RENAISSANCE=1 and "
        "`import torch_renaissance.auto` at the top of the program. Nothing was changed: "
        "existing CUDA tensors stay valid.");
  }
  if (r.owned.empty()) r.config = config;
  if (const char* v = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING"); v && std::string(v) != "0") {
    TORCH_WARN("torch_renaissance always caches CUDA memory: PYTORCH_NO_CUDA_MEMORY_CACHING is "
               "ignored once it is installed");
  }
  auto allocator = std::make_shared<RenaissanceCudaAllocator>();
  g.unlock();
  // torch.cuda reads CUDACachingAllocator::allocator; torch.accelerator and
  // generic storage creation read c10::GetAllocator(kCUDA), which PyTorch's
  // changeCurrentAllocator does not update (checked against 2.11): set both.
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
  if (c10::GetAllocator(c10::DeviceType::CUDA) != allocator.get()) {
    TORCH_WARN("torch_renaissance: another CUDA allocator holds c10::GetAllocator(kCUDA) at a "
               "higher priority; torch.accelerator's memory statistics will not be ours");
  }
  g.lock();
  r.allocator = std::move(allocator);
}

bool installed() {
  Registry& r = registry();
  std::lock_guard g(r.mu);
  return r.allocator != nullptr;
}

std::shared_ptr<Arena> arena(int device) { return state(device).arena; }

std::string vmm_status(int device) { return state(device).device->vmm_status(); }

int private_pool_count(int device) {
  DeviceState* s = find_state(device);
  if (!s) return 0;
  std::lock_guard g(s->mu);
  return static_cast<int>(s->pools.size());
}

}  // namespace renaissance::cuda
