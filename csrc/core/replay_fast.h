// replay_fast.h - planned replay's fast path, per request: StepPlanner's
// fast_place and fast_free, inline, for the one caller that runs them on
// every planned allocation and free (arena.cpp's replay_allocate and
// replay_deallocate, inside the replay lock's fast section). What they rest
// on (arming, the route, the flush) is in step_planner.cpp ("the fast
// path") and docs/design.md ("Planned replay, slot table").
//
// Invariants (kept together with arm_fast and on_free):
//   * fast_place hands out position i's planned range only when i is the
//     step's next position in [fast_first_, fast_end_) (so the trace has
//     room: nothing here allocates), the request fits the slot, the range
//     was clean when armed (or met only awaited live-ins, all freed since),
//     and every immediate spatial predecessor was
//     placed at its range and freed in this arming (fast_freed_ ==
//     fast_epoch_); then no earlier occupant of any byte of the range is live.
//   * fast_free takes only an address fast_place handed out and nobody has
//     freed or flushed since (found by its spot in fast_slots_).
#pragma once

#include <cstdint>

#include "core/step_planner.h"
#include "core/block.h"

namespace renaissance {

inline char* StepPlanner::fast_place(std::size_t requested, std::size_t rounded, StreamId stream) noexcept {
  const std::size_t i = cur_->entries.size();
  // Past the layout, or where the slow path may grow the trace (no
  // allocation here), or where it may switch layouts (the step's first
  // requests, when there is a choice): the slow path.
  if (i - fast_first_ >= fast_end_ - fast_first_) return nullptr;  // i outside [first, end)
  const ReplayRoute& r = routes_[fast_phase_];
  const std::size_t size = r.size(i);
  // A routed position is one of the layout's stream's slots (arm_fast).
  if (size == 0 || rounded > size || stream != fast_stream_) return nullptr;
  // Another thread's position (in the step before): the slow path matches
  // it out of order (place()).
  if (const std::uint64_t t = position_thread(i); t != 0 && t != cur_->opener) return nullptr;
  const std::uint32_t epoch = fast_epoch_;
  if (!fast_all_clean_) {
    const std::uint8_t clean = fast_clean_[i];
    if (clean == 0) return nullptr;
    if (clean == 2) {  // clean once the live-ins it met are freed
      for (std::uint32_t j = fast_wait_start_[i], e = fast_wait_start_[i + 1]; j != e; ++j) {
        if (fast_wait_freed_[fast_wait_list_[j]] != epoch) return nullptr;
      }
    }
  }
  for (const std::uint32_t* p = r.preds_begin(i), *e = r.preds_end(i); p != e; ++p) {
    if (fast_freed_[*p] != epoch) return nullptr;  // an earlier occupant may be live: the slow path checks
  }
  char* ptr = fast_base_ + r.offset(i);
  ++stats_.planned_requests;
  ++stats_.planned_hits;
  ++stats_.planned_fast_hits;
  ++cur_hits_;
  // The trace entry, as record_entry makes it (both vectors have room:
  // i < fast_end_; nothing here allocates), with the reference address
  // taken from the table arm_fast found.
  TraceRecord& en = cur_->entries.emplace_back();
  en.size = rounded;
  en.stream = stream;
  en.alloc_time = clock_++;
  en.address = reinterpret_cast<std::uintptr_t>(ptr);
  if (i < fast_ref_n_) {
    ++cur_comparable_;
    cur_same_ += fast_ref_[i * fast_ref_stride_] == en.address;
  }
  cur_->threads.push_back(cur_->opener);
  fast_req_[i] = requested;
  fast_slots_.insert(r.spot(i), static_cast<std::uint32_t>(i));
  return ptr;
}

inline bool StepPlanner::fast_free(void* ptr, std::size_t& rounded, std::size_t& requested) noexcept {
  const ReplayRoute& r = routes_[fast_phase_];
  // Below the base, the offset wraps past any top.
  const std::size_t off = reinterpret_cast<std::uintptr_t>(ptr) - reinterpret_cast<std::uintptr_t>(fast_base_);
  if (off >= r.top()) return false;
  const std::int64_t k = r.find_spot(off);
  if (k < 0) return false;
  const std::int64_t pos = fast_slots_.take(static_cast<std::uint32_t>(k));
  if (pos < 0) return false;
  const auto i = static_cast<std::size_t>(pos);
  TraceRecord& e = cur_->entries[i];
  e.free_time = clock_++;
  fast_freed_[i] = fast_epoch_;
  rounded = e.size;
  requested = fast_req_[i];
  return true;
}

}  // namespace renaissance
