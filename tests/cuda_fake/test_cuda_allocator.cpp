// test_cuda_allocator.cpp - the torch glue (csrc/torch/cuda_allocator.cpp)
// driven through PyTorch's CUDAAllocator interface, as PyTorch calls it, on
// the fake CUDA runtime and the fake libc10_cuda: no GPU and no CUDA build of
// PyTorch needed. Built, linked (against the installed torch's libc10) and
// run by tools/check_cuda_build.py (make check-cuda, CI).
//
// The glue's registry lives for the process, so the cases run in order in
// one process, each leaving nothing allocated behind; expected values are
// computed here from the sizes each case allocates.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "fake_cuda.h"
#include "core/lock_order.h"
#include "torch/cuda_allocator.h"

extern "C" void* torch_renaissance_cuda_malloc(ssize_t size, int device, cudaStream_t stream);
extern "C" void* torch_renaissance_cuda_malloc_or_null(ssize_t size, int device, cudaStream_t stream);
extern "C" void torch_renaissance_cuda_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;

constexpr std::int64_t MiB = std::int64_t(1) << 20;
constexpr MempoolId_t kDefault{0, 0};

CCA::CUDAAllocator* alloc() { return CCA::allocator.load(); }

c10::CachingDeviceAllocator::DeviceStats stats(int device = 0) {
  return alloc()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
}
std::int64_t allocated(int device = 0) { return stats(device).allocated_bytes[0].current; }
std::int64_t reserved(int device = 0) { return stats(device).reserved_bytes[0].current; }

c10::cuda::CUDAStream stream_of(std::uintptr_t id, int device = 0) {
  return c10::cuda::CUDAStream(
      c10::cuda::CUDAStream::UNCHECKED,
      c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)),
                  static_cast<c10::StreamId>(id)));
}
constexpr std::uintptr_t kSide = 0x5100;
cudaStream_t side() { return reinterpret_cast<cudaStream_t>(kSide); }

void check_clean() {
  CHECK_EQ(allocated(0), std::int64_t(0));
  CHECK_EQ(static_cast<int>(cudaGetLastError()), 0);
}

// A window that routes every stream to `id` (PyTorch's capture filter for
// the capturing stream, or use_mem_pool's for the current one).
void begin(MempoolId_t id) {
  alloc()->beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
}

// --- cases --------------------------------------------------------------------------

void test_install() {
  CHECK(alloc() == nullptr);
  renaissance::cuda::install(renaissance::ArenaConfig{});
  CHECK(alloc() != nullptr);
  CHECK(alloc()->name() == "torch_renaissance");
  CHECK(renaissance::cuda::installed());
  // torch.accelerator reads c10::GetAllocator(kCUDA): ours too.
  CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == static_cast<c10::Allocator*>(alloc()));
  CHECK(!alloc()->initialized());
  alloc()->init(3);  // what CUDAHooks::init does
  CHECK(alloc()->initialized());
  auto* before = alloc();
  renaissance::cuda::install(renaissance::ArenaConfig{});  // a no-op now
  CHECK(alloc() == before);
  CHECK(renaissance::cuda::vmm_status(0) == "on (granularity 2.00 MiB)");
}

// The GPU test's numbers: 3 x 64 MiB, one freed -> 128 MiB now, 192 MiB peak.
void test_stats() {
  std::vector<c10::DataPtr> ptrs;
  for (int i = 0; i < 3; ++i) ptrs.push_back(alloc()->allocate(64 * MiB));
  CHECK(ptrs[0].device() == c10::Device(c10::DeviceType::CUDA, 0));
  ptrs.pop_back();
  auto s = stats();
  CHECK_EQ(s.allocated_bytes[0].current, 128 * MiB);
  CHECK_EQ(s.allocated_bytes[0].peak, 192 * MiB);
  CHECK_EQ(s.allocation[0].current, std::int64_t(2));
  CHECK_EQ(s.reserved_bytes[0].current, fake_cuda::counters().used_bytes);
  // torch.accelerator's path: c10::GetAllocator(kCUDA) as a DeviceAllocator.
  auto* dev_alloc = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
  CHECK(dev_alloc != nullptr);
  CHECK_EQ(dev_alloc->getDeviceStats(0).allocated_bytes[0].current, 128 * MiB);
  alloc()->resetPeakStats(0);
  CHECK_EQ(stats().allocated_bytes[0].peak, 128 * MiB);
  alloc()->resetAccumulatedStats(0);
  CHECK_EQ(stats().allocated_bytes[0].allocated, std::int64_t(0));
  ptrs.clear();
  alloc()->emptyCache(kDefault);
  CHECK_EQ(reserved(), std::int64_t(0));
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

void test_out_of_memory() {
  const auto ooms = stats().num_ooms;
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(1024 * MiB), "CUDA out of memory",
               "Tried to allocate 1024.00 MiB", "GPU 0 has a total capacity of 512.00 MiB");
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(std::size_t(1) << 62), "Tried to allocate");
  CHECK_EQ(stats().num_ooms, ooms + 2);
  void* p = alloc()->raw_alloc(MiB);  // the next normal allocation works
  CHECK(p != nullptr);
  alloc()->raw_delete(p);
  // raw_delete of what we did not hand out: an error, nothing changes.
  int local = 0;
  EXPECT_THROW(c10::Error, alloc()->raw_delete(&local), "did not hand it out");
  EXPECT_THROW(c10::Error, alloc()->raw_delete(p), "already freed");
  // The plain path's two mallocs.
  EXPECT_THROW(c10::OutOfMemoryError, torch_renaissance_cuda_malloc(ssize_t(1) << 40, 0, nullptr),
               "CUDA out of memory");
  CHECK(torch_renaissance_cuda_malloc_or_null(ssize_t(1) << 40, 0, nullptr) == nullptr);
  EXPECT_THROW(c10::Error, torch_renaissance_cuda_malloc_or_null(-1, 0, nullptr), "negative");
  void* q = torch_renaissance_cuda_malloc_or_null(3 * MiB, 0, nullptr);
  CHECK(q != nullptr);
  torch_renaissance_cuda_free(q, 3 * MiB, 0, nullptr);
  check_clean();
}

void test_record_stream() {
  fake_cuda::set_busy(side(), true);
  c10::DataPtr x = alloc()->allocate(16 * MiB);
  void* addr = x.get();
  alloc()->recordStream(x, stream_of(kSide));
  x.clear();  // freed while the side stream may still read it
  c10::DataPtr z = alloc()->allocate(16 * MiB);
  CHECK(z.get() != addr);
  // A DataPtr that is not ours is ignored.
  int local = 0;
  c10::DataPtr foreign(&local, c10::Device(c10::DeviceType::CUDA, 0));
  alloc()->recordStream(foreign, stream_of(kSide));
  fake_cuda::complete(side());
  z.clear();
  renaissance::cuda::arena(0)->sync_point();  // the side stream's event completed
  c10::DataPtr w = alloc()->allocate(16 * MiB);
  CHECK(w.get() == addr);  // x's block is free again: best fit, lowest address
  w.clear();
  fake_cuda::set_busy(side(), false);
  CHECK_EQ(stats().allocated_bytes[0].current, std::int64_t(0));
  alloc()->emptyCache(kDefault);
  check_clean();
}

// A CUDA graph's pool: nothing illegal during the capture; its free blocks
// are the graph's memory while the graph lives, even through ~MemPool.
void test_graph_pool_lifecycle() {
  const MempoolId_t g{1, 0};
  // A default-arena block freed with a pending side-stream use before the capture.
  fake_cuda::set_busy(side(), true);
  c10::DataPtr pending = alloc()->allocate(4 * MiB);
  alloc()->recordStream(pending, stream_of(kSide));
  pending.clear();

  fake_cuda::set_capturing(true);
  begin(g);
  CHECK_EQ(alloc()->getPoolUseCount(0, g), 1);
  void* out = alloc()->raw_alloc(4 * MiB);     // the graph's output: lives on
  void* tmp = alloc()->raw_alloc(32 * MiB);    // an intermediate, freed in the capture
  alloc()->raw_delete(tmp);
  void* tmp2 = alloc()->raw_alloc(32 * MiB);   // reuses it, as replays will
  CHECK(tmp2 == tmp);
  alloc()->raw_delete(tmp2);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 1);
  alloc()->emptyCache(kDefault);  // during the capture: gives nothing back, calls nothing illegal
  alloc()->endAllocateToPool(0, g);
  fake_cuda::set_capturing(false);
  CHECK_EQ(fake_cuda::counters().calls_during_capture, std::int64_t(0));

  const auto pool_reserved = [&] {
    for (auto& seg : alloc()->snapshot(g, false).segments) {
      if (seg.owner_private_pool_id == g) return true;
    }
    return false;
  };
  const auto used = fake_cuda::counters().used_bytes;
  alloc()->emptyCache(kDefault);  // the graph lives: its pool keeps everything
  CHECK(pool_reserved());
  CHECK(fake_cuda::accessible(tmp, 32 * MiB));
  // A MemPool that shares the graph's pool, then is destroyed
  // (createOrIncrefPool ... releasePool + emptyCache(id)).
  alloc()->createOrIncrefPool(0, g, nullptr);
  CHECK_EQ(alloc()->getPoolUseCount(0, g), 2);
  alloc()->releasePool(0, g);
  alloc()->emptyCache(g);
  CHECK(fake_cuda::accessible(tmp, 32 * MiB));  // still the graph's memory
  CHECK_EQ(alloc()->getPoolUseCount(0, g), 1);
  // The graph is reset: its pool goes once its output is freed.
  alloc()->releasePool(0, g);
  CHECK_EQ(alloc()->getPoolUseCount(0, g), 0);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 1);  // `out` is still live
  alloc()->raw_delete(out);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  CHECK(fake_cuda::counters().used_bytes < used);
  fake_cuda::complete(side());
  fake_cuda::set_busy(side(), false);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  // The destroyed pool left the device-wide totals: after a reset, the peaks
  // are what is reserved now (nothing).
  alloc()->resetPeakStats(0);
  CHECK_EQ(stats().reserved_bytes[0].peak, std::int64_t(0));
  CHECK_EQ(stats().segment[0].peak, std::int64_t(0));
  check_clean();
}

// A pool nothing uses any more but with a block still live (a library's
// workspace allocated during a capture) gives back its cached memory.
void test_unused_pool_with_live_block() {
  const MempoolId_t g{2, 0};
  begin(g);
  void* workspace = alloc()->raw_alloc(2 * MiB);
  void* big = alloc()->raw_alloc(200 * MiB);
  alloc()->raw_delete(big);
  alloc()->endAllocateToPool(0, g);
  alloc()->releasePool(0, g);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 1);
  CHECK(fake_cuda::counters().used_bytes >= 200 * MiB);
  // Out of memory in the default arena: the unused pool's cache is given back
  // first, and the allocation that then succeeds counts no OOM.
  const auto ooms = stats().num_ooms;
  void* p = alloc()->raw_alloc(400 * MiB);
  CHECK(p != nullptr);
  CHECK_EQ(stats().num_ooms, ooms);
  CHECK(fake_cuda::accessible(workspace, 2 * MiB));  // the live block stays
  alloc()->raw_delete(p);
  alloc()->emptyCache(kDefault);
  CHECK(fake_cuda::counters().used_bytes <= 20 * MiB);  // the workspace's granules only
  alloc()->raw_delete(workspace);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

// A driver failure while unused pools are emptied for a retry is a c10
// error naming the call, and nothing is lost: the next emptyCache finishes.
void test_retry_device_error() {
  const MempoolId_t g{3, 0};
  begin(g);
  void* ws = alloc()->raw_alloc(2 * MiB);
  void* big = alloc()->raw_alloc(300 * MiB);
  alloc()->raw_delete(big);
  alloc()->endAllocateToPool(0, g);
  alloc()->releasePool(0, g);
  fake_cuda::fail_next("cuMemUnmap", CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_THROW(c10::Error, alloc()->raw_alloc(400 * MiB), "cuMemUnmap",
               "an illegal memory access was encountered");
  CHECK(fake_cuda::accessible(ws, 2 * MiB));
  void* p = alloc()->raw_alloc(400 * MiB);  // the retry now succeeds
  alloc()->raw_delete(p);
  alloc()->raw_delete(ws);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  CHECK_EQ(reserved(), std::int64_t(0));
  check_clean();
}

// Device-wide peaks: 64 MiB in the default arena, freed, then 64 MiB in a
// MemPool: the device never held more than 64 MiB.
void test_peaks_across_pools() {
  alloc()->resetPeakStats(0);
  void* a = alloc()->raw_alloc(64 * MiB);
  alloc()->raw_delete(a);
  const MempoolId_t m{0, 1};
  alloc()->createOrIncrefPool(0, m, nullptr);
  begin(m);
  void* b = alloc()->raw_alloc(64 * MiB);
  alloc()->endAllocateToPool(0, m);  // the end of use_mem_pool: end, then release
  alloc()->releasePool(0, m);
  auto s = stats();
  CHECK_EQ(s.allocated_bytes[0].current, 64 * MiB);
  CHECK_EQ(s.allocated_bytes[0].peak, 64 * MiB);
  CHECK_EQ(s.allocation[0].peak, std::int64_t(1));
  // Reserved: the default arena's 64 MiB cached plus the pool's 64 MiB.
  CHECK_EQ(s.reserved_bytes[0].peak, 128 * MiB);
  CHECK_EQ(s.reserved_bytes[0].current, fake_cuda::counters().used_bytes);
  alloc()->raw_delete(b);
  alloc()->releasePool(0, m);  // ~MemPool: release, then empty the pool
  alloc()->emptyCache(m);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->resetPeakStats(0);
  CHECK_EQ(stats().allocated_bytes[0].peak, std::int64_t(0));
  alloc()->emptyCache(kDefault);
  check_clean();
}

// set_per_process_memory_fraction after the first allocation.
void test_memory_fraction() {
  CHECK(alloc()->getMemoryFraction(0) == 1.0);
  alloc()->setMemoryFraction(0.25, 0);  // 128 MiB of 512
  CHECK(alloc()->getMemoryFraction(0) == 0.25);
  void* a = alloc()->raw_alloc(100 * MiB);
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(64 * MiB), "CUDA out of memory",
               "limit: 128.00 MiB");
  EXPECT_THROW(c10::Error, alloc()->setMemoryFraction(1.5, 0), "invalid fraction");
  // The limit is the device's: a MemPool's growth counts what the default
  // arena reserved (100 MiB + 64 MiB > 128 MiB).
  const MempoolId_t m{0, 2};
  alloc()->createOrIncrefPool(0, m, nullptr);
  begin(m);
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(64 * MiB), "CUDA out of memory");
  void* in_pool = alloc()->raw_alloc(16 * MiB);  // 100 + 16 fits
  alloc()->endAllocateToPool(0, m);
  alloc()->releasePool(0, m);
  alloc()->raw_delete(in_pool);
  alloc()->releasePool(0, m);
  alloc()->emptyCache(m);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->setMemoryFraction(1.0, 0);
  void* b = alloc()->raw_alloc(64 * MiB);
  alloc()->raw_delete(a);
  alloc()->raw_delete(b);
  alloc()->emptyCache(kDefault);
  check_clean();
}

void test_cache_info_and_snapshot() {
  void* keep = alloc()->raw_alloc(3 * MiB);
  void* gone = alloc()->raw_alloc(32 * MiB);
  void* small = alloc()->raw_alloc(512);
  alloc()->raw_delete(gone);
  std::size_t largest = 1;
  alloc()->cacheInfo(0, &largest);
  CHECK(largest >= std::size_t(32 * MiB));
  largest = 0;  // PyTorch passes 0 first: the device's free memory counts
  alloc()->cacheInfo(0, &largest);
  CHECK(largest >= std::size_t(512 * MiB) - static_cast<std::size_t>(fake_cuda::counters().used_bytes));
  auto snap = alloc()->snapshot(kDefault, false);
  std::vector<std::size_t> live;
  for (const auto& seg : snap.segments) {
    std::size_t sum = 0;
    for (const auto& b : seg.blocks) {
      sum += b.size;
      if (b.allocated) live.push_back(b.size);
    }
    CHECK_EQ(sum, seg.total_size);  // blocks tile the segment (the viewer assumes it)
  }
  std::sort(live.begin(), live.end());
  CHECK(live == (std::vector<std::size_t>{512, std::size_t(3 * MiB)}));
  CHECK_EQ(snap.device_traces.size(), std::size_t(3));
  std::size_t base_size = 0;
  CHECK(alloc()->getBaseAllocation(keep, &base_size) == keep);
  CHECK_EQ(base_size, std::size_t(3 * MiB));
  alloc()->raw_delete(keep);
  alloc()->raw_delete(small);
  alloc()->emptyCache(kDefault);
  check_clean();
}

void test_second_device_and_peers() {
  CHECK_EQ(cudaSetDevice(1), cudaSuccess);
  c10::DataPtr x = alloc()->allocate(8 * MiB);
  CHECK(x.device() == c10::Device(c10::DeviceType::CUDA, 1));
  CHECK_EQ(allocated(1), 8 * MiB);
  CHECK_EQ(allocated(0), std::int64_t(0));
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  c10::DataPtr y = alloc()->allocate(8 * MiB);
  CHECK(!fake_cuda::accessible(y.get(), 8 * MiB, 1));
  alloc()->enablePeerAccess(1, 0);  // cuda:1 may access cuda:0's memory
  CHECK(fake_cuda::accessible(y.get(), 8 * MiB, 1));
  CHECK_EQ(fake_cuda::counters().peer_enables, std::int64_t(1));
  alloc()->enablePeerAccess(1, 0);  // again: "already enabled" is not an error
  CHECK_EQ(static_cast<int>(cudaGetLastError()), 0);
  c10::DataPtr z = alloc()->allocate(40 * MiB);  // mapped later: cuda:1 has access too
  CHECK(fake_cuda::accessible(z.get(), 40 * MiB, 1));
  x.clear();
  y.clear();
  z.clear();
  alloc()->emptyCache(kDefault);
  CHECK_EQ(allocated(1), std::int64_t(0));
  CHECK_EQ(reserved(1), std::int64_t(0));
  check_clean();
}

// A helper thread whose current device has no CUDA context (a process that
// only uses cuda:1; the thread never chose a device) empties the cache: the
// work on cuda:1 must not leave a context on the thread's device, and
// PyTorch's view of the thread's device must not change.
void test_no_context_on_the_callers_device() {
  CHECK_EQ(cudaSetDevice(1), cudaSuccess);
  void* p = alloc()->raw_alloc(40 * MiB);
  alloc()->raw_delete(p);
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  CHECK(reserved(1) > 0);
  CHECK(!fake_cuda::has_context(2));
  c10::DeviceIndex seen = -1;
  std::thread t([&] {
    fake_cuda::set_thread_device_without_context(2);
    alloc()->emptyCache(kDefault);  // torch.cuda.empty_cache() from that thread
    C10_CUDA_CHECK(c10::cuda::GetDevice(&seen));
  });
  t.join();
  CHECK_EQ(reserved(1), std::int64_t(0));
  CHECK(!fake_cuda::has_context(2));
  CHECK_EQ(static_cast<int>(seen), 2);
  check_clean();
}

// MemPool(use_on_oom=True) lends its free blocks to an allocation outside it
// that would otherwise run out of memory, as in PyTorch's allocator.
void test_use_on_oom_pool_lends() {
  const MempoolId_t m{0, 77};
  alloc()->createOrIncrefPool(0, m, nullptr);
  alloc()->setUseOnOOM(0, m, true);
  begin(m);
  void* big = alloc()->raw_alloc(300 * MiB);
  alloc()->raw_delete(big);  // cached in the pool
  alloc()->endAllocateToPool(0, m);
  alloc()->releasePool(0, m);  // the end of use_mem_pool; the MemPool lives on
  void* live = alloc()->raw_alloc(150 * MiB);
  const auto ooms = stats().num_ooms;
  void* q = alloc()->raw_alloc(250 * MiB);  // 300 + 150 + 250 > 512: only the pool has room
  CHECK(q == big);
  CHECK_EQ(stats().num_ooms, ooms);
  alloc()->raw_delete(q);
  // Without use_on_oom the same request fails.
  alloc()->setUseOnOOM(0, m, false);
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(250 * MiB), "CUDA out of memory");
  alloc()->raw_delete(live);
  alloc()->releasePool(0, m);  // ~MemPool
  alloc()->emptyCache(m);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

// Out-of-memory observers get PyTorch's arguments: (device, the failed
// request, the limit or the device's total, free bytes).
void test_oom_observer_arguments() {
  static std::int64_t seen_device = -1;
  static std::size_t seen_size = 0, seen_total = 0;
  alloc()->attachOutOfMemoryObserver([](int64_t device, size_t size, size_t total, size_t) {
    seen_device = device;
    seen_size = size;
    seen_total = total;
  });
  void* live = alloc()->raw_alloc(64 * MiB);
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(1024 * MiB), "CUDA out of memory");
  CHECK_EQ(seen_device, std::int64_t(0));
  CHECK_EQ(seen_size, std::size_t(1024 * MiB));
  CHECK_EQ(seen_total, std::size_t(512 * MiB));
  alloc()->setMemoryFraction(0.5, 0);
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(300 * MiB), "CUDA out of memory");
  CHECK_EQ(seen_size, std::size_t(300 * MiB));
  CHECK_EQ(seen_total, std::size_t(256 * MiB));  // the limit the fraction set
  alloc()->setMemoryFraction(1.0, 0);
  alloc()->raw_delete(live);
  alloc()->emptyCache(kDefault);
  check_clean();
}


// ~CUDAGraph (noexcept in torch 2.11) calls releasePool; ~MemPool then
// emptyCache(id). With a sticky CUDA error at that moment (an earlier
// kernel's illegal access) and a pool block freed with a stream use, nothing
// may escape; the pool goes at a later allocation once CUDA works again.
void test_release_pool_never_throws() {
  const MempoolId_t g{4, 0};
  fake_cuda::set_busy(side(), true);
  begin(g);
  c10::DataPtr x = alloc()->allocate(8 * MiB);
  alloc()->recordStream(x, stream_of(kSide));
  x.clear();  // pending on the side stream
  alloc()->endAllocateToPool(0, g);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 1);
  fake_cuda::set_sticky_error(cudaErrorIllegalAddress);
  bool threw = false;
  try {
    alloc()->releasePool(0, g);
    alloc()->emptyCache(g);
  } catch (...) {
    threw = true;
  }
  fake_cuda::set_sticky_error(cudaSuccess);
  (void)cudaGetLastError();
  CHECK(!threw);
  CHECK_EQ(alloc()->getPoolUseCount(0, g), 0);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 1);  // not yet: resolved later
  fake_cuda::complete(side());
  fake_cuda::set_busy(side(), false);
  void* p = alloc()->raw_alloc(MiB);  // the next allocation of the device settles it
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->raw_delete(p);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

// One out-of-memory ladder per failed request (PyTorch's malloc): the retry
// is counted once and pending stream work is host-synchronized once, not
// once per attempt of the glue (issue 13 item 5: it was +3 retries).
void test_one_oom_ladder() {
  fake_cuda::set_busy(side(), true);
  c10::DataPtr x = alloc()->allocate(64 * MiB);
  alloc()->recordStream(x, stream_of(kSide));
  x.clear();  // pending: the side stream may still use it
  const auto before = stats();
  const auto syncs = fake_cuda::counters().event_synchronizes;
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(1024 * MiB), "CUDA out of memory");
  const auto after = stats();
  CHECK_EQ(after.num_alloc_retries, before.num_alloc_retries + 1);
  CHECK_EQ(after.num_ooms, before.num_ooms + 1);
  CHECK_EQ(after.num_sync_all_streams, before.num_sync_all_streams + 1);
  CHECK_EQ(fake_cuda::counters().event_synchronizes, syncs + 1);
  // Under a limit (the memory fraction: 512 MiB), a request that fits once
  // cached granules go back: the growth unmaps the 200 MiB interior hole
  // first (the VMM handles in the middle of the range), so no ladder runs.
  alloc()->setMemoryFraction(1.0, 0);
  alloc()->emptyCache(kDefault);
  void* a = alloc()->raw_alloc(200 * MiB);
  void* b = alloc()->raw_alloc(100 * MiB);  // after a
  alloc()->raw_delete(a);                   // a 200 MiB hole below b
  const auto mid = stats();
  const auto arena_reserved = [] {
    return renaissance::cuda::arena(0)->stats().reserved_bytes[0].current;
  };
  CHECK_EQ(arena_reserved(), 300 * MiB);
  void* c = alloc()->raw_alloc(300 * MiB);  // 100 live + 200 cached + 300 > 512
  const bool ok = c != nullptr && stats().num_alloc_retries == mid.num_alloc_retries &&
                  stats().num_ooms == mid.num_ooms && arena_reserved() == 400 * MiB &&
                  fake_cuda::accessible(b, 100 * MiB) && fake_cuda::accessible(c, 300 * MiB);
  if (c) alloc()->raw_delete(c);
  alloc()->raw_delete(b);
  CHECK(ok);
  fake_cuda::set_busy(side(), false);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

// A MemPool(use_on_oom=True) a live CUDA graph was captured into lends its
// cached blocks to an allocation that would otherwise fail, and nothing
// more: it never grows for the borrower and never gives back memory the
// graph's replays write.
void test_use_on_oom_keeps_graph_memory() {
  const MempoolId_t m{0, 88};
  alloc()->createOrIncrefPool(0, m, nullptr);
  alloc()->setUseOnOOM(0, m, true);
  fake_cuda::set_capturing(true);
  begin(m);  // torch.cuda.graph(pool=mempool.id): the graph's use
  void* out = alloc()->raw_alloc(4 * MiB);  // the graph's output, kept
  void* tmp = alloc()->raw_alloc(64 * MiB);  // an intermediate the replays reuse
  alloc()->raw_delete(tmp);
  alloc()->endAllocateToPool(0, m);
  fake_cuda::set_capturing(false);
  CHECK_EQ(alloc()->getPoolUseCount(0, m), 2);
  std::vector<std::pair<char*, std::size_t>> graph_memory;
  for (const auto& seg : alloc()->snapshot(m, false).segments) {
    graph_memory.emplace_back(reinterpret_cast<char*>(seg.address), seg.total_size);
  }
  CHECK(!graph_memory.empty());
  const auto all_mapped = [&] {
    for (auto& [p, n] : graph_memory) {
      if (!fake_cuda::accessible(p, n)) return false;
    }
    return true;
  };
  CHECK(all_mapped());
  const auto pool_reserved = [&] {
    std::int64_t sum = 0;
    for (const auto& seg : alloc()->snapshot(m, false).segments) sum += static_cast<std::int64_t>(seg.total_size);
    return sum;
  };
  const std::int64_t pool_before = pool_reserved();
  // The default arena takes all but 8 MiB of the device.
  alloc()->emptyCache(kDefault);
  const std::int64_t free_now = std::int64_t(512) * MiB - fake_cuda::counters().used_bytes;
  void* live = alloc()->raw_alloc(static_cast<std::size_t>(free_now - 8 * MiB));
  // Fits the cached 64 MiB block: borrowed.
  void* q = alloc()->raw_alloc(32 * MiB);
  CHECK(q == tmp);
  alloc()->raw_delete(q);
  // Fits nothing cached: the pool would have to give its tail back (the
  // graph's memory) or grow. Out of memory instead.
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(120 * MiB), "CUDA out of memory");
  CHECK(all_mapped());
  EXPECT_THROW(c10::OutOfMemoryError, alloc()->raw_alloc(70 * MiB), "CUDA out of memory");
  CHECK(all_mapped());
  CHECK_EQ(pool_reserved(), pool_before);
  // emptyCache while the graph lives leaves its memory too.
  alloc()->emptyCache(kDefault);
  CHECK(all_mapped());
  alloc()->raw_delete(live);
  alloc()->releasePool(0, m);  // the graph is reset
  alloc()->raw_delete(out);
  alloc()->setUseOnOOM(0, m, false);  // ~MemPool
  alloc()->releasePool(0, m);
  alloc()->emptyCache(m);
  CHECK_EQ(renaissance::cuda::private_pool_count(0), 0);
  alloc()->emptyCache(kDefault);
  CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
  check_clean();
}

// torch.cuda.graph's entry (synchronize, empty_cache) and each settle step
// after a plan give memory back: with the streams that used it
// synchronized, never the whole device.
void test_empty_cache_synchronizes_streams_only() {
  void* p = alloc()->raw_alloc(64 * MiB);
  alloc()->raw_delete(p);
  const auto before = fake_cuda::counters();
  alloc()->emptyCache(kDefault);
  const auto after = fake_cuda::counters();
  CHECK(after.used_bytes < before.used_bytes);
  CHECK_EQ(after.device_synchronizes, before.device_synchronizes);
  CHECK(after.stream_synchronizes > before.stream_synchronizes);
  check_clean();
}

struct CountingWarnings : c10::WarningHandler {
  std::vector<std::string> seen;
  void process(const c10::Warning& w) override { seen.push_back(w.msg()); }
};

// A device whose driver reports VMM support and refuses the mapping: one
// warning naming the error, allocations from cudaMalloc segments, stats right.
void test_vmm_refused_device() {
  CountingWarnings warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  CHECK_EQ(cudaSetDevice(3), cudaSuccess);
  fake_cuda::fail_next("cuMemCreate", CUDA_ERROR_NOT_SUPPORTED);  // the probe's
  const auto mallocs = fake_cuda::counters().live_mallocs;
  std::vector<c10::DataPtr> ptrs;
  for (std::size_t n : {std::size_t(1000), std::size_t(3 * MiB), std::size_t(64 * MiB)}) {
    ptrs.push_back(alloc()->allocate(n));
  }
  CHECK(ptrs[2].device() == c10::Device(c10::DeviceType::CUDA, 3));
  CHECK_EQ(warnings.seen.size(), std::size_t(1));
  CHECK(warnings.seen[0].find("cuda:3 refused CUDA virtual memory (cuMemCreate failed: operation "
                              "not supported (CUDA_ERROR_NOT_SUPPORTED))") != std::string::npos);
  CHECK(renaissance::cuda::vmm_status(3).rfind("off: the driver refused a probe mapping", 0) == 0);
  CHECK_EQ(fake_cuda::counters().live_mallocs - mallocs, std::int64_t(3));
  auto s = stats(3);
  CHECK_EQ(s.allocated_bytes[0].current, std::int64_t(1024 + 3 * MiB + 64 * MiB));
  CHECK_EQ(s.reserved_bytes[0].current, std::int64_t(2 * MiB + 20 * MiB + 64 * MiB));
  CHECK_EQ(s.segment[0].current, std::int64_t(3));
  CHECK_EQ(s.allocation[0].current, std::int64_t(3));
  ptrs.push_back(alloc()->allocate(5 * MiB));  // served from the 20 MiB segment
  CHECK_EQ(warnings.seen.size(), std::size_t(1));  // once
  CHECK_EQ(stats(3).reserved_bytes[0].current, std::int64_t(86 * MiB));
  ptrs.clear();
  alloc()->emptyCache(kDefault);
  CHECK_EQ(reserved(3), std::int64_t(0));
  CHECK_EQ(fake_cuda::counters().live_mallocs, mallocs);
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  check_clean();
}

// The glue ran every case above with the lock-order checker on; no lock is
// left held.
void test_no_lock_left_held() { CHECK_EQ(renaissance::lock_order::held_count(), 0); }
}  // namespace

int main() {
  fake_cuda::Config config;
  config.devices = 4;  // cuda:2 is never used: no context may appear on it; cuda:3 refuses VMM
  config.capacity = std::size_t(512) << 20;
  fake_cuda::reset(config);
  const fake_cuda::TestList tests = {
      {"install", test_install},
      {"stats", test_stats},
      {"out_of_memory", test_out_of_memory},
      {"record_stream", test_record_stream},
      {"graph_pool_lifecycle", test_graph_pool_lifecycle},
      {"unused_pool_with_live_block", test_unused_pool_with_live_block},
      {"retry_device_error", test_retry_device_error},
      {"peaks_across_pools", test_peaks_across_pools},
      {"memory_fraction", test_memory_fraction},
      {"cache_info_and_snapshot", test_cache_info_and_snapshot},
      {"second_device_and_peers", test_second_device_and_peers},
      {"no_context_on_the_callers_device", test_no_context_on_the_callers_device},
      {"use_on_oom_pool_lends", test_use_on_oom_pool_lends},
      {"oom_observer_arguments", test_oom_observer_arguments},
      {"release_pool_never_throws", test_release_pool_never_throws},
      {"use_on_oom_keeps_graph_memory", test_use_on_oom_keeps_graph_memory},
      {"empty_cache_synchronizes_streams_only", test_empty_cache_synchronizes_streams_only},
      {"one_oom_ladder", test_one_oom_ladder},
      {"vmm_refused_device", test_vmm_refused_device},  // last: uses cuda:3
      {"no_lock_left_held", test_no_lock_left_held},
  };
  return fake_cuda::run_tests(tests);
}
