// cuda_pools.cpp - see cuda_pools.h.
#include "torch/cuda_pools.h"

#include <algorithm>
#include <exception>
#include <iterator>

#include "torch/cuda_stats.h"

namespace renaissance::cuda::detail {
namespace {

ArenaConfig pool_config_of(ArenaConfig c) {
  c.planning = false;  // private pools serve captures and scopes, not steps
  return c;
}

}  // namespace

DeviceState::DeviceState(int index, ArenaConfig config)
    : index(index),
      device(std::make_shared<CudaDevice>(index)),
      pool_config(pool_config_of(config)),
      group(std::make_shared<StatsGroup>()),
      arena(std::make_shared<Arena>(device, config, group)) {}

PoolEntry& DeviceState::pool_locked(const c10::MempoolId_t& id) {
  auto it = pools.find(id);
  if (it != pools.end()) return it->second;
  PoolEntry p;
  p.arena = std::make_shared<Arena>(device, pool_config, group);
  if (!windows.empty()) p.arena->set_capturing(true);
  return pools.emplace(id, std::move(p)).first->second;
}

const Window* DeviceState::route_locked(cudaStream_t stream) const {
  for (auto it = windows.rbegin(); it != windows.rend(); ++it) {
    if (it->filter && it->filter(stream)) return &*it;
  }
  return nullptr;
}

void DeviceState::set_capturing_locked(bool on) {
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

std::shared_ptr<Arena> DeviceState::take_idle_pool_locked(const c10::MempoolId_t& id) {
  auto it = pools.find(id);
  return it == pools.end() ? nullptr : take_if_idle_locked(it);
}

void DeviceState::release_unused_pools_locked(std::vector<std::shared_ptr<Arena>>* dead,
                                              const c10::MempoolId_t* only) {
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

std::vector<std::shared_ptr<Arena>> DeviceState::take_idle_pools_locked() {
  std::vector<std::shared_ptr<Arena>> dead;
  for (auto it = pools.begin(); it != pools.end();) {
    auto next = std::next(it);
    if (auto a = take_if_idle_locked(it)) dead.push_back(std::move(a));
    it = next;
  }
  return dead;
}

DeviceStats DeviceState::stats_locked(std::vector<std::pair<c10::MempoolId_t, StatArray>>* per_pool) {
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

void DeviceState::set_limit_locked(std::size_t bytes) {
  pool_config.max_reserved_bytes = bytes;
  arena->set_max_reserved_bytes(bytes);
  for (auto& [id, p] : pools) p.arena->set_max_reserved_bytes(bytes);
}

std::shared_ptr<Arena> DeviceState::take_if_idle_locked(
    std::map<c10::MempoolId_t, PoolEntry>::iterator it) {
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

}  // namespace renaissance::cuda::detail
