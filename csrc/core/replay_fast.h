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
//     room for its entry at the flush: nothing here allocates), the request
//     fits the slot, the range was clean when armed (or met only awaited
//     live-ins, all freed since; a position another thread made in the step
//     before is never clean), and every immediate spatial predecessor was
//     placed at its range and freed in this arming (fast_freed_ ==
//     fast_epoch_); then no earlier occupant of any byte of the range is live.
//   * fast_free takes only an address fast_place handed out and nobody has
//     freed or flushed since (found by its spot in fast_slots_).
//   * Neither writes the trace: positions [cur_->entries.size(), fast_next_)
//     are recorded in fast_rec_ only, and the flush (materialize_fast) makes
//     their entries before anyone holding the arena's lock reads the trace.
#pragma once

#include <cstdint>

#include "core/step_planner.h"
#include "core/block.h"

// Inlined into the arena's replay_allocate / replay_deallocate even where
// the compiler's size heuristics would not (a call, its saved registers
// and its return were a tenth of a replayed pair's instructions).
// TR_NO_INLINE: the rest of a public call that the fast path returns
// before (Arena::allocate_unplanned, deallocate_unplanned).
#if defined(__GNUC__)
#define TR_HOT_INLINE __attribute__((always_inline)) inline
#define TR_NO_INLINE __attribute__((noinline))
#else
#define TR_HOT_INLINE inline
#define TR_NO_INLINE
#endif

namespace renaissance {

TR_HOT_INLINE char* StepPlanner::fast_place(std::size_t requested, std::size_t rounded, StreamId stream) noexcept {
  const std::size_t i = fast_next_;
  // Past the layout, or where the slow path may grow the trace (no
  // allocation here), or where it may switch layouts (the step's first
  // requests, when there is a choice): the slow path.
  if (i - fast_first_ >= fast_end_ - fast_first_) return nullptr;  // i outside [first, end)
  const ReplayRoute& r = *fast_route_;
  const std::size_t size = r.size(i);
  // A routed position is one of the layout's stream's slots (arm_fast).
  if (size == 0 || rounded > size || stream != fast_stream_) return nullptr;
  const std::uint32_t epoch = fast_epoch_;
  // Not clean (arm_fast): its range was in use when armed, or another
  // thread made its request in the step before (the slow path matches that
  // out of order, place()).
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
  // The trace entry, compactly (materialize_fast makes the entry, counts
  // the hit and compares the reference address, at the next flush).
  FastRecord& f = fast_rec_[i];
  f.alloc_time = clock_++;
  f.free_time = -1;
  f.rounded = rounded;
  f.requested = requested;
  fast_next_ = i + 1;
  fast_slots_.insert(r.spot(i), static_cast<std::uint32_t>(i));
  return fast_base_ + r.offset(i);
}

TR_HOT_INLINE bool StepPlanner::fast_free(void* ptr, std::size_t& rounded, std::size_t& requested) noexcept {
  const ReplayRoute& r = *fast_route_;
  // Below the base, the offset wraps past any top.
  const std::size_t off = reinterpret_cast<std::uintptr_t>(ptr) - reinterpret_cast<std::uintptr_t>(fast_base_);
  if (off >= r.top()) return false;
  const std::int64_t k = r.find_spot(off);
  if (k < 0) return false;
  const std::int64_t pos = fast_slots_.take(static_cast<std::uint32_t>(k));
  if (pos < 0) return false;
  // Made since the last flush (a flush empties the table), so not yet in
  // the trace: its record takes the free time.
  const auto i = static_cast<std::size_t>(pos);
  FastRecord& f = fast_rec_[i];
  f.free_time = clock_++;
  fast_freed_[i] = fast_epoch_;
  rounded = f.rounded;
  requested = f.requested;
  return true;
}

}  // namespace renaissance
