// device.h - the device backend interface: the only place that knows what
// memory, streams and events really are (mimalloc's prim/ layer).
//
// Invariants every backend keeps:
//   * reserve() returns memory aligned to alignment() or nullptr when the
//     backend refuses (out of memory); any other failure throws DeviceError.
//   * release() is given exactly a pointer and size that reserve() returned.
//   * An event recorded on stream S completes only after all work enqueued on
//     S before the record has completed. query() never blocks; synchronize()
//     blocks until the event completes. An event never recorded is complete.
//   * stream_wait() makes all work enqueued on the stream after the call wait
//     for the event, on the device, without blocking the host.
//   * Address-range reservations (expandable segments) are optional: a
//     backend that does not support them returns false from
//     supports_address_ranges() and never has the range functions called.
//
// Stream ids: 0 is the device's default stream; other ids are backend
// specific (a cudaStream_t cast to an integer for CudaDevice, a small index
// for SimDevice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance {

using StreamId = std::uint64_t;
using EventId = std::uint64_t;

// Free and total memory of the device in bytes (what cudaMemGetInfo reports).
struct MemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // Short name used in messages and stats ("cpu", "sim", "cuda:0").
  virtual std::string name() const = 0;
  // True for device memory (512 B rounding), false for host memory (64 B).
  virtual bool is_device_memory() const = 0;
  // Alignment in bytes of every pointer reserve() returns.
  virtual std::size_t alignment() const = 0;

  // --- memory -------------------------------------------------------------
  virtual void* reserve(std::size_t bytes) = 0;  // nullptr: refused (OOM)
  virtual void release(void* ptr, std::size_t bytes) = 0;
  virtual MemInfo mem_info() const = 0;
  // The largest single request this backend could ever serve, in bytes (0:
  // no bound known). The arena refuses a larger request at once, whatever
  // it has cached, instead of relying on a growth to be refused.
  virtual std::size_t max_request_bytes() const { return 0; }

  // --- address ranges (expandable segments) -------------------------------
  virtual bool supports_address_ranges() const { return false; }
  // Granularity in bytes of map/unmap offsets and sizes.
  virtual std::size_t range_granularity() const { return 0; }
  // Reserves address space only (no memory). nullptr: refused.
  virtual void* reserve_range(std::size_t /*bytes*/) { return nullptr; }
  virtual void release_range(void* /*base*/, std::size_t /*bytes*/) {}
  // Backs [ptr, ptr + bytes) with memory. false: refused (out of memory).
  virtual bool map(void* /*ptr*/, std::size_t /*bytes*/) { return false; }
  virtual void unmap(void* /*ptr*/, std::size_t /*bytes*/) {}
  // The same, where the caller knows that only work enqueued on `streams`
  // may still touch [ptr, ptr + bytes) (every block there is free, and the
  // other streams' uses of them have completed): a backend whose unmap does
  // not wait for the device (CUDA VMM) synchronizes just those streams
  // instead of the whole device, as PyTorch's expandable segments do.
  // Backends without that concern unmap as above.
  virtual void unmap_used_by(void* ptr, std::size_t bytes, const std::vector<StreamId>& /*streams*/) {
    unmap(ptr, bytes);
  }

  // --- streams and events -------------------------------------------------
  // False for a stream id this backend can never record on (checked when a
  // stream use is registered, so a bad id fails there and not later).
  virtual bool valid_stream(StreamId /*stream*/) const { return true; }
  virtual EventId create_event() = 0;
  virtual void destroy_event(EventId event) = 0;
  virtual void record_event(EventId event, StreamId stream) = 0;
  virtual bool query_event(EventId event) = 0;
  // True when all work enqueued on `stream` so far has completed; false when
  // not, or not known (the default). Never blocks; costs about one query.
  virtual bool stream_idle(StreamId /*stream*/) { return false; }
  virtual void synchronize_event(EventId event) = 0;
  virtual void stream_wait_event(StreamId stream, EventId event) = 0;
};

}  // namespace renaissance
