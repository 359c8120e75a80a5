// cuda_allocator.cpp - see cuda_allocator.h for the invariants.
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
#include "torch/no_destructor.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda_device.h"
#include "core/cuda_stream.h"
#include "core/errors.h"
#include "core/lock_order.h"

namespace renaissance::cuda {
namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::MempoolId_t;
using Filter = std::function<bool(cudaStream_t)>;

constexpr MempoolId_t kDefaultPool{0, 0};
constexpr int kMaxDevices = 256;

// --- statistics ------------------------------------------------------------

// Peaks are not summed: the device's StatsGroup has the peaks of the sums.
void add_stat(Stat& into, const Stat& s) {
  into.current += s.current;
  into.allocated += s.allocated;
  into.freed += s.freed;
}

void add_stats(DeviceStats& into, const DeviceStats& s) {
  for_each_stat(add_stat, into, s);
  into.add_counters(s);
}

// Folds the stats of a pool being destroyed: its memory is all given back,
// so everything it allocated counts as freed (its peaks live on in the
// device's StatsGroup).
void retire_stats(DeviceStats& into, const DeviceStats& s) {
  for_each_stat(
      [](Stat& a, const Stat& b) {
        a.allocated += b.allocated;
        a.freed += b.freed + b.current;
      },
      into, s);
  into.add_counters(s);
  into.num_device_free += s.segment[0].current;  // its segments are freed with it
}

void to_c10(c10::CachingAllocator::Stat& out, const Stat& in) {
  out.current = in.current;
  out.peak = in.peak;
  out.allocated = in.allocated;
  out.freed = in.freed;
}

void to_c10(c10::CachingAllocator::StatArray& out, const StatArray& in) {
  for (std::size_t i = 0; i < 3; ++i) to_c10(out[i], in[i]);
}

// DeviceStats::reserved_bytes_by_private_pools exists from PyTorch 2.12 on.
template <typename T, typename = void>
struct HasPoolReserved : std::false_type {};
template <typename T>
struct HasPoolReserved<T, std::void_t<decltype(std::declval<T&>().reserved_bytes_by_private_pools)>>
    : std::true_type {};

template <typename Stats>
void set_pool_reserved(Stats& out, const MempoolId_t& id, const StatArray& reserved) {
  if constexpr (HasPoolReserved<Stats>::value) {
    to_c10(out.reserved_bytes_by_private_pools[id], reserved);
  } else {
    (void)out, (void)id, (void)reserved;
  }
}

// --- per-device state --------------------------------------------------------

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
  MempoolId_t id;
  Filter filter;
};

class DeviceState {
 public:
  DeviceState(int index, ArenaConfig config)
      : index(index),
        device(std::make_shared<CudaDevice>(index)),
        pool_config(pool_config_of(config)),
        group(std::make_shared<StatsGroup>()),
        arena(std::make_shared<Arena>(device, config, group)) {}

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
  std::map<MempoolId_t, PoolEntry> pools;
  std::vector<Window> windows;
  DeviceStats retired;  // stats of destroyed pools

  // The pool of `id`, created (with a use count of 0) when missing.
  PoolEntry& pool_locked(const MempoolId_t& id) {
    auto it = pools.find(id);
    if (it != pools.end()) return it->second;
    PoolEntry p;
    p.arena = std::make_shared<Arena>(device, pool_config, group);
    if (!windows.empty()) p.arena->set_capturing(true);
    return pools.emplace(id, std::move(p)).first->second;
  }

  // The pool an allocation on `stream` goes to while windows are open, or
  // nullptr for the default arena. The newest matching window wins.
  const Window* route_locked(cudaStream_t stream) const {
    for (auto it = windows.rbegin(); it != windows.rend(); ++it) {
      if (it->filter && it->filter(stream)) return &*it;
    }
    return nullptr;
  }

  // Every arena changes mode even if one fails (giving back memory held
  // during a capture can raise); the first error is raised afterwards.
  void set_capturing_locked(bool on) {
    std::exception_ptr first;
    auto apply = [&](Arena& a) {
      try {
        a.set_capturing(on);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    };
    apply(*arena);
    for (auto& [id, p] : pools) apply(*p.arena);
    if (first) std::rethrow_exception(first);
  }

  // Removes pool `id` if its use count is 0, no window is open and it holds
  // no live or pending block; returns its arena for the caller to destroy
  // outside the lock (destruction gives its memory back to the device).
  std::shared_ptr<Arena> take_idle_pool_locked(const MempoolId_t& id) {
    auto it = pools.find(id);
    return it == pools.end() ? nullptr : take_if_idle_locked(it);
  }

  // Gives back the cached memory of every pool (or only `only`) that no
  // graph or MemPool uses any more (use count 0; nothing while a window is
  // open), and moves those that hold nothing live to `dead`, for the caller
  // to destroy outside the lock. A pool with live blocks (e.g. a cuBLAS
  // workspace allocated during a capture and kept for the process) keeps
  // only those.
  void release_unused_pools_locked(std::vector<std::shared_ptr<Arena>>* dead,
                                   const MempoolId_t* only = nullptr) {
    if (!windows.empty()) return;
    for (auto it = pools.begin(); it != pools.end();) {
      auto next = std::next(it);
      if ((!only || it->first == *only) && it->second.use_count <= 0) {
        it->second.arena->empty_cache();
        if (auto a = take_if_idle_locked(it)) dead->push_back(std::move(a));
      }
      it = next;
    }
  }

  std::vector<std::shared_ptr<Arena>> take_idle_pools_locked() {
    std::vector<std::shared_ptr<Arena>> dead;
    for (auto it = pools.begin(); it != pools.end();) {
      auto next = std::next(it);
      if (auto a = take_if_idle_locked(it)) dead.push_back(std::move(a));
      it = next;
    }
    return dead;
  }

  // `per_pool`, when given, receives each private pool's reserved bytes.
  DeviceStats stats_locked(std::vector<std::pair<MempoolId_t, StatArray>>* per_pool = nullptr) {
    DeviceStats s = arena->stats();
    for (auto& [id, p] : pools) {
      const DeviceStats ps = p.arena->stats();
      if (per_pool) per_pool->emplace_back(id, ps.reserved_bytes);
      add_stats(s, ps);
    }
    add_stats(s, retired);
    const DeviceStats totals = group->totals();
    for_each_stat([](Stat& a, const Stat& t) { a.peak = std::max(t.peak, a.current); }, s, totals);
    return s;
  }

  // Applies a reserved-bytes limit (0: none) to every arena of the device.
  void set_limit_locked(std::size_t bytes) {
    pool_config.max_reserved_bytes = bytes;
    arena->set_max_reserved_bytes(bytes);
    for (auto& [id, p] : pools) p.arena->set_max_reserved_bytes(bytes);
  }

 private:
  std::shared_ptr<Arena> take_if_idle_locked(std::map<MempoolId_t, PoolEntry>::iterator it) {
    if (it->second.use_count > 0 || !windows.empty()) return nullptr;
    Arena& a = *it->second.arena;
    DeviceStats s = a.stats();
    if (s.pending_bytes.current > 0) {
      a.sync_point();  // pending blocks whose streams are done become free
      s = a.stats();
    }
    if (s.allocated_bytes[0].current > 0 || s.pending_bytes.current > 0) return nullptr;
    retire_stats(retired, s);
    std::shared_ptr<Arena> dead = std::move(it->second.arena);
    pools.erase(it);
    return dead;
  }

  static ArenaConfig pool_config_of(ArenaConfig c) {
    c.planning = false;  // private pools serve captures and scopes, not steps
    return c;
  }
};

// --- pointer table -------------------------------------------------------------

struct Owner {
  Arena* arena = nullptr;
  MempoolId_t pool = kDefaultPool;
  int device = -1;
};

class PointerTable {
 public:
  void insert(void* p, const Owner& o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    s.map[p] = o;
  }
  bool take(void* p, Owner* o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    *o = it->second;
    s.map.erase(it);
    return true;
  }
  bool find(const void* p, Owner* o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    *o = it->second;
    return true;
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct Shard {
    lock_order::Mutex<lock_order::kLeaf> mu;
    std::unordered_map<const void*, Owner> map;
  };
  Shard& shard(const void* p) {
    const auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) >> 9);
    return shards_[(a * 0x9E3779B97F4A7C15ULL) >> 60];
  }
  std::array<Shard, kShards> shards_;
};

// --- registry --------------------------------------------------------------------

class RenaissanceCudaAllocator;

struct Registry {
  lock_order::Mutex<lock_order::kRegistry> mu;
  ArenaConfig config;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices{};
  std::vector<std::unique_ptr<DeviceState>> owned;
  std::map<int, double> fractions;  // set_per_process_memory_fraction, by device
  std::shared_ptr<RenaissanceCudaAllocator> allocator;  // set by install()
  PointerTable pointers;
  lock_order::Mutex<lock_order::kLeaf> observers_mu;
  std::vector<CCA::OutOfMemoryObserver> oom_observers;
};

Registry& registry() {
  static NoDestructor<Registry> r;
  return r.get();
}

DeviceState* find_state(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return registry().devices[device].load(std::memory_order_acquire);
}

// The reserved-bytes limit of a device: the install limit (0: none) and
// fraction * total memory, whichever is smaller.
std::size_t effective_limit(std::size_t install_limit, double fraction, std::size_t total) {
  const auto limit = std::max<std::size_t>(
      static_cast<std::size_t>(fraction * static_cast<double>(total)), 1);
  return install_limit == 0 ? limit : std::min(install_limit, limit);
}

// The state of `device`, created on first use. Raises DeviceError.
DeviceState& state(int device) {
  if (DeviceState* s = find_state(device)) return *s;
  if (device < 0 || device >= kMaxDevices) {
    throw DeviceError("torch_renaissance: invalid CUDA device index " + std::to_string(device));
  }
  Registry& r = registry();
  DeviceState* s = nullptr;
  {
    std::lock_guard g(r.mu);
    if (DeviceState* known = r.devices[device].load(std::memory_order_acquire)) return *known;
    ArenaConfig config = r.config;
    auto f = r.fractions.find(device);
    if (f != r.fractions.end()) {
      const std::size_t total = CudaDevice(device).mem_info().total_bytes;
      config.max_reserved_bytes = effective_limit(config.max_reserved_bytes, f->second, total);
    }
    // The arena's first use of the device probes its virtual memory: with
    // the device made current the way PyTorch does it, so that CudaDevice's
    // own guard switches nothing (switching back with cudaSetDevice would
    // put a context on the caller's device).
    std::optional<DeviceScope> scope;
    if (device < CudaDevice::device_count()) scope.emplace(static_cast<DeviceIndex>(device));
    r.owned.push_back(std::make_unique<DeviceState>(device, config));
    s = r.owned.back().get();
    r.devices[device].store(s, std::memory_order_release);
  }
  // Once per device (its state is made once), outside the lock: the
  // warning handler may run Python.
  if (const std::string refused = s->device->vmm_refusal(); !refused.empty()) {
    TORCH_WARN(refused);
  }
  return *s;
}

template <typename F>
void for_each_state(F f) {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (DeviceState* s = find_state(i)) f(*s);
  }
}

// --- errors -------------------------------------------------------------------

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

// --- allocation and free ----------------------------------------------------------

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

// Reports an error that must not escape (a destructor's call, a deferred
// clean-up) on stderr, once per process and kind.
void report_once(std::atomic<bool>& said, const char* what, const char* error) {
  if (said.exchange(true)) return;
  std::fprintf(stderr, "torch_renaissance: %s: %s (reported once; the work is retried later)\n",
               what, error);
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
    c10::CachingDeviceAllocator::DeviceStats out;
    DeviceState* s = find_state(device);
    if (!s) return out;
    DeviceStats st;
    std::vector<std::pair<MempoolId_t, StatArray>> per_pool;
    {
      std::lock_guard g(s->mu);
      st = s->stats_locked(&per_pool);
    }
    to_c10(out.allocation, st.allocation);
    to_c10(out.segment, st.segment);
    to_c10(out.active, st.active);
    to_c10(out.inactive_split, st.inactive_split);
    to_c10(out.allocated_bytes, st.allocated_bytes);
    to_c10(out.reserved_bytes, st.reserved_bytes);
    to_c10(out.active_bytes, st.active_bytes);
    to_c10(out.inactive_split_bytes, st.inactive_split_bytes);
    to_c10(out.requested_bytes, st.requested_bytes);
    to_c10(out.oversize_allocations, st.oversize_allocations);
    to_c10(out.oversize_segments, st.oversize_segments);
    out.num_alloc_retries = st.num_alloc_retries;
    out.num_ooms = st.num_ooms;
    out.num_sync_all_streams = st.num_sync_all_streams;
    out.num_device_alloc = st.num_device_alloc;
    out.num_device_free = st.num_device_free;
    out.max_split_size = -1;  // no limit: every block may be split (PyTorch's default reads so)
    for (auto& [id, reserved] : per_pool) set_pool_reserved(out, id, reserved);
    return out;
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
        for (const auto& seg : a->snapshot()) out.segments.push_back(segment_to_c10(seg, s.index, id));
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

  static c10::CachingDeviceAllocator::SegmentInfo segment_to_c10(const SegmentInfo& seg, int device,
                                                         const MempoolId_t& pool) {
    c10::CachingDeviceAllocator::SegmentInfo si;
    si.device = static_cast<DeviceIndex>(device);
    si.address = seg.address;
    si.total_size = seg.total_size;
    si.requested_size = seg.requested_size;
    si.allocated_size = seg.allocated_size;
    si.active_size = seg.active_size;
    si.stream = to_stream(seg.stream);
    si.is_large = seg.is_large;
    si.is_expandable = seg.expandable;
    si.owner_private_pool_id = pool;
    si.blocks.reserve(seg.blocks.size());
    for (const BlockInfo& b : seg.blocks) {  // they tile the segment in address order
      c10::CachingDeviceAllocator::BlockInfo bi;
      bi.size = b.size;
      bi.requested_size = b.requested;
      bi.allocated = b.state == BlockState::kAllocated;
      bi.active = b.state != BlockState::kFree;
      si.blocks.push_back(std::move(bi));
    }
    return si;
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

// --- the plain path: C functions for torch.cuda.memory.CUDAPluggableAllocator ---------

#define TR_EXPORT extern "C" __attribute__((visibility("default")))

// void* alloc(ssize_t size, int device, cudaStream_t stream). Raises
// torch.OutOfMemoryError (a C++ exception through PyTorch's caller): for
// torch.cuda.memory.change_current_allocator, whose callers do not check for
// nullptr.
TR_EXPORT void* torch_renaissance_cuda_malloc(ssize_t size, int device, cudaStream_t stream) {
  TORCH_CHECK(size >= 0, "torch_renaissance: negative allocation size ", size);
  return renaissance::cuda::malloc_on(static_cast<std::size_t>(size), device, stream);
}

// The same, returning nullptr when out of memory: for a torch.cuda.MemPool
// over PyTorch's allocator, which treats nullptr as "out of memory", frees
// its own cached blocks and retries before it raises.
TR_EXPORT void* torch_renaissance_cuda_malloc_or_null(ssize_t size, int device,
                                                      cudaStream_t stream) {
  TORCH_CHECK(size >= 0, "torch_renaissance: negative allocation size ", size);
  try {
    return renaissance::cuda::malloc_on(static_cast<std::size_t>(size), device, stream);
  } catch (const c10::OutOfMemoryError&) {
    return nullptr;
  }
}

// void free(void* ptr, ssize_t size, int device, cudaStream_t stream).
TR_EXPORT void torch_renaissance_cuda_free(void* ptr, ssize_t /*size*/, int /*device*/,
                                           cudaStream_t /*stream*/) {
  renaissance::cuda::delete_cuda(ptr);
}

// For CUDAPluggableAllocator.set_record_stream_fn: void(void*, cudaStream_t).
TR_EXPORT void torch_renaissance_cuda_record_stream(void* ptr, cudaStream_t stream) {
  try {
    renaissance::cuda::record_stream_on(ptr, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_renaissance: record_stream failed: %s\n", e.what());
  }
}

// For CUDAPluggableAllocator.set_reset_fn: void().
TR_EXPORT void torch_renaissance_cuda_empty_cache() {
  try {
    renaissance::cuda::empty_cache_all(renaissance::cuda::kDefaultPool);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_renaissance: empty_cache failed: %s\n", e.what());
  }
}
