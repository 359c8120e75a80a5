// stats.cpp - see stats.h.
#include "core/stats.h"

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

}  // namespace renaissance
