// stream_events.h - stream uses resolved with group-level events.
//
// A block freed while other streams may still use it is *pending*. Pending
// blocks are grouped by (pool side, owner stream, use stream). A group is open
// until the next boundary (a step boundary, a stream-manager sync point, or
// an allocation that finds no free block); then ONE event is recorded on the
// use stream for the whole group and the group is sealed. A sealed group's
// event covers all work enqueued on the use stream before the boundary, which
// includes everything enqueued before each of its blocks was freed.
//
// Invariants:
//   * A block is released only when every group it belongs to is released;
//     a group is released only when its event is complete (query or host
//     synchronization) or when the stream that takes the memory has been made
//     to wait on the event (the stream-ordered `wait` policy).
//   * Events per boundary are O(groups), never O(blocks); queries likewise.
//   * release_completed() queries the sealed groups of one key in recording
//     order and stops at the first incomplete one (events on one stream
//     complete in order); release_region() may release a later group of a
//     key and keep an earlier one sealed.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "core/block.h"
#include "core/device.h"

namespace renaissance {

// Which side of the arena a pending block is on: the dynamic pool or the planned
// territory. (Named PoolSide, not Region: in docs/design.md's words a region is a
// named part of a memory plan.)
enum class PoolSide : std::uint32_t { kDynamic = 0, kPlanned = 1 };

struct GroupKey {
  PoolSide side;
  StreamId owner;  // the allocating stream of the blocks
  StreamId use;    // the stream the event is recorded on
  bool operator<(const GroupKey& o) const {
    return std::tie(side, owner, use) < std::tie(o.side, o.owner, o.use);
  }
};

// Recycles events (creating CUDA events is not free).
class EventPool {
 public:
  explicit EventPool(Device& device) : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  EventId get();
  void put(EventId event) { free_.push_back(event); }

 private:
  Device& device_;
  std::vector<EventId> free_;
};

struct SealedGroup {
  EventId event;
  std::vector<Block*> blocks;
};

class PendingGroups {
 public:
  PendingGroups(Device& device, EventPool& events) : device_(device), events_(events) {}

  // Adds a freed block with stream uses to the open group of each use.
  void add(Block* block, PoolSide side);
  bool empty() const { return open_.empty() && sealed_.empty(); }

  // Boundary: records one event per open group. Returns events recorded.
  std::size_t seal_all();
  // Releases the groups whose events are complete; returns blocks that are no
  // longer pending on anything. `queries` counts event queries.
  std::vector<Block*> release_completed(std::int64_t& queries);
  // Makes `stream` wait on every sealed group of owner `stream` on `side`
  // and releases them (no host synchronization).
  std::vector<Block*> release_by_waiting(PoolSide side, StreamId stream);
  // Releases every sealed group on `side` whose blocks all satisfy
  // `inside` and hands their events to the caller (who must make later users
  // of the memory wait on them, then return them to the pool).
  std::vector<Block*> release_region(PoolSide side, const std::function<bool(const Block*)>& inside,
                                     std::vector<std::pair<StreamId, EventId>>& events);
  // Host-synchronizes every sealed group and releases it.
  std::vector<Block*> synchronize_all();
  // Cheap progress on the allocation path, at most `budget` device queries
  // (each counted in `queries`): open groups whose use stream is idle
  // (Device::stream_idle) are released without an event, then the oldest
  // sealed group of each key in turn (round robin across calls) is queried.
  std::vector<Block*> poll(std::size_t budget, std::int64_t& queries);

 private:
  void finish(SealedGroup& g, std::vector<Block*>& out);

  Device& device_;
  EventPool& events_;
  std::map<GroupKey, std::vector<Block*>> open_;
  std::map<GroupKey, std::deque<SealedGroup>> sealed_;
  GroupKey cursor_{PoolSide::kDynamic, 0, 0};  // where poll() goes on
};

}  // namespace renaissance
