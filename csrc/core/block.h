// block.h - segments and blocks, the data the arena is made of.
//
// Invariants:
//   * The blocks of a segment tile [base, base + size) exactly, in address
//     order, linked through prev/next. A fixed segment is wholly backed by
//     memory (mapped_bytes == size). An expandable segment records per
//     granule of [base, base + size) whether it is mapped: allocated and
//     pending blocks and planned territory are always mapped; a free block
//     of the dynamic pool may cover unmapped granules (holes that a release
//     gave back to the device, PyTorch's unmapped blocks).
//   * A free block is in exactly one index: the dynamic pool's best-fit set
//     if it lies in dynamic territory, or its segment's `plan_free` map if it
//     lies in planned territory ([base, base + plan_top)). No block straddles
//     base + plan_top, and two free neighbours in the same territory are
//     always merged.
//   * Allocated and pending blocks are in no free index. A pending block
//     (freed while another stream may still use it) keeps its range until
//     every stream use it waits on has completed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/stats.h"
#include "core/territory_index.h"

namespace renaissance {

inline std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

// kCached: freed, in the free cache (reusable for the same size and stream).
enum class BlockState : std::uint8_t { kFree, kAllocated, kPending, kCached };

struct Segment;
struct Front;

// One cache line at least, aligned to one: the blocks of two threads' fronts
// never share a line, so one thread's fast-path stores into its block do not
// evict the line another thread's fast path reads (docs/design.md, "No false
// sharing between threads": 2 threads ran slower than one before).
struct alignas(64) Block {
  char* ptr = nullptr;
  std::size_t size = 0;       // bytes, a multiple of the arena's rounding unit
  std::size_t requested = 0;  // bytes the caller asked for (allocated blocks)
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  BlockState state = BlockState::kFree;
  bool planned = false;       // placed at a planned offset by replay
  StreamId stream = 0;        // allocating stream
  std::vector<StreamId> uses;  // other streams that used it (record_stream)
  int pending_on = 0;         // stream-use groups it still waits for
  // The step planner's per-block record (step_planner.h), opaque to the
  // arena: the step in which it was allocated (0: none) and its index in
  // that step's trace. Kept here, not in a side table, because the arena's
  // slow paths ask `step == 0` (not part of a recorded step) for every
  // block they hand to a front or take back, and the planner's free hook
  // runs on every slow free; the arena only resets it when a block is freed.
  std::uint64_t step = 0;
  std::int64_t seq = -1;
  // The per-thread front holding it (free_cache.h), or null. Written with
  // the arena's lock and the front's held; front_live and front_req with the
  // front's: handed out (live) or cached, and its caller's size while live.
  // `requested` is then what the arena's books count for it (>= front_req).
  Front* front = nullptr;
  bool front_live = false;
  std::size_t front_req = 0;
};

// Best-fit order: by stream, then size, then address (PyTorch's BlockComparator).
struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
  }
};
using FreeSet = std::set<Block*, BySizeThenAddress>;

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;      // bytes its blocks tile (the high-water mark of an expandable one)
  std::size_t capacity = 0;  // address range; == size for fixed segments
  std::size_t mapped_bytes = 0;  // backed by memory (== reserved bytes it accounts for)
  std::vector<bool> mapped;  // expandable: one entry per granule of [base, base + size)
  PoolKind pool = PoolKind::kLarge;
  bool expandable = false;
  StreamId stream = 0;       // the stream whose allocations it serves
  Block* head = nullptr;
  Block* tail = nullptr;
  std::size_t live = 0;      // allocated + pending + cached blocks in it
  // Planned territory: [base, base + plan_top). Its free blocks are indexed
  // by address in plan_free instead of the best-fit set (territory_index.h:
  // no allocation per block). The line is moved only by Territory
  // (territory.h); the arena's free index keeps plan_free.
  std::size_t plan_top = 0;
  TerritoryIndex plan_free;
  // Every stream a block in it was allocated on: the streams whose work may
  // still touch its free memory, synchronized before memory is unmapped
  // (Device::unmap_used_by). Other streams' uses (record_stream) need no
  // place here: a block they used becomes free only after their events
  // completed, or after its allocating stream was made to wait for them
  // (policy wait); planned blocks wait for their epoch events when the
  // territory is demoted. Few (usually one); never shrinks.
  std::vector<StreamId> streams;
  bool retire = false;       // release to the device once it is wholly free
  bool persistent = false;   // holds what a recorded step's optimizer made

  bool in_territory(const Block* b) const { return b->ptr < base + plan_top; }
  void note_stream(StreamId s) {
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  }
  bool wholly_free() const {
    return head && head->next == nullptr && head->state == BlockState::kFree;
  }
};

}  // namespace renaissance
