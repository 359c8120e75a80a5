// sim_device.cpp - see sim_device.h for the model and invariants.
#include "core/sim_device.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/errors.h"
#include "core/host_device.h"

namespace renaissance {

SimDevice::SimDevice(std::size_t capacity_bytes, std::size_t alignment)
    : capacity_(capacity_bytes), alignment_(alignment), streams_(1) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096) {
    throw std::invalid_argument("SimDevice alignment must be a power of two <= 4096, got " +
                                std::to_string(alignment));
  }
}

SimDevice::~SimDevice() {
  for (auto& [ptr, bytes] : reservations_) std::free(ptr);
}

bool SimDevice::fits_locked(std::size_t bytes) const {
  return capacity_ == 0 || (used_ <= capacity_ && bytes <= capacity_ - used_);
}

void* SimDevice::reserve(std::size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  if (bytes == 0 || !fits_locked(bytes)) return nullptr;
  void* p = nullptr;
  if (posix_memalign(&p, std::max<std::size_t>(alignment_, sizeof(void*)), bytes) != 0) {
    return nullptr;
  }
  reservations_.emplace(p, bytes);
  used_ += bytes;
  return p;
}

void SimDevice::release(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = reservations_.find(ptr);
  if (it == reservations_.end() || it->second != bytes) {
    throw DeviceError("SimDevice::release of memory it did not reserve");
  }
  used_ -= bytes;
  reservations_.erase(it);
  std::free(ptr);
}

MemInfo SimDevice::mem_info() const {
  std::lock_guard<std::mutex> g(mu_);
  if (capacity_ == 0) return host_mem_info();
  return MemInfo{capacity_ - std::min(used_, capacity_), capacity_};
}

std::size_t SimDevice::max_request_bytes() const {
  return capacity_ ? capacity_ : host_request_limit();
}

std::size_t SimDevice::range_granularity() const { return HostRanges::kDeviceGranularity; }

void* SimDevice::reserve_range(std::size_t bytes) { return HostRanges::reserve_range(bytes); }

void SimDevice::release_range(void* base, std::size_t bytes) {
  HostRanges::release_range(base, bytes);
}

bool SimDevice::map(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  if (!fits_locked(bytes)) return false;
  if (!HostRanges::map(ptr, bytes)) return false;
  used_ += bytes;
  return true;
}

void SimDevice::unmap(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  HostRanges::unmap(ptr, bytes);
  used_ -= std::min(used_, bytes);
}

SimDevice::Stream& SimDevice::stream_locked(StreamId id) {
  if (id >= streams_.size()) {
    throw std::invalid_argument("SimDevice has no stream " + std::to_string(id) +
                                " (it has " + std::to_string(streams_.size()) + ")");
  }
  return streams_[id];
}

const SimDevice::Stream& SimDevice::stream_locked(StreamId id) const {
  return const_cast<SimDevice*>(this)->stream_locked(id);
}

bool SimDevice::event_done_locked(const Event& e) const {
  return !e.recorded || streams_[e.stream].completed >= e.position;
}

bool SimDevice::valid_stream(StreamId stream) const {
  std::lock_guard<std::mutex> g(mu_);
  return stream < streams_.size();
}

EventId SimDevice::create_event() {
  std::lock_guard<std::mutex> g(mu_);
  EventId id = ++next_event_;
  events_.emplace(id, Event{});
  return id;
}

void SimDevice::destroy_event(EventId event) {
  std::lock_guard<std::mutex> g(mu_);
  events_.erase(event);
}

void SimDevice::record_event(EventId event, StreamId stream) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) throw DeviceError("SimDevice: record of an unknown event");
  Stream& s = stream_locked(stream);
  it->second = Event{true, stream, s.enqueued};
  ++records_;
}

bool SimDevice::query_event(EventId event) {
  std::lock_guard<std::mutex> g(mu_);
  ++queries_;
  auto it = events_.find(event);
  if (it == events_.end()) throw DeviceError("SimDevice: query of an unknown event");
  return event_done_locked(it->second);
}

bool SimDevice::stream_idle(StreamId stream) {
  std::lock_guard<std::mutex> g(mu_);
  ++queries_;
  const Stream& s = stream_locked(stream);
  return s.completed >= s.enqueued;
}

void SimDevice::synchronize_event(EventId event) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) throw DeviceError("SimDevice: synchronize on an unknown event");
  ++syncs_;
  const Event e = it->second;
  if (event_done_locked(e)) return;
  advance_locked(e.stream, e.position - streams_[e.stream].completed, 0);
  if (!event_done_locked(e)) {
    throw DeviceError("SimDevice: deadlock: event can never complete (circular stream waits)");
  }
}

void SimDevice::stream_wait_event(StreamId stream, EventId event) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) throw DeviceError("SimDevice: wait on an unknown event");
  Stream& s = stream_locked(stream);
  const Event& e = it->second;
  waits_.push_back(SimWait{stream, event, e.stream, e.position});
  if (event_done_locked(e)) return;
  // Keep the event's state in the barrier even if the event is re-recorded
  // later: store a private copy under a fresh id.
  EventId copy = ++next_event_;
  events_.emplace(copy, e);
  s.barriers.push_back(Barrier{s.enqueued, copy});
}

StreamId SimDevice::new_stream() {
  std::lock_guard<std::mutex> g(mu_);
  streams_.emplace_back();
  return streams_.size() - 1;
}

std::size_t SimDevice::num_streams() const {
  std::lock_guard<std::mutex> g(mu_);
  return streams_.size();
}

std::uint64_t SimDevice::enqueue(StreamId stream, std::uint64_t units) {
  std::lock_guard<std::mutex> g(mu_);
  Stream& s = stream_locked(stream);
  s.enqueued += units;
  return s.enqueued;
}

std::uint64_t SimDevice::advance_locked(StreamId id, std::uint64_t units, int depth) {
  std::uint64_t done = 0;
  if (depth > static_cast<int>(streams_.size())) return 0;  // circular waits
  while (done < units) {
    Stream& s = streams_[id];
    if (s.completed >= s.enqueued) break;
    std::uint64_t limit = s.enqueued;
    if (!s.barriers.empty()) {
      Barrier& b = s.barriers.front();
      auto it = events_.find(b.event);
      if (it == events_.end() || event_done_locked(it->second)) {
        if (it != events_.end()) events_.erase(it);
        s.barriers.pop_front();
        continue;
      }
      if (s.completed >= b.position) {
        // Blocked: let the stream we wait on make progress first.
        const Event e = it->second;
        const std::uint64_t before = streams_[e.stream].completed;
        if (e.stream == id) break;
        advance_locked(e.stream, e.position - before, depth + 1);
        if (streams_[e.stream].completed == before) break;  // no progress
        continue;
      }
      limit = std::min(limit, b.position);
    }
    const std::uint64_t step = std::min(units - done, limit - s.completed);
    s.completed += step;
    done += step;
  }
  return done;
}

std::uint64_t SimDevice::advance(StreamId stream, std::uint64_t units) {
  std::lock_guard<std::mutex> g(mu_);
  stream_locked(stream);
  return advance_locked(stream, units, 0);
}

void SimDevice::run_all() {
  std::lock_guard<std::mutex> g(mu_);
  bool progress = true;
  while (progress) {
    progress = false;
    for (StreamId id = 0; id < streams_.size(); ++id) {
      const std::uint64_t left = streams_[id].enqueued - streams_[id].completed;
      if (left && advance_locked(id, left, 0)) progress = true;
    }
  }
}

std::uint64_t SimDevice::enqueued(StreamId stream) const {
  std::lock_guard<std::mutex> g(mu_);
  return stream_locked(stream).enqueued;
}

std::uint64_t SimDevice::completed(StreamId stream) const {
  std::lock_guard<std::mutex> g(mu_);
  return stream_locked(stream).completed;
}

std::vector<SimWait> SimDevice::waits() const {
  std::lock_guard<std::mutex> g(mu_);
  return waits_;
}

std::uint64_t SimDevice::events_recorded() const {
  std::lock_guard<std::mutex> g(mu_);
  return records_;
}

std::uint64_t SimDevice::event_queries() const {
  std::lock_guard<std::mutex> g(mu_);
  return queries_;
}

std::uint64_t SimDevice::host_synchronizations() const {
  std::lock_guard<std::mutex> g(mu_);
  return syncs_;
}

std::size_t SimDevice::live_events() const {
  std::lock_guard<std::mutex> g(mu_);
  return events_.size();
}

std::size_t SimDevice::used_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

}  // namespace renaissance
