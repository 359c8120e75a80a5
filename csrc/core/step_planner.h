// step_planner.h - record a step, plan it, replay it (the planned arena's
// policy; the mechanisms are the Arena's).
//
// Steps are numbered from 1. Every step's allocations are recorded as a trace
// (size, stream, logical alloc/free time, stream uses, address). At the end
// of step k >= 2 whose size sequence is new, the step is planned:
//   * buffers born and dead inside the step get their lifetime;
//   * buffers that outlive the step (live-outs) are matched, in order and by
//     size, with the live-outs of step k-1 that died during step k: such a
//     buffer wraps around the step boundary (cyclic lifetime, e.g. gradients
//     made in backward and freed by the next zero_grad); unmatched live-outs
//     are persistent and stay in the dynamic pool;
//   * a live-out whose previous instance is still live when it is born (the
//     loop's `out = model(x)`: last step's logits die only once the new ones
//     exist; a batch made before the old one is dropped) lives longer than
//     one step, so it overlaps its own next instance: the layout becomes
//     *alternating*, planned over two steps (period 2T, every buffer twice),
//     each slot with one offset per phase; even and odd steps replay the two
//     phases in turn. Slots whose two offsets can be equal without growing
//     the plan are made equal (address stability). The recorded step counts
//     as phase 1 (its live-outs stand where the dynamic pool put them) and
//     the first replay is phase 0. Where a recorded live-out is in the way
//     of what phase 0 places before it dies, the first replay gets a
//     *bridge*: its own offsets, planned around the recorded live-outs,
//     with its live-outs where the plan's phase 0 expects its predecessors
//     (and under the plan's top); the plan replays from the step after it
//     (finish_bridge), without pins. Only when the bridge would map more
//     than the reserved peak allows (StepPlanJob::room), or a live-out has
//     no place under the plan's top, is such a live-out pinned where it
//     stands in phase 1 (every later step then pays for it). Where no bridge
//     fits before the plan's phase 0, one into its phase 1 is tried (the
//     bridge's live-outs at phase 0's positions). A plan still pinned, or
//     over its bound, is refined once from its first replay (Layout::refined);
//   * buffers used on another stream keep their range until the step ends;
//   * live blocks of the target segment are obstacles the plan avoids; so
//     are blocks of other steps (another key's) that died during the step,
//     from its start until their death, and a block that another key's
//     alternating layout placed also stands at its slot's other offset.
// Steps of shapes that never repeat back off: after kBackoffPlans plans
// that no later step replayed, a new shape is planned only when seen twice.
// Replay matches request k of a step to position k of the plan, but the
// requests of two threads that run concurrently (intra-op workers) come in
// either order: a request of another thread than the one that made its
// position's request in the step before is matched to its own thread's next
// position (within kMatchWindow, not yet served) when it fits there: at its
// range when that is free, else by the dynamic pool (a conflict), and the
// replay goes on; the positions it skipped are served by the next requests
// (out-of-order matching). One thread's requests are never reordered. A
// step matched wholly so is recorded in plan order (its trace, threads and
// its blocks' positions), so it is the same variant as the recorded one.
// A layout is a plan for one structure (allocation count and streams); the
// variants of a structure (other batch sizes or lengths) share a layout,
// each slot taking the max size over them, so the addresses do not change,
// as long as the merged LOAD stays within kMergeSlack of each variant's own;
// a variant whose sizes do not fit (two buffers whose sizes swap) gets a
// layout of its own, and the first requests of a step choose the layout
// whose slots have exactly their sizes.
//
// Invariants:
//   * Replay never returns memory a live block holds: the arena's placement
//     checks the range against its free index first (territory_index.h); a conflict
//     or a mismatch falls back to the dynamic pool and is counted.
//   * At most `max_variants` variants are kept, least recently used out; a
//     layout lives while one of its variants does.
//   * All methods run with the arena's lock held, except run(): the planner
//     itself runs outside it, on a snapshot of the trace (a PlanJob), so
//     other threads' allocations do not wait for the plan budget. The
//     result is installed under the lock; what was allocated or freed
//     meanwhile is safe because replay checks every range when it places.
//   * At most one plan is in flight; a step that ends while one is makes
//     no second one (it is planned when it is seen again).
//   * Territory is per stream (the layout's stream, that of its step's first
//     allocation); the territory of stream S is exactly the highest top of
//     S's layouts after each plan, and blocks pending at plan time are no
//     obstacles (they are released into the territory with an epoch event
//     that the placements there wait on, or the slot falls back).
//
// Contract (StepPlanner, Territory, Arena): the arena owns one StepPlanner
// and calls its hooks with its lock held (all but run()). The planner owns
// traces, layouts, variants and the per-block fields Block::step and
// Block::seq. It changes the territory only through its Territory&
// (candidate, fit, demote, demote_all, place; territory.h) and sees the
// rest of the arena through StepArenaView: the config, the rounding unit,
// the live map and the capture flag, read-only, and release_cached(), its
// one change to the dynamic pool. It never splits, indexes or frees a block
// itself. StepPlanJob is the planner's own record of one plan (it names the
// public PlannedBuffer and Layout records), read by run() without the
// arena's lock. No core class is a friend of another.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <functional>

#include "core/arena.h"
#include "core/planner.h"
#include "core/replay_table.h"
#include "core/territory.h"

namespace renaissance {

// What the planner sees of its arena besides the territory: read-only,
// but for release_cached (gives back what the free lists cache: empty_cache
// without the territory, PyTorch's release_cached_blocks) and the planner's
// own per-block fields (Block::step, Block::seq) of the live blocks.
struct StepArenaView {
  const ArenaConfig& config;
  std::size_t unit;      // rounding and alignment of block sizes (bytes)
  const LiveMap& live;   // live allocations by address
  const bool& capturing;  // a CUDA-graph capture is open (Arena::set_capturing)
  std::function<std::size_t()> release_cached;  // returns the bytes given back
  // Bytes of reserved memory that can be mapped before the reserved peak
  // (since the last reset) grows: peak - current of all pools.
  std::function<std::size_t()> reserved_headroom;
};

// A live-out of the recorded step that may stand in the way of the first
// replay (alternating layouts): the phase-1 instance of planned slot `k`
// is pinned at `at` when a buffer live in [0, until) of the cycle overlaps
// [at, at + bytes). StepPlanJob::PinCandidate.
struct StepPinCandidate {
  std::size_t k = 0;
  std::uint64_t at = 0, bytes = 0;
  std::int64_t until = 0;
};

class StepPlanner {
 public:
  StepPlanner(Territory& territory, StepArenaView view)
      : territory_(territory), view_(std::move(view)) {}

  // Allocation hooks.
  Block* place(std::size_t requested, std::size_t rounded, StreamId stream);
  void on_allocated(Block* b);
  void on_free(Block* b);
  void on_record_stream(Block* b, StreamId stream);

  // The planner's input and output for one plan: made under the arena's
  // lock by end_step(), planned by run() without it, installed by install().
  using PlanJob = StepPlanJob;
  void begin_step(std::uint64_t key);
  // Ends the open step; returns the plan to make (run() it without the
  // arena's lock, then install() it with the lock) or nullptr.
  std::unique_ptr<PlanJob> end_step();
  static void run(PlanJob& job);
  void install(std::unique_ptr<PlanJob> job);
  // Forgets a job whose run() failed (the step stays unplanned).
  void abandon() { planning_ = false; }
  bool in_step() const { return open_; }
  // A step is open and served by the dynamic pool (no plan, or it diverged),
  // and will be planned from: not a step of a frozen structure (served as
  // with planning off: its small requests in small segments, nothing put
  // in the persistent segment).
  bool recording() const { return open_ && !replaying_ && !frozen_; }
  // A step is open that began replaying a layout and left it (a miss, a new
  // structure such as a periodic eval inside the step): what its optimizer
  // makes are temporaries (the state exists), not state to pack apart.
  bool diverged() const { return open_ && !replaying_ && replayed_; }
  // Whether the calling thread runs planned steps (it opened one, or a
  // layout plans its allocations); false for other threads' work, e.g. a
  // data loader or server thread allocating while steps run elsewhere.
  bool plans_calling_thread() const;
  // Out-of-memory path: hand the planned territory to the dynamic pool for
  // the rest of this step.
  void release_territory();
  PlanStats stats() const;
  StepRecord last_step() const;
  // --- the fast path (issue 14; replay_table.h, arena.cpp's replay lock) --
  // The opener thread's planned allocations of a replayed step served
  // without the arena's lock, from the active layout's slot table: position
  // i goes to its planned offset when its range was wholly free territory
  // when the step began (clean) and every immediate spatial predecessor of
  // it (ReplayRoute) was placed at its planned range and freed in this
  // step. By induction over the positions, no earlier occupant of the range
  // is live then. The territory's tiling does not change on the fast path:
  // flush_fast() hands its live allocations to the arena as blocks
  // (territory place) before anything else looks at blocks or stats.
  //
  // Arms it for the open step (the caller, the arena, holds its lock and
  // the replay lock); returns the territory segment, or nullptr (not armed:
  // not replaying, a capture, epoch events outstanding, no territory).
  Segment* arm_fast();
  void disarm_fast() { fast_armed_ = false; }
  // Whether the armed fast path may go on after a slow operation: the same
  // step, layout (unchanged), phase and territory line, no miss, no capture,
  // no epoch event. False when not armed.
  bool fast_valid() const;
  // Whether arm_fast() may arm it again in the open step, after what made
  // fast_valid() false (a layout switch, a new territory line): the step
  // still replays, without a miss, a capture or an epoch event. Positions
  // already made count as freed predecessors (what they still hold is in
  // the blocks, so the ranges over it are not clean).
  bool fast_rearmable() const;
  // Without the arena's lock (the replay lock's fast section): the address
  // for the next request of the step, or nullptr (take the slow path; nothing
  // changed). `rounded` is `requested` rounded to the unit.
  // (Defined in replay_fast.h, inline for the arena's hot path.)
  inline char* fast_place(std::size_t requested, std::size_t rounded, StreamId stream) noexcept;
  // The free of an address the fast path handed out: its rounded and
  // requested bytes; false when it is none (take the slow path).
  inline bool fast_free(void* ptr, std::size_t& rounded, std::size_t& requested) noexcept;
  // The fast path's live allocations (address, position, bytes), taken out
  // of its table: the arena places each as a block (the flush) and gives it
  // to adopt_fast_block(). First the positions the fast path served since
  // the last flush become trace entries (it records them compactly, see
  // fast_rec_): whoever reads the open step's trace holds the arena's lock,
  // and every holder flushes first, so the trace is whole when read.
  struct FastBlock {
    char* ptr;
    std::size_t position, rounded, requested;
    StreamId stream;
  };
  const std::vector<FastBlock>& take_fast_live();
  void adopt_fast_block(Block* b, std::size_t position);
  Segment* fast_segment() const { return fast_seg_; }
  // After a slow operation that left the fast path armed (fast_valid()):
  // the trace's room may have grown.
  void fast_refresh() noexcept;

  // The problem and offsets of the most recent plan (for tests and tools).
  const planner::Problem& last_problem() const { return last_problem_; }
  const std::vector<std::uint64_t>& last_offsets() const { return last_offsets_; }
  // What stopped the search of that plan (planner::Result::stopped_by):
  // "bound", "work", "clock" (only then does it depend on the machine) or
  // "done"; empty before the first plan.
  const std::string& last_stopped_by() const { return last_stopped_by_; }

 private:
  struct StepTrace : StepRecord {  // entries' sizes rounded; free_time -1: live at the end
    std::vector<std::pair<std::int64_t, std::int64_t>> livein_frees;  // (prev seq, time)
    std::vector<std::int64_t> later_frees;  // its seqs freed after it ended, before its key's next step
    // Blocks of other steps (another key's, or older than the one before)
    // freed during it: where they stood and when they died (its clock).
    // They were live from its start until then, so its plan avoids them
    // there (a keyed loop: the previous prompt's output, at its own key's
    // planned offsets, dies inside the next key's step).
    struct ForeignFree {
      std::uintptr_t address = 0;
      std::size_t size = 0;
      std::int64_t time = 0;
      std::uint64_t step = 0;  // its own step and position (Block::step, Block::seq)
      std::int64_t seq = -1;
    };
    std::vector<ForeignFree> foreign_frees;
    int phase = -1;  // the phase it replayed (-1: not replayed)
    std::uint64_t layout_id = 0;  // the layout whose variant it was (Layout::id; 0: none)
    // The step of its key before it, kept while this one is its key's last
    // (an alternating layout's step repeats the addresses of the last step
    // of the same phase: prior->entries[i].address). Its own `prior` is
    // empty (end_step recycles the one before it).
    std::unique_ptr<StepTrace> prior;
    std::uint64_t prior_replayed_id = 0;  // the layout that step replayed (its id; 0: none)
    // It began replaying a layout (`phase` is also set on the step a plan
    // was made from, so that the next step replays phase 0).
    bool replayed = false;
    std::uint64_t replayed_id = 0;  // the layout it replayed at its end (Layout::id; 0: none)
    // Per entry, the allocating thread (thread_tag()), kept only once some
    // entry is another thread's than the opener (other_threads): empty
    // until then, every entry being the opener's (a replayed step's fast
    // path serves the opener only, and filling a column of one value was 8
    // instructions a request). Read it through thread().
    std::vector<std::uint64_t> threads;
    std::uint64_t opener = 0;            // the thread that began the step
    // Some entry was recorded for another thread than the opener (record_entry;
    // it stays set when such entries are dropped or reordered): false means
    // every entry is the opener's and `threads` is empty.
    bool other_threads = false;
    // The thread of entry i (i < entries.size()).
    std::uint64_t thread(std::size_t i) const { return other_threads ? threads[i] : opener; }
    // Some entry's stream differs from the first entry's (record_entry and
    // materialize_fast keep it; dropping entries may leave it set). False:
    // every entry is on the first one's stream.
    bool mixed_streams = false;
  };

 public:
  // The records a plan job (StepPlanJob) carries between the arena's lock
  // and run(): public so that it names them without being a friend; only the
  // planner makes or reads them.
  // One request position of a layout: its (max) size, lifetime in the
  // step's ticks, stream and offset per phase (was StepPlanner::Slot; the
  // static planner's MemoryPlan calls its placements slots). A layout's
  // `slots` are indexed by the request's position in its step.
  struct PlannedBuffer {
    std::size_t size = 0;
    std::int64_t lower = 0, upper = 0;
    StreamId stream = 0;
    bool dynamic = false;  // served by the dynamic pool (persistent buffers)
    std::size_t offset[2] = {0, 0};  // per phase (equal in a one-phase layout)
    // Per phase: bytes it may grow above its end at its offset without
    // reaching another planned buffer or the layout's top (slot_room.h; set
    // when its layout is installed).
    std::uint64_t room[2] = {0, 0};
  };
  struct Layout {
    std::vector<PlannedBuffer> slots;
    // Set with `slots` when the layout is installed (slots' streams and
    // dynamic flags do not change after): every slot on the first one's
    // stream; some slot served by the dynamic pool.
    bool one_stream = true;
    bool any_dynamic = false;
    std::int64_t horizon = 0;  // the step's length in logical ticks
    StreamId stream = 0;
    std::size_t top = 0;       // end of the highest slot
    std::size_t load = 0;      // LOAD (lower bound): the largest over its variants' steps
    std::size_t layout_load = 0;  // LOAD of the merged problem (max sizes over variants)
    std::size_t greedy = 0;    // greedy-by-size plan size (same problem)
    std::size_t obstacles = 0; // bytes of obstacles below top (inside the territory)
    std::size_t lasting = 0;   // of those, the ones in the way for the whole step (not live-outs dying early)
    std::size_t persistent = 0;  // bytes live before the step and still live at its end (plan time)
    // LOAD with what lives outside the steps: the largest, over the steps it
    // holds, of that step's LOAD + its `persistent`. Each term is a lower
    // bound of the live bytes during that step; a step's LOAD + the bytes
    // live at plan time was not (an optimizer's state made after the step's
    // peak, in the one step that makes it, was counted at the peak: LOAD
    // 37.9 MiB above a peak allocated of 32.9 MiB).
    std::size_t total_load = 0;
    int conflict_streak = 0;
    // Re-plans made because a live-out it serves dynamically proved to die
    // in the next step (kept_dynamic_but_cyclic); at most kRelearnMax.
    int relearned = 0;
    std::uint64_t key = 0;     // the kind of step it plans
    int phases = 1;            // 2: alternating (a slot's lifetime spans two steps)
    std::size_t pinned = 0;    // bytes of live-outs pinned where the recorded step left them
    // A bridge (see StepPlanJob::bridge): while `bridging`, `slots`' offsets
    // (both phases) and `top` are the bridge's, for the first step that
    // replays the layout; `next_offsets` (per slot: phase 0, phase 1) and
    // `next_top` are the layout proper, which end_step installs after that
    // step (finish_bridge).
    bool bridging = false;
    int bridge_next_phase = 0;  // the phase the step after the bridge replays
    std::vector<std::size_t> next_offsets;
    std::size_t next_top = 0;
    std::size_t bound = 0;     // the planner's lower bound for its problem (obstacles included)
    // A plan over its bound by more than 1/kRefineOver, or pinned, is planned once more
    // from its first clean replay (refine): with kRefineBudget times the
    // budget, and from a step whose live-outs stand at the plan's own
    // offsets rather than where the dynamic pool put the recorded ones, so a
    // bridge fits where the first plan's did not. Installed only when its top
    // is lower (StepPlanner::install). `refined`: the installed plan was
    // refined, or its refine was not lower; reset by any other plan.
    bool refined = false;
    // Threads whose allocations it plans (sorted): those that allocated at
    // the same positions in the two steps it was planned from. Another
    // thread's allocations during a step are not part of it.
    std::vector<std::uint64_t> threads;
    std::uint64_t id = 0;  // unique per planner (StepTrace::layout_id)
    // The layouts of the steps that followed a step of this one (id, how
    // often): the next step begins on the most frequent (begin_step), since
    // a step's first requests are placed before they tell layouts apart.
    std::vector<std::pair<std::uint64_t, std::uint32_t>> next;
    // Its last kGiveUpWindow replays, one bit each (1: it missed: a request
    // outgrew its slot or left the structure); see kGiveUpMisses.
    std::uint32_t recent_misses = 0;
    int recent_replays = 0;
    // Given up (its steps served by the dynamic pool) until this step;
    // 0: planned. give_ups: how many times.
    std::uint64_t given_up_until = 0;
    int give_ups = 0;
  };

 private:
  struct Variant {
    Layout* layout = nullptr;
    std::vector<std::size_t> sizes;
    std::uint64_t last_used = 0;
  };


  bool fits(const Layout& l, std::size_t i, std::size_t rounded, StreamId stream) const;
  // Whether slot i of `l` (this step's phase) can take `rounded` bytes, more
  // than its size, at its offset without reaching into another planned
  // buffer's range (either phase, any time) or above the layout's top: the
  // rest of the plan still holds. O(1): the slot's room above, computed once
  // per installed layout (slot_room.h).
  bool room_to_grow(const Layout& l, std::size_t i, std::size_t rounded) const;
  // exact: only a layout whose slot i has exactly `rounded` bytes. Never
  // after out-of-order matching (the step's positions are the active
  // layout's).
  bool switch_layout(std::size_t i, std::size_t rounded, StreamId stream, bool exact = false);
  // The first requests of a step that look for a layout with exact sizes.
  static constexpr std::size_t kChooseWindow = 16;
  // A replay that conflicts this often (and on more than one in
  // kConflictShare of its placements) is not the plan's step: the rest of it
  // is served dynamically, with the territory handed back, as after a miss.
  static constexpr int kConflictLimit = 16;
  static constexpr int kConflictShare = 8;
  // --- out-of-order matching (the top; place()) --------------------------
  static constexpr std::size_t kMatchWindow = 16;  // positions looked at after the next one
  static constexpr std::size_t kMaxAhead = 8;  // positions served ahead at once
  static constexpr std::size_t kNoPosition = ~std::size_t(0);
  // The open step's next position: the lowest not yet served.
  std::size_t next_position() const { return permuted_ ? pos_next_ : cur_->entries.size(); }
  // The thread that made position i's request in the step of its key
  // before (position order); 0 when not known.
  std::uint64_t position_thread(std::size_t i) const {
    return prev_ && i < prev_->entries.size() ? prev_->thread(i) : 0;
  }
  // Serves the request at the calling thread's (`tag`) next position after
  // `i` (within the window, not yet served) when the request fits it: at its
  // range when free, else by the dynamic pool (a conflict); `served` says
  // whether it took that position (the block, or nullptr). O(kMatchWindow).
  Block* place_ahead(std::size_t i, std::size_t requested, std::size_t rounded, StreamId stream,
                     std::uint64_t tag, bool& served);
  // Books the position of the request on_allocated records (the one place()
  // chose, else the next).
  void take_position();
  // end_step: puts a wholly out-of-order matched step's trace in plan order
  // (entries, threads, its live blocks' positions); false when its positions
  // do not cover it (a miss), which keeps the order of arrival.
  bool order_by_position();
  bool permuted_ = false;   // the open step matched a position out of order
  std::size_t pos_next_ = 0;
  std::vector<std::size_t> ahead_;   // positions served ahead of pos_next_
  std::vector<std::size_t> pos_of_;  // per recorded entry: its position (permuted_ only)
  std::size_t pending_pos_ = kNoPosition;  // place()'s choice, booked by on_allocated
  bool activate_territory();
  // Makes `stream`'s territory exactly the highest top of its layouts
  // (lowering it when the old layouts were larger); none when it has none.
  void fit_territory(StreamId stream);
  // keep_live_outs: the step's live-outs standing in the territory are
  // pinned where they are (a re-plan that must not move them).
  std::unique_ptr<PlanJob> plan_step(std::vector<std::size_t> sizes, bool keep_live_outs = false);
  // plan_step's parts, in order. The open step's buffers with their
  // lifetimes (live-outs matched with the previous step's, see the top).
  std::vector<PlannedBuffer> derive_lifetimes(StreamId stream, std::int64_t T) const;
  // Widens each in-step lifetime to cover the same buffer's in the step of
  // its key before (same sizes and streams): the order of two threads'
  // allocations and frees varies from step to step, and a plan of one
  // order alone conflicts on the other.
  void widen_with_previous(std::vector<PlannedBuffer>& slots, std::int64_t T) const;
  // Merges `slots` into the kept layout of the same structure whose merged
  // LOAD is lowest (within kMergeSlack); returns it (or nullptr: a layout of
  // its own), with the merged horizon and the LOAD of the steps it holds.
  // `own_load`: the LOAD of `slots` as recorded (load_of(slots, T)).
  Layout* merge_with_layout(std::vector<PlannedBuffer>& slots, std::int64_t T,
                            std::size_t own_load, std::int64_t& horizon,
                            std::size_t& variant_load) const;
  // Steps of one key switch between layouts (a periodic no_grad eval makes
  // every fifth training step a structure of its own): each layout's replay
  // finds the previous step's live-outs where *its* plan put them, and a
  // step's first requests are placed before switch_layout knows its layout.
  // So a plan of a key that has another layout (the most recently used one
  // besides the one it replaces, same stream and phases) pins, phase by
  // phase, its live-outs at the offsets of that layout's live-outs (matched
  // in order and by size) and its common prefix (same sizes from position 0)
  // at that layout's offsets, where such a pin meets no other pin and no
  // obstacle. Writes them into `pinned` (per problem buffer).
  void share_boundary(const std::vector<PlannedBuffer>& slots, const std::vector<std::size_t>& index,
                             std::int64_t horizon, int phases, const Layout* target,
                             const planner::Problem& problem, std::vector<std::uint64_t>& pinned) const;
  static int make_problem(std::vector<PlannedBuffer>& slots, std::int64_t horizon,
                          planner::Problem& problem, std::vector<std::size_t>& index);
  // A live block of the open step that is a planned slot (a live-out).
  bool wraps_next_step(const Block* b, const std::vector<PlannedBuffer>& slots) const;
  // Adds the territory candidate's live blocks to `problem` as obstacles
  // (or, for this step's live-outs, as pin candidates); returns the
  // obstacle bytes, with the bytes live outside the step in `persistent`.
  std::size_t collect_obstacles(const std::vector<PlannedBuffer>& slots,
                                const std::vector<std::size_t>& index, std::int64_t horizon,
                                std::int64_t fixed_upper, StreamId stream,
                                planner::Problem& problem,
                                std::vector<StepPinCandidate>& pins,
                                std::size_t& persistent, bool keep_live_outs) const;
  // Merges layout `l` into `slots` (a step of T ticks); returns the merged horizon.
  static std::int64_t merge_into(std::vector<PlannedBuffer>& slots, std::int64_t T, const Layout& l);
  // LOAD of the planned slots on a step of `horizon` ticks.
  static std::size_t load_of(const std::vector<PlannedBuffer>& slots, std::int64_t horizon);
  // A variant shares a layout while the merged LOAD is at most this much
  // above the LOAD of each step it holds.
  static constexpr double kMergeSlack = 1.05;
  void forget_least_recent_variant();
  // The most recently used layout (of `*key`, or of any key when null).
  Layout* most_recent_layout(const std::uint64_t* key) const;
  Variant* find_variant(const std::vector<std::size_t>& sizes);  // of the open step's key
  bool same_structure(const Layout& l) const;  // same key, count and streams as the open step
  Layout* covering_layout() const;  // a layout whose slots hold this step
  Block* place_slot(const PlannedBuffer& s, std::size_t requested, std::size_t rounded, StreamId stream);
  // Appends the open step's next trace entry (allocated now, at `address`,
  // by thread `tag`) and counts whether it repeats its reference address.
  // The locked path (on_allocated) and the fast path (fast_place) both
  // record through it.
  void record_entry(std::size_t size, StreamId stream, std::uintptr_t address, std::uint64_t tag);
  // The address request i of the open step should repeat (false: none).
  bool reference_address(std::size_t i, std::uintptr_t& out) const;
  // The trace reference_address reads (nullptr: none).
  const StepTrace* reference_trace() const;
  void remember_variant(Layout* layout, std::vector<std::size_t> sizes);
  // A small number naming the calling thread (stable while it lives).
  static std::uint64_t thread_tag();
  // False when the open step replays (or records a variant of) a layout that
  // does not plan the calling thread's allocations: they go to the dynamic
  // pool and are not part of the step.
  bool counts_thread(std::uint64_t tag) const;
  // Drops from the open step the entries of threads other than its opener
  // that did not allocate at the same positions in the step of its key
  // before (concurrent work on other threads); their live blocks leave the
  // step. Returns whether anything was dropped.
  bool drop_irregular_threads();
  // A new open step's trace: spare_ reset to a new trace's fields (its
  // entries' and threads' room kept), else a new one.
  std::unique_ptr<StepTrace> fresh_trace();
  // Whether the obstacles a layout was planned around (blocks live in its
  // territory at plan time that were no part of the step: another thread's,
  // or one a step kept past its planned death) have mostly died: at least
  // half of its obstacle bytes gone (another key's alternating block counted
  // at both offsets), where they cost at least a sixteenth of its top (its
  // top over the step's own LOAD; with other keys' layouts: where they were
  // at least an eighth of its top). Then a re-plan without them lowers the
  // territory. O(blocks under the top), only for such layouts.
  bool obstacles_gone(const Layout& l) const;
  // Whether `key`'s last step (`trace`) ran since the open step's key's
  // previous step (so what it keeps live meets this step): the keys whose
  // layouts plan_step keeps this step's plan out of.
  bool ran_since_prev(std::uint64_t key, const StepTrace* trace) const;
  // Whether layout `l` serves dynamically a live-out of the open step that a
  // plan made now would plan: its instance of the step before died during
  // this step. The plan judged it persistent because, in the steps it was
  // made from, the earlier instance lived on (torch.compile's first call
  // keeps its outputs; the next calls' die one step later): without a
  // re-plan it stays in the dynamic pool, beside the territory, for good.
  // O(entries), plus one derive_lifetimes when such a slot is live.
  bool kept_dynamic_but_cyclic(const Layout& l) const;
  // After the first step that replayed a bridging layout: its bridge's live-
  // outs stand where the layout proper's phase 0 expects its predecessors
  // (phase 1's), so the layout proper takes over and the next step of its
  // key replays phase 0. O(slots log slots) (the rooms).
  void finish_bridge(Layout& l, StepTrace& replayed);
  // The stream whose territory line stands above its layouts' top because a
  // bridge's live-out stood across the layout proper's top when it took
  // over (the line may not cut a live block); end_step lowers it once it
  // can. kNoStream: none.
  static constexpr StreamId kNoStream = ~StreamId(0);
  StreamId lower_line_ = kNoStream;
  // Re-plans for that reason per layout (a guard: each one plans the slot).
  static constexpr int kRelearnMax = 2;
  // A refine (Layout::refined) is made for a plan whose top is above its
  // bound by more than 1/kRefineOver, with kRefineBudget times the budget.
  static constexpr std::size_t kRefineOver = 100;
  static constexpr int kRefineBudget = 4;

  // The fast path's state (see arm_fast). routes_ by phase, each built for
  // one layout at one layout_gen_ (bumped whenever a layout is installed or
  // forgotten, so a changed layout is never served from an old route).
  ReplayRoute routes_[2];
  std::uint64_t layout_gen_ = 1;
  bool fast_armed_ = false;
  const Layout* fast_layout_ = nullptr;
  int fast_phase_ = 0;
  const ReplayRoute* fast_route_ = &routes_[0];  // routes_[fast_phase_]
  std::uint64_t fast_step_ = 0;
  Segment* fast_seg_ = nullptr;
  StreamId fast_stream_ = 0;
  std::size_t fast_top_ = 0;
  char* fast_base_ = nullptr;  // fast_seg_->base
  // Positions [fast_first_, fast_end_) may be served (past the layout, the
  // trace's reserved room, or within the window where the step may switch
  // layouts: the slow path). fast_end_ is refreshed by fast_valid's caller.
  std::size_t fast_first_ = 0, fast_end_ = 0;
  // Clean (see arm_fast): every routed position when fast_all_clean_ (no
  // block in use under the line when armed), else fast_clean_[i]: 0 not
  // clean, 1 clean, 2 clean once its awaited live-ins are freed.
  bool fast_all_clean_ = false;
  std::vector<std::uint8_t> fast_clean_;  // per position
  // Freed in this arming: fast_freed_[i] == fast_epoch_ (a new arming bumps
  // the epoch instead of clearing the array).
  std::vector<std::uint32_t> fast_freed_;
  std::uint32_t fast_epoch_ = 0;
  // What the fast path records per position it serves, in place of the
  // trace entry (32 bytes, no vector, no thread, no reference compare): the
  // rest of the entry is the route's (stream fast_stream_, address
  // fast_base_ + offset, thread the opener). Positions [cur_->entries.size(),
  // fast_next_) are served and not yet in the trace; materialize_fast() (the
  // flush) appends them and counts their hits and reference addresses.
  struct FastRecord {
    std::int64_t alloc_time, free_time;  // free_time -1: live
    std::size_t rounded, requested;      // bytes
  };
  std::vector<FastRecord> fast_rec_;  // per position
  // Positions [i, end) as the trace entries materialize_fast makes of their
  // records (a forward iterator, so that vector::insert constructs each
  // entry once, in room reserved before).
  struct FastEntries {
    using iterator_category = std::forward_iterator_tag;
    using value_type = TraceRecord;
    using difference_type = std::ptrdiff_t;
    using pointer = const TraceRecord*;
    using reference = TraceRecord;
    const FastRecord* f = nullptr;
    const ReplayRoute* route = nullptr;
    std::uintptr_t base = 0;
    StreamId stream = 0;
    std::size_t i = 0;
    TraceRecord operator*() const {
      return TraceRecord{f[i].rounded, stream, f[i].alloc_time, f[i].free_time, base + route->offset(i), 0};
    }
    FastEntries& operator++() {
      ++i;
      return *this;
    }
    FastEntries operator++(int) {
      FastEntries old = *this;
      ++i;
      return old;
    }
    bool operator==(const FastEntries& o) const { return i == o.i; }
    bool operator!=(const FastEntries& o) const { return i != o.i; }
  };
  std::size_t fast_next_ = 0;          // the step's next position while armed
  void materialize_fast();
  // The reference addresses record_entry compares with (reference_address):
  // fast_ref_[i * fast_ref_stride_] for i < fast_ref_n_.
  const std::uintptr_t* fast_ref_ = nullptr;
  std::size_t fast_ref_stride_ = 0, fast_ref_n_ = 0;
  FastSlots fast_slots_;
  // arm_fast's blocks in use: their range (from the base) and their number
  // among the awaited live-ins, or -1.
  struct FastBusy {
    std::size_t lo, hi;
    std::int64_t wait;
  };
  std::vector<FastBusy> fast_busy_;
  // Awaited live-ins: planned blocks of the previous step standing under the
  // line when armed, with no stream use. fast_wait_of_[seq] == (fast_epoch_
  // << 32 | w) numbers the one of trace position seq; fast_wait_freed_[w] ==
  // fast_epoch_ once it was freed (on_free: it became free territory). A
  // position whose range met only such blocks is clean once they are freed
  // (fast_clean_[i] == 2; their numbers are fast_wait_list_[fast_wait_start_[i]
  // .. fast_wait_start_[i + 1])).
  std::vector<std::uint64_t> fast_wait_of_;
  std::vector<std::uint32_t> fast_wait_freed_;
  std::vector<std::uint32_t> fast_wait_start_, fast_wait_list_;
  std::vector<FastBlock> fast_flush_;

  Territory& territory_;
  const StepArenaView view_;
  bool open_ = false;
  bool replaying_ = false;
  bool replayed_ = false;  // the open step began replaying (planned_unserved)
  std::uint64_t step_ = 0;
  std::uint64_t key_ = 0;  // key of the open (or last) step
  std::int64_t clock_ = 0;
  int phase_ = 0;  // phase of the open step (alternating layouts)
  std::unique_ptr<StepTrace> cur_;
  // The last completed step of each key, and the one of the open step's key.
  std::map<std::uint64_t, std::unique_ptr<StepTrace>> last_by_key_;
  // A trace no key holds any more (end_step), made the next open step's by
  // begin_step with its entries' and threads' room kept: a replayed step
  // then allocates no trace (a fresh one was 3 vectors a step).
  std::unique_ptr<StepTrace> spare_;
  StepTrace* prev_ = nullptr;
  StepTrace* last_ = nullptr;  // the last completed step, any key
  std::vector<std::unique_ptr<Layout>> layouts_;
  std::vector<Variant> variants_;
  Layout* active_ = nullptr;
  std::uint64_t use_clock_ = 0;
  std::uint64_t next_layout_id_ = 1;
  int settle_steps_ = 0;     // clean replayed steps still to wait for after a plan
  int settle_releases_ = 0;  // cache releases since the last plan
  static constexpr int kSettleReleases = 8;
  // Back-off for steps whose shapes never repeat (a random graph per step,
  // lengths that are never seen twice): once kBackoffPlans plans in a row
  // made layouts or variants that no later step replayed (no step since
  // matched a kept variant or fitted a kept layout), a new shape is planned
  // only when it is seen for the second time; until then its steps are
  // served by the dynamic pool. Any step that replays resets the count.
  static constexpr int kBackoffPlans = 4;
  // Structures that repeat but whose sizes change at their positions every
  // step (eager MoE routing: each expert's token count): every replay
  // outgrows a slot somewhere, misses, runs the rest of the step in the
  // dynamic pool around the territory and is planned again, so planning
  // costs memory and time (Qwen2-MoE: 56.6 MiB reserved against 44.9 with
  // planning off, 27-40 plans in 60 steps). A layout that missed in
  // kGiveUpMisses of its last kGiveUpWindow replays is given up as a plan to
  // improve: it is frozen (its structure is not planned again) for
  // kGiveUpSteps << (times given up - 1) steps, and meanwhile a request that
  // outgrows its slot is served alone by the dynamic pool while the rest of
  // the step replays. Deliberate deviations every few steps (a late free,
  // one larger request: tests/test_replay_deviation.py) leave clean replays
  // between them and never reach the share; variable lengths miss only
  // when a length longer than any before comes.
  static constexpr int kGiveUpWindow = 6;
  static constexpr int kGiveUpMisses = 5;
  static constexpr std::uint64_t kGiveUpSteps = 64;
  // Books a replayed step of layout `l` (missed or not); returns whether `l`
  // is given up now.
  bool book_replay(Layout& l, bool missed);
  bool given_up(const Layout& l) const { return l.given_up_until > step_; }
  // --- a step longer than its layout (variable lengths; issue 16) --------
  // A replayed step whose request i outgrew its slot with no room to grow
  // (a sequence longer than every planned one) is not handed to the dynamic
  // pool: the rest of it is planned at once, for sizes predicted from the
  // layout. Each position's size is taken to follow a power of one length:
  // its exponent (0 for a fixed size, 1 for an activation, 2 for attention
  // scores) is read off its slot (the longest length planned) and the
  // layout's variant shortest at position i, relative to position i's, and
  // the length's growth off request i itself; a prediction is its slot at
  // least, and kGrowMargin above the power (rounding; affine sizes). The
  // plan (budget 0, O(n log n) under the arena lock: a few ms for 2,000
  // positions) puts positions i.. around every block live in the
  // territory's segment until it dies (this step's earlier positions and
  // the previous step's live-outs at their planned deaths, anything else
  // for the whole step), and the line is raised to its top when that is
  // higher. Best fit there had left the holes of the early frees
  // (gradients, the batch), sized for the shorter length, unused: 1.09-1.21
  // x the step's own peak on HF GPT-2, lengths from [32, 256]. A request
  // larger than predicted plans the rest again from itself (at most
  // kGrowPlansMax plans a step); one whose range is taken goes to the
  // dynamic pool alone. The step still counts as a miss and is planned at
  // its end as before. False (nothing changed: the old miss) where it
  // cannot be done: one length seen at position i, sizes that the model
  // does not explain (a variant of the layout between the two, predicted
  // from its size at position i, off by more than kGrowFit of its bytes:
  // eager MoE routing), out-of-order matching, a bridge, fixed segments
  // (the line cannot rise in place).
  bool grow_plan(std::size_t i, std::size_t rounded);
  Block* place_grown(std::size_t i, std::size_t requested, std::size_t rounded, StreamId stream);
  static constexpr std::uint64_t kNoGrown = ~std::uint64_t(0);
  static constexpr double kGrowMargin = 1.02;
  static constexpr double kGrowFit = 0.05;  // of a variant's bytes (grow_plan's check)
  // Plans per step: the first and re-plans from a request larger than
  // predicted (place_grown).
  static constexpr int kGrowPlansMax = 4;
  int grow_plans_ = 0;
  std::vector<std::size_t> grown_size_;  // per position: the predicted size (bytes)
  bool grown_ = false;  // the open step is served by a grown plan from some position on
  bool frozen_ = false;  // the open step's structure is given up: the dynamic pool serves it
  Segment* grown_seg_ = nullptr;
  std::vector<std::uint64_t> grown_offset_;  // per position: its offset (bytes), or kNoGrown
  // Shapes (hash of key and size sequence) seen in back-off and not planned,
  // the most recent kShapeMemory of them.
  static constexpr std::size_t kShapeMemory = 64;
  int unreplayed_plans_ = 0;
  std::vector<std::uint64_t> unplanned_shapes_;
  // Whether a step of a new shape is planned now (the back-off above);
  // remembers the shape when it is not.
  bool plan_new_shape(const std::vector<std::size_t>& sizes);
  // A block of step `step` (request `seq`) at offset `at` of the territory
  // that its key's alternating layout placed there: the slot's offset in the
  // other phase, where the block's next instance stands every other step;
  // kNoTwin when there is none (not placed by such a layout).
  static constexpr std::uint64_t kNoTwin = ~std::uint64_t(0);
  std::uint64_t twin_offset(std::uint64_t step, std::int64_t seq, std::uint64_t at) const;
  // The slot of its key's current layout that placed a block of step `step`
  // (request `seq`) at offset `at` (either phase), and that layout's phases
  // in `phases` when given; nullptr when none did. What twin_offset and
  // slot_extent read.
  const PlannedBuffer* placed_slot(std::uint64_t step, std::int64_t seq, std::uint64_t at,
                                   int* phases = nullptr) const;
  // Its slot's size there (the largest over the layout's variants) where its
  // key's layout placed it at `at` (either phase), else `size`, if larger:
  // the next instances stand there at up to that size (a request between a
  // serving loop's calls, 16-128 KiB by prompt length: a call's layout
  // planned around a 64 KiB one conflicted with the 128 KiB one).
  std::size_t slot_extent(std::uint64_t step, std::int64_t seq, std::uint64_t at, std::size_t size) const;
  bool planning_ = false;  // a PlanJob is between end_step() and install()
  bool missed_ = false;
  std::int64_t step_conflicts_ = 0;
  // Counters of the open step; copied to stats_.last_step_* when it ends
  // with at least one allocation.
  std::int64_t cur_hits_ = 0, cur_same_ = 0, cur_comparable_ = 0;
  PlanStats stats_;
  planner::Problem last_problem_;
  std::vector<std::uint64_t> last_offsets_;
  std::string last_stopped_by_;
};

// The planner's input and output for one plan: made under the arena's lock
// by StepPlanner::end_step(), planned by run() without it, installed by
// install() with it.
struct StepPlanJob {
  using PinCandidate = StepPinCandidate;
  static constexpr std::uint64_t kNotPinned = ~std::uint64_t(0);
  // Above this many slots, the phases are not aligned (O(n^2) checks).
  static constexpr std::size_t kAlignMax = 8192;

  planner::Problem problem;
  planner::Options options;
  planner::Result result;
  std::vector<StepPlanner::PlannedBuffer> slots;
  std::vector<std::size_t> index;  // problem buffer -> slot
  std::vector<std::size_t> sizes;  // the variant's size sequence
  // The sizes of the step before it (of the same count and streams, other
  // sizes): a variant of the layout too where they fit its slots, so that
  // a longer step than both has two lengths to predict from (grow_plan).
  std::vector<std::size_t> prev_sizes;
  StepPlanner::Layout* target = nullptr;  // the layout it merges into (may be gone at install)
  std::int64_t horizon = 0;
  std::uint64_t key = 0;
  StreamId stream = 0;
  std::size_t step_load = 0, obstacle_bytes = 0, persistent = 0;
  // The last `boundary_fixed` of problem.fixed: other keys' layouts (their
  // live-outs' slots, their highest top at the step's end; see plan_step), no
  // blocks: not obstacles in the layout's books.
  std::size_t boundary_fixed = 0;
  std::size_t variant_load = 0;  // LOAD of the steps it holds (the larger of own and target's)
  std::size_t total_load = 0;    // Layout::total_load after install
  int phases = 1;
  int relearned = 0;  // Layout::relearned after install
  std::size_t n_slots = 0;  // planned slots; in an alternating plan buffers k, k + n_slots are slot k's phases
  std::vector<PinCandidate> pin_candidates;
  std::vector<std::uint64_t> pinned;  // per problem buffer: kNotPinned or its fixed offset
  bool pin_all = false;  // pin every candidate where it stands, not only those in the way
  // When a candidate is in the way of the plan's first replay (and not
  // pin_all): the offsets of the one step that replays first (per planned
  // slot k < n_slots), planned in linear time over two steps: that step's
  // buffers around the recorded live-outs until they die, and its own
  // live-outs around the plan's phase-0 buffers of the step after it until
  // they die, so the plan (`result`, unpinned) replays from that step on.
  // Empty: no bridge (result is replayed at once).
  std::vector<std::uint64_t> bridge;
  // The phase the step after the bridge replays: 0, or 1 where no bridge
  // fitted around phase 0's buffers (plan_bridge's next_phase).
  int bridge_next_phase = 0;
  // The target segment's size when the job was made plus the reserved
  // headroom below the reserved peak (StepArenaView): a bridge above it would
  // raise the peak reserved for its one step, so then the live-outs in the
  // way are pinned instead.
  std::uint64_t room = 0;
  std::vector<std::uint64_t> threads;  // the layout's threads (sorted)
  double seconds = 0.0;  // time in run()
  // A refine (StepPlanner::Layout::refined): installed only when its top is
  // below the target's; otherwise dropped, the installed plan kept.
  bool refine = false;
};

}  // namespace renaissance
