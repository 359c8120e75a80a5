// replay_table.cpp - see replay_table.h for the invariants.
#include "core/replay_table.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <stdexcept>

namespace renaissance {

void ReplayRoute::build(const std::vector<std::size_t>& offset,
                        const std::vector<std::size_t>& size) {
  if (offset.size() != size.size() || offset.size() >= 0xFFFFFFFFu) {
    throw std::invalid_argument("ReplayRoute::build: offsets and sizes differ in count or are too many");
  }
  offset_ = offset;
  size_ = size;
  start_.assign(1, 0);
  preds_.clear();
  // The painter's sweep: `paint` maps the start of each painted interval to
  // (its end, the last position that covered it); intervals are disjoint.
  std::map<std::size_t, std::pair<std::size_t, std::uint32_t>> paint;
  std::vector<std::uint32_t> found;
  for (std::size_t i = 0; i < offset.size(); ++i) {
    if (size[i] > 0) {
      const std::size_t lo = offset[i], hi = offset[i] + size[i];
      found.clear();
      auto it = paint.upper_bound(lo);
      if (it != paint.begin() && std::prev(it)->second.first > lo) --it;
      std::vector<std::pair<std::size_t, std::pair<std::size_t, std::uint32_t>>> keep;
      while (it != paint.end() && it->first < hi) {
        const std::size_t s = it->first, e = it->second.first;
        const std::uint32_t owner = it->second.second;
        found.push_back(owner);
        if (s < lo) keep.push_back({s, {lo, owner}});
        if (e > hi) keep.push_back({hi, {e, owner}});
        it = paint.erase(it);
      }
      for (const auto& k : keep) paint.emplace(k.first, k.second);
      paint.emplace(lo, std::make_pair(hi, static_cast<std::uint32_t>(i)));
      std::sort(found.begin(), found.end());
      found.erase(std::unique(found.begin(), found.end()), found.end());
      preds_.insert(preds_.end(), found.begin(), found.end());
    }
    start_.push_back(static_cast<std::uint32_t>(preds_.size()));
  }
}

void FastLive::reset(std::size_t capacity_hint) {
  std::size_t cap = 16;
  while (cap < 2 * capacity_hint) cap *= 2;
  if (slots_.size() != cap) {
    slots_.assign(cap, Slot{});
  } else if (used_ != 0) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
  }
  mask_ = cap - 1;
  shift_ = 64;
  for (std::size_t c = cap; c > 1; c >>= 1) --shift_;
  used_ = 0;
}

void FastLive::clear() {
  if (used_ == 0) return;
  std::fill(slots_.begin(), slots_.end(), Slot{});
  used_ = 0;
}

}  // namespace renaissance
