// host_device.h - HostDevice (CPU memory) and the host address-range helper
// shared with SimDevice.
//
// Invariants:
//   * reserve() returns 64-byte aligned memory; reservations of 64 KiB and
//     more are page aligned. nullptr when the system refuses.
//   * Address ranges are reserved with mmap(PROT_NONE, MAP_NORESERVE): they
//     cost no memory until map() makes a granule-aligned part read/write;
//     unmap() returns the pages to the system (MADV_DONTNEED) and protects
//     them again, so a stray access faults instead of corrupting.
//   * Events complete at once: the CPU has no asynchronous streams.
#pragma once

#include <atomic>

#include "core/device.h"

namespace renaissance {

// Address-space reservation and mapping on the host (used by HostDevice and
// SimDevice). HostDevice maps in 64 KiB granules (pages would do; 64 KiB
// keeps system calls few); SimDevice uses CUDA's 2 MiB VMM granularity so
// that simulated runs behave like a GPU.
struct HostRanges {
  static constexpr std::size_t kHostGranularity = std::size_t(64) << 10;
  static constexpr std::size_t kDeviceGranularity = std::size_t(2) << 20;
  static void* reserve_range(std::size_t bytes);
  static void release_range(void* base, std::size_t bytes);
  static bool map(void* ptr, std::size_t bytes);
  static void unmap(void* ptr, std::size_t bytes);
};

// Page- or 64-byte aligned host memory. nullptr when refused.
void* host_reserve(std::size_t bytes);
void host_release(void* ptr);
MemInfo host_mem_info();
// RAM + swap in bytes: what the kernel would refuse one malloc beyond.
std::size_t host_request_limit();

class HostDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool is_device_memory() const override { return false; }
  std::size_t alignment() const override { return 64; }

  void* reserve(std::size_t bytes) override { return host_reserve(bytes); }
  void release(void* ptr, std::size_t) override { host_release(ptr); }
  MemInfo mem_info() const override { return host_mem_info(); }
  std::size_t max_request_bytes() const override { return host_request_limit(); }

  bool supports_address_ranges() const override { return true; }
  std::size_t range_granularity() const override { return HostRanges::kHostGranularity; }
  void* reserve_range(std::size_t bytes) override { return HostRanges::reserve_range(bytes); }
  void release_range(void* base, std::size_t bytes) override {
    HostRanges::release_range(base, bytes);
  }
  bool map(void* ptr, std::size_t bytes) override { return HostRanges::map(ptr, bytes); }
  void unmap(void* ptr, std::size_t bytes) override { HostRanges::unmap(ptr, bytes); }

  EventId create_event() override { return ++next_event_; }
  void destroy_event(EventId) override {}
  void record_event(EventId, StreamId) override {}
  bool query_event(EventId) override { return true; }
  bool stream_idle(StreamId) override { return true; }
  void synchronize_event(EventId) override {}
  void stream_wait_event(StreamId, EventId) override {}

 private:
  std::atomic<EventId> next_event_{0};
};

}  // namespace renaissance
