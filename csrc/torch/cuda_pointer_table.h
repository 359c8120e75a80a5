// cuda_pointer_table.h - which arena handed out each live CUDA pointer.
//
// Invariants:
//   * Every pointer the glue hands out is inserted before it is returned and
//     taken out (take) before its arena frees it, so a free, record_stream or
//     block lookup reaches the arena (default or private pool) that owns it;
//     a pointer not in the table is not ours.
//   * 16 shards by address hash, each with its own leaf-level mutex
//     (core/lock_order.h, level kLeaf): nothing is called, and no other lock
//     taken, while a shard is held; the arena is called after the shard's
//     lock is released.
// Compiled only with TR_WITH_CUDA.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/arena.h"
#include "core/lock_order.h"

namespace renaissance::cuda::detail {

inline constexpr c10::MempoolId_t kDefaultPool{0, 0};

struct Owner {
  Arena* arena = nullptr;
  c10::MempoolId_t pool = kDefaultPool;
  int device = -1;
};

class PointerTable {
 public:
  void insert(void* p, const Owner& o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    s.map[p] = o;
  }
  // Removes p, setting *o to its owner; false when p is not in the table.
  bool take(void* p, Owner* o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    *o = it->second;
    s.map.erase(it);
    return true;
  }
  // Sets *o to p's owner; false when p is not in the table.
  bool find(const void* p, Owner* o) {
    Shard& s = shard(p);
    std::lock_guard g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    *o = it->second;
    return true;
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct Shard {
    lock_order::Mutex<lock_order::kLeaf> mu;
    std::unordered_map<const void*, Owner> map;
  };
  Shard& shard(const void* p) {
    const auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) >> 9);
    return shards_[(a * 0x9E3779B97F4A7C15ULL) >> 60];
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace renaissance::cuda::detail
