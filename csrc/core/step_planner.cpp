// step_planner.cpp - see step_planner.h for the policy and invariants.
#include "core/step_planner.h"

#include <algorithm>
#include <chrono>

namespace renaissance {

bool StepPlanner::fits(const Layout& l, std::size_t i, std::size_t rounded,
                       StreamId stream) const {
  return i < l.slots.size() && l.slots[i].stream == stream && rounded <= l.slots[i].size;
}

bool StepPlanner::switch_layout(std::size_t i, std::size_t rounded, StreamId stream) {
  // The step's first allocations choose the variant: take the most recently
  // used layout that fits every request so far and this one.
  Layout* best = nullptr;
  std::uint64_t best_use = 0;
  for (const Variant& v : variants_) {
    Layout* l = v.layout;
    if (l->key != key_ || l == active_ || (best && v.last_used <= best_use)) continue;
    if (!fits(*l, i, rounded, stream)) continue;
    bool ok = true;
    for (std::size_t j = 0; ok && j < i; ++j) {
      const TraceRecord& e = cur_->entries[j];
      ok = fits(*l, j, e.size, e.stream);
    }
    if (ok) {
      best = l;
      best_use = v.last_used;
    }
  }
  if (!best) return false;
  active_ = best;
  return true;
}

Block* StepPlanner::place(std::size_t requested, std::size_t rounded, StreamId stream) {
  // During a CUDA-graph capture no event may be waited on: no replay then.
  if (!open_ || !replaying_ || !active_ || arena_.capturing_) return nullptr;
  const std::size_t i = cur_->entries.size();
  ++stats_.planned_requests;
  if (!fits(*active_, i, rounded, stream) && !switch_layout(i, rounded, stream)) {
    ++stats_.planned_misses;
    missed_ = true;
    const bool same_structure = i < active_->slots.size() && active_->slots[i].stream == stream;
    if (same_structure) {
      // Only the size grew (a longer sequence, a larger batch): try the
      // planned offset with the larger size. The arena's overlap check keeps
      // it safe; if something live is in the way, the dynamic pool serves it.
      const Slot& s = active_->slots[i];
      if (s.dynamic) return nullptr;
      if (Block* b = place_slot(s, requested, rounded, stream)) return b;
      // It does not fit where planned: stop replaying this step and let the
      // dynamic pool use the territory's free space for the rest of it.
    }
    // The sequence left every layout: serve the rest of the step dynamically,
    // with the territory handed back so that nothing is held twice.
    replaying_ = false;
    arena_.demote_locked(arena_.territory_of_locked(active_->stream));
    return nullptr;
  }
  const Slot& s = active_->slots[i];
  if (s.dynamic) {
    ++stats_.planned_hits;
    ++cur_hits_;
    return nullptr;
  }
  Block* b = place_slot(s, requested, rounded, stream);
  if (!b) {
    ++stats_.planned_conflicts;
    ++step_conflicts_;
    return nullptr;
  }
  ++stats_.planned_hits;
  ++cur_hits_;
  return b;
}

Block* StepPlanner::place_slot(const Slot& s, std::size_t requested, std::size_t rounded,
                               StreamId stream) {
  // The slot's stream is the layout's, so this is that stream's territory:
  // memory of another stream is never handed out through a plan.
  Segment* seg = arena_.territory_of_locked(s.stream);
  return seg ? arena_.place_locked(seg, s.offset, rounded, requested, stream) : nullptr;
}

void StepPlanner::on_allocated(Block* b) {
  if (!open_) return;
  b->step = step_;
  b->seq = static_cast<std::int64_t>(cur_->entries.size());
  TraceRecord e;
  e.size = b->size;
  e.stream = b->stream;
  e.alloc_time = clock_++;
  e.address = reinterpret_cast<std::uintptr_t>(b->ptr);
  const std::size_t i = cur_->entries.size();
  if (prev_ && i < prev_->entries.size()) {
    ++cur_comparable_;
    if (prev_->entries[i].address == e.address) ++cur_same_;
  }
  cur_->entries.push_back(std::move(e));
}

void StepPlanner::on_free(Block* b) {
  if (b->step == 0) return;
  if (open_ && b->step == step_) {
    cur_->entries[static_cast<std::size_t>(b->seq)].free_time = clock_++;
  } else if (open_ && prev_ && b->step == prev_->step) {
    cur_->livein_frees.emplace_back(b->seq, clock_++);
  } else {
    // Freed between its step and the next step of the same key (outside any
    // step, or during a step of another key): the first events of that step.
    for (auto& [key, trace] : last_by_key_) {
      if (trace->step == b->step) {
        trace->later_frees.push_back(b->seq);
        break;
      }
    }
  }
}

void StepPlanner::on_record_stream(Block* b, StreamId stream) {
  // The arena calls this once per new (block, stream) use.
  if (open_ && b->step == step_) cur_->entries[static_cast<std::size_t>(b->seq)].streams_used.push_back(stream);
}

bool StepPlanner::activate_territory() {
  // The active layout's stream's territory must cover every layout of that
  // stream (the step's first allocations choose among them).
  const StreamId stream = active_->stream;
  std::size_t top = 0;
  for (const auto& l : layouts_) {
    if (l->stream == stream) top = std::max(top, l->top);
  }
  if (top == 0) return false;
  Segment* seg = arena_.territory_of_locked(stream);
  if (seg && seg->plan_top >= top) return true;
  return arena_.territory_segment_locked(stream, top) != nullptr;
}

void StepPlanner::fit_territory(StreamId stream) {
  std::size_t top = 0;
  for (const auto& l : layouts_) {
    if (l->stream == stream) top = std::max(top, l->top);
  }
  Segment* seg = arena_.territory_of_locked(stream);
  if (top == 0) {
    arena_.demote_locked(seg);
  } else if (!seg || seg->plan_top != top) {
    arena_.territory_segment_locked(stream, top);
  }
}

void StepPlanner::begin_step(std::uint64_t key) {
  if (open_) {
    // The arena ends an open step itself (planning without its lock); this
    // is the fallback for a step opened meanwhile by another thread.
    if (std::unique_ptr<PlanJob> job = end_step()) {
      run(*job);
      install(std::move(job));
    }
  }
  open_ = true;
  ++step_;
  key_ = key;
  auto last = last_by_key_.find(key);
  prev_ = last == last_by_key_.end() ? nullptr : last->second.get();
  clock_ = 0;
  missed_ = false;
  step_conflicts_ = 0;
  cur_hits_ = cur_same_ = cur_comparable_ = 0;
  cur_ = std::make_unique<StepTrace>();
  cur_->step = step_;
  // Frees of the previous step's buffers that happened after it ended count
  // as the first events of this one.
  if (prev_) {
    for (std::int64_t seq : prev_->later_frees) cur_->livein_frees.emplace_back(seq, clock_++);
    prev_->later_frees.clear();
  }
  active_ = most_recent_layout(&key_);
  replaying_ = active_ && activate_territory();
  if (replaying_) ++stats_.planned_steps;
}

void StepPlanner::release_territory() {
  if (open_) replaying_ = false;
  arena_.demote_locked();
}

std::unique_ptr<StepPlanner::PlanJob> StepPlanner::end_step() {
  if (!open_) return nullptr;
  open_ = false;
  replaying_ = false;
  cur_->end_time = clock_;
  ++stats_.steps;
  if (!cur_->entries.empty()) {
    stats_.last_step_allocations = static_cast<std::int64_t>(cur_->entries.size());
    stats_.last_step_hits = cur_hits_;
    stats_.last_step_same_address = cur_same_;
    stats_.last_step_comparable = cur_comparable_;
  }

  // Which variant was this step? Exact size sequences identify variants.
  std::vector<std::size_t> sizes;
  sizes.reserve(cur_->entries.size());
  for (const TraceRecord& e : cur_->entries) sizes.push_back(e.size);
  Variant* known = find_variant(sizes);
  std::unique_ptr<PlanJob> job;
  if (known) {
    known->last_used = ++use_clock_;
    Layout* l = known->layout;
    l->conflict_streak = step_conflicts_ ? l->conflict_streak + 1 : 0;
    // Conflicts that persist (a new long-lived block in the way): re-plan.
    if (l->conflict_streak >= 2 && prev_ && !planning_) job = plan_step(std::move(sizes));
  } else if (Layout* l = covering_layout(); l && !missed_) {
    remember_variant(l, std::move(sizes));  // new shapes, but they fit: no re-plan
  } else if (prev_ && !cur_->entries.empty() && !planning_) {
    job = plan_step(std::move(sizes));
  }
  if (settle_steps_ > 0 && !job) {
    --settle_steps_;
    // After a (re)plan, give back what recording and the first replay
    // steps left in the dynamic pool.
    arena_.release_cached_locked();
  }
  auto& slot = last_by_key_[key_];
  slot = std::move(cur_);
  last_ = slot.get();
  prev_ = nullptr;
  return job;
}

StepPlanner::Layout* StepPlanner::most_recent_layout(const std::uint64_t* key) const {
  const Variant* best = nullptr;
  for (const Variant& v : variants_) {
    if ((!key || v.layout->key == *key) && (!best || v.last_used > best->last_used)) best = &v;
  }
  return best ? best->layout : nullptr;
}

StepPlanner::Variant* StepPlanner::find_variant(const std::vector<std::size_t>& sizes) {
  for (Variant& v : variants_) {
    if (v.layout->key == key_ && v.sizes == sizes) return &v;
  }
  return nullptr;
}

bool StepPlanner::same_structure(const Layout& l) const {
  // Same key, allocation count and streams as the open step.
  if (l.key != key_ || l.slots.size() != cur_->entries.size()) return false;
  for (std::size_t i = 0; i < l.slots.size(); ++i) {
    if (l.slots[i].stream != cur_->entries[i].stream) return false;
  }
  return true;
}

StepPlanner::Layout* StepPlanner::covering_layout() const {
  for (const auto& l : layouts_) {
    if (!same_structure(*l)) continue;
    bool ok = true;
    for (std::size_t i = 0; ok && i < l->slots.size(); ++i) {
      ok = l->slots[i].dynamic || cur_->entries[i].size <= l->slots[i].size;
    }
    if (ok) return l.get();
  }
  return nullptr;
}

void StepPlanner::remember_variant(Layout* layout, std::vector<std::size_t> sizes) {
  // Register the variant, evicting the least recently used beyond the limit.
  if (Variant* known = find_variant(sizes)) {
    known->layout = layout;
    known->last_used = ++use_clock_;
  } else {
    variants_.push_back(Variant{layout, std::move(sizes), ++use_clock_});
  }
  while (variants_.size() > std::max<std::size_t>(1, arena_.config_.max_variants)) {
    forget_least_recent_variant();
  }
}

void StepPlanner::forget_least_recent_variant() {
  auto lru = std::min_element(variants_.begin(), variants_.end(),
                              [](const Variant& a, const Variant& b) { return a.last_used < b.last_used; });
  Layout* l = lru->layout;
  variants_.erase(lru);
  const bool used = std::any_of(variants_.begin(), variants_.end(),
                                [l](const Variant& v) { return v.layout == l; });
  if (!used) {
    if (active_ == l) active_ = nullptr;
    layouts_.erase(std::find_if(layouts_.begin(), layouts_.end(),
                                [l](const std::unique_ptr<Layout>& p) { return p.get() == l; }));
  }
}

std::unique_ptr<StepPlanner::PlanJob> StepPlanner::plan_step(std::vector<std::size_t> sizes) {
  const StepTrace& cur = *cur_;
  const std::int64_t T = std::max<std::int64_t>(cur.end_time, 1);

  // Free times, in this step, of the previous step's live-outs.
  std::vector<std::pair<std::int64_t, std::int64_t>> died(cur.livein_frees);
  std::sort(died.begin(), died.end());

  // The planned territory belongs to the stream of the step's first
  // allocation (the compute stream). Allocations on other streams stay in
  // their streams' own pools: reusing one stream's memory on another needs
  // an event, which the dynamic pool's per-stream segments already avoid.
  const StreamId stream = cur.entries.empty() ? 0 : cur.entries.front().stream;
  std::vector<Slot> slots(cur.entries.size());
  std::size_t next = 0;  // cursor into `died` (ordered by the previous step's seq)
  bool wraps = false;
  for (std::size_t i = 0; i < cur.entries.size(); ++i) {
    const TraceRecord& e = cur.entries[i];
    Slot& s = slots[i];
    s.size = e.size;
    s.stream = e.stream;
    s.lower = e.alloc_time;
    if (e.stream != stream) {
      s.dynamic = true;
      continue;
    }
    if (e.free_time >= 0) {
      s.upper = !e.streams_used.empty() ? T : std::max(e.free_time, e.alloc_time + 1);
      continue;
    }
    // A live-out: find the next previous-step live-out of the same size that
    // died during this step; this one will die at the same point next step.
    std::size_t j = next;
    while (j < died.size() &&
           prev_->entries[static_cast<std::size_t>(died[j].first)].size != e.size) {
      ++j;
    }
    if (j == died.size()) {
      s.dynamic = true;  // persistent: lives on, the dynamic pool keeps it
      continue;
    }
    next = j + 1;
    const std::int64_t t_next = died[j].second;
    if (t_next > e.alloc_time) {
      s.dynamic = true;  // would overlap itself across steps (double buffering)
      continue;
    }
    s.upper = T + t_next;
    if (!e.streams_used.empty()) s.upper = std::max(s.upper, T);
    if (s.upper > T) wraps = true;
  }

  // Same structure as a kept layout: merge (max sizes, union of lifetimes).
  Layout* target = nullptr;
  for (auto& l : layouts_) {
    if (same_structure(*l)) target = l.get();
  }
  std::int64_t horizon = T;  // the step's length on the merged time axis
  if (target) {
    // Put both on one time axis of length P; a wrapped upper keeps its
    // distance from the step's end.
    const std::int64_t P = std::max(target->horizon, T);
    auto norm = [P](std::int64_t upper, std::int64_t h) { return upper > h ? upper - h + P : upper; };
    wraps = false;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      const Slot& o = target->slots[i];
      s.size = std::max(s.size, o.size);
      s.dynamic = s.dynamic || o.dynamic;
      if (s.dynamic) continue;
      s.upper = std::max(norm(s.upper, T), norm(o.upper, target->horizon));
      s.lower = std::min(s.lower, o.lower);
      if (s.upper - s.lower > P) s.dynamic = true;  // would overlap itself
      else if (s.upper > P) wraps = true;
    }
    horizon = P;
  }
  const std::int64_t period = wraps ? horizon : 0;
  // This step's live blocks that are planned slots (they die early in the
  // next step); every other live or pending block is in the way.
  auto wraps_next_step = [&](const Block* b) {
    return b->state == BlockState::kAllocated && b->step == step_ && b->seq >= 0 &&
           static_cast<std::size_t>(b->seq) < slots.size() && !slots[b->seq].dynamic;
  };

  // The problem: planned slots, plus the live blocks of the target segment
  // that are not this step's live-outs as obstacles.
  planner::Problem problem;
  problem.period = period;
  std::vector<std::size_t> index;  // problem buffer -> slot
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].dynamic) continue;
    problem.buffers.push_back(planner::Buffer{slots[i].size, slots[i].lower, slots[i].upper});
    index.push_back(i);
  }
  if (problem.buffers.empty()) return nullptr;
  const std::size_t step_load = planner::load(problem);  // before the obstacles join
  Segment* seg = arena_.territory_candidate_locked(stream);
  std::size_t obstacle_bytes = 0;
  if (seg) {
    for (Block* b = seg->head; b; b = b->next) {
      // A pending block is no obstacle: its stream use ends soon (it is
      // released into the territory with an epoch event, or its slot falls
      // back while it lasts); going around it would grow the layout for good.
      if (b->state != BlockState::kAllocated || wraps_next_step(b)) continue;
      problem.fixed.push_back(planner::FixedBuffer{
          static_cast<std::size_t>(b->ptr - seg->base), b->size, 0, horizon});
      obstacle_bytes += b->size;
    }
  }
  std::size_t persistent = 0;
  for (const auto& [ptr, b] : arena_.live_) {
    if (!wraps_next_step(b)) persistent += b->size;
  }

  auto job = std::make_unique<PlanJob>();
  job->options.budget_seconds = arena_.config_.plan_budget_seconds;
  job->problem = std::move(problem);
  job->slots = std::move(slots);
  job->index = std::move(index);
  job->sizes = std::move(sizes);
  job->target = target;
  job->horizon = horizon;
  job->key = key_;
  job->stream = stream;
  job->step_load = step_load;
  job->obstacle_bytes = obstacle_bytes;
  job->persistent = persistent;
  planning_ = true;
  return job;
}

void StepPlanner::run(PlanJob& job) {
  const auto t0 = std::chrono::steady_clock::now();
  job.result = planner::plan(job.problem, job.options);
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void StepPlanner::install(std::unique_ptr<PlanJob> job) {
  planning_ = false;
  planner::Result& r = job->result;
  // The layout it merges into may have been forgotten meanwhile (another
  // thread's steps): then it becomes a layout of its own. Its slots already
  // hold the merged sizes and lifetimes.
  Layout* target = job->target;
  if (target && std::none_of(layouts_.begin(), layouts_.end(),
                             [target](const std::unique_ptr<Layout>& l) { return l.get() == target; })) {
    target = nullptr;
  }
  std::unique_ptr<Layout> fresh;
  Layout* layout = target;
  if (!layout) {
    fresh = std::make_unique<Layout>();
    layout = fresh.get();
  }
  layout->slots = std::move(job->slots);
  layout->horizon = job->horizon;
  layout->key = job->key;
  layout->stream = job->stream;
  layout->top = 0;
  for (std::size_t k = 0; k < job->index.size(); ++k) {
    Slot& s = layout->slots[job->index[k]];
    s.offset = r.offsets[k];
    layout->top = std::max(layout->top, s.offset + s.size);
  }
  layout->top = round_up(layout->top, arena_.unit_);
  layout->load = job->step_load;
  layout->greedy = r.greedy_size;
  // Only what lies under the layout's top is in its way (issue 11): an
  // obstacle above it bounds nothing, and counting it made
  // plan_over_step_load_and_obstacles fall below 1.
  layout->obstacles = 0;
  for (const planner::FixedBuffer& f : job->problem.fixed) {
    if (f.offset < layout->top) {
      layout->obstacles += static_cast<std::size_t>(std::min<std::uint64_t>(f.size, layout->top - f.offset));
    }
  }
  layout->persistent = job->persistent;
  layout->conflict_streak = 0;
  if (fresh) layouts_.push_back(std::move(fresh));
  last_problem_ = std::move(job->problem);
  last_offsets_ = std::move(r.offsets);
  // remember_variant matches the open step's key; this variant is job->key's.
  const std::uint64_t open_key = key_;
  key_ = job->key;
  remember_variant(layout, std::move(job->sizes));
  key_ = open_key;

  ++stats_.plans;
  stats_.plan_seconds += job->seconds;
  // Make each stream's territory cover exactly its kept layouts now (lower
  // when older, larger layouts were forgotten), so that the next step starts
  // replaying at once. A step opened meanwhile keeps what it has.
  if (!open_) {
    // What recording left in the dynamic pool goes back first, so that a
    // territory outgrown in fixed segments (its step served dynamically) is
    // never held beside the new one (issue 11).
    arena_.release_cached_locked();
    std::vector<StreamId> streams;
    for (const auto& [stream, seg] : arena_.territory_) streams.push_back(stream);
    for (const auto& l : layouts_) streams.push_back(l->stream);
    std::sort(streams.begin(), streams.end());
    streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
    for (StreamId stream : streams) fit_territory(stream);
  }
  // After a (re)plan, give back what recording and the first replay steps
  // left in the dynamic pool (this step's share of it now, two more steps).
  settle_steps_ = 1;
  arena_.release_cached_locked();
}

StepRecord StepPlanner::last_step() const {
  return last_ ? StepRecord(*last_) : StepRecord{};
}

PlanStats StepPlanner::stats() const {
  PlanStats s = stats_;
  s.variants = static_cast<std::int64_t>(variants_.size());
  s.layouts = static_cast<std::int64_t>(layouts_.size());
  const Layout* l = active_ ? active_ : most_recent_layout(nullptr);
  if (l) {
    s.plan_bytes = static_cast<std::int64_t>(l->top);
    s.load_bytes = static_cast<std::int64_t>(l->load + l->persistent);
    s.step_load_bytes = static_cast<std::int64_t>(l->load);
    s.greedy_bytes = static_cast<std::int64_t>(l->greedy);
    s.obstacle_bytes = static_cast<std::int64_t>(l->obstacles);
  }
  return s;
}

}  // namespace renaissance
