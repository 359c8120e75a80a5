// cuda_stats.cpp - see cuda_stats.h.
#include "torch/cuda_stats.h"

#include <cstddef>
#include <type_traits>

#include "core/cuda_stream.h"

namespace renaissance::cuda::detail {
namespace {

using c10::MempoolId_t;

// Peaks are not summed: the device's StatsGroup has the peaks of the sums.
void add_stat(Stat& into, const Stat& s) {
  into.current += s.current;
  into.allocated += s.allocated;
  into.freed += s.freed;
}

void to_c10(c10::CachingAllocator::Stat& out, const Stat& in) {
  out.current = in.current;
  out.peak = in.peak;
  out.allocated = in.allocated;
  out.freed = in.freed;
}

void to_c10(c10::CachingAllocator::StatArray& out, const StatArray& in) {
  for (std::size_t i = 0; i < 3; ++i) to_c10(out[i], in[i]);
}

// DeviceStats::reserved_bytes_by_private_pools exists from PyTorch 2.12 on.
template <typename T, typename = void>
struct HasPoolReserved : std::false_type {};
template <typename T>
struct HasPoolReserved<T, std::void_t<decltype(std::declval<T&>().reserved_bytes_by_private_pools)>>
    : std::true_type {};

template <typename Stats>
void set_pool_reserved(Stats& out, const MempoolId_t& id, const StatArray& reserved) {
  if constexpr (HasPoolReserved<Stats>::value) {
    to_c10(out.reserved_bytes_by_private_pools[id], reserved);
  } else {
    (void)out, (void)id, (void)reserved;
  }
}

}  // namespace

void add_stats(DeviceStats& into, const DeviceStats& s) {
  for_each_stat(add_stat, into, s);
  into.add_counters(s);
}

void retire_stats(DeviceStats& into, const DeviceStats& s) {
  for_each_stat(
      [](Stat& a, const Stat& b) {
        a.allocated += b.allocated;
        a.freed += b.freed + b.current;
      },
      into, s);
  into.add_counters(s);
  into.num_device_free += s.segment[0].current;  // its segments are freed with it
}

c10::CachingDeviceAllocator::DeviceStats to_c10(
    const DeviceStats& st, const std::vector<std::pair<MempoolId_t, StatArray>>& per_pool) {
  c10::CachingDeviceAllocator::DeviceStats out;
  to_c10(out.allocation, st.allocation);
  to_c10(out.segment, st.segment);
  to_c10(out.active, st.active);
  to_c10(out.inactive_split, st.inactive_split);
  to_c10(out.allocated_bytes, st.allocated_bytes);
  to_c10(out.reserved_bytes, st.reserved_bytes);
  to_c10(out.active_bytes, st.active_bytes);
  to_c10(out.inactive_split_bytes, st.inactive_split_bytes);
  to_c10(out.requested_bytes, st.requested_bytes);
  to_c10(out.oversize_allocations, st.oversize_allocations);
  to_c10(out.oversize_segments, st.oversize_segments);
  out.num_alloc_retries = st.num_alloc_retries;
  out.num_ooms = st.num_ooms;
  out.num_sync_all_streams = st.num_sync_all_streams;
  out.num_device_alloc = st.num_device_alloc;
  out.num_device_free = st.num_device_free;
  out.max_split_size = -1;  // no limit: every block may be split (PyTorch's default reads so)
  for (auto& [id, reserved] : per_pool) set_pool_reserved(out, id, reserved);
  return out;
}

c10::CachingDeviceAllocator::SegmentInfo to_c10(const SegmentInfo& seg, int device,
                                                const MempoolId_t& pool) {
  c10::CachingDeviceAllocator::SegmentInfo si;
  si.device = static_cast<c10::DeviceIndex>(device);
  si.address = seg.address;
  si.total_size = seg.total_size;
  si.requested_size = seg.requested_size;
  si.allocated_size = seg.allocated_size;
  si.active_size = seg.active_size;
  si.stream = to_stream(seg.stream);
  si.is_large = seg.is_large;
  si.is_expandable = seg.expandable;
  si.owner_private_pool_id = pool;
  si.blocks.reserve(seg.blocks.size());
  for (const BlockInfo& b : seg.blocks) {  // they tile the segment in address order
    c10::CachingDeviceAllocator::BlockInfo bi;
    bi.size = b.size;
    bi.requested_size = b.requested;
    bi.allocated = b.state == BlockState::kAllocated;
    bi.active = b.state != BlockState::kFree;
    si.blocks.push_back(std::move(bi));
  }
  return si;
}

}  // namespace renaissance::cuda::detail
