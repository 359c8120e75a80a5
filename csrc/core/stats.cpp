// stats.cpp - see stats.h.
#include "core/stats.h"

#include <cstdio>
#include <string>

#include "core/errors.h"

namespace renaissance {


void DeviceStats::reset_peak() {
  for_each_stat([](Stat& st) { st.reset_peak(); }, *this);
}

void DeviceStats::reset_accumulated() {
  for_each_stat([](Stat& st) { st.reset_accumulated(); }, *this);
  num_alloc_retries = num_ooms = num_sync_all_streams = 0;
  num_device_alloc = num_device_free = 0;
  events_recorded = event_queries = 0;
}

void StatsGroup::publish(const DeviceStats& now, DeviceStats& published) {
  std::lock_guard g(mu_);
  for_each_stat(
      [](Stat& t, const Stat& n, Stat& p) {
        if (n.current == p.current) return;
        t.current += n.current - p.current;
        TR_ASSERT(t.current >= 0);  // a device total is the sum of its arenas' currents
        if (t.current > t.peak) t.peak = t.current;
        p.current = n.current;
      },
      totals_, now, published);
}

void StatsGroup::withdraw(const DeviceStats& published) {
  std::lock_guard g(mu_);
  for_each_stat(
      [](Stat& t, const Stat& p) {
        t.current -= p.current;
        TR_ASSERT(t.current >= 0);
      },
      totals_, published);
}

DeviceStats StatsGroup::totals() const {
  std::lock_guard g(mu_);
  return totals_;
}

std::int64_t StatsGroup::reserved_current() const {
  std::lock_guard g(mu_);
  return totals_.reserved_bytes[0].current;
}

void StatsGroup::reset_peak() {
  std::lock_guard g(mu_);
  totals_.reset_peak();
}

void DeviceStats::add_counters(const DeviceStats& o) {
  num_alloc_retries += o.num_alloc_retries;
  num_ooms += o.num_ooms;
  num_sync_all_streams += o.num_sync_all_streams;
  num_device_alloc += o.num_device_alloc;
  num_device_free += o.num_device_free;
  events_recorded += o.events_recorded;
  event_queries += o.event_queries;
}

std::string format_bytes(std::size_t bytes) {
  // Same thresholds as c10::CachingAllocator::format_size.
  char buf[64];
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  } else if (bytes <= (std::size_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  } else if (bytes <= (std::size_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  } else if (bytes <= (std::size_t(1) << 40)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  } else if (bytes <= (std::size_t(1) << 50)) {
    std::snprintf(buf, sizeof buf, "%.2f TiB", bytes / 1099511627776.0);
  } else if (bytes <= (std::size_t(1) << 60)) {
    std::snprintf(buf, sizeof buf, "%.2f PiB", bytes / 1125899906842624.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f EiB", bytes / 1152921504606846976.0);
  }
  return buf;
}

}  // namespace renaissance
