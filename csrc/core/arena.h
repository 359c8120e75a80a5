// arena.h - the arena of one device: its segments, the dynamic pool that
// hands out blocks for unplanned requests, planned territory for replayed
// steps, stream-use handling and statistics. All public calls are thread
// safe (one mutex per arena).
//
// Invariants (tests check each):
//   * Two live blocks never overlap; every pointer is aligned to the
//     device's alignment (512 B for device memory, 64 B for host memory) and
//     every block size is a multiple of it.
//   * A block used on another stream is never handed out again before that
//     stream's work on it is complete, or before the allocating stream has
//     been made to wait for it (policy `wait`).
//   * Stats equal what the blocks say: allocated_bytes is the sum of live
//     block sizes, reserved_bytes the sum of mapped segment bytes, and so on
//     (see stats.h for PyTorch's meanings).
//   * Bad input never corrupts the arena: a size of 0 returns nullptr and
//     changes nothing; an impossible size raises OutOfMemoryError; freeing a
//     pointer that is not a live allocation raises InvalidPointerError and
//     changes nothing.
//
// Pools follow PyTorch's caching allocator: requests up to 1 MiB go to the
// small pool, larger ones to the large pool, so small blocks never split
// large segments. Where the backend supports address ranges, each pool of
// each stream is ONE expandable segment that grows and shrinks in the
// backend's granules (PyTorch's expandable_segments), plus one persistent
// segment per stream for what optimizers create while a step is recorded;
// otherwise segments are 2 MiB (small pool), 20 MiB (large requests below
// 10 MiB) or the request rounded up to 2 MiB, and never smaller than the
// request.
//
// Releasing memory (empty_cache, the out-of-memory ladder) unmaps every
// granule that lies wholly inside a free block of the dynamic pool, interior
// holes included, not only a segment's free tail (PyTorch's release_blocks /
// unmapBlock). An allocation that lands on unmapped granules maps them.
//
// Under a limit, a growth (or a mapping of holes) that would raise the
// reserved peak while the pool caches free granules unmaps those first.
// Fixed segments under a limit: a new segment that would raise the peak
// gives back wholly free segments first, and a wholly free segment larger
// than large_segment is not split for a request of less than half of it
// (PyTorch's max_split_size_mb, applied automatically; issue 11 item 2).
//
// Planned territory (territory.h): the Territory member owns each
// stream's territory and its epoch events; the arena lends it its block and
// segment mechanisms (TerritoryHost, implemented privately below) and asks
// it whether a segment is territory. The step planner (step_planner.h)
// reaches the arena only through a Territory& and a StepArenaView; no core
// class is a friend of the Arena. Everything runs under mu_.
//
// Out of memory: one ladder per failed request, in allocate() (PyTorch's
// malloc): the cheap attempt (try_allocate: free lists, completed stream
// work, growth within the limit); then host-synchronize pending stream uses
// and search again; then the free-memory hook (outside the lock); then
// release the planned territory and every cached granule and retry once
// (num_alloc_retries += 1); then the last-resort hook; then raise
// OutOfMemoryError (num_ooms += 1).
//
// Free cache (issue 14): a block freed outside a step, with no stream use,
// in the dynamic pool (not planned, not in territory) and at most
// kCacheMaxBlock bytes goes into a small per-(stream, size, pool) bin
// instead of being merged and re-indexed; an allocation of that stream, size
// and pool takes it back in O(1), with no tree or hash-node allocation. A
// cached block stays split from its neighbours and counts as in use for every
// walk over blocks, so nothing else can hand it out. It is accounted as freed
// (allocation, allocated, requested and active bytes and their peaks fall
// and rise exactly as without the cache) and counts as an inactive split
// block of its own until it is merged. The cache is flushed (its blocks
// freed and merged for real) before a growth of its stream and pool, at
// every step boundary, when a capture starts, before a plan is installed, at
// the start of every release (empty_cache, the out-of-memory ladder) and by
// stats(), snapshot() and largest_free_block(), so reserved memory, plans,
// snapshots, every current stat and the fit guarantee below see the same
// free space as without it (only inactive_split's peak may differ).
//
// Per-thread front (issue 14; free_cache.h, docs/design.md): in front of
// all of the above, each thread that uses an arena without a stats group has
// a front of its own, reached without the arena's lock. A block of the small
// pool that a thread was given outside a step (no stream use, not planned,
// not in territory) is *held* by that thread's front: the front finds it by
// address when the thread frees it, and keeps it in a per-(stream, size) bin
// to hand out again, all under the front's own lock. Held blocks stay
// allocated in the arena's books (state, live map, every stat); what the
// front served since the last *fold* is in its counters, and a fold adds
// those to the books and gives the cached blocks back (merged). Folds: every
// flush of the free cache (so every point listed above), stats(),
// reset_peak_stats(), reset_accumulated_stats(), a step boundary or capture
// (the fronts are closed inside steps and captures), thread exit (the
// thread's front is given back), and any allocation that would raise a
// current value of the books above its peak: the books are never below the
// true values and a front never serves a request larger than the block's
// booked size, so the true values never pass a peak unseen and peaks stay
// exact. A block freed by another thread goes back to its holder's front.
//
// Fit guarantee (expandable segments, tested with hypothesis): after the
// ladder's release, the arena's reserved bytes are the granules its live and
// pending blocks touch (their footprint) plus what the small pool keeps, so
// a request succeeds whenever round_up(size, granule) <= limit - footprint.
// Fixed segments cannot return part of a segment (cudaMalloc memory), so
// there the bound is PyTorch's: limit - the bytes of segments holding a live
// block.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/block.h"
#include "core/config.h"
#include "core/debug.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/free_cache.h"
#include "core/live_map.h"
#include "core/lock_order.h"
#include "core/planner.h"
#include "core/stats.h"
#include "core/stream_events.h"
#include "core/territory.h"

namespace renaissance {

// StreamPolicy and ArenaConfig (with the table of its keys) live in config.h.

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  BlockState state = BlockState::kFree;
  bool planned = false;
  bool in_territory = false;
  StreamId stream = 0;
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;  // reserved (mapped) bytes; blocks may tile more (holes)
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  std::size_t plan_top = 0;
  StreamId stream = 0;
  bool is_large = true;
  bool expandable = false;
  bool persistent = false;  // the persistent segment of recorded optimizer steps
  std::vector<BlockInfo> blocks;
};

// Counters and gauges of the planned-step machinery ("renaissance.*").
struct PlanStats {
  std::int64_t steps = 0;           // step boundaries seen
  std::int64_t planned_steps = 0;   // steps that replayed a plan
  // Named as their stats keys (renaissance.planned_*), in every layer.
  std::int64_t planned_requests = 0;   // allocations of planned steps while they replayed
  // Allocations of planned steps after their replay stopped (a miss, the
  // conflict limit): the dynamic pool served them. With planned_requests,
  // every allocation of the planned steps' own threads.
  std::int64_t planned_unserved = 0;
  std::int64_t planned_hits = 0;       // served where the plan said
  std::int64_t planned_misses = 0;     // did not match the trace (size, stream, count)
  std::int64_t planned_conflicts = 0;  // matched, but the range was still live
  std::int64_t planned_fast_hits = 0;  // of the hits, those served without the arena's lock
  // Of the hits, those served at a later position of the plan than the
  // request's own (concurrent threads' requests in another order than recorded).
  std::int64_t planned_reordered = 0;
  // Of the hits, those placed by a plan made during a step that outgrew its
  // layout (a longer sequence than every planned one; StepPlanner::grow_plan).
  std::int64_t planned_grown = 0;
  std::int64_t plans = 0;           // plans computed
  // Structures whose replays kept leaving their layout (sizes that change
  // every step: data-dependent MoE routing) and that are served by the
  // dynamic pool instead: how many times that happened, and how many are
  // so now (StepPlanner::kGiveUpMisses).
  std::int64_t give_ups = 0;
  std::int64_t given_up = 0;
  std::int64_t variants = 0;        // variants kept now
  std::int64_t layouts = 0;         // layouts (structures) kept now
  std::int64_t plan_bytes = 0;      // planned territory of the current layout
  std::int64_t load_bytes = 0;      // step LOAD + bytes live outside the step at plan time
  std::int64_t largest_load_bytes = 0;  // the largest load_bytes over every layout kept (all keys)
  std::int64_t step_load_bytes = 0; // LOAD of the step's planned buffers alone (largest over the layout's variants)
  std::int64_t layout_load_bytes = 0;  // LOAD of the layout's merged problem (max sizes over its variants)
  std::int64_t pinned_bytes = 0;  // live-outs of the recorded step pinned where they stood (alternating layouts)
  std::int64_t plan_bound_bytes = 0;  // the planner's lower bound for the current layout's problem (obstacles included)
  std::int64_t phases = 0;  // of the current layout: 1, or 2 (alternating: live-outs that overlap their next instance)
  std::int64_t greedy_bytes = 0;    // greedy-by-size size for the same problem
  std::int64_t obstacle_bytes = 0;  // live bytes under plan_bytes the plan had to avoid
  std::int64_t last_step_allocations = 0;
  std::int64_t last_step_hits = 0;
  std::int64_t last_step_same_address = 0;  // same address as in the previous step
  std::int64_t last_step_comparable = 0;    // allocations that had a previous-step peer
  // The same two summed over the replayed steps whose reference step was
  // replayed too (run --report's address stability over its steady steps:
  // the difference of two readings).
  std::int64_t same_address = 0;
  std::int64_t comparable = 0;
  double plan_seconds = 0.0;        // time spent in the planner, total
};

// One allocation of the last completed step (for exports and tests): the
// C++ side of Python's torch_renaissance.trace.TraceEntry (same fields;
// Arena.last_step()["entries"] are its dicts).
struct TraceEntry {
  std::size_t size = 0;       // bytes (rounded)
  StreamId stream = 0;
  std::int64_t alloc_time = 0;
  std::int64_t free_time = -1;  // -1: still live when the step ended
  std::uintptr_t address = 0;
  // The other streams that used it (record_stream, a hand-off) are kept
  // beside the entries, in its StepRecord's `stream_uses[uses - 1]`
  // (StepRecord::streams_used); 0: none. Few entries have any, and an entry
  // of plain words is made, copied and dropped without touching the heap
  // (a replayed step makes one per allocation at its end).
  std::uint32_t uses = 0;
  bool other_streams() const { return uses != 0; }
};

struct StepRecord {
  std::uint64_t step = 0;
  std::int64_t end_time = 0;
  std::vector<TraceEntry> entries;
  // Lists of the other streams that used an entry (TraceEntry::uses).
  std::vector<std::vector<StreamId>> stream_uses;
  // The other streams that used `e`, one of `entries` (empty: none).
  const std::vector<StreamId>& streams_used(const TraceEntry& e) const {
    static const std::vector<StreamId> kNone;
    return e.uses == 0 ? kNone : stream_uses[e.uses - 1];
  }
};

// The old name of TraceEntry, kept for one release.
using TraceRecord = TraceEntry;

class StepPlanner;
struct StepPlanJob;

// What the out-of-memory ladder may call, outside the arena lock (the CUDA
// glue fills it). Either may be empty.
struct OomHooks {
  // Frees memory elsewhere (unused graph pools; PyTorch's
  // trigger_free_memory_callbacks). True: something was freed, search again.
  std::function<bool()> free_memory;
  // Serves the request from elsewhere just before the error is raised
  // (MemPool(use_on_oom=True) pools), or returns nullptr.
  std::function<void*()> last_resort;
};

// Which free set (and which expandable segment of a stream) a segment's
// blocks belong to: the small pool, the large pool, or the persistent
// segment of recorded optimizer steps. Keys expandable_ and the free cache.
enum class SegmentClass : std::uint8_t { kSmall, kLarge, kPersistent };

class Arena : private TerritoryHost {
 public:
  // `group`: the stats group of the device's arenas (see StatsGroup), or
  // null for an arena whose stats are its own.
  Arena(std::shared_ptr<Device> device, ArenaConfig config,
        std::shared_ptr<StatsGroup> group = nullptr);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Returns nullptr for size 0. Runs the out-of-memory ladder (see the top
  // of this file) at most once, then raises OutOfMemoryError. A stream id
  // the device does not have raises std::invalid_argument (this and the
  // two below; nothing changes).
  void* allocate(std::size_t size, StreamId stream = 0);
  void* allocate(std::size_t size, StreamId stream, const OomHooks& hooks);
  // The cheap attempt only: free lists, completed stream work and growth
  // within the limit; no host synchronization, no release, no retry counted.
  // nullptr where that does not serve the request (and for size 0).
  void* try_allocate(std::size_t size, StreamId stream = 0);
  // Only from a cached free block of `stream` (best fit): no growth, no
  // memory given back, no waiting on pending uses. For lending a pool's
  // free memory (MemPool(use_on_oom=True)) without changing what the pool
  // has mapped: memory a CUDA graph's replays may write. nullptr when no
  // free block fits (counts nothing).
  void* allocate_cached(std::size_t size, StreamId stream = 0);
  // nullptr is a no-op. Raises InvalidPointerError (arena unchanged).
  void deallocate(void* ptr);
  // Adds a stream use: the block will not be reused before `stream`'s work
  // enqueued before its free is done. A no-op for the allocating stream and
  // for nullptr. Raises InvalidPointerError for a pointer that is not live.
  void record_stream(void* ptr, StreamId stream);
  // Changes the limit on reserved bytes (0: none) for the growth that
  // follows; what is reserved already stays (PyTorch's
  // set_per_process_memory_fraction acts the same way). In a stats group
  // the limit counts what all arenas of the group reserve.
  void set_max_reserved_bytes(std::size_t bytes);
  // Returns wholly free segments and every free granule of expandable
  // segments (interior holes and tails, outside planned territory) to the
  // device, after synchronizing pending stream uses.
  void empty_cache();
  // A boundary for stream uses: one event per (region, stream) group.
  void sync_point();
  // Hint that the allocations that follow are likely to outlive the step
  // (an optimizer step creating its state). While a step is being recorded,
  // such allocations go to a segment of their own, so the blocks that
  // persist are packed together instead of scattered where the plan of the
  // next steps has to go around them. Ignored while a plan replays. Turning
  // the hint off after such allocations gives back the free granules of the
  // persistent segment (what the hinted phase freed: its temporaries).
  void set_persistent_hint(bool on);

  // Planned steps: mark the start and the end of a step.
  // `key` names the kind of step (e.g. an architecture's forward, a
  // training step): layouts and variants are only matched within one key.
  void begin_step(std::uint64_t key = 0);
  void end_step();
  // The same for callers that must pair them (the Python-facing Arena):
  // with planning on, begin_step_checked while a step is open and
  // end_step_checked with none open raise std::logic_error before anything
  // changes (begin_step would end the open step, end_step would only be a
  // sync point). With planning off there is no step to lose: begin is a
  // no-op and end a sync point, as above.
  void begin_step_checked(std::uint64_t key = 0);
  void end_step_checked();
  bool in_step() const;

  DeviceStats stats() const;
  PlanStats plan_stats() const;
  // The trace of the last completed step (empty when none or planning is off).
  StepRecord last_step() const;
  // The most recent plan's input and output (empty before the first plan).
  std::pair<planner::Problem, std::vector<std::uint64_t>> last_plan() const;
  // What stopped the search of last_plan() (StepPlanner::last_stopped_by()).
  std::string last_plan_stopped_by() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  std::vector<SegmentInfo> snapshot() const;
  // The largest free block of the dynamic pool (PyTorch's cacheInfo).
  std::size_t largest_free_block() const;
  // Size in bytes of the live block at ptr (raises InvalidPointerError).
  std::size_t block_size(void* ptr) const;
  // Throws std::logic_error describing the first broken invariant; for tests.
  void check_invariants() const;
  // Frees the blocks of the free cache for real (merged and indexed). Stats
  // do not change (cached blocks are accounted as freed already).
  void flush_cache();
  // What the free cache holds now.
  struct CacheInfo {
    std::size_t bytes = 0;
    std::size_t blocks = 0;
  };
  CacheInfo cache_info() const;

  // fork() safety (pthread_atfork): hold the lock (and every front's) across
  // the fork so the child never inherits one held by a thread that does not
  // exist there.
  void lock_for_fork();
  void unlock_after_fork();
  // For free_cache.cpp: a thread that exits gives its front back (folded;
  // its cached blocks freed, its live blocks no longer held).
  void retire_front(Front& f);
  // Fronts this arena has (one per thread that used it), for tests.
  std::size_t front_count() const;
  // Turns the per-thread fronts on (the default where the arena has no
  // stats group) or off (folded first); for benchmarks and tests that
  // compare the two. A no-op for an arena in a stats group.
  void set_fronts(bool on);
  // Capture mode (a CUDA graph capture or another private-pool window is
  // open on the device): while on, the arena records, queries, waits on and
  // synchronizes no event and gives no memory back to the device (no event
  // call or free is legal during a capture). Blocks freed with stream uses
  // stay pending until capture mode ends; empty_cache() and the
  // out-of-memory retry release nothing. Off by default.
  void set_capturing(bool capturing);

  Device& device() { return *device_; }
  std::size_t rounding() const { return unit_; }

 private:
  class Op;
  // The arena's lock for a call that reads or changes blocks or stats but
  // publishes nothing (Op does both): takes mu_, then the replay lock and
  // flushes the replay fast path (replay_enter_locked); releases them in the
  // other order (replay_leave_locked). Every holder of mu_ takes one of the
  // two, so nothing looks at blocks or stats while the fast path has
  // allocations the blocks do not show.
  class Locked;
  // Runs a plan that end_step() prepared under the lock, without the lock,
  // and installs it under the lock.
  void finish_plan(std::unique_ptr<StepPlanJob> job);
  void end_step(bool checked);  // checked: raise (unchanged) when no step is open
  void publish_locked() noexcept;
  void check_invariants_locked() const;
  // Its parts (arena.cpp): each checks one structure and adds what it
  // counts to the tally; check_totals_locked compares the tally with the books.
  struct InvariantTally;
  void check_cache_locked(InvariantTally& t) const;
  void check_front_locked(const Front& f, InvariantTally& t) const;
  void check_segment_locked(const Segment& seg, InvariantTally& t) const;
  void check_granules_locked(const Segment& seg) const;
  void check_free_block_locked(const Segment& seg, const Block* b, const Block* prev,
                               InvariantTally& t) const;
  void check_used_block_locked(const Segment& seg, const Block* b, InvariantTally& t) const;
  void check_totals_locked(const InvariantTally& t) const;
  // TR_DEBUG=3: check_invariants_locked() after every Op; aborts on failure.
  void debug_check_locked() const noexcept;
  void debug_check_fast_path() const noexcept;  // the same after a front's operation
  void debug_check_replay() noexcept;  // the same after a replay fast-path operation (flushes)

  // --- planned replay's fast path (step_planner.h: "the fast path") ------
  // The step's opener serves its planned allocations and frees them without
  // mu_, inside the replay lock's fast section (an asymmetric Dekker pair,
  // FrontLock). nullptr / false: take the slow path.
  inline void* replay_allocate(std::size_t size, StreamId stream) noexcept;
  // allocate()'s and try_allocate()'s first attempt: the fast path when it
  // is armed (with TR_DEBUG=3's check after it); nullptr: go on.
  inline void* replay_try_allocate(std::size_t size, StreamId stream) noexcept;
  inline bool replay_deallocate(void* ptr) noexcept;
  // allocate(size, stream) and deallocate(ptr) after planned replay's
  // attempt (the fronts' direct fast path), then the fronts' general path
  // and the locked path, then the locked path alone: each out of line, so
  // that no fast path pays for the registers a slower one saves.
  void* allocate_unplanned(std::size_t size, StreamId stream);
  void* allocate_front_or_locked(std::size_t size, StreamId stream);
  void deallocate_unplanned(void* ptr);
  void deallocate_front_or_locked(void* ptr);
  void deallocate_locked_path(void* ptr);
  // With mu_ held: takes the replay lock when armed and flushes (the fast
  // path's live allocations become territory blocks); leave disarms unless
  // the fast path may go on (the opener's own operation, same step and
  // layout, no deviation), then releases the replay lock.
  void replay_enter_locked();
  // The flush failed (host out of memory part-way): prints why and aborts.
  [[noreturn]] static void flush_failed(const char* what) noexcept;
  void replay_leave_locked() noexcept;
  void replay_disarm_locked() noexcept;
  // After StepPlanner::begin_step: arms the fast path for the calling thread.
  void replay_arm_locked();
  // A per-thread address: who runs the fast path.
  static const void* replay_me() noexcept;

  // The cheap attempt (planned placement, free lists, growth); nullptr when
  // it does not serve the request.
  void* allocate_locked(std::size_t size, StreamId stream);
  // Why no device could ever serve `size` bytes, or nullptr.
  const char* impossible(std::size_t size) const;
  // Raises std::invalid_argument (arena unchanged) for a stream id the
  // device does not have.
  void check_stream(StreamId stream) const;

  // --- dynamic pool --------------------------------------------------------
  PoolKind pool_for(std::size_t rounded) const;
  Block* allocate_dynamic_locked(std::size_t requested, std::size_t rounded,
                                 StreamId stream);  // nullptr: out of memory
  // Best fit whose first `rounded` bytes are mapped or can be (within the
  // limit); returned unindexed.
  // may_map false: only blocks whose first `rounded` bytes are mapped, and
  // nothing is mapped or unmapped.
  Block* find_free_locked(FreeSet& set, StreamId stream, std::size_t rounded,
                          bool may_map = true);
  Block* take_locked(Block* b, std::size_t rounded);  // b is free and unindexed
  // A new free block of at least `rounded` mapped bytes, unindexed; nullptr
  // where the limit or the device refuses.
  Block* grow_locked(PoolKind pool, StreamId stream, std::size_t rounded, bool persistent);
  Block* grow_expandable_locked(PoolKind pool, StreamId stream, std::size_t rounded, bool persistent);
  // exact: `rounded` in round_large steps, not the pool's segment sizes.
  Segment* new_segment_locked(PoolKind pool, StreamId stream, std::size_t rounded,
                              bool exact = false);
  // Under a limit: gives back wholly free fixed segments (largest first)
  // while a new segment of `bytes` would raise the reserved peak.
  void release_free_segments_for_locked(std::size_t bytes);
  // Under a limit: b (free) is a wholly free fixed segment too large to be
  // split for `rounded` (PyTorch's max_split_size_mb, automatic).
  bool oversize_split_locked(const Block* b, std::size_t rounded) const;
  Segment* expandable_segment_locked(StreamId stream, PoolKind pool, bool persistent = false);
  FreeSet& free_set(PoolKind pool, bool persistent);
  const FreeSet& free_set(const Segment* seg) const;
  bool map_tail_locked(Segment* seg, std::size_t bytes);
  // Reserved bytes that max_reserved_bytes limits: the whole device's (every
  // arena of the stats group, as PyTorch's memory fraction counts) or this
  // arena's when it has no group.
  std::size_t limit_reserved_locked() const;
  bool over_limit_locked(std::size_t bytes) const;  // growth by `bytes` passes max_reserved_bytes
  // Mapping of expandable segments, by offsets from seg->base.
  std::size_t unmapped_bytes_locked(const Segment* seg, std::size_t begin, std::size_t end) const;
  // Maps every unmapped granule [begin, end) touches (end <= seg->size).
  // false: the limit or the device refused, and nothing changed.
  bool map_range_locked(Segment* seg, std::size_t begin, std::size_t end);
  // Unmaps the mapped granules of [first, last) granule indexes.
  std::size_t unmap_granules_locked(Segment* seg, std::size_t first, std::size_t last);
  // Unmaps every granule lying wholly inside a free dynamic-pool block, but
  // those touching [keep_lo, keep_hi), and lowers the segment's end to its
  // last block in use (or keep_hi). Returns bytes.
  std::size_t release_free_granules_locked(Segment* seg, std::size_t keep_lo = 0,
                                           std::size_t keep_hi = 0);
  // Whether mapping `bytes` more would raise the reserved peak while the
  // pool caches free granules: then they are released first.
  bool recycle_first_locked(PoolKind pool, std::size_t bytes) const;
  // Maps [0, top) of `seg` for planned territory. false: refused.
  bool map_territory_locked(Segment* seg, std::size_t top);
  void release_segment_locked(Segment* seg);
  std::size_t release_cached_locked();
  [[noreturn]] void raise_oom_locked(std::size_t requested, const char* why);

  // --- free cache (see the top of this file) ------------------------------
  static constexpr std::size_t kCacheBins = 32;    // bins, probed linearly (cache_bin_home)
  static constexpr std::size_t kCacheDepth = 8;    // blocks per bin
  static constexpr std::size_t kCacheProbes = 4;   // bins looked at per request
  static constexpr std::size_t kCacheMaxBlock = std::size_t(1) << 20;  // bytes
  static constexpr std::size_t kCacheMaxBytes = std::size_t(16) << 20;  // in all bins
  struct CacheBin {
    std::size_t size = 0;  // rounded bytes of its blocks
    StreamId stream = 0;
    SegmentClass cls = SegmentClass::kSmall;  // of their segments
    std::size_t count = 0;
    Block* blocks[kCacheDepth] = {};
  };
  // Whether a dynamic request may be served from / a freed block may enter
  // the cache now (no step open, no capture).
  bool cache_open_locked() const;
  // A cached block for a dynamic request (marked allocated), or nullptr.
  Block* take_cached_locked(std::size_t requested, std::size_t rounded, StreamId stream);
  // Puts a freed block (stats already reduced for allocation, allocated and
  // requested) into the cache; false where it may not go there.
  bool cache_block_locked(Block* b);
  void flush_cache_locked();
  // Only the bins of `stream` and free-set class `cls` (expandable_class):
  // the blocks that could merge into a fit for a request there. True when
  // it flushed any.
  bool flush_cache_locked(StreamId stream, SegmentClass cls);
  void flush_bin_locked(CacheBin& bin);
  // For stats(), snapshot() and largest_free_block(): they report free
  // memory merged.
  void flush_cache_for_read_locked() const;
  void count_cached_locked(const Block* b, int sign);  // inactive_split of a cached block
  static std::size_t cache_bin_home(std::size_t rounded, StreamId stream) {
    // Fibonacci hashing of the size (its low 6 bits are zero) and stream.
    const std::uint64_t x = (static_cast<std::uint64_t>(rounded) >> 6) + 0x9E3779B9ull * stream;
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 59);  // kCacheBins == 32
  }

  // --- per-thread front (free_cache.h; see the top of this file) ---------
  // The fast paths: no arena lock. nullptr / false: take the slow path.
  // The general ones (any key, any block of the bin that may serve):
  void* front_allocate(std::size_t size, StreamId stream) noexcept;
  bool front_deallocate(void* ptr) noexcept;
  // Their common case, inline into allocate_unplanned / deallocate_unplanned
  // with the thread's last front (arena.cpp); nullptr / false: nothing
  // changed, take the general ones.
  inline void* front_allocate_direct(Front& f, std::size_t size, StreamId stream) noexcept;
  inline bool front_deallocate_direct(Front& f, void* ptr) noexcept;
  // The changes of a block handed out of / put into a bin (f's fast section
  // or lock held).
  static inline void front_hand_out(Front& f, Front::Bin& bin, Block* b, std::size_t size) noexcept;
  static inline void front_push(Front& f, Front::Bin& bin, Block* b) noexcept;
  // The calling thread's front, made on first use; nullptr when fronts are
  // off or the thread is exiting.
  Front* my_front_locked();
  bool front_eligible_locked(const Block* b) const;
  // After a slow allocation / at a slow free (f locked by the caller).
  void front_hold_live_locked(Front& f, Block* b, std::size_t requested);
  bool front_hold_freed_locked(Front& f, Block* b);
  // Puts a live block held by f into one of its bins (f locked).
  static bool front_cache(Front& f, Block* b) noexcept;
  // f no longer holds live block b; b's booked requested becomes its caller's.
  static void front_drop_locked(Front& f, Block* b);
  // Adds f's counters to the books, books its live blocks' sizes and frees
  // its cached blocks (f locked); with `release`, f then holds nothing.
  // True when it freed any block.
  bool fold_front_locked(Front& f, bool release);
  bool fold_fronts_locked(bool release);  // every front; true when any block was freed
  // Opens the fronts outside steps and captures; closing folds them.
  void update_fronts_open_locked();
  // Whether booking a block of `size` bytes (`requested` asked) would raise
  // a current value of the books above its peak while fronts may hold slack.
  bool would_pass_peak_locked(std::size_t size, std::size_t requested, PoolKind pool) const;

  // --- free blocks ---------------------------------------------------------
  void index_free_locked(Block* b);    // insert into the right free index
  void unindex_free_locked(Block* b);  // remove from its free index
  void count_inactive_locked(const Block* b, int sign);
  void free_block_locked(Block* b);    // allocated/pending -> free, coalesced
  void merge_free_locked(Block* b);    // b becomes free: coalesced, indexed
  void mark_allocated_locked(Block* b, std::size_t requested, StreamId stream);
  Block* split_locked(Block* b, std::size_t first);  // returns the tail
  void absorb_next_locked(Block* a);  // a takes over a->next (free, unindexed)

  // --- stream uses ---------------------------------------------------------
  void boundary_locked();  // seal groups, release what completed
  bool reclaim_pending_locked(StreamId stream);  // for an allocation that found nothing
  void synchronize_pending_locked();
  void release_blocks_locked(const std::vector<Block*>& blocks);

  // --- planned territory (territory.h) -----------------------------------
  // The arena's mechanisms the Territory borrows (TerritoryHost), with the
  // arena's lock held.
  void unindex_free(Block* b) override { unindex_free_locked(b); }
  void index_free(Block* b) override { index_free_locked(b); }
  void count_inactive(const Block* b, int sign) override { count_inactive_locked(b, sign); }
  Block* split(Block* b, std::size_t first) override { return split_locked(b, first); }
  void absorb_next(Block* a) override { absorb_next_locked(a); }
  void mark_allocated(Block* b, std::size_t requested, StreamId stream) override {
    mark_allocated_locked(b, requested, stream);
  }
  void release_blocks(const std::vector<Block*>& blocks) override { release_blocks_locked(blocks); }
  bool use_ranges() const override { return config_.expandable_segments && ranges_ok_; }
  Segment* expandable_large(StreamId stream) override {
    return expandable_segment_locked(stream, PoolKind::kLarge);
  }
  Segment* new_fixed_segment(StreamId stream, std::size_t bytes) override;
  void release_segment(Segment* seg) override { release_segment_locked(seg); }
  bool map_tail(Segment* seg, std::size_t bytes) override { return map_tail_locked(seg, bytes); }
  bool map_territory(Segment* seg, std::size_t top) override { return map_territory_locked(seg, top); }
  bool capturing() const override { return capturing_; }

  // --- blocks storage ------------------------------------------------------
  Block* new_block();
  void recycle_block(Block* b);
  std::string describe_pointer_locked(const void* ptr) const;
  Block* live_block_locked(const void* ptr, const char* what) const;

  // Its lock level (core/lock_order.h) is checked by Op, the lock of every
  // call that changes the arena (the others call nothing under it).
  mutable std::mutex mu_;
  std::shared_ptr<Device> device_;
  ArenaConfig config_;
  std::size_t unit_;  // rounding and alignment of block sizes
  std::size_t max_request_;  // the device's bound on one request (0: none)

  std::deque<Block> block_storage_;
  std::vector<Block*> spare_blocks_;
  std::map<char*, std::unique_ptr<Segment>> segments_;  // by base address
  // Expandable segments by (stream, class): 1 small pool, 2 large pool,
  // 3 the persistent segment of recorded optimizer steps.
  std::map<std::pair<StreamId, SegmentClass>, Segment*> expandable_;
  bool ranges_ok_;
  FreeSet small_free_, large_free_, persistent_free_;
  bool persistent_hint_ = false;
  bool hinted_allocations_ = false;  // a hinted allocation went to the persistent segment
  LiveMap live_;  // live allocations by address
  CacheBin cache_[kCacheBins];
  std::size_t cache_bytes_ = 0, cache_blocks_ = 0;

  DeviceStats stats_;
  std::shared_ptr<StatsGroup> group_;
  DeviceStats published_;  // what group_ has of stats_ (current values)
  EventPool events_;
  PendingGroups pending_;
  Territory territory_;  // owns the planned territory and its epoch events
  bool capturing_ = false;        // see set_capturing()

  std::unique_ptr<StepPlanner> steps_;

  // Planned replay's fast path. armed and owner change under mu_ and the
  // replay lock; the owner reads them in its fast section.
  std::atomic<bool> replay_armed_{false};
  std::atomic<const void*> replay_owner_{nullptr};
  FrontLock replay_lock_;
  bool replay_held_ = false;  // this Op / Locked holds replay_lock_ (under mu_)
  PoolKind replay_pool_ = PoolKind::kLarge;  // the territory segment's pool
  // What the fast path changed in the books since the last flush, which
  // adds it (replay_enter_locked): allocation and active move by `n`,
  // allocated and active bytes by `bytes`, requested bytes by `req`; the
  // max_* are the highest values of those changes (so the peaks come out as
  // if each operation had booked itself), the alloc_* their increases.
  // Nothing else changes those stats between two flushes.
  struct ReplayBooks {
    std::int64_t n = 0, bytes = 0, req = 0;
    std::int64_t max_n = 0, max_bytes = 0, max_req = 0;
    std::int64_t alloc_n = 0, alloc_bytes = 0, alloc_req = 0;
  };
  ReplayBooks replay_books_;
  void replay_book_locked();  // adds replay_books_ to stats_ and clears it

  // Per-thread fronts (free_cache.h). fronts_ and registry_ under mu_.
  const std::uint64_t serial_;  // never reused: names this arena in thread-local lookups
  const bool fronts_enabled_;   // off for arenas in a stats group (its totals are the books)
  bool fronts_wanted_ = true;   // set_fronts()
  std::size_t front_max_ = 0;   // largest request a front serves (0: fronts off)
  std::atomic<bool> fronts_open_{false};  // no step and no capture (read under a front's lock)
  std::vector<std::shared_ptr<Front>> fronts_;
  std::shared_ptr<FrontRegistry> registry_;
};

}  // namespace renaissance
