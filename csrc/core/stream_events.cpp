// stream_events.cpp - see stream_events.h for the invariants.
#include "core/stream_events.h"

#include <algorithm>

namespace renaissance {

EventPool::~EventPool() {
  for (EventId e : free_) {
    try {
      device_.destroy_event(e);
    } catch (...) {
      // Destruction at exit: the device may already be gone; nothing to do.
    }
  }
}

EventId EventPool::get() {
  if (!free_.empty()) {
    EventId e = free_.back();
    free_.pop_back();
    return e;
  }
  return device_.create_event();
}

void PendingGroups::add(Block* block, PoolSide side) {
  for (StreamId use : block->uses) {
    auto& v = open_[GroupKey{side, block->stream, use}];
    v.push_back(block);
    ++block->pending_on;
  }
}

std::size_t PendingGroups::seal_all() {
  // Open groups are never empty: add() creates them with a block.
  std::size_t recorded = 0;
  for (auto it = open_.begin(); it != open_.end();) {
    EventId e = events_.get();
    try {
      device_.record_event(e, it->first.use);
    } catch (...) {
      events_.put(e);  // the group stays open; nothing leaks
      throw;
    }
    ++recorded;
    sealed_[it->first].push_back(SealedGroup{e, std::move(it->second)});
    it = open_.erase(it);
  }
  return recorded;
}

void PendingGroups::finish(SealedGroup& g, std::vector<Block*>& out) {
  for (Block* b : g.blocks) {
    if (--b->pending_on == 0) out.push_back(b);
  }
  g.blocks.clear();
}

std::vector<Block*> PendingGroups::release_completed(std::int64_t& queries) {
  std::vector<Block*> out;
  for (auto it = sealed_.begin(); it != sealed_.end();) {
    auto& q = it->second;
    while (!q.empty()) {
      ++queries;
      if (!device_.query_event(q.front().event)) break;
      events_.put(q.front().event);
      finish(q.front(), out);
      q.pop_front();
    }
    it = q.empty() ? sealed_.erase(it) : std::next(it);
  }
  return out;
}

std::vector<Block*> PendingGroups::release_by_waiting(PoolSide side, StreamId stream) {
  std::vector<Block*> out;
  for (auto it = sealed_.begin(); it != sealed_.end();) {
    if (it->first.side != side || it->first.owner != stream) {
      ++it;
      continue;
    }
    for (SealedGroup& g : it->second) {
      device_.stream_wait_event(stream, g.event);
      events_.put(g.event);
      finish(g, out);
    }
    it = sealed_.erase(it);
  }
  return out;
}

std::vector<Block*> PendingGroups::release_region(
    PoolSide side, const std::function<bool(const Block*)>& inside,
    std::vector<std::pair<StreamId, EventId>>& events) {
  std::vector<Block*> out;
  for (auto it = sealed_.begin(); it != sealed_.end();) {
    auto& q = it->second;
    if (it->first.side == side) {
      for (auto g = q.begin(); g != q.end();) {
        if (std::all_of(g->blocks.begin(), g->blocks.end(), inside)) {
          events.emplace_back(it->first.use, g->event);
          finish(*g, out);
          g = q.erase(g);
        } else {
          ++g;  // stays sealed: released when its event completes
        }
      }
    }
    it = q.empty() ? sealed_.erase(it) : std::next(it);
  }
  return out;
}

std::vector<Block*> PendingGroups::poll(std::size_t budget, std::int64_t& queries) {
  std::vector<Block*> out;
  for (auto it = open_.begin(); it != open_.end() && budget;) {
    --budget;
    ++queries;
    if (!device_.stream_idle(it->first.use)) {
      ++it;
      continue;
    }
    // Everything enqueued on the use stream so far is done, so is all work
    // enqueued before each of these blocks was freed.
    for (Block* b : it->second) {
      if (--b->pending_on == 0) out.push_back(b);
    }
    it = open_.erase(it);
  }
  if (sealed_.empty() || !budget) return out;
  auto it = sealed_.lower_bound(cursor_);
  for (std::size_t keys = sealed_.size(); keys && budget; --keys) {
    if (it == sealed_.end()) it = sealed_.begin();
    auto& q = it->second;
    --budget;
    ++queries;
    if (device_.query_event(q.front().event)) {
      events_.put(q.front().event);
      finish(q.front(), out);
      q.pop_front();
    }
    if (q.empty()) {
      it = sealed_.erase(it);
      if (sealed_.empty()) break;
    } else {
      ++it;
    }
  }
  if (it != sealed_.end()) cursor_ = it->first;
  return out;
}

std::vector<Block*> PendingGroups::synchronize_all() {
  std::vector<Block*> out;
  for (auto& [key, q] : sealed_) {
    for (SealedGroup& g : q) {
      device_.synchronize_event(g.event);
      events_.put(g.event);
      finish(g, out);
    }
  }
  sealed_.clear();
  return out;
}

}  // namespace renaissance
