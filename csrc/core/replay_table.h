// replay_table.h - the data of planned replay's fast path (issue 14): per
// trace position of one layout's phase, its planned range and its
// immediate spatial predecessors; per step, which positions are clean (their
// range was wholly free territory when the step began), which were freed in
// the step, and the fast path's live allocations by address. The policy
// that uses it (who may serve what, when it is flushed) is in
// step_planner.cpp ("fast path") and arena.cpp (the replay lock); what each
// invariant rests on is in docs/design.md ("Planned replay, slot table").
//
// Invariants:
//   * ReplayRoute: for every planned position i, preds(i) is the set
//     { max { j < i : j planned, [off_j, off_j + size_j) holds x } :
//       x in [off_i, off_i + size_i) }, without duplicates (a painter's
//     sweep over the positions in trace order). Unplanned positions (sizes
//     0: served by the dynamic pool) have no range and no predecessors.
//   * FastLive: each key (an address handed out by the fast path and not
//     yet freed or flushed) is present once; at most half the slots are
//     used (linear probing, backward-shift deletion).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace renaissance {

class ReplayRoute {
 public:
  // `offset[i]`, `size[i]`: position i's planned range in bytes from the
  // territory's base (size 0: not planned in territory).
  void build(const std::vector<std::size_t>& offset, const std::vector<std::size_t>& size);
  std::size_t positions() const { return offset_.size(); }
  std::size_t offset(std::size_t i) const { return offset_[i]; }
  std::size_t size(std::size_t i) const { return size_[i]; }
  const std::uint32_t* preds_begin(std::size_t i) const { return preds_.data() + start_[i]; }
  const std::uint32_t* preds_end(std::size_t i) const { return preds_.data() + start_[i + 1]; }

  // What the route was built for (StepPlanner's cache key).
  const void* layout = nullptr;
  std::uint64_t generation = 0;

 private:
  std::vector<std::size_t> offset_, size_;
  std::vector<std::uint32_t> start_;  // positions + 1 entries into preds_
  std::vector<std::uint32_t> preds_;
};

// Address -> trace position of the fast path's live allocations.
class FastLive {
 public:
  void reset(std::size_t capacity_hint);
  std::size_t size() const { return used_; }
  // The position of `p`, or -1.
  std::int64_t find(std::uintptr_t p) const {
    if (slots_.empty()) return -1;
    for (std::size_t i = home(p);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == p) return s.pos;
      if (s.key == 0) return -1;
    }
  }
  // Needs a free slot beyond half the table: reset() with the most keys
  // that will be present (the fast path never grows it).
  bool has_room() const { return 2 * (used_ + 1) <= slots_.size(); }
  void insert(std::uintptr_t p, std::uint32_t pos) {
    std::size_t i = home(p);
    while (slots_[i].key != 0 && slots_[i].key != p) i = (i + 1) & mask_;
    if (slots_[i].key == 0) ++used_;
    slots_[i] = Slot{p, pos};
  }
  // Removes `p` (present) and returns its position, or -1 when absent.
  std::int64_t take(std::uintptr_t p) {
    if (slots_.empty()) return -1;
    std::size_t i = home(p);
    while (slots_[i].key != p) {
      if (slots_[i].key == 0) return -1;
      i = (i + 1) & mask_;
    }
    const std::int64_t pos = slots_[i].pos;
    // Backward-shift deletion: move later entries of the run into the hole
    // when their home does not lie cyclically in (i, j].
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = Slot{};
    --used_;
    return pos;
  }
  template <typename F>
  void for_each(F f) const {
    for (const Slot& s : slots_) {
      if (s.key) f(s.key, s.pos);
    }
  }
  void clear();

 private:
  struct Slot {
    std::uintptr_t key = 0;
    std::uint32_t pos = 0;
  };
  std::size_t home(std::uintptr_t p) const {
    return static_cast<std::size_t>(((p >> 6) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0, used_ = 0;
  unsigned shift_ = 64;
};

}  // namespace renaissance
