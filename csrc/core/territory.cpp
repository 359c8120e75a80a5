// territory.cpp - see territory.h for the contract and invariants. The
// bodies moved here from arena.cpp (issue 15 item 1) unchanged but for the
// names of the arena's mechanisms (TerritoryHost).
#include "core/territory.h"

#include <algorithm>

namespace renaissance {

namespace {
// Re-tiles the free blocks of `seg` for a new planned-territory line `top`:
// unindexes every free block under the old line, splits the one straddling
// the new line, merges free runs within each territory, and re-indexes.
template <typename Unindex, typename Index, typename Split, typename Merge>
void retile(Segment* seg, std::size_t top, Unindex unindex, Index index, Split split,
            Merge merge) {
  for (Block* b = seg->head; b; b = b->next) {
    if (b->state == BlockState::kFree) unindex(b);
  }
  seg->plan_top = top;
  char* line = seg->base + top;
  for (Block* b = seg->head; b; b = b->next) {
    if (b->state == BlockState::kFree && b->ptr < line && line < b->ptr + b->size) {
      split(b, static_cast<std::size_t>(line - b->ptr));
    }
  }
  for (Block* b = seg->head; b; b = b->next) {
    while (b->state == BlockState::kFree && b->next && b->next->state == BlockState::kFree &&
           seg->in_territory(b) == seg->in_territory(b->next)) {
      merge(b);
    }
  }
  for (Block* b = seg->head; b; b = b->next) {
    if (b->state == BlockState::kFree) index(b);
  }
}
}  // namespace

bool Territory::promote(Segment* seg, std::size_t top) {
  if (Segment* other = of(seg->stream); other && other != seg) {
    if (!demote(other)) return false;
  }
  // The line may not cut a live or pending block: move it to that block's end.
  for (Block* b = seg->head; b; b = b->next) {
    char* line = seg->base + top;
    if (b->state != BlockState::kFree && b->ptr < line && line < b->ptr + b->size) {
      top = static_cast<std::size_t>(b->ptr + b->size - seg->base);
    }
  }
  // Lowering the line hands territory memory to the dynamic pool, which does
  // not wait on epoch events: settle them first (not possible in a capture).
  if (top < seg->plan_top && !settle_epoch()) {
    demote_after_capture_ = true;
    return false;
  }
  retile(
      seg, top, [&](Block* b) { host_.unindex_free(b); }, [&](Block* b) { host_.index_free(b); },
      [&](Block* b, std::size_t first) { host_.split(b, first); },
      [&](Block* a) { host_.absorb_next(a); });
  by_stream_[seg->stream] = seg;
  last_valid_ = false;
  outgrown_.erase(seg->stream);
  adopt_pending();
  return true;
}

bool Territory::demote(Segment* seg) {
  if (!seg || !is_territory(seg)) return true;
  if (!settle_epoch()) {
    // A capture is open: no event may be synchronized, so the territory
    // stays (the dynamic pool cannot take it) until set_capturing(false).
    demote_after_capture_ = true;
    return false;
  }
  retile(
      seg, 0, [&](Block* b) { host_.unindex_free(b); }, [&](Block* b) { host_.index_free(b); },
      [&](Block* b, std::size_t first) { host_.split(b, first); },
      [&](Block* a) { host_.absorb_next(a); });
  by_stream_.erase(seg->stream);
  last_valid_ = false;
  if (!seg->expandable) outgrown_[seg->stream] = seg;  // the next layout's first candidate
  if (seg->retire && seg->live == 0) host_.release_segment(seg);
  return true;
}

bool Territory::demote_all() {
  std::vector<Segment*> all;
  for (auto& [stream, seg] : by_stream_) all.push_back(seg);
  bool done = true;
  for (Segment* seg : all) done = demote(seg) && done;
  return done;
}

Segment* Territory::candidate(StreamId stream) {
  return host_.use_ranges() ? host_.expandable_large(stream)
                      : of(stream);
}

Segment* Territory::fit(StreamId stream, std::size_t top) {
  if (host_.use_ranges()) {
    if (Segment* seg = candidate(stream); seg && top <= seg->capacity) {
      // Map what the line needs above the mapped size (retile moves free
      // blocks across the line either way).
      if (seg->size < top &&
          !host_.map_tail(seg, round_up(top - seg->size, device_.range_granularity()))) {
        return nullptr;
      }
      if (!host_.map_territory(seg, top)) return nullptr;
      return promote(seg, top) ? seg : nullptr;
    }
  }
  // Fixed segments: a dedicated segment holds the territory. The one a
  // step outgrew (demoted mid-step, its memory in the dynamic pool since)
  // is the first candidate: a new layout takes it back when it is large
  // enough and nothing allocated outside a step (held for good) lies under
  // the new line, instead of holding a second segment beside it. What a
  // step left live there is mostly its live-outs (gradients), which die
  // early in the next step; a placement that meets one falls back (the
  // overlap check), and one that stays makes conflicts that re-plan around
  // it as an obstacle.
  Segment* old = of(stream);
  if (!old) {
    if (auto it = outgrown_.find(stream); it != outgrown_.end()) old = it->second;
  }
  auto free_enough = [](const Segment* seg, std::size_t line) {
    for (const Block* b = seg->head; b && b->ptr < seg->base + line; b = b->next) {
      if (b->state != BlockState::kFree && b->step == 0) return false;
    }
    return true;
  };
  if (old && !old->expandable && old->size >= top &&
      (is_territory(old) || free_enough(old, top))) {
    return promote(old, top) ? old : nullptr;
  }
  // Sized to the layout (in round_large steps), not to a large segment's
  // minimum: a 3 MiB plan holding 10 MiB was most of item 5's excess. A
  // layout that outgrew its segment gets 1.5x the old size when that is
  // more, so that lengths growing step by step re-make it a few times, not
  // every other step.
  std::size_t bytes = top;
  if (old) {
    bytes = std::max(bytes, old->size + old->size / 2);
    if (!demote(old)) return nullptr;
    outgrown_.erase(stream);
    old->retire = true;  // released once wholly free (now, or when its last block goes)
    if (old->live == 0) host_.release_segment(old);
  }
  Segment* seg = host_.new_fixed_segment(stream, bytes);
  if (!seg && bytes > top) seg = host_.new_fixed_segment(stream, top);
  if (seg && !promote(seg, top)) return nullptr;
  return seg;
}

Block* Territory::place(Segment* seg, std::size_t offset, std::size_t rounded,
                        std::size_t requested, StreamId stream) {
  if (offset > seg->plan_top || rounded > seg->plan_top - offset) return nullptr;
  char* p = seg->base + offset;
  // The free block holding p (the one with the highest start at or below
  // it); the range must end inside it, or something live overlaps.
  Block* f = seg->plan_free.holding(p);
  if (!f || f->ptr + f->size < p + rounded) return nullptr;
  wait_epoch(stream);
  if (f->ptr < p) {
    // The head [f->ptr, p) stays free and stays indexed under the same
    // start (the index is by address): only its inactive-split share
    // changes with its size. The tail from p is not indexed.
    host_.count_inactive(f, -1);
    Block* t = host_.split(f, static_cast<std::size_t>(p - f->ptr));
    host_.count_inactive(f, +1);
    f = t;
  } else {
    host_.unindex_free(f);
  }
  if (f->size > rounded) host_.index_free(host_.split(f, rounded));
  f->planned = true;
  host_.mark_allocated(f, requested, stream);
  return f;
}

void Territory::adopt_pending() {
  // Pending blocks inside planned territory: release them into it now; the
  // next placement there makes its stream wait for the epoch event. Blocks
  // of either region qualify: a dynamic block the territory grew over (one
  // still pending when its step was planned) is no obstacle of the plan.
  if (by_stream_.empty() || host_.capturing()) return;
  auto inside = [this](const Block* b) { return holds(b); };
  for (PoolSide region : {PoolSide::kPlanned, PoolSide::kDynamic}) {
    std::vector<std::pair<StreamId, EventId>> events;
    auto blocks = pending_.release_region(region, inside, events);
    for (auto& [stream, event] : events) epoch_.push_back(EpochEvent{stream, event, {}});
    host_.release_blocks(blocks);
  }
}

void Territory::wait_epoch(StreamId stream) {
  for (EpochEvent& e : epoch_) {
    if (std::find(e.waited.begin(), e.waited.end(), stream) != e.waited.end()) continue;
    device_.stream_wait_event(stream, e.event);
    e.waited.push_back(stream);
  }
}

bool Territory::settle_epoch() {
  if (epoch_.empty()) return true;
  if (host_.capturing()) return false;
  synchronize_epoch();
  return true;
}

void Territory::synchronize_epoch() {
  if (host_.capturing()) return;
  if (epoch_.empty()) return;
  ++stats_.num_sync_all_streams;
  for (EpochEvent& e : epoch_) {
    device_.synchronize_event(e.event);
    events_.put(e.event);
  }
  epoch_.clear();
}

std::vector<StreamId> Territory::streams() const {
  std::vector<StreamId> out;
  for (const auto& [stream, seg] : by_stream_) out.push_back(stream);
  return out;
}

void Territory::poll_epoch() {
  for (auto it = epoch_.begin(); it != epoch_.end();) {
    ++stats_.event_queries;
    if (device_.query_event(it->event)) {
      events_.put(it->event);
      it = epoch_.erase(it);
    } else {
      ++it;
    }
  }
}

void Territory::forget(const Segment* seg) {
  if (is_territory(seg)) {
    by_stream_.erase(seg->stream);
    last_valid_ = false;
  }
  if (auto it = outgrown_.find(seg->stream); it != outgrown_.end() && it->second == seg) {
    outgrown_.erase(it);
  }
}

void Territory::after_capture() {
  if (demote_after_capture_) {
    // A demotion (or a lowering) asked for during the capture: the epoch
    // events can be synchronized now. The step planner re-activates the
    // territory at the next step.
    demote_after_capture_ = false;
    demote_all();
  }
}

void Territory::release_events() {
  for (EpochEvent& e : epoch_) events_.put(e.event);
  epoch_.clear();
}

}  // namespace renaissance
