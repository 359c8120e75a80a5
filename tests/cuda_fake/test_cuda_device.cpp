// test_cuda_device.cpp - CudaDevice and the Arena on top of it, run against
// the fake CUDA runtime of fake_cuda.cpp (no GPU needed). Built, linked and
// run by tools/check_cuda_build.py (make check-cuda, CI).
//
// Each test resets the fake, drives CudaDevice (directly or through an
// Arena), and checks both what our code returns and what the fake saw:
// leaks (mallocs, handles, reservations, events), the device each call
// charged, the capture mode allocations ran under, unmaps while work was in
// flight, and that no CUDA error is left behind for PyTorch's next
// cudaGetLastError check.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "core/cuda_device.h"
#include "core/cuda_stream.h"
#include "core/errors.h"
#include "core/lock_order.h"
#include "check.h"
#include "fake_cuda.h"

#include <cuda.h>  // CUresult codes for fault injection

using namespace renaissance;

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;

// No CUDA error may be left for the next cudaGetLastError (PyTorch checks
// it after every kernel launch).
void check_no_sticky_error() { CHECK_EQ(static_cast<int>(cudaGetLastError()), 0); }

void check_nothing_live() {
  const auto c = fake_cuda::counters();
  CHECK_EQ(c.live_mallocs, 0);
  CHECK_EQ(c.live_handles, 0);
  CHECK_EQ(c.live_reservations, 0);
  CHECK_EQ(c.live_mappings, 0);
  CHECK_EQ(c.live_events, 0);
  CHECK_EQ(c.used_bytes, 0);
}

fake_cuda::Config config(int devices = 1, std::size_t capacity = 256 * MiB, bool vmm = true) {
  fake_cuda::Config c;
  c.devices = devices;
  c.capacity = capacity;
  c.vmm = vmm;
  return c;
}

cudaStream_t side_stream() { return reinterpret_cast<cudaStream_t>(std::uintptr_t(0x5100)); }
StreamId sid(cudaStream_t s) { return stream_id(s); }

// --- construction -------------------------------------------------------------

void test_no_device() {
  fake_cuda::reset(config(0));
  EXPECT_THROW(DeviceError, CudaDevice d(0), "CUDA is not usable here", "cudaGetDeviceCount",
               "no CUDA-capable device is detected", "cudaErrorNoDevice");
  check_no_sticky_error();
}

void test_bad_index() {
  fake_cuda::reset(config(2));
  EXPECT_THROW(DeviceError, CudaDevice d(2), "cuda:2 does not exist (this machine has 2 CUDA devices)");
  EXPECT_THROW(DeviceError, CudaDevice d(-1), "cuda:-1 does not exist");
  CudaDevice ok(1);
  CHECK(ok.name() == "cuda:1");
  CHECK_EQ(ok.alignment(), std::size_t(512));
}

// --- reserve / release ----------------------------------------------------------

void test_reserve_release() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  void* p = d.reserve(3 * MiB + 100);
  CHECK(p != nullptr);
  CHECK_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, std::uintptr_t(0));
  auto c = fake_cuda::counters();
  CHECK_EQ(c.live_mallocs, 1);
  CHECK_EQ(c.allocations_not_relaxed, 0);  // cudaMalloc ran in relaxed capture mode
  CHECK(fake_cuda::capture_mode() == cudaStreamCaptureModeGlobal);  // and it was restored
  const MemInfo info = d.mem_info();
  CHECK_EQ(info.total_bytes, 256 * MiB);
  CHECK_EQ(info.free_bytes, 256 * MiB - (3 * MiB + 100));
  CHECK(d.reserve(0) == nullptr);
  d.release(p, 3 * MiB + 100);
  check_nothing_live();
  check_no_sticky_error();
}

void test_device_guard() {
  fake_cuda::reset(config(2));
  CudaDevice d1(1);
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = d1.reserve(8 * MiB);
  int current = -1;
  CHECK_EQ(cudaGetDevice(&current), cudaSuccess);
  CHECK_EQ(current, 0);  // restored
  CHECK_EQ(d1.mem_info().free_bytes, 256 * MiB - 8 * MiB);  // charged to device 1
  CudaDevice d0(0);
  CHECK_EQ(d0.mem_info().free_bytes, 256 * MiB);
  d1.release(p, 8 * MiB);
  check_nothing_live();
}

void test_reserve_out_of_memory() {
  fake_cuda::reset(config(1, 64 * MiB));
  CudaDevice d(0);
  CHECK(d.reserve(128 * MiB) == nullptr);
  check_no_sticky_error();
  CHECK(d.reserve(std::size_t(1) << 62) == nullptr);
  check_no_sticky_error();
  // A driver that answers an absurd size with "invalid argument": refused.
  fake_cuda::fail_next("cudaMalloc", cudaErrorInvalidValue);
  CHECK(d.reserve(65 * MiB) == nullptr);
  check_no_sticky_error();
  // "invalid argument" for a size the device could hold is a real error.
  fake_cuda::fail_next("cudaMalloc", cudaErrorInvalidValue);
  EXPECT_THROW(DeviceError, d.reserve(MiB), "cudaMalloc", "on cuda:0", "invalid argument",
               "cudaErrorInvalidValue");
  check_no_sticky_error();
  void* p = d.reserve(MiB);  // works afterwards
  CHECK(p != nullptr);
  d.release(p, MiB);
  check_nothing_live();
}

void test_error_text() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  void* p = d.reserve(MiB);
  fake_cuda::fail_next("cudaFree", cudaErrorIllegalAddress);
  EXPECT_THROW(DeviceError, d.release(p, MiB), "cudaFree(ptr) failed on cuda:0",
               "an illegal memory access was encountered", "cudaErrorIllegalAddress");
  check_no_sticky_error();
  d.release(p, MiB);
  fake_cuda::fail_next("cudaMemGetInfo", cudaErrorInvalidValue);
  EXPECT_THROW(DeviceError, d.mem_info(), "cudaMemGetInfo");
  fake_cuda::fail_next("cudaSetDevice", cudaErrorInvalidDevice);
  fake_cuda::reset(config(2));
  CudaDevice d1(1);
  fake_cuda::fail_next("cudaSetDevice", cudaErrorInvalidDevice);
  EXPECT_THROW(DeviceError, d1.reserve(MiB), "cudaSetDevice", "cuda:1", "invalid device ordinal");
  check_nothing_live();
  check_no_sticky_error();
}

// --- address ranges (VMM) -----------------------------------------------------------

void test_vmm_status() {
  fake_cuda::reset(config());
  {
    CudaDevice d(0);
    CHECK(d.supports_address_ranges());
    CHECK(d.vmm_status() == "on (granularity 2.00 MiB)");
    CHECK_EQ(d.range_granularity(), 2 * MiB);
  }
  fake_cuda::reset(config(1, 256 * MiB, /*vmm=*/false));
  {
    CudaDevice d(0);
    CHECK(!d.supports_address_ranges());
    CHECK(d.vmm_status() == "off: the device does not support virtual memory management");
    CHECK(d.reserve_range(2 * MiB) == nullptr);
    CHECK(!d.map(reinterpret_cast<void*>(std::uintptr_t(1) << 40), 2 * MiB));
  }
  fake_cuda::reset(config());
  fake_cuda::hide_symbol("cuMemCreate");
  {
    CudaDevice d(0);
    CHECK(d.vmm_status() == "off: cuMemCreate not found in the CUDA driver");
    CHECK(!d.supports_address_ranges());
  }
  fake_cuda::reset(config());
  setenv("TORCH_RENAISSANCE_CUDA_VMM", "0", 1);
  {
    CudaDevice d(0);
    CHECK(d.vmm_status() == "off: TORCH_RENAISSANCE_CUDA_VMM=0");
  }
  unsetenv("TORCH_RENAISSANCE_CUDA_VMM");
  fake_cuda::Config odd = config();
  odd.granularity = 3000;  // not a power of two: refused
  fake_cuda::reset(odd);
  {
    CudaDevice d(0);
    CHECK(!d.supports_address_ranges());
    CHECK(d.vmm_status().rfind("off: cuMemGetAllocationGranularity", 0) == 0);
  }
  check_no_sticky_error();
}

void test_map_unmap() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  const std::size_t g = d.range_granularity();
  char* base = static_cast<char*>(d.reserve_range(8 * g));
  CHECK(base != nullptr);
  CHECK(d.reserve_range(g + 1) == nullptr);  // not a granule multiple
  CHECK(d.map(base + g, g));
  CHECK(d.map(base + 2 * g, g));
  CHECK(fake_cuda::accessible(base + g, 2 * g));
  CHECK(!fake_cuda::accessible(base, g));
  std::memset(base + g, 0x5a, 2 * g);  // really readable and writable
  CHECK_EQ(static_cast<int>(base[3 * g - 1]), 0x5a);
  auto c = fake_cuda::counters();
  CHECK_EQ(c.live_handles, 2);  // one handle per map() call of one granule
  CHECK_EQ(c.allocations_not_relaxed, 0);
  CHECK_EQ(d.mem_info().free_bytes, 256 * MiB - 2 * g);

  EXPECT_THROW(DeviceError, d.map(base + 2 * g, g), "already mapped");
  EXPECT_THROW(DeviceError, d.map(base + g / 2, g), "not granule aligned");
  EXPECT_THROW(DeviceError, d.map(base + 7 * g, 2 * g), "not granule aligned");  // past the end
  EXPECT_THROW(DeviceError, d.unmap(base, g), "not mapped");
  EXPECT_THROW(DeviceError, d.release_range(base, 8 * g), "still has mapped memory");
  EXPECT_THROW(DeviceError, d.release_range(base, 4 * g), "did not reserve");
  CHECK_EQ(fake_cuda::counters().live_handles, 2);  // the refusals changed nothing

  // Unmapping one granule of the two: the other stays usable.
  fake_cuda::set_busy(side_stream(), true);
  const EventId e = d.create_event();
  d.record_event(e, sid(side_stream()));  // work in flight on a side stream
  const auto syncs = fake_cuda::counters().device_synchronizes;
  d.unmap(base + g, g);
  c = fake_cuda::counters();
  CHECK_EQ(c.device_synchronizes, syncs + 1);  // cuMemUnmap does not wait: we synchronize first
  CHECK_EQ(c.unsafe_unmaps, 0);
  CHECK(d.query_event(e));
  CHECK(!fake_cuda::accessible(base + g, g));
  CHECK(fake_cuda::accessible(base + 2 * g, g));
  CHECK_EQ(static_cast<int>(base[2 * g]), 0x5a);
  CHECK_EQ(c.live_handles, 1);
  d.unmap(base + 2 * g, g);
  d.release_range(base, 8 * g);
  d.destroy_event(e);
  check_nothing_live();
  check_no_sticky_error();
}

void test_map_failures_roll_back() {
  fake_cuda::reset(config(1, 64 * MiB));
  CudaDevice d(0);
  const std::size_t g = d.range_granularity();
  char* base = static_cast<char*>(d.reserve_range(40 * g));  // 80 MiB of addresses
  // 60 MiB is three 20 MiB handles. Out of memory on the third: the two
  // made are undone.
  const auto probed = fake_cuda::counters().handles_created;  // the probe's one
  fake_cuda::fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 2);
  CHECK(!d.map(base, 30 * g));
  auto c = fake_cuda::counters();
  CHECK_EQ(c.handles_created - probed, 2);
  CHECK_EQ(c.live_handles, 0);
  CHECK_EQ(c.live_mappings, 0);
  // A mapping failure is an error naming the call; nothing stays behind
  // (24 MiB: a 20 MiB and a 4 MiB handle; the second mapping fails).
  fake_cuda::fail_next("cuMemMap", CUDA_ERROR_ILLEGAL_ADDRESS, 1);
  EXPECT_THROW(DeviceError, d.map(base, 12 * g), "cuMemMap failed on cuda:0",
               "an illegal memory access was encountered");
  c = fake_cuda::counters();
  CHECK_EQ(c.live_handles, 0);
  CHECK_EQ(c.live_mappings, 0);
  fake_cuda::fail_next("cuMemSetAccess", CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_THROW(DeviceError, d.map(base, 2 * g), "cuMemSetAccess", "operation not supported");
  CHECK_EQ(fake_cuda::counters().live_handles, 0);
  fake_cuda::fail_next("cuMemSetAccess", CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(!d.map(base, 2 * g));
  CHECK_EQ(fake_cuda::counters().live_mappings, 0);
  // More than the device has free: refused before any handle is made.
  const auto created = fake_cuda::counters().handles_created;
  CHECK(!d.map(base, 40 * g));
  CHECK_EQ(fake_cuda::counters().handles_created, created);
  // After all that, the same range maps cleanly.
  CHECK(d.map(base, 4 * g));
  CHECK(fake_cuda::accessible(base, 4 * g));
  d.unmap(base, 4 * g);
  d.release_range(base, 40 * g);
  check_nothing_live();
  check_no_sticky_error();
}

void test_destructor_returns_ranges() {
  fake_cuda::reset(config());
  {
    CudaDevice d(0);
    const std::size_t g = d.range_granularity();
    char* base = static_cast<char*>(d.reserve_range(4 * g));
    CHECK(d.map(base, 3 * g));
  }
  check_nothing_live();  // the destructor unmapped, released and freed
}

void test_peer_access() {
  fake_cuda::reset(config(2));
  CudaDevice d(0);
  const std::size_t g = d.range_granularity();
  char* base = static_cast<char*>(d.reserve_range(4 * g));
  CHECK(d.map(base, 2 * g));
  CHECK(fake_cuda::accessible(base, 2 * g, 0));
  CHECK(!fake_cuda::accessible(base, 2 * g, 1));
  d.add_peer_access(0);  // itself: nothing to do
  EXPECT_THROW(DeviceError, d.add_peer_access(2), "peer access from cuda:2, which does not exist");
  fake_cuda::fail_next("cuMemSetAccess", CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_THROW(DeviceError, d.add_peer_access(1), "cuMemSetAccess", "operation not supported");
  d.add_peer_access(1);  // what is mapped now ...
  CHECK(fake_cuda::accessible(base, 2 * g, 1));
  CHECK(d.map(base + 2 * g, g));  // ... and what is mapped later
  CHECK(fake_cuda::accessible(base + 2 * g, g, 0));
  CHECK(fake_cuda::accessible(base + 2 * g, g, 1));
  d.add_peer_access(1);  // again: a no-op
  d.unmap(base, 3 * g);
  d.release_range(base, 4 * g);
  check_nothing_live();
  check_no_sticky_error();
  fake_cuda::reset(config(2, 256 * MiB, false));
  CudaDevice plain(0);
  plain.add_peer_access(1);  // cudaMalloc memory: peer access covers it already
  check_nothing_live();
}

// --- events ------------------------------------------------------------------------

void test_events() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  const EventId e = d.create_event();
  CHECK(d.query_event(e));  // never recorded: complete
  fake_cuda::set_busy(side_stream(), true);
  d.record_event(e, sid(side_stream()));
  CHECK(!d.query_event(e));
  check_no_sticky_error();  // "not ready" is an answer, not an error
  fake_cuda::complete(side_stream());
  CHECK(d.query_event(e));
  d.record_event(e, sid(side_stream()));
  CHECK(!d.query_event(e));
  d.synchronize_event(e);
  CHECK(d.query_event(e));
  d.stream_wait_event(0, e);
  const auto w = fake_cuda::waits();
  CHECK_EQ(w.size(), std::size_t(1));
  CHECK(w[0].first == nullptr && reinterpret_cast<std::uintptr_t>(w[0].second) == e);
  fake_cuda::fail_next("cudaEventRecord", cudaErrorInvalidResourceHandle);
  EXPECT_THROW(DeviceError, d.record_event(e, 12345), "cudaEventRecord", "invalid resource handle");
  fake_cuda::fail_next("cudaEventQuery", cudaErrorIllegalAddress);
  EXPECT_THROW(DeviceError, d.query_event(e), "cudaEventQuery", "an illegal memory access");
  check_no_sticky_error();
  d.destroy_event(e);
  EXPECT_THROW(DeviceError, d.destroy_event(e), "cudaEventDestroy");
  check_nothing_live();
  check_no_sticky_error();
}

// --- the Arena on CudaDevice --------------------------------------------------------

void test_arena_expandable() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    std::vector<void*> ps;
    for (std::size_t sz : {512 * std::size_t(1), 4 * MiB, 700 * std::size_t(1024), 24 * MiB, 100 * std::size_t(1)}) {
      void* p = arena.allocate(sz, 0);
      CHECK(fake_cuda::accessible(p, sz));  // mapped, with access, before it is handed out
      std::memset(p, 1, sz);
      ps.push_back(p);
    }
    auto c = fake_cuda::counters();
    CHECK_EQ(c.live_mallocs, 0);  // served from address ranges, not cudaMalloc
    CHECK(c.live_handles > 0);
    CHECK_EQ(arena.stats().reserved_bytes[0].current, c.used_bytes);
    arena.check_invariants();
    for (void* p : ps) arena.deallocate(p);
    arena.empty_cache();
    c = fake_cuda::counters();
    CHECK_EQ(c.live_handles, 0);  // everything unmapped
    CHECK_EQ(c.unsafe_unmaps, 0);
    CHECK_EQ(arena.stats().reserved_bytes[0].current, 0);
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
  check_no_sticky_error();
}

void test_arena_record_stream() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    fake_cuda::set_busy(side_stream(), true);
    void* p = arena.allocate(8 * MiB, 0);
    arena.record_stream(p, sid(side_stream()));
    arena.deallocate(p);
    arena.sync_point();  // one event recorded on the side stream for the group
    void* q = arena.allocate(8 * MiB, 0);
    CHECK(q != p);  // the side stream may still read p
    arena.deallocate(q);
    fake_cuda::complete(side_stream());
    arena.sync_point();
    void* r = arena.allocate(8 * MiB, 0);
    CHECK(r == p || r == q);  // both are free again
    arena.deallocate(r);
    arena.check_invariants();
    // empty_cache waits for pending uses, then unmaps: never while in flight.
    void* s = arena.allocate(8 * MiB, 0);
    arena.record_stream(s, sid(side_stream()));
    arena.deallocate(s);
    arena.empty_cache();
    CHECK_EQ(fake_cuda::counters().unsafe_unmaps, 0);
    CHECK_EQ(fake_cuda::counters().live_handles, 0);
  }
  dev.reset();
  check_nothing_live();
  check_no_sticky_error();
}

void test_arena_out_of_memory(bool vmm) {
  fake_cuda::reset(config(1, 64 * MiB, vmm));
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    void* a = arena.allocate(40 * MiB, 0);
    EXPECT_THROW(OutOfMemoryError, arena.allocate(32 * MiB, 0), "out of memory on cuda:0",
                 "Tried to allocate 32.00 MiB", "of 64.00 MiB");
    check_no_sticky_error();
    arena.check_invariants();
    void* b = arena.allocate(8 * MiB, 0);  // the next normal allocation works
    CHECK(b != nullptr);
    EXPECT_THROW(OutOfMemoryError, arena.allocate(std::size_t(1) << 62, 0), "Tried to allocate");
    arena.deallocate(a);
    arena.deallocate(b);
    // With a 40 MiB block cached, a 48 MiB request succeeds by giving the cache back.
    void* c = arena.allocate(48 * MiB, 0);
    CHECK(c != nullptr);
    arena.deallocate(c);
    arena.empty_cache();
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
}

// A driver failure while giving memory back leaves the arena consistent,
// and the memory still counted; the next try gives it back.
void test_arena_unmap_failure() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    void* keep = arena.allocate(4 * MiB, 0);
    void* p = arena.allocate(64 * MiB, 0);
    arena.deallocate(p);
    fake_cuda::fail_next("cuMemUnmap", CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_THROW(DeviceError, arena.empty_cache(), "cuMemUnmap");
    arena.check_invariants();
    CHECK_EQ(arena.stats().reserved_bytes[0].current, fake_cuda::counters().used_bytes);
    void* q = arena.allocate(64 * MiB, 0);  // the cached block is still usable
    CHECK(q == p);
    arena.deallocate(q);
    arena.deallocate(keep);
    fake_cuda::fail_next("cuMemUnmap", CUDA_ERROR_ILLEGAL_ADDRESS);  // a whole segment this time
    EXPECT_THROW(DeviceError, arena.empty_cache(), "cuMemUnmap");
    arena.check_invariants();
    CHECK_EQ(arena.stats().reserved_bytes[0].current, fake_cuda::counters().used_bytes);
    arena.empty_cache();
    CHECK_EQ(fake_cuda::counters().used_bytes, std::int64_t(0));
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
  check_no_sticky_error();
}

void test_arena_without_vmm() {
  fake_cuda::reset(config(1, 256 * MiB, false));
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    void* small = arena.allocate(1000, 0);
    void* large = arena.allocate(3 * MiB, 0);
    auto c = fake_cuda::counters();
    CHECK_EQ(c.live_mallocs, 2);  // one 2 MiB small segment, one 20 MiB large segment
    CHECK_EQ(c.used_bytes, static_cast<std::int64_t>(22 * MiB));
    arena.deallocate(small);
    arena.deallocate(large);
    arena.empty_cache();
    CHECK_EQ(fake_cuda::counters().live_mallocs, 0);
  }
  dev.reset();
  check_nothing_live();
}

void test_arena_threads() {
  fake_cuda::reset(config(1, std::size_t(1) << 30));
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&arena, t] {
        std::vector<void*> live;
        std::uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
        for (int i = 0; i < 3000; ++i) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          if (live.size() < 16 && (x & 3) != 0) {
            const std::size_t sz = (x >> 8) % (6 * MiB) + 1;
            void* p = arena.allocate(sz, 0);
            static_cast<char*>(p)[0] = 1;
            static_cast<char*>(p)[sz - 1] = 2;
            live.push_back(p);
          } else if (!live.empty()) {
            const std::size_t k = (x >> 16) % live.size();
            arena.deallocate(live[k]);
            live[k] = live.back();
            live.pop_back();
          }
          if (i % 500 == 0 && t == 0) arena.empty_cache();
        }
        for (void* p : live) arena.deallocate(p);
      });
    }
    for (auto& th : threads) th.join();
    arena.check_invariants();
    CHECK_EQ(arena.stats().allocated_bytes[0].current, 0);
    arena.empty_cache();
    CHECK_EQ(fake_cuda::counters().unsafe_unmaps, 0);
  }
  dev.reset();
  check_nothing_live();
}

// Two arenas of one device in a StatsGroup (the default arena and a graph
// pool): device-wide peaks are peaks of the sum, not sums of the peaks.
void test_stats_group() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  auto group = std::make_shared<StatsGroup>();
  const auto m64 = static_cast<std::int64_t>(64 * MiB);
  {
    Arena a(dev, ArenaConfig{}, group);
    {
      Arena b(dev, ArenaConfig{}, group);
      void* p = a.allocate(64 * MiB, 0);
      a.deallocate(p);
      void* q = b.allocate(64 * MiB, 0);
      DeviceStats t = group->totals();
      CHECK_EQ(t.allocated_bytes[0].current, m64);
      CHECK_EQ(t.allocated_bytes[0].peak, m64);  // each arena's peak is 64 MiB; the sum's too
      CHECK_EQ(a.stats().allocated_bytes[0].peak + b.stats().allocated_bytes[0].peak, 2 * m64);
      CHECK_EQ(t.reserved_bytes[0].current,
               a.stats().reserved_bytes[0].current + b.stats().reserved_bytes[0].current);
      CHECK_EQ(t.allocation[0].peak, std::int64_t(1));
      void* r = a.allocate(32 * MiB, 0);
      t = group->totals();
      CHECK_EQ(t.allocated_bytes[0].peak, m64 + m64 / 2);
      a.deallocate(r);
      b.deallocate(q);
      // An out-of-memory error is published too (it throws out of allocate).
      EXPECT_THROW(OutOfMemoryError, a.allocate(std::size_t(1) << 40, 0), "out of memory");
      t = group->totals();
      CHECK_EQ(t.allocated_bytes[0].current, std::int64_t(0));
      group->reset_peak();
      CHECK_EQ(group->totals().allocated_bytes[0].peak, std::int64_t(0));
      CHECK_EQ(group->totals().reserved_bytes[0].peak, group->totals().reserved_bytes[0].current);
    }
    // b is gone: its reserved memory left the totals with it.
    CHECK_EQ(group->totals().reserved_bytes[0].current, a.stats().reserved_bytes[0].current);
    a.empty_cache();
    CHECK_EQ(group->totals().reserved_bytes[0].current, std::int64_t(0));
  }
  CHECK_EQ(group->totals().segment[0].current, std::int64_t(0));
  dev.reset();
  check_nothing_live();
}

// A limit set after memory was reserved (set_per_process_memory_fraction).
void test_limit_changes() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    void* p = arena.allocate(32 * MiB, 0);
    arena.set_max_reserved_bytes(40 * MiB);
    EXPECT_THROW(OutOfMemoryError, arena.allocate(16 * MiB, 0), "limit: 40.00 MiB");
    void* q = arena.allocate(4 * MiB, 0);  // within the limit
    arena.set_max_reserved_bytes(16 * MiB);  // below what is reserved: no growth, nothing lost
    EXPECT_THROW(OutOfMemoryError, arena.allocate(8 * MiB, 0), "limit: 16.00 MiB");
    CHECK(fake_cuda::accessible(p, 32 * MiB));
    arena.set_max_reserved_bytes(0);
    void* r = arena.allocate(16 * MiB, 0);
    for (void* x : {p, q, r}) arena.deallocate(x);
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
}


// The driver reports VMM support, then refuses the mapping (some virtualized
// GPUs): the probe turns address ranges off, names the error, leaks nothing,
// and the arena serves from cudaMalloc segments with the right stats.
void test_vmm_probe_refused() {
  fake_cuda::reset(config());
  fake_cuda::fail_next("cuMemCreate", CUDA_ERROR_NOT_SUPPORTED);
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});  // the device's first arena: the probe runs
    CHECK(!dev->supports_address_ranges());
    CHECK(dev->vmm_status() == "off: the driver refused a probe mapping: cuMemCreate failed: "
                               "operation not supported (CUDA_ERROR_NOT_SUPPORTED)");
    const std::string warning = dev->vmm_refusal();
    CHECK(warning.find("cuda:0 refused CUDA virtual memory") != std::string::npos);
    CHECK(warning.find("CUDA_ERROR_NOT_SUPPORTED") != std::string::npos);
    CHECK(warning.find('\n') == std::string::npos);  // one line
    CHECK_EQ(fake_cuda::counters().live_reservations, 0);  // the probe's range is gone
    check_no_sticky_error();
    void* a = arena.allocate(1000, 0);
    void* b = arena.allocate(3 * MiB, 0);
    void* c = arena.allocate(64 * MiB, 0);
    const auto k = fake_cuda::counters();
    CHECK_EQ(k.live_mallocs, 3);  // 2 MiB small, 20 MiB large, 64 MiB
    CHECK_EQ(k.live_handles, 0);
    CHECK_EQ(arena.stats().reserved_bytes[0].current, k.used_bytes);
    CHECK_EQ(k.used_bytes, static_cast<std::int64_t>(86 * MiB));
    CHECK_EQ(arena.stats().allocated_bytes[0].current,
             static_cast<std::int64_t>(1024 + 3 * MiB + 64 * MiB));
    for (void* p : {a, b, c}) arena.deallocate(p);
    arena.empty_cache();
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
  // Refused at the other steps: off as well, nothing left behind.
  for (const char* call : {"cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve"}) {
    fake_cuda::reset(config());
    fake_cuda::fail_next(call, CUDA_ERROR_NOT_SUPPORTED);
    {
      CudaDevice d(0);
      CHECK(!d.supports_address_ranges());
      CHECK(d.vmm_status().find(std::string(call) + " failed") != std::string::npos);
    }
    const auto k = fake_cuda::counters();
    CHECK_EQ(k.live_handles, 0);
    CHECK_EQ(k.live_reservations, 0);
    CHECK_EQ(k.used_bytes, 0);
  }
  // Out of memory says nothing about support: address ranges stay on.
  fake_cuda::reset(config());
  fake_cuda::fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  {
    CudaDevice d(0);
    CHECK(d.supports_address_ranges());
    CHECK(d.vmm_refusal().empty());
  }
  check_nothing_live();
  check_no_sticky_error();
}

// Large growths take one cuMemCreate per 20 MiB, not per 2 MiB granule,
// and any granule-aligned sub-range can still be unmapped (cut handles are
// held until their last granule goes).
void test_large_handles() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  const std::size_t g = d.range_granularity();
  char* base = static_cast<char*>(d.reserve_range(128 * g));
  auto before = fake_cuda::counters().handles_created;
  CHECK(d.map(base, 100 * g));  // 200 MiB
  CHECK_EQ(fake_cuda::counters().handles_created - before, 10);
  CHECK(d.map(base + 100 * g, 11 * g));  // 22 MiB: 20 + 2
  CHECK_EQ(fake_cuda::counters().handles_created - before, 12);
  d.unmap(base, 111 * g);
  CHECK_EQ(fake_cuda::counters().live_handles, 0);
  CHECK_EQ(fake_cuda::counters().used_bytes, 0);

  // [0, 40 MiB) in two 20 MiB handles A, B; unmap [10, 30): it cuts both.
  CHECK(d.map(base, 20 * g));
  std::memset(base, 7, 20 * g);
  before = fake_cuda::counters().handles_created;
  d.unmap(base + 5 * g, 10 * g);
  auto c = fake_cuda::counters();
  CHECK_EQ(c.live_handles, 2);  // nothing could go back
  CHECK_EQ(c.used_bytes, static_cast<std::int64_t>(40 * MiB));
  CHECK_EQ(d.held_bytes(), 20 * MiB);
  CHECK(fake_cuda::accessible(base, 5 * g) && fake_cuda::accessible(base + 15 * g, 5 * g));
  CHECK_EQ(static_cast<int>(base[0]), 7);
  CHECK_EQ(static_cast<int>(base[20 * g - 1]), 7);
  EXPECT_THROW(DeviceError, d.unmap(base + 5 * g, g), "not mapped");
  EXPECT_THROW(DeviceError, d.map(base, g), "already mapped");
  // The rest of A: A goes back whole.
  d.unmap(base, 5 * g);
  c = fake_cuda::counters();
  CHECK_EQ(c.live_handles, 1);
  CHECK_EQ(c.used_bytes, static_cast<std::int64_t>(20 * MiB));
  CHECK_EQ(d.held_bytes(), 10 * MiB);
  CHECK(!fake_cuda::accessible(base, 10 * g));
  // Mapping [10, 30) again: A's part needs a new handle, B's held part
  // comes back without one, its data intact.
  CHECK(d.map(base + 5 * g, 10 * g));
  CHECK_EQ(fake_cuda::counters().handles_created - before, 1);
  CHECK_EQ(d.held_bytes(), std::size_t(0));
  CHECK_EQ(static_cast<int>(base[15 * g]), 7);
  CHECK(fake_cuda::accessible(base + 5 * g, 15 * g));
  d.unmap(base + 5 * g, 15 * g);
  c = fake_cuda::counters();
  CHECK_EQ(c.live_handles, 0);
  CHECK_EQ(c.used_bytes, 0);
  d.release_range(base, 128 * g);
  check_nothing_live();
  check_no_sticky_error();
}

// Giving memory back synchronizes the streams that used it, not the device:
// a busy stream that never touched the arena's memory is not waited for.
void test_unmap_syncs_only_its_streams() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  const cudaStream_t alloc_stream = reinterpret_cast<cudaStream_t>(std::uintptr_t(0x5200));
  const cudaStream_t other = reinterpret_cast<cudaStream_t>(std::uintptr_t(0x5300));
  {
    Arena arena(dev, ArenaConfig{});
    fake_cuda::set_busy(alloc_stream, true);
    fake_cuda::set_busy(side_stream(), true);
    fake_cuda::set_busy(other, true);
    fake_cuda::set_unrelated(other);
    const EventId unrelated_work = dev->create_event();
    dev->record_event(unrelated_work, sid(other));  // e.g. an all-reduce in flight
    void* p = arena.allocate(8 * MiB, sid(alloc_stream));
    void* q = arena.allocate(40 * MiB, sid(alloc_stream));
    const EventId kernel = dev->create_event();
    dev->record_event(kernel, sid(alloc_stream));  // a kernel on p and q, in flight
    arena.record_stream(q, sid(side_stream()));
    arena.deallocate(p);
    arena.deallocate(q);
    const auto before = fake_cuda::counters();
    arena.empty_cache();
    const auto after = fake_cuda::counters();
    CHECK_EQ(after.live_handles, 0);
    CHECK_EQ(after.device_synchronizes, before.device_synchronizes);
    CHECK(after.stream_synchronizes > before.stream_synchronizes);
    // The allocating stream was synchronized; the side stream's use was
    // waited for (its event) before q's block became free.
    CHECK_EQ(after.unsafe_unmaps, 0);
    CHECK(after.event_synchronizes > before.event_synchronizes);
    CHECK(dev->query_event(kernel));
    CHECK(!dev->query_event(unrelated_work));  // the unrelated stream was not
    dev->destroy_event(kernel);
    dev->destroy_event(unrelated_work);
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
  check_no_sticky_error();
}

// The lock-order checker of debug builds (this program is one).
void test_lock_order_checker() {
  using namespace lock_order;
  Mutex<kArena> arena;
  Mutex<kDeviceState> device;
  Mutex<kLeaf> leaf;
  Mutex<kStatsGroup> stats;
  CHECK_EQ(held_count(), 0);
  {
    std::lock_guard<Mutex<kDeviceState>> a(device);
    std::lock_guard<Mutex<kArena>> b(arena);
    std::lock_guard<Mutex<kStatsGroup>> c(stats);
    std::lock_guard<Mutex<kLeaf>> d(leaf);
    CHECK_EQ(held_count(), 4);
  }
  CHECK_EQ(held_count(), 0);
  {
    std::lock_guard<Mutex<kArena>> b(arena);
    EXPECT_THROW(std::logic_error, device.lock(), "lock order broken",
                 "taking a device state while holding an arena");
    Mutex<kArena> another;
    EXPECT_THROW(std::logic_error, another.lock(), "taking an arena while holding an arena");
  }
  {
    std::lock_guard<Mutex<kLeaf>> d(leaf);
    Mutex<kLeaf> shard;
    EXPECT_THROW(std::logic_error, shard.lock(), "while holding a leaf lock");
  }
  CHECK_EQ(held_count(), 0);
  device.lock();  // the refused attempts took nothing
  device.unlock();
}
}  // namespace

// cudaStreamQuery behind stream_idle: "not ready" is an answer (no sticky
// error), a capturing stream is never queried, other errors throw.
void test_stream_idle() {
  fake_cuda::reset(config());
  CudaDevice d(0);
  const StreamId side = sid(side_stream());
  CHECK(d.stream_idle(side));  // nothing enqueued
  fake_cuda::set_busy(side_stream(), true);
  CHECK(!d.stream_idle(side));
  check_no_sticky_error();
  fake_cuda::complete(side_stream());
  CHECK(d.stream_idle(side));
  fake_cuda::set_capturing(true);
  const auto queries = fake_cuda::counters().stream_queries;
  CHECK(!d.stream_idle(side));
  CHECK_EQ(fake_cuda::counters().stream_queries, queries);
  CHECK_EQ(fake_cuda::counters().calls_during_capture, 0);
  fake_cuda::set_capturing(false);
  fake_cuda::fail_next("cudaStreamQuery", cudaErrorIllegalAddress);
  EXPECT_THROW(DeviceError, d.stream_idle(side), "cudaStreamQuery", "an illegal memory access");
  check_no_sticky_error();
  check_nothing_live();
}

// Issue 11 item 4 on CUDA: a block freed with a use on a side stream whose
// work has finished is reused by the very next request of its size, with no
// event recorded for it (before: CudaDevice could not tell an idle stream,
// so the block stayed pending until a sync point sealed its group and that
// event was queried).
void test_arena_notices_finished_stream_work() {
  fake_cuda::reset(config());
  auto dev = std::make_shared<CudaDevice>(0);
  {
    Arena arena(dev, ArenaConfig{});
    void* keep = arena.allocate(1 * MiB, 0);
    fake_cuda::set_busy(side_stream(), true);
    void* p = arena.allocate(1 * MiB, 0);
    arena.record_stream(p, sid(side_stream()));
    arena.deallocate(p);
    CHECK_EQ(arena.stats().pending_bytes.current, static_cast<std::int64_t>(1 * MiB));
    fake_cuda::complete(side_stream());
    const auto before = fake_cuda::counters();
    void* r = arena.allocate(1 * MiB, 0);
    CHECK(r == p);  // free again: the stream is idle
    CHECK_EQ(arena.stats().pending_bytes.current, 0);
    CHECK_EQ(fake_cuda::counters().live_events, before.live_events);  // no event for it
    CHECK_EQ(fake_cuda::counters().stream_queries, before.stream_queries + 1);
    for (void* x : {keep, r}) arena.deallocate(x);
    arena.check_invariants();
  }
  dev.reset();
  check_nothing_live();
  check_no_sticky_error();
}

int main() {
  const fake_cuda::TestList tests = {
      {"no_device", test_no_device},
      {"bad_index", test_bad_index},
      {"reserve_release", test_reserve_release},
      {"device_guard", test_device_guard},
      {"reserve_out_of_memory", test_reserve_out_of_memory},
      {"error_text", test_error_text},
      {"vmm_status", test_vmm_status},
      {"map_unmap", test_map_unmap},
      {"map_failures_roll_back", test_map_failures_roll_back},
      {"destructor_returns_ranges", test_destructor_returns_ranges},
      {"peer_access", test_peer_access},
      {"events", test_events},
      {"stream_idle", test_stream_idle},
      {"arena_notices_finished_stream_work", test_arena_notices_finished_stream_work},
      {"arena_expandable", test_arena_expandable},
      {"arena_record_stream", test_arena_record_stream},
      {"arena_out_of_memory_vmm", [] { test_arena_out_of_memory(true); }},
      {"arena_out_of_memory_cudamalloc", [] { test_arena_out_of_memory(false); }},
      {"arena_unmap_failure", test_arena_unmap_failure},
      {"arena_without_vmm", test_arena_without_vmm},
      {"arena_threads", test_arena_threads},
      {"stats_group", test_stats_group},
      {"limit_changes", test_limit_changes},
      {"vmm_probe_refused", test_vmm_probe_refused},
      {"large_handles", test_large_handles},
      {"unmap_syncs_only_its_streams", test_unmap_syncs_only_its_streams},
      {"lock_order_checker", test_lock_order_checker},
  };
  return fake_cuda::run_tests(tests);
}
