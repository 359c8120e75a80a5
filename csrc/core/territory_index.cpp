// territory_index.cpp - see territory_index.h.
#include "core/territory_index.h"

namespace renaissance {

void TerritoryIndex::grow(std::size_t bits) {
  std::size_t want = bits_ * 2 > bits ? bits_ * 2 : bits;
  want = (want + 63) & ~std::size_t(63);
  std::vector<std::uint64_t> bottom(want / 64, 0);
  if (!levels_.empty()) {
    for (std::size_t i = 0; i < levels_[0].size(); ++i) bottom[i] = levels_[0][i];
  }
  levels_.clear();
  levels_.push_back(std::move(bottom));
  while (levels_.back().size() > 1) {
    const std::vector<std::uint64_t>& below = levels_.back();
    std::vector<std::uint64_t> up((below.size() + 63) / 64, 0);
    for (std::size_t i = 0; i < below.size(); ++i) {
      if (below[i]) up[i >> 6] |= std::uint64_t(1) << (i & 63);
    }
    levels_.push_back(std::move(up));
  }
  bits_ = want;
}

bool TerritoryIndex::check() const {
  std::size_t set = 0;
  for (std::size_t l = 0; l < levels_.size(); ++l) {
    const std::vector<std::uint64_t>& level = levels_[l];
    for (std::size_t i = 0; i < level.size(); ++i) {
      if (l + 1 < levels_.size()) {
        const bool summary = (levels_[l + 1][i >> 6] >> (i & 63)) & 1;
        if (summary != (level[i] != 0)) return false;
      }
      if (l == 0) {
        for (std::uint64_t w = level[i]; w; w &= w - 1) {
          const auto bit = static_cast<std::size_t>(__builtin_ctzll(w));
          if (!blocks_.find(base_ + (((i << 6) + bit) << shift_))) return false;
          ++set;
        }
      }
    }
  }
  if (set != blocks_.size()) return false;
  for (auto [key, block] : blocks_) {
    const auto* p = static_cast<const char*>(key);
    if (!block || p < base_) return false;
    const auto off = static_cast<std::size_t>(p - base_);
    if (off & ((std::size_t(1) << shift_) - 1)) return false;
  }
  return true;
}

}  // namespace renaissance
