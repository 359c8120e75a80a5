// lock_order.cpp - see lock_order.h. Only the checker of debug builds
// (TR_LOCK_ORDER_CHECK) lives here.
#include "core/lock_order.h"

#ifdef TR_LOCK_ORDER_CHECK

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::lock_order {

namespace {

thread_local std::vector<std::pair<Level, const void*>> t_held;

const char* name(Level level) {
  switch (level) {
    case kRegistry: return "the registry";
    case kDeviceState: return "a device state";
    case kArena: return "an arena";
    case kStatsGroup: return "a stats group";
    case kLeaf: return "a leaf lock (pointer-table shard, observers, VMM handles)";
  }
  return "an unknown lock";
}

}  // namespace

void acquire(Level level, const void* mutex) {
  for (const auto& [held, m] : t_held) {
    if (held >= level || held == kLeaf) {
      throw std::logic_error(std::string("torch_renaissance: lock order broken: taking ") +
                             name(level) + " while holding " + name(held) +
                             " (order: registry -> device state -> arena -> stats group, "
                             "leaves last)" + (m == mutex ? " (the same lock twice)" : ""));
    }
  }
  t_held.emplace_back(level, mutex);
}

void release(Level level, const void* mutex) {
  // Locks need not be released in reverse order (std::unique_lock::unlock).
  for (auto it = t_held.rbegin(); it != t_held.rend(); ++it) {
    if (it->first == level && it->second == mutex) {
      t_held.erase(std::next(it).base());
      return;
    }
  }
}

int held_count() { return static_cast<int>(t_held.size()); }

}  // namespace renaissance::lock_order

#endif  // TR_LOCK_ORDER_CHECK
