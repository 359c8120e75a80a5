// territory.h - planned territory: the part of a segment where replayed
// steps place their blocks at planned offsets, and the epoch events that
// make that replay safe across streams.
//
// Territory is per stream: the layouts of the steps whose compute stream is
// S replay in S's territory only, [base, base + plan_top) of one segment of
// S, so memory never moves between streams through a plan (that would need
// an event per reuse; issue 18). With expandable segments it is the bottom
// of S's large-pool segment; with fixed segments a segment of its own, sized
// to the layout in round_large steps (1.5x the old one when a layout
// outgrew it). A step that outgrows its layout hands the territory to the
// dynamic pool (demote); the next layout takes that segment back when it is
// large enough and holds nothing allocated outside a step under the new
// line; otherwise it is retired (given back once wholly free).
//
// Invariants (Arena::check_invariants checks the first three):
//   * No block straddles a territory line; the free blocks under it are in
//     their segment's plan_free index (by address), not the best-fit sets,
//     and two free neighbours on the same side of it are merged.
//   * Territory memory is always mapped.
//   * A block pending at plan time is no obstacle: it is released into the
//     territory with an epoch event (adopt_pending), and every placement
//     there makes its stream wait for the epoch events first (place). The
//     dynamic pool does not wait on them, so memory leaves the territory
//     (demote, a lower line) only after they are host-synchronized, which a
//     CUDA-graph capture forbids: then the change waits for the capture's
//     end (after_capture).
//   * place() never returns memory a live block holds: the range must lie in
//     one free block of the index (a bitmap lookup, territory_index.h), or
//     it returns nullptr.
//
// Contract (Territory, Arena, StepPlanner):
//   * Every method here runs with the arena's lock held (the arena's
//     `_locked` convention: the caller holds Arena::mu_); Territory has no
//     lock of its own.
//   * Territory owns: which segment is each stream's territory (by_stream_),
//     the segment a step outgrew (outgrown_), the epoch events, a demotion
//     postponed by a capture, and the line of each segment (Segment::plan_top,
//     moved only by retile()). It touches blocks only through TerritoryHost
//     (the arena's block and segment mechanisms) and the three shared
//     structures it is given (device, event pool, pending groups) plus the
//     two counters of DeviceStats it names (num_sync_all_streams,
//     event_queries).
//   * Arena owns segments, blocks, free indexes, mapping and statistics; it
//     asks Territory whether a segment or block is territory, forwards
//     stream boundaries (adopt_pending, poll_epoch), segment releases
//     (forget) and capture ends (after_capture).
//   * StepPlanner (step_planner.h) decides what the territory should be
//     (fit, demote, demote_all) and places replayed blocks (place); it never
//     changes a segment or block itself.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "core/block.h"
#include "core/device.h"
#include "core/stats.h"
#include "core/stream_events.h"

namespace renaissance {

// The arena's mechanisms the territory uses (Arena implements it,
// privately). Called with the arena's lock held.
class TerritoryHost {
 public:
  // The free indexes and the tiling of a segment.
  virtual void unindex_free(Block* b) = 0;
  virtual void index_free(Block* b) = 0;
  // A free block's share of the inactive-split stats (sign +1 / -1), for a
  // territory block that stays indexed under its start while its size
  // changes (place() splitting the head off the free block it uses).
  virtual void count_inactive(const Block* b, int sign) = 0;
  virtual Block* split(Block* b, std::size_t first) = 0;  // returns the tail
  virtual void absorb_next(Block* a) = 0;
  virtual void mark_allocated(Block* b, std::size_t requested, StreamId stream) = 0;
  // Pending blocks whose stream uses completed become free (coalesced).
  virtual void release_blocks(const std::vector<Block*>& blocks) = 0;
  // Segments: whether the territory lives in expandable segments; the
  // large-pool expandable segment of a stream; a new fixed large segment of
  // `bytes` in round_large steps; giving one back.
  virtual bool use_ranges() const = 0;
  virtual Segment* expandable_large(StreamId stream) = 0;
  virtual Segment* new_fixed_segment(StreamId stream, std::size_t bytes) = 0;
  virtual void release_segment(Segment* seg) = 0;
  // Maps `bytes` more at the end of an expandable segment / every unmapped
  // granule of [0, top). false: the limit or the device refused.
  virtual bool map_tail(Segment* seg, std::size_t bytes) = 0;
  virtual bool map_territory(Segment* seg, std::size_t top) = 0;
  virtual bool capturing() const = 0;

 protected:
  ~TerritoryHost() = default;
};

class Territory {
 public:
  Territory(TerritoryHost& host, Device& device, EventPool& events, PendingGroups& pending,
            DeviceStats& stats)
      : host_(host), device_(device), events_(events), pending_(pending), stats_(stats) {}
  Territory(const Territory&) = delete;
  Territory& operator=(const Territory&) = delete;

  // --- what is territory ---------------------------------------------------
  Segment* of(StreamId stream) const {  // nullptr: none
    // Replay asks once per planned allocation, nearly always for the same
    // stream: the last answer is kept (forgotten whenever by_stream_ changes).
    if (last_valid_ && last_stream_ == stream) return last_seg_;
    auto it = by_stream_.find(stream);
    last_seg_ = it == by_stream_.end() ? nullptr : it->second;
    last_stream_ = stream;
    last_valid_ = true;
    return last_seg_;
  }
  bool is_territory(const Segment* seg) const { return seg && of(seg->stream) == seg; }
  // b lies under the line of its stream's territory.
  bool holds(const Block* b) const { return is_territory(b->segment) && b->segment->in_territory(b); }
  bool empty() const { return by_stream_.empty(); }
  // No epoch event is outstanding (a placement need not make its stream wait).
  bool epoch_idle() const { return epoch_.empty(); }
  std::vector<StreamId> streams() const;  // those that have territory

  // --- changing it (StepPlanner) ------------------------------------------
  // The segment a plan for `stream` goes into (its obstacles are that
  // segment's live blocks), or nullptr.
  Segment* candidate(StreamId stream);
  // Makes it the territory of `stream`, exactly `top` bytes (lowering it
  // when it was larger); nullptr where the device, the limit or a capture
  // refuses.
  Segment* fit(StreamId stream, std::size_t top);
  // Moves seg's line to `top` (and makes seg its stream's territory); false
  // (unchanged) where lowering it would need an event synchronization
  // during a capture.
  bool promote(Segment* seg, std::size_t top);
  // Hands territory back to the dynamic pool (one stream's, or every one).
  // During a capture it is postponed to the capture's end (the epoch events
  // cannot be waited on then); returns false when postponed.
  bool demote(Segment* seg);
  bool demote_all();
  // A block of `rounded` bytes at seg->base + offset, allocated (planned),
  // after its stream waited for the epoch events; nullptr where the range is
  // not wholly free territory.
  Block* place(Segment* seg, std::size_t offset, std::size_t rounded, std::size_t requested,
               StreamId stream);

  // --- the arena's hooks ---------------------------------------------------
  // Releases the sealed pending groups (either pool side) whose blocks all
  // lie in territory into it; their events become epoch events.
  void adopt_pending();
  // Returns the epoch events that completed to the pool (a stream boundary).
  void poll_epoch();
  // Host-synchronizes the epoch events so that territory memory may leave
  // the territory; false (nothing done) during a capture.
  bool settle_epoch();
  // A segment is being released: it is no territory (nor outgrown) any more.
  void forget(const Segment* seg);
  // The capture ended: runs a demotion postponed during it.
  void after_capture();
  // The arena is going away: the epoch events go back to the pool.
  void release_events();

 private:
  void wait_epoch(StreamId stream);
  void synchronize_epoch();

  TerritoryHost& host_;
  Device& device_;
  EventPool& events_;
  PendingGroups& pending_;
  DeviceStats& stats_;
  struct EpochEvent {
    StreamId stream;
    EventId event;
    std::vector<StreamId> waited;  // streams already made to wait on it
  };
  std::vector<EpochEvent> epoch_;
  std::map<StreamId, Segment*> by_stream_;  // per stream: the segment holding its territory
  // of()'s last answer; last_valid_ is cleared by every change of by_stream_.
  mutable bool last_valid_ = false;
  mutable StreamId last_stream_ = 0;
  mutable Segment* last_seg_ = nullptr;
  // Fixed segments: per stream, the territory segment a step outgrew (now
  // dynamic pool), which the next layout takes back when it can.
  std::map<StreamId, Segment*> outgrown_;
  bool demote_after_capture_ = false;  // a demotion was postponed by a capture
};

}  // namespace renaissance
