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
  pos_.assign(offset.size() + 1, Position{});
  for (std::size_t i = 0; i < offset.size(); ++i) {
    pos_[i].offset = offset[i];
    pos_[i].size = size[i];
  }
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
    pos_[i + 1].start = static_cast<std::uint32_t>(preds_.size());
  }
  // Spots: the distinct starts, in a read-only table at most half full.
  std::size_t planned = 0;
  top_ = 0;
  for (std::size_t i = 0; i < offset.size(); ++i) {
    if (size[i] > 0) {
      ++planned;
      top_ = std::max(top_, offset[i] + size[i]);
    }
  }
  std::size_t cap = 2;
  while (cap < 2 * planned) cap *= 2;
  if (cap - 1 > 0xFFFFFFFFu) {  // a spot is its slot's number, 32 bits
    throw std::invalid_argument("ReplayRoute::build: too many planned positions for the spot table");
  }
  table_.assign(cap, kNoKey);
  mask_ = cap - 1;
  shift_ = 64;
  for (std::size_t c = cap; c > 1; c >>= 1) --shift_;
  for (std::size_t i = 0; i < offset.size(); ++i) {
    if (size[i] == 0) continue;
    std::size_t h = home(offset[i]);
    while (table_[h] != kNoKey && table_[h] != offset[i]) h = (h + 1) & mask_;
    table_[h] = offset[i];
    pos_[i].spot = static_cast<std::uint32_t>(h);  // the spot is its slot
  }
}

void FastSlots::reset(std::size_t spots) {
  // Every spot is empty when nothing is live (take and take_all empty the
  // spots they take), so a table of the right size is kept as it is: an
  // arming (once a step) does not rewrite the route's whole table.
  if (at_.size() != spots) {
    at_.assign(spots, 0);
  } else if (live_ != 0) {
    std::fill(at_.begin(), at_.end(), 0);
  }
  live_ = 0;
}

}  // namespace renaissance
