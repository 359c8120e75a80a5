// arena.cpp - see arena.h for the invariants. The planned-step policy lives
// in step_planner.cpp; this file holds the mechanisms it uses.
#include "core/arena.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/replay_fast.h"
#include "core/step_planner.h"

namespace renaissance {

namespace {

constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 2;

std::string hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

// The error for a block a front holds cached (freed by its caller).
InvalidPointerError freed_error(const char* what, const void* ptr) {
  return InvalidPointerError(std::string("torch_renaissance: cannot ") + what + " " + hex(ptr) +
                             ": the pointer lies in free memory of this arena (double free or " +
                             "stale pointer)");
}

Device& checked(const std::shared_ptr<Device>& d) {
  if (!d) throw std::invalid_argument("Arena needs a device backend, got none");
  return *d;
}

// The free-set class of a segment (arena.h, SegmentClass).
SegmentClass expandable_class(PoolKind pool, bool persistent) {
  if (persistent) return SegmentClass::kPersistent;
  return pool == PoolKind::kSmall ? SegmentClass::kSmall : SegmentClass::kLarge;
}

std::atomic<std::uint64_t> g_arena_serial{0};

}  // namespace

Arena::Arena(std::shared_ptr<Device> device, ArenaConfig config,
             std::shared_ptr<StatsGroup> group)
    : device_(std::move(device)),
      config_(config),
      unit_(checked(device_).alignment()),
      max_request_(device_->max_request_bytes()),
      ranges_ok_(device_->supports_address_ranges()),
      group_(std::move(group)),
      events_(*device_),
      pending_(*device_, events_),
      territory_(*this, *device_, events_, pending_, stats_),
      serial_(++g_arena_serial),
      fronts_enabled_(!group_),
      registry_(std::make_shared<FrontRegistry>()) {
  if (unit_ == 0 || (unit_ & (unit_ - 1)) != 0) {
    throw std::invalid_argument("device alignment must be a power of two");
  }
  config_table::validate(config_);  // each key's range (config.h); then the device's rules
  if (config_.small_size % unit_ || config_.small_segment < config_.small_size) {
    throw std::invalid_argument("small_segment must be at least small_size, a multiple of the alignment");
  }
  if (config_.large_segment < config_.small_size || config_.round_large == 0 ||
      config_.round_large % unit_ || config_.min_large_alloc == 0) {
    throw std::invalid_argument("large_segment must be larger than small_size and the rounding a "
                                "positive multiple of the alignment");
  }
  if (config_.large_segment < config_.min_large_alloc || config_.large_segment % unit_) {
    // Requests below min_large_alloc share segments of large_segment bytes:
    // a smaller segment could not hold them.
    throw std::invalid_argument(
        "large_segment (" + std::to_string(config_.large_segment) +
        " bytes) must be a multiple of the alignment (" + std::to_string(unit_) +
        " bytes) and at least min_large_alloc (" + std::to_string(config_.min_large_alloc) +
        " bytes)");
  }
  if (config_.small_segment % unit_) {
    throw std::invalid_argument("small_segment (" + std::to_string(config_.small_segment) +
                                " bytes) must be a multiple of the alignment (" +
                                std::to_string(unit_) + " bytes)");
  }
  if (config_.planning) {
    steps_ = std::make_unique<StepPlanner>(
        territory_, StepArenaView{config_, unit_, live_, capturing_, [this] { return release_cached_locked(); },
                                  [this] {
                                    const Stat& r = stats_.reserved_bytes[0];
                                    return static_cast<std::size_t>(std::max<std::int64_t>(0, r.peak - r.current));
                                  }});
  }
  if (fronts_enabled_) {
    // Fronts hold small-pool blocks only (a request the dynamic pool serves
    // from the small pool outside steps), and never one the device refuses.
    front_max_ = std::min(config_.small_size, std::size_t(1) << 20);
    if (max_request_) front_max_ = std::min(front_max_, max_request_);
    registry_->arena = this;
    fronts_open_.store(true);
  }
}

Arena::~Arena() {
  {
    // A thread that exits from now on has nothing to give back.
    std::lock_guard<std::mutex> g(registry_->mu);
    registry_->arena = nullptr;
    registry_->alive.store(false);
  }
  steps_.reset();
  for (auto& [base, seg] : segments_) {
    try {
      if (seg->expandable) {
        if (seg->mapped_bytes) unmap_granules_locked(seg.get(), 0, seg->mapped.size());
        device_->release_range(seg->base, seg->capacity);
      } else {
        device_->release(seg->base, seg->size);
      }
    } catch (...) {
      // A destructor must not throw; the process is going away with the device.
    }
  }
  territory_.release_events();
  if (group_) {
    try {
      group_->withdraw(published_);
    } catch (...) {
      // As above: nothing may escape a destructor.
    }
  }
}

// The lock of a public call that may change the stats: publishes them to the
// stats group (if any) before unlocking, whether the call returns or throws.
class Arena::Op {
 public:
  explicit Op(Arena& a) : a_(a), level_(&a.mu_), g_(a.mu_) { a.replay_enter_locked(); }
  ~Op() {
    a_.replay_leave_locked();
    if constexpr (debug::kLevel >= 3) a_.debug_check_locked();  // debug.h
    a_.publish_locked();
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

 private:
  Arena& a_;
  lock_order::Held<lock_order::kArena> level_;  // checked before the lock is taken
  std::lock_guard<std::mutex> g_;
};

// arena.h: "Locked". Const calls take it too: the flush changes blocks, not
// what any call reports.
class Arena::Locked {
 public:
  explicit Locked(const Arena& a) : a_(const_cast<Arena&>(a)), g_(a.mu_) { a_.replay_enter_locked(); }
  ~Locked() { a_.replay_leave_locked(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  Arena& a_;
  std::lock_guard<std::mutex> g_;
};

void Arena::publish_locked() noexcept {
  if (!group_) return;
  try {
    group_->publish(stats_, published_);
  } catch (...) {
    // Only std::mutex::lock can throw here (resource exhaustion); the totals
    // catch up with the next publication.
  }
}

// ---------------------------------------------------------------------------
// public API
// ---------------------------------------------------------------------------

void Arena::set_max_reserved_bytes(std::size_t bytes) {
  Locked g(*this);
  config_.max_reserved_bytes = bytes;
}

TR_HOT_INLINE void* Arena::replay_try_allocate(std::size_t size, StreamId stream) noexcept {
  if (!replay_armed_.load(std::memory_order_relaxed)) return nullptr;
  void* p = replay_allocate(size, stream);
  if constexpr (debug::kLevel >= 3) {
    if (p) debug_check_replay();
  }
  return p;
}

void* Arena::allocate(std::size_t size, StreamId stream) {
  if (void* p = replay_try_allocate(size, stream)) return p;
  return allocate_unplanned(size, stream);
}

TR_NO_INLINE void* Arena::allocate_unplanned(std::size_t size, StreamId stream) {
  if (size - 1 < front_max_) {  // 0 < size <= front_max_
    if (Front* f = front_tls::find_last(serial_)) {
      if (void* p = front_allocate_direct(*f, size, stream)) {
        if constexpr (debug::kLevel >= 3) debug_check_fast_path();
        return p;
      }
    }
  }
  return allocate_front_or_locked(size, stream);
}

TR_NO_INLINE void* Arena::allocate_front_or_locked(std::size_t size, StreamId stream) {
  if (size - 1 < front_max_) {
    if (void* p = front_allocate(size, stream)) {
      if constexpr (debug::kLevel >= 3) debug_check_fast_path();
      return p;
    }
  }
  return allocate(size, stream, OomHooks{});
}

const char* Arena::impossible(std::size_t size) const {
  if (size > kMaxRequest) return "the size is beyond what any device can hold";
  if (max_request_ && size > max_request_) {
    return "the size is larger than the device could ever serve (for CPU memory: RAM + swap)";
  }
  return nullptr;
}

void Arena::check_stream(StreamId stream) const {
  // Stream 0 is every backend's default stream; any other id is the
  // backend's to vouch for (a SimDevice stream that new_stream() made).
  if (stream != 0 && !device_->valid_stream(stream)) {
    throw std::invalid_argument("torch_renaissance: allocation on stream " + std::to_string(stream) +
                                ", which " + device_->name() + " does not have");
  }
}

void* Arena::allocate(std::size_t size, StreamId stream, const OomHooks& hooks) {
  if (size == 0) return nullptr;
  if (void* p = replay_try_allocate(size, stream)) return p;
  check_stream(stream);
  if (const char* why = impossible(size)) {
    Op g(*this);
    raise_oom_locked(size, why);  // the request, not a growth, is what cannot fit
  }
  {
    Op g(*this);
    if (void* p = allocate_locked(size, stream)) return p;
    // A block that only waits on another stream may be the fit: wait for
    // the pending uses on the host, once, and search again.
    if (!capturing_ && !pending_.empty()) {
      synchronize_pending_locked();
      if (void* p = allocate_locked(size, stream)) return p;
    }
  }
  // Memory held elsewhere (the CUDA glue's unused graph pools), freed
  // without the arena lock held.
  if (hooks.free_memory && hooks.free_memory()) {
    Op g(*this);
    if (void* p = allocate_locked(size, stream)) return p;
  }
  {
    // PyTorch's order: give the planned territory (for the rest of this
    // step) and every cached granule back to the device, and retry once.
    Op g(*this);
    ++stats_.num_alloc_retries;
    flush_cache_locked();
    if (steps_) steps_->release_territory();
    release_cached_locked();
    if (void* p = allocate_locked(size, stream)) return p;
  }
  if (hooks.last_resort) {
    if (void* p = hooks.last_resort()) return p;
  }
  Op g(*this);
  raise_oom_locked(size, nullptr);
}

void* Arena::try_allocate(std::size_t size, StreamId stream) {
  if (size == 0 || impossible(size)) return nullptr;
  if (void* p = replay_try_allocate(size, stream)) return p;
  check_stream(stream);
  if (size <= front_max_) {
    if (void* p = front_allocate(size, stream)) {
      if constexpr (debug::kLevel >= 3) debug_check_fast_path();
      return p;
    }
  }
  Op g(*this);
  return allocate_locked(size, stream);
}

void* Arena::allocate_cached(std::size_t size, StreamId stream) {
  if (size == 0 || size > kMaxRequest) return nullptr;
  check_stream(stream);
  Op g(*this);
  const std::size_t rounded = (size + unit_ - 1) & ~(unit_ - 1);  // unit_ is a power of two
  Block* b = find_free_locked(free_set(pool_for(rounded), false), stream, rounded,
                              /*may_map=*/false);
  if (!b) return nullptr;
  b = take_locked(b, rounded);
  mark_allocated_locked(b, size, stream);
  if (steps_) steps_->on_allocated(b);
  return b->ptr;
}

void* Arena::allocate_locked(std::size_t size, StreamId stream) {
  // Stream work that completed since the last look, noticed now as PyTorch's
  // process_events does on every allocation, but bounded: at most
  // kPollQueries event or stream queries per allocation, none without
  // pending blocks.
  constexpr std::size_t kPollQueries = 2;
  if (!capturing_ && !pending_.empty()) {
    release_blocks_locked(pending_.poll(kPollQueries, stats_.event_queries));
  }
  const std::size_t rounded = (size + unit_ - 1) & ~(unit_ - 1);  // unit_ is a power of two
  Block* b = nullptr;
  if (steps_) b = steps_->place(size, rounded, stream);
  if (!b && cache_blocks_) b = take_cached_locked(size, rounded, stream);
  if (!b) b = allocate_dynamic_locked(size, rounded, stream);
  if (!b) return nullptr;
  if (steps_) steps_->on_allocated(b);
  if (fronts_open_.load(std::memory_order_relaxed) && front_eligible_locked(b)) {
    // Held by this thread's front from now on: its free takes the fast path.
    if (Front* f = my_front_locked()) {
      FrontGuard fg(f->lock);
      front_hold_live_locked(*f, b, size);
    }
  }
  return b->ptr;
}

void Arena::deallocate(void* ptr) {
  if (!ptr) return;
  if (replay_armed_.load(std::memory_order_relaxed) && replay_deallocate(ptr)) {
    if constexpr (debug::kLevel >= 3) debug_check_replay();
    return;
  }
  deallocate_unplanned(ptr);
}

TR_NO_INLINE void Arena::deallocate_unplanned(void* ptr) {
  if (front_max_) {
    if (Front* f = front_tls::find_last(serial_)) {
      if (front_deallocate_direct(*f, ptr)) {
        if constexpr (debug::kLevel >= 3) debug_check_fast_path();
        return;
      }
    }
  }
  deallocate_front_or_locked(ptr);
}

TR_NO_INLINE void Arena::deallocate_front_or_locked(void* ptr) {
  if (front_max_ && front_deallocate(ptr)) {
    if constexpr (debug::kLevel >= 3) debug_check_fast_path();
    return;
  }
  deallocate_locked_path(ptr);
}

TR_NO_INLINE void Arena::deallocate_locked_path(void* ptr) {
  Op g(*this);
  Block* b = live_block_locked(ptr, "free");
  if (Front* f = b->front) {
    // Held by a front: the fast path missed (another thread frees it, a bin
    // is full, the fronts are closed). Back into its holder's front if it
    // can go there, else no longer held and freed below.
    FrontGuard fg(f->lock);
    if (!b->front_live) throw freed_error("free", ptr);
    if (fronts_open_.load(std::memory_order_relaxed) && front_cache(*f, b)) return;
    front_drop_locked(*f, b);
  } else if (fronts_open_.load(std::memory_order_relaxed) && front_eligible_locked(b)) {
    if (Front* mine = my_front_locked()) {
      FrontGuard fg(mine->lock);
      if (front_hold_freed_locked(*mine, b)) return;
    }
  }
  live_.erase(b->ptr);
  if (steps_) steps_->on_free(b);
  const PoolKind pool = b->segment->pool;
  stats_.sub(stats_.allocation, pool, 1);
  stats_.sub(stats_.allocated_bytes, pool, static_cast<std::int64_t>(b->size));
  stats_.sub(stats_.requested_bytes, pool, static_cast<std::int64_t>(b->requested));
  if (!b->uses.empty()) {
    b->state = BlockState::kPending;
    stats_.pending_bytes.increase(static_cast<std::int64_t>(b->size));
    pending_.add(b, b->planned ? PoolSide::kPlanned : PoolSide::kDynamic);
    return;
  }
  if (cache_block_locked(b)) return;
  free_block_locked(b);
}

void Arena::record_stream(void* ptr, StreamId stream) {
  if (!ptr) return;
  Locked g(*this);
  // A stream use inside a replayed step: the fast path stops for the rest
  // of the step (a freed block may now be pending, which its free flag
  // would not show).
  replay_disarm_locked();
  Block* b = live_block_locked(ptr, "record_stream on");
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) != b->uses.end()) return;
  if (!device_->valid_stream(stream)) {
    throw std::invalid_argument("torch_renaissance: record_stream on stream " +
                                std::to_string(stream) + ", which " + device_->name() +
                                " does not have");
  }
  if (Front* f = b->front) {
    // A block with a stream use never enters a front: its free must wait.
    FrontGuard fg(f->lock);
    if (!b->front_live) throw freed_error("record_stream on", ptr);
    front_drop_locked(*f, b);
  }
  b->uses.push_back(stream);
  if (steps_) steps_->on_record_stream(b, stream);
}

void Arena::empty_cache() {
  Op g(*this);
  flush_cache_locked();
  synchronize_pending_locked();
  // The planned territory is cache too (PyTorch's empty_cache returns every
  // unused cached block): it goes back, and the next step maps it again.
  if (steps_) steps_->release_territory();
  release_cached_locked();
}

void Arena::set_persistent_hint(bool on) {
  Locked g(*this);
  persistent_hint_ = on;
  if (on) return;
  if (!hinted_allocations_) return;
  hinted_allocations_ = false;
  // The hinted phase is over: what it left free in the persistent segment
  // were its temporaries (an optimizer's foreach intermediates, allocated
  // after the state they update), not state. Its free granules go back, so
  // they do not stay mapped beside the dynamic pool until the next plan
  // (issue 16: HF GPT-2's second recorded step peaked with the first
  // step()'s 15 MiB of AdamW temporaries still mapped there).
  if (capturing_) return;
  for (auto& [base, seg] : segments_) {
    if (seg->expandable && seg->persistent) release_free_granules_locked(seg.get());
  }
}

void Arena::sync_point() {
  Op g(*this);
  boundary_locked();
}

void Arena::set_capturing(bool capturing) {
  Op g(*this);
  fronts_open_.store(false);
  flush_cache_locked();  // no cache during a capture (see cache_open_locked)
  capturing_ = capturing;
  update_fronts_open_locked();
  if (capturing) return;
  territory_.after_capture();
  // Give back what release_segment_locked had to keep during the capture.
  std::vector<Segment*> due;
  for (auto& [base, seg] : segments_) {
    if (seg->retire && seg->live == 0 && !territory_.is_territory(seg.get())) due.push_back(seg.get());
  }
  for (Segment* seg : due) release_segment_locked(seg);
}

void Arena::begin_step(std::uint64_t key) {
  if (!steps_) return;
  std::unique_ptr<StepPlanJob> job;
  {
    Op g(*this);
    fronts_open_.store(false);  // closed through the step, holding nothing
    fold_fronts_locked(/*release=*/true);
    flush_cache_locked();  // steps see the free space merged (no cache inside a step)
    if (steps_->in_step()) job = steps_->end_step();  // an open step ends first
  }
  finish_plan(std::move(job));
  Op g(*this);
  fronts_open_.store(false);
  flush_cache_locked();
  steps_->begin_step(key);
  update_fronts_open_locked();
  replay_arm_locked();
}

void Arena::end_step() { end_step(false); }

void Arena::end_step(bool checked) {
  std::unique_ptr<StepPlanJob> job;
  {
    Op g(*this);
    if (checked && steps_ && !steps_->in_step()) {
      throw std::logic_error(
          "torch_renaissance: end_step() without an open step on this arena (call begin_step() "
          "first); nothing was changed");
    }
    flush_cache_locked();
    boundary_locked();
    if (steps_) job = steps_->end_step();
    update_fronts_open_locked();
  }
  finish_plan(std::move(job));
}

void Arena::begin_step_checked(std::uint64_t key) {
  if (!steps_) return;
  Op g(*this);
  if (steps_->in_step()) {
    throw std::logic_error(
        "torch_renaissance: begin_step() while a step is already open on this arena (steps do not "
        "nest: call end_step() first); nothing was changed");
  }
  // As begin_step: no cache and no front serves inside a step (the step
  // recorder sees every allocation of the step through allocate_locked).
  fronts_open_.store(false);
  fold_fronts_locked(/*release=*/true);
  flush_cache_locked();
  steps_->begin_step(key);
  update_fronts_open_locked();
  replay_arm_locked();
}

void Arena::end_step_checked() { end_step(true); }

void Arena::finish_plan(std::unique_ptr<StepPlanJob> job) {
  if (!job) return;
  // The planner runs without the lock, on the job's copy of the trace and
  // obstacles: other threads allocate and free meanwhile (issue 18).
  try {
    StepPlanner::run(*job);
  } catch (...) {
    Op g(*this);
    steps_->abandon();
    throw;
  }
  Op g(*this);
  // The territory's new line sees merged free blocks, and no front holds a
  // block it may now cover.
  fold_fronts_locked(/*release=*/true);
  flush_cache_locked();
  steps_->install(std::move(job));
}

bool Arena::in_step() const {
  Locked g(*this);
  return steps_ && steps_->in_step();
}

DeviceStats Arena::stats() const {
  Locked g(*this);
  flush_cache_for_read_locked();  // inactive_split as with the free blocks merged
  return stats_;
}

PlanStats Arena::plan_stats() const {
  Locked g(*this);
  return steps_ ? steps_->stats() : PlanStats{};
}

std::pair<planner::Problem, std::vector<std::uint64_t>> Arena::last_plan() const {
  Locked g(*this);
  if (!steps_) return {};
  return {steps_->last_problem(), steps_->last_offsets()};
}

std::string Arena::last_plan_stopped_by() const {
  Locked g(*this);
  return steps_ ? steps_->last_stopped_by() : std::string();
}

StepRecord Arena::last_step() const {
  Locked g(*this);
  return steps_ ? steps_->last_step() : StepRecord{};
}

void Arena::reset_peak_stats() {
  Locked g(*this);
  fold_fronts_locked(false);  // the books equal the true values: peak = current
  stats_.reset_peak();
}

void Arena::reset_accumulated_stats() {
  Locked g(*this);
  fold_fronts_locked(false);  // what the fronts served before the reset is counted now
  stats_.reset_accumulated();
}

std::size_t Arena::block_size(void* ptr) const {
  Locked g(*this);
  return live_block_locked(ptr, "block_size of")->size;
}

std::size_t Arena::largest_free_block() const {
  Locked g(*this);
  flush_cache_for_read_locked();  // the largest block as merged without the cache
  std::size_t best = 0;
  for (const FreeSet* s : {&small_free_, &large_free_, &persistent_free_}) {
    for (const Block* b : *s) best = std::max(best, b->size);
  }
  return best;
}

std::vector<SegmentInfo> Arena::snapshot() const {
  Locked g(*this);
  flush_cache_for_read_locked();  // free memory shows merged, as without the cache
  std::vector<SegmentInfo> out;
  for (const auto& [base, seg] : segments_) {
    if (seg->size == 0) continue;
    SegmentInfo si;
    si.address = reinterpret_cast<std::uintptr_t>(seg->base);
    // The bytes it reserves. Its blocks tile [address, address + size), which
    // for an expandable segment with holes is more: free blocks may cover
    // unmapped granules.
    si.total_size = seg->mapped_bytes;
    si.plan_top = seg->plan_top;
    si.stream = seg->stream;
    si.is_large = seg->pool == PoolKind::kLarge;
    si.expandable = seg->expandable;
    si.persistent = seg->persistent;
    for (const Block* b = seg->head; b; b = b->next) {
      BlockInfo bi;
      bi.address = reinterpret_cast<std::uintptr_t>(b->ptr);
      bi.size = b->size;
      bi.requested = b->requested;
      bi.state = b->state == BlockState::kCached ? BlockState::kFree : b->state;  // free memory
      bi.planned = b->planned;
      bi.in_territory = seg->in_territory(b);
      bi.stream = b->stream;
      if (b->state == BlockState::kAllocated) {
        si.allocated_size += b->size;
        si.requested_size += b->requested;
      }
      if (b->state != BlockState::kFree && b->state != BlockState::kCached) si.active_size += b->size;
      si.blocks.push_back(bi);
    }
    out.push_back(std::move(si));
  }
  return out;
}

// ---------------------------------------------------------------------------
// dynamic pool
// ---------------------------------------------------------------------------

PoolKind Arena::pool_for(std::size_t rounded) const {
  return rounded <= config_.small_size ? PoolKind::kSmall : PoolKind::kLarge;
}

Block* Arena::allocate_dynamic_locked(std::size_t requested, std::size_t rounded,
                                      StreamId stream) {
  // While a step is being recorded, small requests go to the large pool too:
  // the blocks that outlive the step then sit where the planner can place the
  // next steps around them, instead of fragmenting small segments for good.
  const bool recording = steps_ && steps_->recording() && use_ranges();
  const PoolKind pool = recording ? PoolKind::kLarge : pool_for(rounded);
  // Likewise what the optimizer creates while a step is recorded goes to its
  // own segment, packed (see set_persistent_hint); not in a step that left
  // its layout, where the state exists and the optimizer's foreach
  // temporaries grew that segment by their size (a periodic eval's first
  // step: 40 MiB over a 113 MiB steady reserved, a 16-layer MLP).
  bool persistent = recording && persistent_hint_ && !steps_->diverged();
  hinted_allocations_ |= persistent;
  // Between steps, what a stream with planned territory allocates goes to
  // the persistent segment too: not above the territory, where it would be
  // an obstacle that the next plan of a new structure goes above (issue 18).
  // So does what other threads allocate during a step (it is no part of
  // the step): all of their work then sits in one pool, never in the way of
  // the next plan.
  if (pool == PoolKind::kLarge && use_ranges() && steps_ && territory_.of(stream) &&
      (!steps_->in_step() || !steps_->plans_calling_thread())) {
    persistent = true;
  }
  FreeSet* set = &free_set(pool, persistent);
  for (;;) {
    Block* b = find_free_locked(*set, stream, rounded);
    if (!b && !pending_.empty() && reclaim_pending_locked(stream)) continue;
    if (!b && flush_cache_locked(stream, expandable_class(pool, persistent))) {
      continue;  // the cache's blocks of this free set may merge into a fit: no growth first
    }
    if (!b) b = grow_locked(pool, stream, rounded, persistent);
    if (!b && persistent) {  // no room for a packed segment: serve it as usual
      persistent = false;
      set = &free_set(pool, false);
      continue;
    }
    if (!b) return nullptr;  // the caller's out-of-memory ladder takes over
    b = take_locked(b, rounded);
    mark_allocated_locked(b, requested, stream);
    return b;
  }
}

Block* Arena::find_free_locked(FreeSet& set, StreamId stream, std::size_t rounded,
                               bool may_map) {
  // Candidates whose unmapped granules the limit refuses are passed over; a
  // few are looked at, then the ladder's release makes the best fit mappable.
  constexpr int kProbes = 4;
  Block key;
  key.stream = stream;
  key.size = rounded;
  key.ptr = nullptr;
  for (bool recycled = false;;) {
    int probes = 0;
    bool again = false;
    for (auto it = set.lower_bound(&key); it != set.end() && (*it)->stream == stream &&
                                          probes < kProbes;
         ++it, ++probes) {
      Block* b = *it;
      Segment* seg = b->segment;
      if (oversize_split_locked(b, rounded)) continue;
      if (seg->mapped_bytes < seg->size) {
        const auto off = static_cast<std::size_t>(b->ptr - seg->base);
        const std::size_t need = unmapped_bytes_locked(seg, off, off + rounded);
        if (need && !may_map) continue;  // only what is mapped already
        if (need && !recycled && recycle_first_locked(seg->pool, need)) {
          // Map the holes in place of the segment's other free granules, not
          // on top of them (see grow_expandable_locked); the release re-tiles
          // free blocks, so search again.
          flush_cache_locked();  // the release walks the segment's free blocks
          release_free_granules_locked(seg, off, off + rounded);
          recycled = again = true;
          break;
        }
        if (!map_range_locked(seg, off, off + rounded)) continue;
      }
      unindex_free_locked(b);
      return b;
    }
    if (!again) return nullptr;
  }
}

bool Arena::map_territory_locked(Segment* seg, std::size_t top) {
  // Holes a release unmapped below the line: territory is always mapped.
  // Like any mapping, in place of the free granules above it when the
  // peak would rise.
  const std::size_t need = unmapped_bytes_locked(seg, 0, top);
  if (need == 0) return true;
  if (recycle_first_locked(seg->pool, need)) release_free_granules_locked(seg, 0, top);
  return map_range_locked(seg, 0, top);
}

bool Arena::recycle_first_locked(PoolKind pool, std::size_t bytes) const {
  // Only under a limit (max_reserved_bytes; on CUDA also the memory
  // fraction): without one, growth keeps PyTorch's behaviour (cached
  // granules stay mapped until empty_cache or the out-of-memory ladder).
  if (!config_.max_reserved_bytes) return false;
  const auto p = static_cast<int>(pool);
  const std::int64_t cached = stats_.reserved_bytes[p].current - stats_.active_bytes[p].current;
  return !capturing_ && cached >= static_cast<std::int64_t>(device_->range_granularity()) &&
         stats_.reserved_bytes[0].current + static_cast<std::int64_t>(bytes) >
             stats_.reserved_bytes[0].peak;
}

Block* Arena::take_locked(Block* b, std::size_t rounded) {
  if (b->size - rounded >= unit_) index_free_locked(split_locked(b, rounded));
  return b;
}

Block* Arena::split_locked(Block* b, std::size_t first) {
  Segment* seg = b->segment;
  Block* t = new_block();
  t->ptr = b->ptr + first;
  t->size = b->size - first;
  t->segment = seg;
  t->stream = seg->stream;
  t->prev = b;
  t->next = b->next;
  if (b->next) b->next->prev = t;
  b->next = t;
  b->size = first;
  if (seg->tail == b) seg->tail = t;
  return t;
}

void Arena::mark_allocated_locked(Block* b, std::size_t requested, StreamId stream) {
  b->state = BlockState::kAllocated;
  b->requested = requested;
  b->stream = stream;
  const PoolKind pool = b->segment->pool;
  const auto size = static_cast<std::int64_t>(b->size);
  if (would_pass_peak_locked(b->size, requested, pool)) {
    // A new peak: the books must equal the true values first (the fronts'
    // slack would be counted in it). b is marked in use, so the freed
    // blocks do not merge into it.
    ++b->segment->live;
    fold_fronts_locked(false);
    --b->segment->live;
  }
  stats_.add(stats_.allocation, pool, 1);
  stats_.add(stats_.allocated_bytes, pool, size);
  stats_.add(stats_.requested_bytes, pool, static_cast<std::int64_t>(requested));
  stats_.add(stats_.active, pool, 1);
  stats_.add(stats_.active_bytes, pool, size);
  ++b->segment->live;
  b->segment->note_stream(stream);
  live_.insert(b->ptr, b);
}

Block* Arena::grow_locked(PoolKind pool, StreamId stream, std::size_t rounded, bool persistent) {
  if (use_ranges()) {
    if (Block* b = grow_expandable_locked(pool, stream, rounded, persistent)) return b;
  }
  if (persistent) return nullptr;  // only its own expandable segment serves it
  Segment* seg = new_segment_locked(pool, stream, rounded);
  if (!seg) return nullptr;
  unindex_free_locked(seg->head);
  return seg->head;
}

FreeSet& Arena::free_set(PoolKind pool, bool persistent) {
  if (persistent) return persistent_free_;
  return pool == PoolKind::kSmall ? small_free_ : large_free_;
}

const FreeSet& Arena::free_set(const Segment* seg) const {
  return const_cast<Arena*>(this)->free_set(seg->pool, seg->persistent);
}

Segment* Arena::expandable_segment_locked(StreamId stream, PoolKind pool, bool persistent) {
  const SegmentClass cls = expandable_class(pool, persistent);
  auto it = expandable_.find({stream, cls});
  if (it != expandable_.end()) return it->second;
  const std::size_t gran = device_->range_granularity();
  std::size_t bytes = config_.range_bytes;
  if (bytes == 0) {
    const std::size_t total = device_->mem_info().total_bytes;
    bytes = std::max<std::size_t>(std::size_t(8) << 30, total > (std::size_t(1) << 41) ? total : 2 * total);
    bytes = std::min<std::size_t>(bytes, std::size_t(4) << 40);
  }
  bytes = round_up(std::max(bytes, gran), gran);
  void* base = nullptr;
  while (!(base = device_->reserve_range(bytes)) && bytes > (std::size_t(1) << 30)) {
    bytes = round_up(bytes / 2, gran);
  }
  if (!base) {
    ranges_ok_ = false;  // this backend cannot reserve address space here
    return nullptr;
  }
  auto seg = std::make_unique<Segment>();
  seg->base = static_cast<char*>(base);
  seg->plan_free.set_origin(seg->base, unit_);
  seg->capacity = bytes;
  seg->pool = pool;
  seg->expandable = true;
  seg->persistent = persistent;
  seg->stream = stream;
  Segment* raw = seg.get();
  segments_.emplace(raw->base, std::move(seg));
  expandable_.emplace(std::make_pair(stream, cls), raw);
  return raw;
}

std::size_t Arena::limit_reserved_locked() const {
  std::int64_t reserved = stats_.reserved_bytes[0].current;
  if (group_) reserved += group_->reserved_current() - published_.reserved_bytes[0].current;
  TR_ASSERT(reserved >= 0);
  return static_cast<std::size_t>(std::max<std::int64_t>(reserved, 0));
}

bool Arena::over_limit_locked(std::size_t bytes) const {
  const std::size_t limit = config_.max_reserved_bytes;
  if (!limit) return false;
  const std::size_t reserved = limit_reserved_locked();
  return reserved > limit || bytes > limit - reserved;
}

bool Arena::map_tail_locked(Segment* seg, std::size_t bytes) {
  if (bytes > seg->capacity - seg->size) return false;
  if (over_limit_locked(bytes)) return false;
  if (!device_->map(seg->base + seg->size, bytes)) return false;
  ++stats_.num_device_alloc;
  seg->mapped.resize((seg->size + bytes) / device_->range_granularity(), true);
  seg->mapped_bytes += bytes;
  if (seg->size == 0) stats_.add(stats_.segment, seg->pool, 1);
  stats_.add(stats_.reserved_bytes, seg->pool, static_cast<std::int64_t>(bytes));
  Block* last = seg->tail;
  const bool extend = last && last->state == BlockState::kFree &&
                      seg->in_territory(last) == (seg->size < seg->plan_top);
  if (extend) {
    unindex_free_locked(last);
    last->size += bytes;
  } else {
    // A free block that gains a neighbour stops being a wholly free
    // segment: take it out of the counts while its links change.
    Block* relink = last && last->state == BlockState::kFree ? last : nullptr;
    if (relink) unindex_free_locked(relink);
    Block* nb = new_block();
    nb->ptr = seg->base + seg->size;
    nb->size = bytes;
    nb->segment = seg;
    nb->stream = seg->stream;
    nb->prev = last;
    if (last) last->next = nb; else seg->head = nb;
    seg->tail = nb;
    if (relink) index_free_locked(relink);
    last = nb;
  }
  seg->size += bytes;
  index_free_locked(last);
  return true;
}

Block* Arena::grow_expandable_locked(PoolKind pool, StreamId stream, std::size_t rounded,
                                     bool persistent) {
  Segment* seg = expandable_segment_locked(stream, pool, persistent);
  if (!seg) return nullptr;
  const std::size_t gran = device_->range_granularity();
  bool reuse = false;
  std::size_t have = 0, start = 0, more = 0, holes = 0;
  auto measure = [&] {
    const Block* last = seg->tail;
    reuse = last && last->state == BlockState::kFree && !seg->in_territory(last);
    have = reuse ? last->size : 0;
    start = reuse ? static_cast<std::size_t>(last->ptr - seg->base) : seg->size;
    more = have >= rounded ? 0 : round_up(rounded - have, gran);
    // The free tail may have unmapped granules too: the limit sees both.
    holes = reuse ? unmapped_bytes_locked(seg, start, seg->size) : 0;
  };
  measure();
  if (have >= rounded) return nullptr;  // it was passed over: its granules do not fit the limit
  // A growth that would raise the reserved peak while the segment caches
  // free granules: give those back first, so that the new granules take
  // their place instead of adding to them (a step recorded before its plan
  // exists then peaks near its live bytes, not near live + cached). Only a
  // new peak pays the unmapping, so a steady run does not churn.
  if (recycle_first_locked(seg->pool, more + holes)) {
    release_free_granules_locked(seg);
    measure();
  }
  if (more > seg->capacity - seg->size) return nullptr;
  if (over_limit_locked(more + holes)) return nullptr;
  if (!map_tail_locked(seg, more)) return nullptr;
  if (!map_range_locked(seg, start, start + rounded)) return nullptr;
  Block* b = seg->tail;  // starts at `start`: the old free tail, extended, or a new block
  unindex_free_locked(b);
  return b;
}

std::size_t Arena::unmapped_bytes_locked(const Segment* seg, std::size_t begin,
                                         std::size_t end) const {
  if (!seg->expandable || seg->mapped_bytes == seg->size || begin >= end) return 0;
  const std::size_t gran = device_->range_granularity();
  std::size_t n = 0;
  for (std::size_t i = begin / gran, last = (end - 1) / gran; i <= last; ++i) n += !seg->mapped[i];
  return n * gran;
}

bool Arena::map_range_locked(Segment* seg, std::size_t begin, std::size_t end) {
  const std::size_t need = unmapped_bytes_locked(seg, begin, end);
  if (need == 0) return true;
  if (over_limit_locked(need)) return false;
  const std::size_t gran = device_->range_granularity();
  const std::size_t first = begin / gran, last = (end - 1) / gran + 1;
  std::vector<std::pair<std::size_t, std::size_t>> done;  // granule runs mapped here
  auto undo = [&] {
    for (auto& [i, j] : done) {
      try {
        device_->unmap_used_by(seg->base + i * gran, (j - i) * gran, {});  // never used
      } catch (...) {
        // Leaves those granules mapped on the device: memory leaked, books right.
      }
    }
  };
  for (std::size_t i = first; i < last;) {
    if (seg->mapped[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < last && !seg->mapped[j]) ++j;
    bool ok = false;
    try {
      ok = device_->map(seg->base + i * gran, (j - i) * gran);
    } catch (...) {
      undo();
      throw;
    }
    if (!ok) {
      undo();
      return false;
    }
    done.emplace_back(i, j);
    i = j;
  }
  for (auto& [i, j] : done) {
    for (std::size_t k = i; k < j; ++k) seg->mapped[k] = true;
    ++stats_.num_device_alloc;
  }
  seg->mapped_bytes += need;
  stats_.add(stats_.reserved_bytes, seg->pool, static_cast<std::int64_t>(need));
  return true;
}

std::size_t Arena::unmap_granules_locked(Segment* seg, std::size_t first, std::size_t last) {
  const std::size_t gran = device_->range_granularity();
  std::size_t released = 0;
  for (std::size_t i = first; i < last;) {
    if (!seg->mapped[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < last && seg->mapped[j]) ++j;
    // Only the streams whose blocks lay in the segment can still use it.
    device_->unmap_used_by(seg->base + i * gran, (j - i) * gran, seg->streams);  // may throw: the books still agree
    for (std::size_t k = i; k < j; ++k) seg->mapped[k] = false;
    const std::size_t bytes = (j - i) * gran;
    seg->mapped_bytes -= bytes;
    released += bytes;
    ++stats_.num_device_free;
    stats_.sub(stats_.reserved_bytes, seg->pool, static_cast<std::int64_t>(bytes));
    i = j;
  }
  return released;
}

Segment* Arena::new_segment_locked(PoolKind pool, StreamId stream, std::size_t rounded,
                                  bool exact) {
  std::size_t bytes;
  if (exact) {
    bytes = round_up(rounded, config_.round_large);
  } else if (pool == PoolKind::kSmall) {
    bytes = config_.small_segment;
  } else if (rounded < config_.min_large_alloc) {
    bytes = config_.large_segment;
  } else {
    bytes = round_up(rounded, config_.round_large);
  }
  bytes = std::max(bytes, rounded);  // a segment always holds the request
  release_free_segments_for_locked(bytes);
  if (over_limit_locked(bytes) && pool == PoolKind::kLarge) bytes = rounded;  // last resort: exact
  if (over_limit_locked(bytes)) return nullptr;
  void* p = device_->reserve(bytes);
  const std::size_t own = std::max(round_up(rounded, config_.round_large), rounded);
  if (!p && own < bytes) {
    // The shared segment size (large_segment, small_segment) does not fit on
    // the device although the request would: a segment of the request's own
    // size, as for a request above min_large_alloc.
    bytes = own;
    p = device_->reserve(bytes);
  }
  if (!p) return nullptr;
  ++stats_.num_device_alloc;
  auto seg = std::make_unique<Segment>();
  seg->base = static_cast<char*>(p);
  seg->plan_free.set_origin(seg->base, unit_);
  seg->size = seg->capacity = seg->mapped_bytes = bytes;
  seg->pool = pool;
  seg->stream = stream;
  Block* b = new_block();
  b->ptr = seg->base;
  b->size = bytes;
  b->segment = seg.get();
  b->stream = stream;
  seg->head = seg->tail = b;
  Segment* raw = seg.get();
  segments_.emplace(seg->base, std::move(seg));
  stats_.add(stats_.segment, pool, 1);
  stats_.add(stats_.reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  index_free_locked(b);
  return raw;
}

void Arena::release_free_segments_for_locked(std::size_t bytes) {
  // Fixed segments' form of recycle_first_locked: under a limit, a new
  // segment that would raise the reserved peak while wholly free segments
  // are cached (none of which served the request) gives those back first,
  // largest first and only as many as it takes (issue 11 item 2). Without a
  // limit, PyTorch's behaviour: the cache stays until empty_cache or the
  // out-of-memory ladder.
  if (!config_.max_reserved_bytes || capturing_) return;
  auto over = [&] {
    return stats_.reserved_bytes[0].current + static_cast<std::int64_t>(bytes) >
           stats_.reserved_bytes[0].peak;
  };
  if (!over()) return;
  std::vector<Segment*> free_segs;
  for (auto& [base, seg] : segments_) {
    if (!seg->expandable && seg->wholly_free() && !territory_.is_territory(seg.get())) {
      free_segs.push_back(seg.get());
    }
  }
  std::sort(free_segs.begin(), free_segs.end(),
            [](const Segment* a, const Segment* b) { return a->size > b->size; });
  for (Segment* seg : free_segs) {
    if (!over()) break;
    release_segment_locked(seg);
  }
}

bool Arena::oversize_split_locked(const Block* b, std::size_t rounded) const {
  // PyTorch's max_split_size_mb, applied under a limit: a wholly free fixed
  // segment made for a large request (above large_segment) is not split for
  // a request of less than half of it. The small blocks would pin it: its
  // free rest could serve no request as large as the one it was made for,
  // and it could never be given back (issue 11 item 2: #35901's 16 MiB
  // blocks splitting a cached 3.2 GiB segment). The request grows a segment
  // of its own instead (the wholly free one is given back first when the
  // peak would rise, release_free_segments_for_locked).
  const Segment* seg = b->segment;
  return config_.max_reserved_bytes && !seg->expandable && seg->pool == PoolKind::kLarge &&
         !b->prev && !b->next && b->size > config_.large_segment && rounded <= b->size / 2;
}

std::size_t Arena::release_free_granules_locked(Segment* seg, std::size_t keep_lo,
                                               std::size_t keep_hi) {
  const std::size_t gran = device_->range_granularity();
  const std::size_t keep_first = keep_lo / gran, keep_last = round_up(keep_hi, gran) / gran;
  std::size_t released = 0;
  // Every granule wholly inside a free block of the dynamic pool, interior
  // holes included (PyTorch's release_blocks -> unmapBlock). The granules a
  // live block shares stay mapped; planned territory stays mapped.
  for (Block* b = seg->head; b && seg->mapped_bytes; b = b->next) {
    if (b->state != BlockState::kFree || seg->in_territory(b)) continue;
    const auto off = static_cast<std::size_t>(b->ptr - seg->base);
    const std::size_t first = round_up(off, gran) / gran, last = (off + b->size) / gran;
    if (keep_first < keep_last && first < keep_last && keep_first < last) {  // around the kept range
      if (first < keep_first) released += unmap_granules_locked(seg, first, keep_first);
      if (keep_last < last) released += unmap_granules_locked(seg, keep_last, last);
    } else if (first < last) {
      released += unmap_granules_locked(seg, first, last);
    }
  }
  // Then the end of the segment comes down to the last granule in use.
  Block* last = seg->tail;
  if (!last || last->state != BlockState::kFree || seg->in_territory(last)) return released;
  const std::size_t start = std::max(round_up(static_cast<std::size_t>(last->ptr - seg->base), gran),
                                     keep_last * gran);
  if (start >= seg->size) return released;
  const std::size_t cut = seg->size - start;  // all unmapped now
  unindex_free_locked(last);
  seg->size = start;
  seg->mapped.resize(start / gran);
  if (seg->size == 0) stats_.sub(stats_.segment, seg->pool, 1);
  last->size -= cut;
  if (last->size == 0) {
    Block* prev = last->prev;
    Block* relink = prev && prev->state == BlockState::kFree ? prev : nullptr;
    if (relink) unindex_free_locked(relink);  // it may become the whole segment
    seg->tail = prev;
    if (prev) prev->next = nullptr; else seg->head = nullptr;
    recycle_block(last);
    if (relink) index_free_locked(relink);
  } else {
    index_free_locked(last);
  }
  return released;
}

void Arena::release_segment_locked(Segment* seg) {
  if (capturing_) {
    // No memory goes back during a CUDA-graph capture; set_capturing(false)
    // releases it afterwards.
    seg->retire = true;
    return;
  }
  // The device first: if it fails, the arena is unchanged (or, for an
  // expandable segment, has unmapped part of it, with the books saying so).
  if (seg->expandable) {
    if (seg->mapped_bytes) unmap_granules_locked(seg, 0, seg->mapped.size());
  } else {
    device_->release(seg->base, seg->size);
    stats_.sub(stats_.reserved_bytes, seg->pool, static_cast<std::int64_t>(seg->size));
  }
  if (seg->head) {
    unindex_free_locked(seg->head);
    recycle_block(seg->head);
  }
  if (seg->size) {
    stats_.sub(stats_.segment, seg->pool, 1);
    if (!seg->expandable) ++stats_.num_device_free;  // unmapping counted its runs
  }
  territory_.forget(seg);
  char* const base = seg->base;
  const std::size_t capacity = seg->capacity;
  const bool expandable = seg->expandable;
  if (expandable) expandable_.erase({seg->stream, expandable_class(seg->pool, seg->persistent)});
  segments_.erase(base);  // destroys *seg
  // The memory is gone and the books say so; a failure here leaks address
  // space only.
  if (expandable) device_->release_range(base, capacity);
}

std::size_t Arena::release_cached_locked() {
  flush_cache_locked();  // what the free cache holds is free memory too
  if (capturing_) return 0;
  std::size_t released = 0;
  std::vector<Segment*> wholly_free;
  for (auto& [base, seg] : segments_) {
    if (seg->expandable) {  // every free granule outside planned territory
      released += release_free_granules_locked(seg.get());
      // An empty one gives its address range back too (streams come and go).
      if (seg->size == 0 && !territory_.is_territory(seg.get())) wholly_free.push_back(seg.get());
    } else if (seg->wholly_free() && !territory_.is_territory(seg.get())) {
      wholly_free.push_back(seg.get());
    }
  }
  for (Segment* seg : wholly_free) {
    released += seg->mapped_bytes;
    release_segment_locked(seg);
  }
  return released;
}

void Arena::raise_oom_locked(std::size_t requested, const char* why) {
  ++stats_.num_ooms;
  const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes[0].current);
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[0].current);
  const MemInfo mem = device_->mem_info();
  std::ostringstream os;
  os << "torch_renaissance: out of memory on " << device_->name() << ". Tried to allocate "
     << format_bytes(requested) << " (" << requested << " bytes). ";
  if (why) os << "Reason: " << why << ". ";
  os << "Allocated: " << format_bytes(allocated) << "; reserved: " << format_bytes(reserved)
     << " (" << format_bytes(reserved - std::min(reserved, allocated))
     << " reserved but unallocated); limit: "
     << (config_.max_reserved_bytes ? format_bytes(config_.max_reserved_bytes) +
                                          " (max_reserved_bytes)"
                                    : std::string("none"))
     << "; device: " << format_bytes(mem.free_bytes) << " free of "
     << format_bytes(mem.total_bytes) << ".";
  throw OutOfMemoryError(os.str(), requested);
}

// ---------------------------------------------------------------------------
// free blocks
// ---------------------------------------------------------------------------

void Arena::count_inactive_locked(const Block* b, int sign) {
  if (!b->prev && !b->next) return;  // a wholly free segment is releasable
  const PoolKind pool = b->segment->pool;
  if (sign > 0) {
    stats_.add(stats_.inactive_split, pool, 1);
    stats_.add(stats_.inactive_split_bytes, pool, static_cast<std::int64_t>(b->size));
  } else {
    stats_.sub(stats_.inactive_split, pool, 1);
    stats_.sub(stats_.inactive_split_bytes, pool, static_cast<std::int64_t>(b->size));
  }
}

void Arena::index_free_locked(Block* b) {
  Segment* seg = b->segment;
  if (seg->in_territory(b)) {
    seg->plan_free.insert(b->ptr, b);
  } else {
    free_set(seg->pool, seg->persistent).insert(b);
  }
  count_inactive_locked(b, +1);
}

void Arena::unindex_free_locked(Block* b) {
  Segment* seg = b->segment;
  if (seg->in_territory(b)) {
    seg->plan_free.erase(b->ptr);
  } else {
    free_set(seg->pool, seg->persistent).erase(b);
  }
  count_inactive_locked(b, -1);
}

void Arena::absorb_next_locked(Block* a) {
  Block* b = a->next;
  a->size += b->size;
  a->next = b->next;
  if (b->next) b->next->prev = a;
  if (a->segment->tail == b) a->segment->tail = a;
  recycle_block(b);
}

void Arena::free_block_locked(Block* b) {
  Segment* seg = b->segment;
  const PoolKind pool = seg->pool;
  stats_.sub(stats_.active, pool, 1);
  stats_.sub(stats_.active_bytes, pool, static_cast<std::int64_t>(b->size));
  --seg->live;
  b->state = BlockState::kFree;
  b->requested = 0;
  b->planned = false;
  b->stream = seg->stream;
  b->uses.clear();
  b->pending_on = 0;
  b->step = 0;
  b->seq = -1;
  merge_free_locked(b);
}

void Arena::merge_free_locked(Block* b) {
  Segment* seg = b->segment;
  b->state = BlockState::kFree;
  const bool territory = seg->in_territory(b);
  // A free territory block before b keeps its index entry (plan_free is by
  // start address, which merging b into it does not change): only its
  // inactive-split share is counted again with its new size.
  bool indexed = false;
  if (Block* p = b->prev; p && p->state == BlockState::kFree && seg->in_territory(p) == territory) {
    if (territory) {
      count_inactive_locked(p, -1);
      indexed = true;
    } else {
      unindex_free_locked(p);
    }
    absorb_next_locked(p);
    b = p;
  }
  if (Block* n = b->next; n && n->state == BlockState::kFree && seg->in_territory(n) == territory) {
    unindex_free_locked(n);
    absorb_next_locked(b);
  }
  if (indexed) {
    count_inactive_locked(b, +1);
  } else {
    index_free_locked(b);
  }
  if (seg->retire && seg->live == 0 && !territory_.is_territory(seg)) release_segment_locked(seg);
}

// ---------------------------------------------------------------------------
// free cache (arena.h: "Free cache")
// ---------------------------------------------------------------------------

void Arena::count_cached_locked(const Block* b, int sign) {
  // Always an inactive split block, whatever its links (they may change while
  // it is cached: a segment's tail grows, a free neighbour is released).
  const PoolKind pool = b->segment->pool;
  const auto size = static_cast<std::int64_t>(b->size);
  if (sign > 0) {
    stats_.add(stats_.inactive_split, pool, 1);
    stats_.add(stats_.inactive_split_bytes, pool, size);
  } else {
    stats_.sub(stats_.inactive_split, pool, 1);
    stats_.sub(stats_.inactive_split_bytes, pool, size);
  }
}

bool Arena::cache_open_locked() const {
  return !capturing_ && !(steps_ && steps_->in_step());
}

Block* Arena::take_cached_locked(std::size_t requested, std::size_t rounded, StreamId stream) {
  if (rounded > kCacheMaxBlock || !cache_open_locked()) return nullptr;
  // The free set allocate_dynamic_locked would search first (outside a step:
  // the request's pool, or the persistent segment for a large request of a
  // stream with planned territory).
  const PoolKind pool = pool_for(rounded);
  const bool persistent = pool == PoolKind::kLarge && use_ranges() && steps_ &&
                          territory_.of(stream);
  const SegmentClass cls = expandable_class(pool, persistent);
  CacheBin* bin = bins::take_bin(cache_, cache_bin_home(rounded, stream), kCacheProbes,
                                 [&](const CacheBin& x) {
                                   return x.size == rounded && x.stream == stream && x.cls == cls;
                                 });
  if (!bin) return nullptr;
  Block* b = bin->blocks[--bin->count];
  cache_bytes_ -= b->size;
  --cache_blocks_;
  count_cached_locked(b, -1);
  --b->segment->live;  // mark_allocated_locked counts it again
  mark_allocated_locked(b, requested, stream);
  return b;
}

bool Arena::cache_block_locked(Block* b) {
  Segment* seg = b->segment;
  if (b->size > kCacheMaxBlock || cache_bytes_ + b->size > kCacheMaxBytes || b->planned ||
      seg->in_territory(b) || seg->retire || !b->uses.empty() || !cache_open_locked()) {
    return false;
  }
  // Only memory of the block's own segment's stream, keyed by it: a block is
  // never handed to another stream through the cache (issue 18).
  const StreamId stream = seg->stream;
  const SegmentClass cls = expandable_class(seg->pool, seg->persistent);
  const std::size_t size = b->size;
  CacheBin* target = bins::put_bin<kCacheDepth>(
      cache_, cache_bin_home(size, stream), kCacheProbes,
      [&](const CacheBin& x) { return x.size == size && x.stream == stream && x.cls == cls; },
      [&](CacheBin& x) {
        x.size = size;
        x.stream = stream;
        x.cls = cls;
      });
  if (!target) return false;
  stats_.sub(stats_.active, seg->pool, 1);
  stats_.sub(stats_.active_bytes, seg->pool, static_cast<std::int64_t>(b->size));
  b->state = BlockState::kCached;
  b->requested = 0;
  b->stream = stream;
  b->pending_on = 0;
  b->step = 0;
  b->seq = -1;
  count_cached_locked(b, +1);
  target->blocks[target->count++] = b;
  cache_bytes_ += b->size;
  ++cache_blocks_;
  return true;
}

void Arena::flush_cache_locked() {
  fold_fronts_locked(false);
  if (!cache_blocks_) return;
  for (CacheBin& bin : cache_) flush_bin_locked(bin);
}

bool Arena::flush_cache_locked(StreamId stream, SegmentClass cls) {
  bool any = false;
  if (cls == SegmentClass::kSmall) {
    // What a front caches for this stream may merge into a fit too.
    for (const auto& f : fronts_) {
      FrontGuard fg(f->lock);
      bool mine = false;
      for (const Front::Bin& bin : f->bins) mine |= bin.count && bin.stream == stream;
      if (mine) any |= fold_front_locked(*f, false);
    }
  }
  if (!cache_blocks_) return any;
  for (CacheBin& bin : cache_) {
    if (bin.count && bin.stream == stream && bin.cls == cls) {
      flush_bin_locked(bin);
      any = true;
    }
  }
  return any;
}

void Arena::flush_bin_locked(CacheBin& bin) {
  while (bin.count) {
    Block* b = bin.blocks[--bin.count];
    cache_bytes_ -= b->size;
    --cache_blocks_;
    count_cached_locked(b, -1);
    --b->segment->live;
    merge_free_locked(b);  // may release a retired segment it empties
  }
}

void Arena::flush_cache_for_read_locked() const {
  // Flushing changes no stat (cached blocks are accounted as freed) and
  // nothing a caller can see but the layout of free memory: a read may do it.
  const_cast<Arena*>(this)->flush_cache_locked();
}

void Arena::flush_cache() {
  Op g(*this);
  flush_cache_locked();
}

Arena::CacheInfo Arena::cache_info() const {
  Locked g(*this);
  CacheInfo info{cache_bytes_, cache_blocks_};
  for (const auto& f : fronts_) {
    FrontGuard fg(f->lock);
    info.bytes += f->cached_bytes;
    info.blocks += f->cached_blocks;
  }
  return info;
}


// ---------------------------------------------------------------------------
// per-thread front (arena.h: "Per-thread front"; free_cache.h)
// ---------------------------------------------------------------------------

// The fast paths proper (inline, and leaves: no call on them, so no
// callee-saved register is pushed): the thread's last front, a key of the
// direct map, the top block of its bin booked for the caller's size, a bin
// with room. Anything else returns nullptr / false having changed nothing,
// and the caller's out-of-line rest (front_allocate / front_deallocate,
// then the locked path) does the general case.
TR_HOT_INLINE void* Arena::front_allocate_direct(Front& f, std::size_t size,
                                                 StreamId stream) noexcept {
  const std::size_t rounded = (size + unit_ - 1) & ~(unit_ - 1);  // unit_ is a power of two
  FastSection g(f.lock);
  if (!g.entered() || !fronts_open_.load(std::memory_order_relaxed)) return nullptr;
  if (size == f.next_req && stream == 0) {
    // The block a free put on top of its bin last (Front::next_ptr): the
    // address comes from the front, and the checks that it is what the
    // direct map's path below would hand out only decide a branch.
    Front::Bin& bin = *f.next_bin;
    Block* b = f.next_block;
    const void* p = f.next_ptr;
    if (bin.count != 0 && bin.blocks[bin.count - 1] == b && b->ptr == p && b->requested == size &&
        bin.size == rounded && bin.stream == 0) {
      --bin.count;
      front_hand_out(f, bin, b, size);
      return const_cast<void*>(p);
    }
  }
  const std::uint8_t* d = f.direct_entry(rounded, stream);
  if (!d || *d == 0) return nullptr;
  Front::Bin& bin = f.bins[*d - 1];
  if (bin.count == 0) return nullptr;
  // Last in, first out: the top block, when its booked size is the caller's
  // (the common case: the same request again).
  Block* b = bin.blocks[bin.count - 1];
  if (b->requested != size) return nullptr;
  --bin.count;
  front_hand_out(f, bin, b, size);
  return b->ptr;
}

TR_HOT_INLINE bool Arena::front_deallocate_direct(Front& f, void* ptr) noexcept {
  FastSection g(f.lock);
  if (!g.entered() || !fronts_open_.load(std::memory_order_relaxed)) return false;
  Block* b;
  Front::Bin* bin;
  if (ptr == f.last_ptr) {
    // The block handed out last (Front::last_ptr): its bin is known. Its
    // free ends here or on the slow path, so the hint is spent either way.
    f.forget_last();
    b = f.last_block;
    bin = f.last_bin;
  } else {
    // Not held here: the slow path finds out whether it is anyone's.
    b = f.held.find(ptr);
    if (!b) return false;
    const std::uint8_t* d = f.direct_entry(b->size, b->stream);
    if (!d || *d == 0) return false;
    bin = &f.bins[*d - 1];
  }
  // Freed already (the slow path says so), or no room.
  if (!b->front_live || f.cached_bytes + b->size > Front::kMaxBytes ||
      bin->count >= Front::kDepth) {
    return false;
  }
  front_push(f, *bin, b);
  return true;
}

TR_HOT_INLINE void Arena::front_hand_out(Front& f, Front::Bin& bin, Block* b,
                                         std::size_t size) noexcept {
  f.last_ptr = b->ptr;  // the hint (Front::last_ptr): b's free finds `bin` directly
  f.last_block = b;
  f.last_bin = &bin;
  --f.cached_blocks;
  f.cached_bytes -= b->size;
  b->front_live = true;
  b->front_req = size;
  ++f.acc.allocs;
  f.acc.alloc_bytes += static_cast<std::int64_t>(b->size);
  f.acc.req_alloc += static_cast<std::int64_t>(size);
}

TR_HOT_INLINE void Arena::front_push(Front& f, Front::Bin& bin, Block* b) noexcept {
  bin.blocks[bin.count++] = b;
  if (f.direct_entry(bin.size, bin.stream)) {  // a key of the direct map
    f.next_ptr = b->ptr;  // the allocation hint (Front::next_ptr)
    f.next_block = b;
    f.next_bin = &bin;
    f.next_req = b->requested;
  }
  ++f.cached_blocks;
  f.cached_bytes += b->size;
  b->front_live = false;
  ++f.acc.frees;
  f.acc.free_bytes += static_cast<std::int64_t>(b->size);
  f.acc.req_free += static_cast<std::int64_t>(b->front_req);
}

void* Arena::front_allocate(std::size_t size, StreamId stream) noexcept {
  Front* f = front_tls::find(serial_);
  if (!f) return nullptr;
  const std::size_t rounded = (size + unit_ - 1) & ~(unit_ - 1);  // unit_ is a power of two
  FastSection g(f->lock);
  if (!g.entered() || !f->cached_blocks || !fronts_open_.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  Front::Bin* bin = f->take_bin(rounded, stream);
  if (!bin) return nullptr;
  for (std::size_t k = bin->count; k-- > 0;) {  // last in, first out
    Block* b = bin->blocks[k];
    // Only within the block's booked size, so the true requested bytes
    // never pass the books (and their peak); a smaller request is booked
    // at the next fold (the dirty list).
    if (b->requested < size) continue;
    if (b->requested != size) {
      if (f->dirty_count == Front::kDirty) continue;
      f->dirty[f->dirty_count++] = b;
    }
    bin->blocks[k] = bin->blocks[--bin->count];
    front_hand_out(*f, *bin, b, size);
    return b->ptr;
  }
  return nullptr;
}

bool Arena::front_deallocate(void* ptr) noexcept {
  Front* f = front_tls::find(serial_);
  if (!f) return false;
  FastSection g(f->lock);
  if (!g.entered() || !fronts_open_.load(std::memory_order_relaxed)) return false;
  Block* b = f->held.find(ptr);
  // Not held here, or freed already: the slow path finds out which.
  if (!b || !b->front_live) return false;
  return front_cache(*f, b);
}

bool Arena::front_cache(Front& f, Block* b) noexcept {
  // Freed here, or refused and dropped by the caller: the hint is spent.
  if (f.last_ptr == b->ptr) f.forget_last();
  if (f.cached_bytes + b->size > Front::kMaxBytes) return false;
  Front::Bin* target = f.put_bin(b->size, b->stream);
  if (!target) return false;
  front_push(f, *target, b);
  return true;
}

Front* Arena::my_front_locked() {
  if (Front* f = front_tls::find(serial_)) return f;
  if (!fronts_enabled_) return nullptr;
  auto f = std::make_shared<Front>();
  f->lock.set_owner(std::this_thread::get_id());
  f->unit_shift = static_cast<unsigned>(__builtin_ctzll(unit_));
  f->arena_serial = serial_;
  f->registry = registry_;
  fronts_.push_back(f);
  if (!front_tls::adopt(f)) {  // the thread is exiting
    fronts_.pop_back();
    return nullptr;
  }
  return fronts_.back().get();
}

bool Arena::front_eligible_locked(const Block* b) const {
  const Segment* seg = b->segment;
  return b->size <= front_max_ && seg->pool == PoolKind::kSmall && !seg->persistent &&
         !seg->retire && !b->planned && !seg->in_territory(b) && b->uses.empty() &&
         b->step == 0 && b->stream == seg->stream;
}

void Arena::front_hold_live_locked(Front& f, Block* b, std::size_t requested) {
  try {
    f.held.insert(b->ptr, b);
  } catch (const std::bad_alloc&) {
    return;  // not held: its free takes the slow path
  }
  b->front = &f;
  b->front_live = true;
  b->front_req = requested;  // == b->requested: booked exactly
}

bool Arena::front_hold_freed_locked(Front& f, Block* b) {
  try {
    f.held.insert(b->ptr, b);
  } catch (const std::bad_alloc&) {
    return false;
  }
  b->front = &f;
  b->front_live = true;
  b->front_req = b->requested;
  // The free is counted in the front's counters: the books keep the block
  // allocated until the next fold.
  if (front_cache(f, b)) return true;
  f.held.erase(b->ptr);
  b->front = nullptr;
  b->front_live = false;
  return false;
}

void Arena::front_drop_locked(Front& f, Block* b) {
  // What the front served of b is in its counters (booked at its next
  // fold); from now on the books count b's caller's size, as its free will.
  b->requested = b->front_req;
  b->front = nullptr;
  b->front_live = false;
  if (f.last_ptr == b->ptr) f.forget_last();
  f.held.erase(b->ptr);
}

bool Arena::fold_front_locked(Front& f, bool release) {
  f.forget_last();  // blocks may leave `held` below
  if (f.acc.any()) {
    const Front::Counters& c = f.acc;
    auto apply = [](StatArray& a, std::int64_t up, std::int64_t down) {
      // The net change is never positive (the books are never below the
      // true values), so no peak moves.
      for (int i : {0, static_cast<int>(PoolKind::kSmall)}) {
        a[i].current += up - down;
        a[i].allocated += up;
        a[i].freed += down;
      }
    };
    apply(stats_.allocation, c.allocs, c.frees);
    apply(stats_.active, c.allocs, c.frees);
    apply(stats_.allocated_bytes, c.alloc_bytes, c.free_bytes);
    apply(stats_.active_bytes, c.alloc_bytes, c.free_bytes);
    apply(stats_.requested_bytes, c.req_alloc, c.req_free);
    f.acc = {};
  }
  for (std::size_t k = 0; k < f.dirty_count; ++k) {
    Block* b = f.dirty[k];
    if (b->front == &f && b->front_live) b->requested = b->front_req;
  }
  f.dirty_count = 0;
  const bool freed = f.cached_blocks != 0;
  if (freed) {
    for (Front::Bin& bin : f.bins) {
      while (bin.count) {
        Block* b = bin.blocks[--bin.count];
        f.held.erase(b->ptr);
        b->front = nullptr;
        b->front_live = false;
        // Already freed in the books by the fold above: only the block.
        live_.erase(b->ptr);
        --b->segment->live;
        b->state = BlockState::kFree;
        b->requested = 0;
        b->seq = -1;
        merge_free_locked(b);  // may release a retired segment it empties
      }
    }
    f.cached_blocks = 0;
    f.cached_bytes = 0;
  }
  if (release) {
    for (auto [ptr, b] : f.held) {
      b->front = nullptr;
      b->front_live = false;
    }
    f.held = LiveMap();
  }
  return freed;
}

bool Arena::fold_fronts_locked(bool release) {
  if (fronts_.empty()) return false;
  // Every front locked at once: the books then equal the true values at one
  // instant, which is where the operation that asked for the fold happens.
  lock_fronts(fronts_);
  bool freed = false;
  for (const auto& f : fronts_) freed |= fold_front_locked(*f, release);
  unlock_fronts(fronts_);
  return freed;
}

void Arena::set_fronts(bool on) {
  Op g(*this);
  fronts_wanted_ = on;
  update_fronts_open_locked();
}

void Arena::update_fronts_open_locked() {
  const bool open = fronts_enabled_ && fronts_wanted_ && cache_open_locked();
  if (!open) {
    fronts_open_.store(false);
    fold_fronts_locked(false);  // nothing a front served stays unbooked while closed
  } else {
    fronts_open_.store(true);
  }
}

bool Arena::would_pass_peak_locked(std::size_t size, std::size_t requested, PoolKind pool) const {
  if (fronts_.empty() || !fronts_open_.load(std::memory_order_relaxed)) return false;
  // Only the small pool's and the all-pools' values carry fronts' slack.
  const auto sz = static_cast<std::int64_t>(size);
  const auto rq = static_cast<std::int64_t>(requested);
  auto over = [](const Stat& s, std::int64_t d) { return s.current + d > s.peak; };
  for (int i : {0, static_cast<int>(PoolKind::kSmall)}) {
    if (i != 0 && pool != PoolKind::kSmall) break;
    if (over(stats_.allocation[i], 1) || over(stats_.active[i], 1) ||
        over(stats_.allocated_bytes[i], sz) || over(stats_.active_bytes[i], sz) ||
        over(stats_.requested_bytes[i], rq)) {
      return true;
    }
  }
  return false;
}

void Arena::retire_front(Front& f) {
  // Not an Op: this runs in a thread-local destructor, after other
  // thread-locals (the lock-order checker's list of held locks) may already
  // be gone. No stats group here (fronts are off in one), so nothing to publish.
  Locked g(*this);
  for (auto it = fronts_.begin(); it != fronts_.end(); ++it) {
    if (it->get() != &f) continue;
    {
      FrontGuard fg(f.lock);
      fold_front_locked(f, /*release=*/true);
    }
    fronts_.erase(it);
    return;
  }
}

std::size_t Arena::front_count() const {
  Locked g(*this);
  return fronts_.size();
}

// ---------------------------------------------------------------------------
// planned replay's fast path (arena.h; step_planner.h: "the fast path")
// ---------------------------------------------------------------------------

const void* Arena::replay_me() noexcept {
  // The calling thread's own TLS slot (initial-exec: no call): an address
  // no other living thread has.
  return &front_tls::t_last_front;
}

TR_HOT_INLINE void* Arena::replay_allocate(std::size_t size, StreamId stream) noexcept {
  if (size - 1 >= kMaxRequest || replay_owner_.load(std::memory_order_relaxed) != replay_me()) {
    return nullptr;
  }
  FastSection g(replay_lock_);
  // Read again inside: what an arming or disarming by another thread wrote
  // under the replay lock is seen here (replay_arm_locked).
  if (!g.entered() || !replay_armed_.load(std::memory_order_relaxed) ||
      replay_owner_.load(std::memory_order_relaxed) != replay_me()) {
    return nullptr;
  }
  const std::size_t rounded = (size + unit_ - 1) & ~(unit_ - 1);  // unit_ is a power of two
  char* p = steps_->fast_place(size, rounded, stream);
  if (!p) return nullptr;
  // The stats mark_allocated_locked books, kept as a change that the next
  // flush adds (with the peaks: the fronts hold nothing inside a step).
  ReplayBooks& k = replay_books_;
  const auto bytes = static_cast<std::int64_t>(rounded), req = static_cast<std::int64_t>(size);
  ++k.alloc_n;
  k.alloc_bytes += bytes;
  k.alloc_req += req;
  if (++k.n > k.max_n) k.max_n = k.n;
  if ((k.bytes += bytes) > k.max_bytes) k.max_bytes = k.bytes;
  if ((k.req += req) > k.max_req) k.max_req = k.req;
  return p;
}

TR_HOT_INLINE bool Arena::replay_deallocate(void* ptr) noexcept {
  if (replay_owner_.load(std::memory_order_relaxed) != replay_me()) return false;
  FastSection g(replay_lock_);
  if (!g.entered() || !replay_armed_.load(std::memory_order_relaxed) ||
      replay_owner_.load(std::memory_order_relaxed) != replay_me()) {
    return false;
  }
  std::size_t rounded = 0, requested = 0;
  if (!steps_->fast_free(ptr, rounded, requested)) return false;
  // deallocate's and free_block_locked's stats (replay_books_); the tiling
  // never changed. It frees what the fast path allocated since the last
  // flush (a flush empties its table), so no change goes below zero.
  ReplayBooks& k = replay_books_;
  --k.n;
  k.bytes -= static_cast<std::int64_t>(rounded);
  k.req -= static_cast<std::int64_t>(requested);
  return true;
}

void Arena::replay_enter_locked() {
  if (!replay_armed_.load(std::memory_order_relaxed)) return;
  replay_lock_.lock();  // another thread: waits until the owner is out of its fast section
  replay_held_ = true;
  try {
    replay_book_locked();
    // The flush: each live allocation of the fast path becomes the block
    // Territory::place would have made (its range is wholly free territory:
    // clean when the step began, every earlier occupant freed). Its stats
    // were booked by the fast path: taken off, then booked again by
    // mark_allocated (the current values come back to what they were, so
    // no peak moves). The accumulated counts come back too: the allocation
    // was booked once, by the fast path, so neither the taking off (a free)
    // nor the booking again (an allocation) may count.
    Segment* seg = steps_->fast_segment();
    const int pool_at = static_cast<int>(replay_pool_);
    auto unbook = [&](StatArray& a, std::int64_t amount) {
      for (int at : {0, pool_at}) {
        a[at].current -= amount;  // booked by replay_book_locked: no underflow
      }
    };
    auto uncount = [&](StatArray& a, std::int64_t amount) {
      for (int at : {0, pool_at}) a[at].allocated -= amount;
    };
    for (const StepPlanner::FastBlock& f : steps_->take_fast_live()) {
      const auto bytes = static_cast<std::int64_t>(f.rounded);
      const auto req = static_cast<std::int64_t>(f.requested);
      unbook(stats_.allocation, 1);
      unbook(stats_.allocated_bytes, bytes);
      unbook(stats_.requested_bytes, req);
      unbook(stats_.active, 1);
      unbook(stats_.active_bytes, bytes);
      Block* b = territory_.place(seg, static_cast<std::size_t>(f.ptr - seg->base), f.rounded,
                                  f.requested, f.stream);
      if (!b || b->ptr != f.ptr) {
        debug::assertion_failed("replay fast path: a live allocation's range is not free territory",
                                __FILE__, __LINE__);
      }
      uncount(stats_.allocation, 1);
      uncount(stats_.allocated_bytes, bytes);
      uncount(stats_.requested_bytes, req);
      uncount(stats_.active, 1);
      uncount(stats_.active_bytes, bytes);
      steps_->adopt_fast_block(b, f.position);
    }
  } catch (const std::exception& e) {
    // Only host memory for a block, an index or live-map entry can fail
    // (bad_alloc), after the fast path's table was emptied: the allocations
    // not yet made blocks would be neither blocks nor in the table, their
    // ranges free territory that a later placement could hand out again.
    // No caller could recover from that, so it stops here, loudly, rather
    // than go on with live tensors it no longer knows.
    flush_failed(e.what());
  } catch (...) {
    flush_failed("unknown exception");
  }
}

void Arena::flush_failed(const char* what) noexcept {
  std::fprintf(stderr,
               "torch_renaissance: the planned replay's fast path could not hand its live "
               "allocations back to the arena (%s); aborting rather than lose track of live "
               "memory\n",
               what);
  std::fflush(stderr);
  std::abort();
}

void Arena::replay_book_locked() {
  ReplayBooks& k = replay_books_;
  if (k.alloc_n == 0) return;
  const int pool = static_cast<int>(replay_pool_);
  auto book = [&](StatArray& a, std::int64_t change, std::int64_t max, std::int64_t alloc) {
    for (int at : {0, pool}) {
      Stat& s = a[at];
      s.peak = std::max(s.peak, s.current + max);
      s.current += change;
      s.allocated += alloc;
      s.freed += alloc - change;
    }
  };
  book(stats_.allocation, k.n, k.max_n, k.alloc_n);
  book(stats_.active, k.n, k.max_n, k.alloc_n);
  book(stats_.allocated_bytes, k.bytes, k.max_bytes, k.alloc_bytes);
  book(stats_.active_bytes, k.bytes, k.max_bytes, k.alloc_bytes);
  book(stats_.requested_bytes, k.req, k.max_req, k.alloc_req);
  k = ReplayBooks{};
}

void Arena::replay_disarm_locked() noexcept {
  if (!replay_armed_.load(std::memory_order_relaxed)) return;
  replay_armed_.store(false, std::memory_order_relaxed);
  replay_owner_.store(nullptr, std::memory_order_relaxed);
  if (steps_) steps_->disarm_fast();
}

void Arena::replay_leave_locked() noexcept {
  if (!replay_held_) return;
  // Another thread's operation, or one that changed what the fast path
  // relies on (the step, the layout, the territory, a miss, a capture, an
  // epoch event): the rest of the step takes the slow path.
  if (replay_owner_.load(std::memory_order_relaxed) != replay_me()) {
    replay_disarm_locked();
  } else if (!steps_->fast_valid()) {
    // The opener's own operation changed the layout or the territory: armed
    // again from the blocks as they are now, when the step still replays.
    replay_disarm_locked();
    if (steps_->fast_rearmable()) {
      try {
        replay_arm_locked();
      } catch (...) {
        // Only the tables' storage can fail (bad_alloc): stays disarmed.
      }
    }
  } else {
    steps_->fast_refresh();  // the slow path may have grown the trace's room
  }
  replay_held_ = false;
  replay_lock_.unlock();
}

void Arena::replay_arm_locked() {
  if (!steps_ || group_ || capturing_) return;  // a stats group's books must be current
  Segment* seg = steps_->arm_fast();
  if (!seg) return;
  replay_pool_ = seg->pool;
  // Under the replay lock (taken here unless the caller's guard holds it):
  // a thread that armed it before may still run a fast section, which must
  // either finish first or see the new owner (the check inside it).
  const bool take = !replay_held_;
  if (take) replay_lock_.lock();
  replay_lock_.set_owner(std::this_thread::get_id());
  replay_owner_.store(replay_me(), std::memory_order_relaxed);
  replay_armed_.store(true, std::memory_order_relaxed);
  if (take) replay_lock_.unlock();
}

void Arena::lock_for_fork() {
  mu_.lock();
  // The fast path stops (flushed) across a fork: the child has no opener.
  replay_enter_locked();
  replay_disarm_locked();
  replay_leave_locked();
  lock_fronts(fronts_);
}

void Arena::unlock_after_fork() {
  unlock_fronts(fronts_);
  mu_.unlock();
}

// ---------------------------------------------------------------------------
// stream uses
// ---------------------------------------------------------------------------

void Arena::release_blocks_locked(const std::vector<Block*>& blocks) {
  for (Block* b : blocks) {
    stats_.pending_bytes.decrease(static_cast<std::int64_t>(b->size));
    free_block_locked(b);
  }
}

void Arena::boundary_locked() {
  if (capturing_) return;
  stats_.events_recorded += static_cast<std::int64_t>(pending_.seal_all());
  territory_.adopt_pending();
  release_blocks_locked(pending_.release_completed(stats_.event_queries));
  territory_.poll_epoch();
}

bool Arena::reclaim_pending_locked(StreamId stream) {
  if (capturing_) return false;
  const std::int64_t before = stats_.pending_bytes.current;
  boundary_locked();
  if (config_.stream_policy == StreamPolicy::kWait) {
    release_blocks_locked(pending_.release_by_waiting(PoolSide::kDynamic, stream));
  }
  return stats_.pending_bytes.current < before;
}

void Arena::synchronize_pending_locked() {
  if (capturing_) return;
  if (pending_.empty()) return;
  stats_.events_recorded += static_cast<std::int64_t>(pending_.seal_all());
  ++stats_.num_sync_all_streams;
  release_blocks_locked(pending_.synchronize_all());
}

// ---------------------------------------------------------------------------
// planned territory: territory.{h,cpp}; the mechanisms it borrows
// (TerritoryHost) are these.
// ---------------------------------------------------------------------------

Segment* Arena::new_fixed_segment(StreamId stream, std::size_t bytes) {
  return new_segment_locked(PoolKind::kLarge, stream, bytes, /*exact=*/true);
}

// ---------------------------------------------------------------------------
// blocks storage and diagnostics
// ---------------------------------------------------------------------------

Block* Arena::new_block() {
  if (!spare_blocks_.empty()) {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    *b = Block{};
    return b;
  }
  block_storage_.emplace_back();
  return &block_storage_.back();
}

void Arena::recycle_block(Block* b) {
  b->uses.clear();
  spare_blocks_.push_back(b);
}

Block* Arena::live_block_locked(const void* ptr, const char* what) const {
  Block* b = live_.find(ptr);
  if (!b) {
    throw InvalidPointerError(std::string("torch_renaissance: cannot ") + what + " " +
                              describe_pointer_locked(ptr));
  }
  if (Front* f = b->front) {
    FrontGuard fg(f->lock);
    if (!b->front_live) throw freed_error(what, ptr);  // cached by a front: freed
  }
  return b;
}

std::string Arena::describe_pointer_locked(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  std::string where = hex(ptr);
  auto it = segments_.upper_bound(const_cast<char*>(p));
  if (it == segments_.begin()) {
    return where + ": the pointer was not allocated by this arena (" + device_->name() + ")";
  }
  --it;
  const Segment* seg = it->second.get();
  if (p >= seg->base + seg->capacity) {
    return where + ": the pointer was not allocated by this arena (" + device_->name() + ")";
  }
  if (p >= seg->base + seg->size) {
    return where + ": the pointer lies in unmapped address space of this arena (stale pointer)";
  }
  for (const Block* b = seg->head; b; b = b->next) {
    if (p < b->ptr || p >= b->ptr + b->size) continue;
    const std::size_t off = static_cast<std::size_t>(p - b->ptr);
    switch (b->state) {
      case BlockState::kAllocated:
        return where + ": the pointer is " + std::to_string(off) +
               " bytes into a live block of " + std::to_string(b->size) + " bytes at " +
               hex(b->ptr) + " (an interior pointer, not the start of an allocation)";
      case BlockState::kPending:
        return where + ": the block was already freed (double free; it still waits on " +
               "another stream's use)";
      case BlockState::kFree:
      case BlockState::kCached:
        return where + ": the pointer lies in free memory of this arena (double free or " +
               "stale pointer)";
    }
  }
  return where + ": the pointer is not a live allocation of this arena";
}

void Arena::check_invariants() const {
  Locked g(*this);
  check_invariants_locked();
}

void Arena::debug_check_fast_path() const noexcept {
  // TR_DEBUG=3: a front's operation is an operation too (no Op around it).
  Locked g(*this);
  debug_check_locked();
}

void Arena::debug_check_replay() noexcept {
  // TR_DEBUG=3: a fast-path operation is an operation too. The check
  // flushes (its live allocations become blocks; the fast path goes on).
  try {
    Locked g(*this);
    debug_check_locked();
  } catch (const std::exception& e) {
    debug::assertion_failed(e.what(), __FILE__, __LINE__);
  }
}

void Arena::debug_check_locked() const noexcept {
  debug::count_invariant_check();
  try {
    check_invariants_locked();
  } catch (const std::exception& e) {
    debug::assertion_failed(e.what(), __FILE__, __LINE__);
  }
}

namespace {
[[noreturn]] void invariant_failed(const std::string& m) {
  throw std::logic_error("arena invariant: " + m);
}
}  // namespace

// What check_invariants_locked counts while it walks the caches, the fronts
// and the blocks, compared with the books at the end.
struct Arena::InvariantTally {
  std::int64_t allocated = 0, allocated_n = 0, requested = 0, active = 0, active_n = 0;
  std::int64_t reserved = 0, segments = 0, inactive = 0, inactive_n = 0, pending = 0;
  std::size_t free_small = 0, free_large = 0, free_persistent = 0, live = 0;
  std::set<const Block*> cached;  // the shared free cache's blocks
  std::size_t cached_seen = 0;    // cached blocks found in segments
  // The fronts: their counters' net change to the books, and held blocks.
  std::int64_t net_n = 0, net_bytes = 0, net_req = 0;
  std::size_t held_seen = 0, held_total = 0;
};

void Arena::check_invariants_locked() const {
  InvariantTally t;
  check_cache_locked(t);
  // The fronts, all locked (free_cache.h): what each holds, and what their
  // counters add to the books (the true values are checked, without a fold).
  struct AllFronts {
    const std::vector<std::shared_ptr<Front>>& v;
    explicit AllFronts(const std::vector<std::shared_ptr<Front>>& fronts) : v(fronts) {
      lock_fronts(v);
    }
    ~AllFronts() { unlock_fronts(v); }
  } all_fronts(fronts_);
  for (const auto& f : fronts_) check_front_locked(*f, t);
  for (const auto& [base, seg] : segments_) check_segment_locked(*seg, t);
  check_totals_locked(t);
}

void Arena::check_cache_locked(InvariantTally& t) const {
  // The free cache: each block in one bin, matching its key.
  std::size_t cached_bytes = 0;
  for (const CacheBin& bin : cache_) {
    if (bin.count > kCacheDepth) invariant_failed("a cache bin overflows");
    for (std::size_t i = 0; i < bin.count; ++i) {
      const Block* b = bin.blocks[i];
      if (!t.cached.insert(b).second) invariant_failed("a block is in the free cache twice");
      if (b->state != BlockState::kCached || b->size != bin.size ||
          b->segment->stream != bin.stream ||
          expandable_class(b->segment->pool, b->segment->persistent) != bin.cls) {
        invariant_failed("a cache bin holds a block of another state, size, stream or pool");
      }
      cached_bytes += b->size;
    }
  }
  if (t.cached.size() != cache_blocks_ || cached_bytes != cache_bytes_) {
    invariant_failed("free cache totals are wrong");
  }
}

void Arena::check_front_locked(const Front& f, InvariantTally& t) const {
  t.net_n += f.acc.allocs - f.acc.frees;
  t.net_bytes += f.acc.alloc_bytes - f.acc.free_bytes;
  t.net_req += f.acc.req_alloc - f.acc.req_free;
  if (!fronts_open_.load() && (f.acc.any() || f.cached_blocks)) {
    invariant_failed("a closed front holds unfolded work");
  }
  std::size_t n = 0, bytes = 0;
  for (const Front::Bin& bin : f.bins) {
    if (bin.count > Front::kDepth) invariant_failed("a front bin overflows");
    for (std::size_t i = 0; i < bin.count; ++i) {
      const Block* b = bin.blocks[i];
      if (b->front != &f || b->front_live || f.held.find(b->ptr) != b || b->size != bin.size ||
          b->stream != bin.stream) {
        invariant_failed(
            "a front bin holds a block it does not hold cached, or of another size or stream");
      }
      ++n;
      bytes += b->size;
    }
  }
  if (n != f.cached_blocks || bytes != f.cached_bytes) invariant_failed("front cache totals are wrong");
  // The hint (Front::last_ptr) names a block held live here and a bin of
  // its key.
  if (f.last_ptr) {
    const Block* b = f.last_block;
    const std::ptrdiff_t k = f.last_bin - f.bins;
    if (!b || b->ptr != f.last_ptr || f.held.find(b->ptr) != b || b->front != &f ||
        !b->front_live || k < 0 || k >= static_cast<std::ptrdiff_t>(Front::kBins) ||
        f.last_bin->size != b->size || f.last_bin->stream != b->stream) {
      invariant_failed("a front's last hand-out hint names a block it does not hold live, or a bin of another key");
    }
  }
  // The direct map names exactly the bins of the keys it covers: each bin
  // of such a key is named, and nothing else is.
  std::size_t named = 0;
  for (std::size_t i = 0; i < Front::kBins; ++i) {
    const Front::Bin& bin = f.bins[i];
    const std::size_t c = bin.size >> f.unit_shift;
    if (bin.size == 0 || bin.stream != 0 || c >= Front::kDirect) continue;
    if (f.direct[c] != i + 1) invariant_failed("a front's direct map does not name a bin of its key");
    ++named;
  }
  const auto entries = static_cast<std::size_t>(
      std::count_if(f.direct, f.direct + Front::kDirect, [](std::uint8_t e) { return e != 0; }));
  if (entries != named) invariant_failed("a front's direct map names a bin that does not have its key");
  for (auto [ptr, b] : f.held) {
    ++t.held_total;
    const Segment* seg = b->segment;
    if (b->front != &f || b->ptr != ptr || b->state != BlockState::kAllocated ||
        live_.find(ptr) != b || seg->pool != PoolKind::kSmall || seg->persistent || b->planned ||
        seg->in_territory(b) || !b->uses.empty() || b->step != 0) {
      invariant_failed("a front holds a block that is not an allocated small-pool block linked to it");
    }
    if (b->front_live && b->front_req > b->requested) {
      invariant_failed("a front served more than a block's booked size");
    }
    if (b->front_live && b->front_req != b->requested &&
        std::find(f.dirty, f.dirty + f.dirty_count, b) == f.dirty + f.dirty_count) {
      invariant_failed("a block served below its booked size is not on its front's dirty list");
    }
  }
}

void Arena::check_segment_locked(const Segment& seg, InvariantTally& t) const {
  if (seg.size == 0) {
    if (seg.head) invariant_failed("an empty segment has blocks");
    return;
  }
  t.reserved += static_cast<std::int64_t>(seg.mapped_bytes);
  ++t.segments;
  if (seg.expandable) {
    check_granules_locked(seg);
  } else if (seg.mapped_bytes != seg.size) {
    invariant_failed("a fixed segment is not wholly mapped");
  }
  const char* expect = seg.base;
  std::size_t seg_live = 0, plan_free = 0;
  const Block* prev = nullptr;
  for (const Block* b = seg.head; b; prev = b, b = b->next) {
    if (b->ptr != expect) invariant_failed("blocks do not tile their segment");
    if (b->prev != prev || b->segment != &seg) invariant_failed("broken block links");
    if (b->size == 0 || b->size % unit_ || reinterpret_cast<std::uintptr_t>(b->ptr) % unit_) {
      invariant_failed("unaligned block");
    }
    const char* line = seg.base + seg.plan_top;
    if (seg.plan_top && b->ptr < line && line < b->ptr + b->size) {
      invariant_failed("a block straddles the territory line");
    }
    expect = b->ptr + b->size;
    if (b->state == BlockState::kFree) {
      check_free_block_locked(seg, b, prev, t);
      plan_free += seg.in_territory(b) ? 1 : 0;
    } else {
      ++seg_live;
      check_used_block_locked(seg, b, t);
    }
  }
  if (expect != seg.base + seg.size) invariant_failed("blocks do not cover their segment");
  if (seg.tail != prev) invariant_failed("segment tail is wrong");
  if (seg_live != seg.live) invariant_failed("segment live count is wrong");
  if (plan_free != seg.plan_free.size()) invariant_failed("stale entries in a territory index");
  if (!seg.plan_free.check()) invariant_failed("a territory index is inconsistent");
}

void Arena::check_granules_locked(const Segment& seg) const {
  const std::size_t gran = device_->range_granularity();
  if (seg.size % gran || seg.mapped.size() != seg.size / gran) {
    invariant_failed("granule map has the wrong length");
  }
  const auto n = static_cast<std::size_t>(std::count(seg.mapped.begin(), seg.mapped.end(), true));
  if (n * gran != seg.mapped_bytes) invariant_failed("mapped_bytes disagrees with the granule map");
  for (const Block* b = seg.head; b; b = b->next) {
    if (b->state == BlockState::kFree && !seg.in_territory(b)) continue;
    const auto off = static_cast<std::size_t>(b->ptr - seg.base);
    for (std::size_t i = off / gran; i <= (off + b->size - 1) / gran; ++i) {
      if (!seg.mapped[i]) invariant_failed("a block in use or in planned territory is not mapped");
    }
  }
}

void Arena::check_free_block_locked(const Segment& seg, const Block* b, const Block* prev,
                                    InvariantTally& t) const {
  if (prev && prev->state == BlockState::kFree && seg.in_territory(prev) == seg.in_territory(b)) {
    invariant_failed("two free neighbours were not merged");
  }
  if (seg.in_territory(b)) {
    if (seg.plan_free.find(b->ptr) != b) invariant_failed("territory free block not indexed");
  } else {
    const FreeSet& s = free_set(&seg);
    if (!s.count(const_cast<Block*>(b))) invariant_failed("free block not in the best-fit index");
    (seg.persistent ? t.free_persistent : seg.pool == PoolKind::kSmall ? t.free_small : t.free_large)++;
  }
  if (b->prev || b->next) {
    t.inactive += static_cast<std::int64_t>(b->size);
    ++t.inactive_n;
  }
}

void Arena::check_used_block_locked(const Segment& seg, const Block* b, InvariantTally& t) const {
  const auto size = static_cast<std::int64_t>(b->size);
  if (b->state == BlockState::kCached) {
    ++t.cached_seen;
    t.inactive += size;
    ++t.inactive_n;
    if (!t.cached.count(b)) invariant_failed("a cached block is in no cache bin");
    if (b->planned || seg.in_territory(b) || !b->uses.empty()) {
      invariant_failed("a planned, territory or stream-used block is in the free cache");
    }
    return;
  }
  t.active += size;
  ++t.active_n;
  if (b->state != BlockState::kAllocated) {
    t.pending += size;
    if (b->pending_on <= 0) invariant_failed("pending block waits on nothing");
    return;
  }
  ++t.live;
  if (live_.find(b->ptr) != b) invariant_failed("allocated block missing from the live map");
  if (b->front) ++t.held_seen;
  if (b->front && !b->front_live) {
    // Cached by a front: its true state is freed.
    t.active -= size;
    --t.active_n;
    return;
  }
  t.allocated += size;
  ++t.allocated_n;
  // Live through a front: its caller's size; otherwise the booked one.
  t.requested += static_cast<std::int64_t>(b->front ? b->front_req : b->requested);
}

void Arena::check_totals_locked(const InvariantTally& t) const {
  if (t.free_small != small_free_.size() || t.free_large != large_free_.size() ||
      t.free_persistent != persistent_free_.size()) {
    invariant_failed("stale entries in the best-fit index");
  }
  if (t.live != live_.size()) invariant_failed("live map has entries without blocks");
  if (t.cached_seen != t.cached.size()) invariant_failed("a cache bin holds a block of no segment");
  if (t.held_seen != t.held_total) invariant_failed("a front holds a block of no segment");
  const auto& s = stats_;
  if (s.allocated_bytes[0].current + t.net_bytes != t.allocated) {
    invariant_failed("allocated_bytes disagrees with the blocks");
  }
  if (s.allocation[0].current + t.net_n != t.allocated_n) {
    invariant_failed("allocation count disagrees with the blocks");
  }
  if (s.requested_bytes[0].current + t.net_req != t.requested) {
    invariant_failed("requested_bytes disagrees with the blocks");
  }
  if (s.active_bytes[0].current + t.net_bytes != t.active ||
      s.active[0].current + t.net_n != t.active_n) {
    invariant_failed("active disagrees with the blocks");
  }
  if (s.reserved_bytes[0].current != t.reserved) invariant_failed("reserved_bytes disagrees with the segments");
  if (s.segment[0].current != t.segments) invariant_failed("segment count disagrees");
  if (s.inactive_split_bytes[0].current != t.inactive || s.inactive_split[0].current != t.inactive_n) {
    invariant_failed("inactive_split disagrees with the blocks");
  }
  if (s.pending_bytes.current != t.pending) invariant_failed("pending_bytes disagrees with the blocks");
  for (auto m : detail::kStatArrays) {
    const StatArray& a = s.*m;
    if (a[0].current != a[1].current + a[2].current) invariant_failed("pool stats do not add up");
  }
  if (s.stat_underflows) invariant_failed("a stat went negative");
}

}  // namespace renaissance
