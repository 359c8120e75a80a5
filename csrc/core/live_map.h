// live_map.h - the arena's map from a live allocation's address to its
// block: an open-addressing hash table (linear probing, backward-shift
// deletion, no tombstones), so that allocate and free make no heap
// allocation (std::unordered_map made one node per allocation; issue 14).
//
// Invariants:
//   * Every key is a non-null pointer and appears at most once.
//   * Every key sits in the probe run that starts at its home slot: no empty
//     slot lies between its home slot and its slot (backward-shift deletion
//     keeps this without tombstones).
//   * At most half of the slots are used (the table doubles before that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace renaissance {

struct Block;

class LiveMap {
 public:
  LiveMap() : slots_(kInitial), mask_(kInitial - 1) {}

  std::size_t size() const { return used_; }

  // The block at `ptr`, or nullptr.
  Block* find(const void* ptr) const {
    for (std::size_t i = home(ptr);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == ptr) return s.block;
      if (s.key == nullptr) return nullptr;
    }
  }

  // `ptr` must not be in the map.
  void insert(const void* ptr, Block* block) {
    if (2 * (used_ + 1) > slots_.size()) grow();
    place(ptr, block);
    ++used_;
  }

  // Removes `ptr` (a no-op when absent).
  void erase(const void* ptr) {
    std::size_t i = home(ptr);
    for (;; i = (i + 1) & mask()) {
      if (slots_[i].key == ptr) break;
      if (slots_[i].key == nullptr) return;
    }
    // Backward shift: move later members of the run into the hole when the
    // hole lies between their home slot and their slot.
    for (std::size_t j = (i + 1) & mask();; j = (j + 1) & mask()) {
      if (slots_[j].key == nullptr) break;
      const std::size_t h = home(slots_[j].key);
      // Is h cyclically outside (i, j]? Then slot j may move to i.
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --used_;
  }

  // Iteration over (address, block) pairs, in no particular order.
  class const_iterator {
   public:
    const_iterator(const LiveMap* m, std::size_t i) : m_(m), i_(i) { skip(); }
    std::pair<const void*, Block*> operator*() const {
      return {m_->slots_[i_].key, m_->slots_[i_].block};
    }
    const_iterator& operator++() {
      ++i_;
      skip();
      return *this;
    }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }

   private:
    void skip() {
      while (i_ < m_->slots_.size() && m_->slots_[i_].key == nullptr) ++i_;
    }
    const LiveMap* m_;
    std::size_t i_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, slots_.size()}; }

 private:
  struct Slot {
    const void* key = nullptr;
    Block* block = nullptr;
  };
  static constexpr std::size_t kInitial = 64;  // a power of two

  std::size_t mask() const { return mask_; }  // slots_.size() - 1, kept (no size division)
  std::size_t home(const void* ptr) const {
    // Fibonacci hashing of the address (its low 6 bits are always zero).
    const auto x = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr) >> 6);
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 32) & mask();
  }
  void place(const void* ptr, Block* block) {
    std::size_t i = home(ptr);
    while (slots_[i].key != nullptr) i = (i + 1) & mask();
    slots_[i] = Slot{ptr, block};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.key) place(s.key, s.block);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_;
  std::size_t used_ = 0;
};

}  // namespace renaissance
