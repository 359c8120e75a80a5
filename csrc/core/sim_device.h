// sim_device.h - SimDevice: host memory with simulated streams and a clock
// that the caller (a test) advances, so that stream-ordered policies can be
// checked deterministically on a machine without a GPU.
//
// Model:
//   * Each stream is a queue of work units. enqueue() appends units and
//     returns the position of the last one; advance() completes units.
//   * An event recorded on stream S captures S's current enqueued position;
//     it is complete once S has completed that many units.
//   * stream_wait_event(T, e) puts a barrier at T's current enqueued
//     position: T cannot complete units past it until e is complete.
//   * synchronize_event() is the host blocking on the device: it advances
//     the event's stream (and, through barriers, the streams it waits on)
//     until the event is complete, and counts one host synchronization.
// Invariants:
//   * Memory behaves like HostDevice's, with alignment() bytes alignment and
//     an optional capacity: reserve()/map() past it are refused (nullptr /
//     false), like a full GPU.
//   * Every record, query and wait is logged for tests.
//   * Thread safe: one mutex guards the simulated state.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace renaissance {

struct SimWait {  // one stream_wait_event call, for tests
  StreamId stream;        // the stream made to wait
  EventId event;
  StreamId event_stream;  // where the event was recorded
  std::uint64_t event_position;  // units of event_stream it covers
};

class SimDevice final : public Device {
 public:
  // capacity_bytes: 0 = unlimited. alignment: 512 simulates device memory.
  explicit SimDevice(std::size_t capacity_bytes = 0, std::size_t alignment = 512);
  ~SimDevice() override;

  std::string name() const override { return "sim"; }
  bool is_device_memory() const override { return alignment_ >= 512; }
  std::size_t alignment() const override { return alignment_; }

  void* reserve(std::size_t bytes) override;
  void release(void* ptr, std::size_t bytes) override;
  MemInfo mem_info() const override;
  // The capacity, or RAM + swap when unlimited (its memory is the host's).
  std::size_t max_request_bytes() const override;

  bool supports_address_ranges() const override { return ranges_enabled_; }
  std::size_t range_granularity() const override;
  void* reserve_range(std::size_t bytes) override;
  void release_range(void* base, std::size_t bytes) override;
  bool map(void* ptr, std::size_t bytes) override;
  void unmap(void* ptr, std::size_t bytes) override;

  bool valid_stream(StreamId stream) const override;
  EventId create_event() override;
  void destroy_event(EventId event) override;
  void record_event(EventId event, StreamId stream) override;
  bool query_event(EventId event) override;
  bool stream_idle(StreamId stream) override;  // counted as a query
  void synchronize_event(EventId event) override;
  void stream_wait_event(StreamId stream, EventId event) override;

  // --- simulation controls (tests) ----------------------------------------
  void set_address_ranges(bool enabled) { ranges_enabled_ = enabled; }
  StreamId new_stream();
  std::size_t num_streams() const;
  std::uint64_t enqueue(StreamId stream, std::uint64_t units = 1);
  // Completes up to `units` units of `stream`; returns how many completed
  // (fewer when a barrier blocks or the queue runs dry).
  std::uint64_t advance(StreamId stream, std::uint64_t units);
  // Completes everything that can complete on every stream.
  void run_all();
  std::uint64_t enqueued(StreamId stream) const;
  std::uint64_t completed(StreamId stream) const;

  std::vector<SimWait> waits() const;
  std::uint64_t events_recorded() const;
  std::uint64_t event_queries() const;
  std::uint64_t host_synchronizations() const;
  std::size_t live_events() const;
  std::size_t used_bytes() const;  // reserved + mapped, against the capacity

 private:
  struct Barrier {
    std::uint64_t position;
    EventId event;
  };
  struct Stream {
    std::uint64_t enqueued = 0;
    std::uint64_t completed = 0;
    std::deque<Barrier> barriers;
  };
  struct Event {
    bool recorded = false;
    StreamId stream = 0;
    std::uint64_t position = 0;
  };

  Stream& stream_locked(StreamId id);
  const Stream& stream_locked(StreamId id) const;
  bool event_done_locked(const Event& e) const;
  std::uint64_t advance_locked(StreamId id, std::uint64_t units, int depth);
  bool fits_locked(std::size_t bytes) const;

  mutable std::mutex mu_;
  std::size_t capacity_;
  std::size_t alignment_;
  bool ranges_enabled_ = true;
  std::size_t used_ = 0;
  std::unordered_map<void*, std::size_t> reservations_;
  std::vector<Stream> streams_;
  std::unordered_map<EventId, Event> events_;
  EventId next_event_ = 0;
  std::vector<SimWait> waits_;
  std::uint64_t records_ = 0;
  std::uint64_t queries_ = 0;
  std::uint64_t syncs_ = 0;
};

}  // namespace renaissance
