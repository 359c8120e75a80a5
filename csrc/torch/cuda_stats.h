// cuda_stats.h - our statistics in c10's shapes: summing the arenas of a
// device, retiring a destroyed pool's stats, and converting DeviceStats and
// snapshot segments to c10::CachingDeviceAllocator's types (what
// torch.cuda.memory_stats() and torch.cuda.memory_snapshot() read).
//
// Invariants:
//   * Peaks are never summed: a device's peaks are the peaks of the sums,
//     kept by its StatsGroup (core/stats.h); add_stats adds only current,
//     allocated and freed (and the counters).
//   * A retired pool gave all its memory back: everything it allocated counts
//     as freed, and each of its segments as one device free.
//   * Fields c10 has and we do not fill (PyTorch >= 2.12's extra ones) keep
//     their defaults; reserved_bytes_by_private_pools is filled where it
//     exists.
// Compiled only with TR_WITH_CUDA (against torch's CUDA headers); no lock is
// taken here.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/stats.h"

namespace renaissance::cuda::detail {

// into += s, for the sums of a device's arenas (peaks are left alone).
void add_stats(DeviceStats& into, const DeviceStats& s);

// Folds the stats of a pool being destroyed into `into` (see above).
void retire_stats(DeviceStats& into, const DeviceStats& s);

// torch.cuda.memory_stats()'s source: `st` in c10's DeviceStats, with each
// private pool's reserved bytes (`per_pool`) where PyTorch has that field.
c10::CachingDeviceAllocator::DeviceStats to_c10(
    const DeviceStats& st, const std::vector<std::pair<c10::MempoolId_t, StatArray>>& per_pool);

// One segment of a snapshot in c10's shape (blocks in address order).
c10::CachingDeviceAllocator::SegmentInfo to_c10(const SegmentInfo& seg, int device,
                                                const c10::MempoolId_t& pool);

}  // namespace renaissance::cuda::detail
