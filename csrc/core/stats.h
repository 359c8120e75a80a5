// stats.h - allocator statistics with PyTorch's names and semantics
// (c10/core/CachingDeviceAllocator.h: Stat, StatArray, DeviceStats).
//
// Invariants:
//   * current = allocated - freed (since the last accumulated reset, current
//     is kept), peak >= current, and current never goes negative: a decrease
//     past zero is a logic error and is clamped and counted in
//     `stat_underflows` so tests can catch it; in a TR_DEBUG build (debug.h)
//     it is an assertion.
//   * reset_peak() sets peak = current and never changes current;
//     reset_accumulated() clears allocated / freed only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/debug.h"
#include "core/lock_order.h"

namespace renaissance {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) {
    TR_ASSERT(amount >= 0);  // decreases go through decrease()
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  // Returns false (and clamps at 0) if the decrease would go negative.
  bool decrease(std::int64_t amount) {
    TR_ASSERT(current >= amount);  // a stat never goes below zero
    freed += amount;
    current -= amount;
    if (current < 0) {
      current = 0;
      return false;
    }
    return true;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

// Index 0: all pools, 1: small pool, 2: large pool (PyTorch's StatType).
enum class PoolKind : std::uint8_t { kSmall = 1, kLarge = 2 };
using StatArray = std::array<Stat, 3>;

struct DeviceStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
      requested_bytes;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  // We never refuse to split a block, so nothing is "oversize"; kept for
  // PyTorch's key set (max_split_size is reported as -1, "no limit").
  Stat oversize_allocations, oversize_segments;

  // torch_renaissance's own counters ("renaissance.*" keys).
  Stat pending_bytes;  // freed blocks waiting on stream events
  std::int64_t events_recorded = 0;
  std::int64_t event_queries = 0;
  std::int64_t stat_underflows = 0;

  void add(StatArray& a, PoolKind pool, std::int64_t amount) {
    a[0].increase(amount);
    a[static_cast<int>(pool)].increase(amount);
  }
  void sub(StatArray& a, PoolKind pool, std::int64_t amount) {
    if (!a[0].decrease(amount)) ++stat_underflows;
    if (!a[static_cast<int>(pool)].decrease(amount)) ++stat_underflows;
  }
  void reset_peak();
  void reset_accumulated();
  // Adds the event counters (num_*, events_recorded, event_queries) of `o`.
  void add_counters(const DeviceStats& o);
};

namespace detail {
inline constexpr StatArray DeviceStats::*kStatArrays[] = {
    &DeviceStats::allocation,      &DeviceStats::segment,         &DeviceStats::active,
    &DeviceStats::inactive_split,  &DeviceStats::allocated_bytes, &DeviceStats::reserved_bytes,
    &DeviceStats::active_bytes,    &DeviceStats::inactive_split_bytes,
    &DeviceStats::requested_bytes};
inline constexpr Stat DeviceStats::*kStats[] = {
    &DeviceStats::oversize_allocations, &DeviceStats::oversize_segments,
    &DeviceStats::pending_bytes};
}  // namespace detail

// Calls f(s.x...) for every Stat x of the DeviceStats s... (the StatArrays
// element by element, then oversize_* and pending_bytes).
template <typename F, typename... S>
void for_each_stat(F f, S&... s) {
  for (auto m : detail::kStatArrays) {
    for (std::size_t i = 0; i < 3; ++i) f((s.*m)[i]...);
  }
  for (auto m : detail::kStats) f(s.*m...);
}

// Device-wide current and peak values of several arenas that share one
// device (PyTorch keeps one DeviceStats per device, whatever the pools): the
// peak of a sum is not the sum of the peaks. Each arena in the group
// publishes its changes at the end of every operation, under its own lock;
// the group has its own mutex and calls nothing else, so the lock order is
// always arena -> group. Only `current` and `peak` of the totals are kept:
// `allocated` and `freed` of a sum are the sums. An arena's changes inside
// an operation not yet ended are not in the totals.
class StatsGroup {
 public:
  // Adds now.current - published.current to the totals (raising their
  // peaks) and sets published.current = now.current, for every Stat.
  void publish(const DeviceStats& now, DeviceStats& published);
  // Removes an arena that is going away (its last published values).
  void withdraw(const DeviceStats& published);
  // The totals: current and peak of every Stat (other fields are 0).
  DeviceStats totals() const;
  // totals().reserved_bytes[0].current, without the copy.
  std::int64_t reserved_current() const;
  void reset_peak();

 private:
  mutable lock_order::Mutex<lock_order::kStatsGroup> mu_;
  DeviceStats totals_;
};

}  // namespace renaissance
