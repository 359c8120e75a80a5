// planner_obstacles.cpp - per-tick obstacle profiles (see planner_obstacles.h).
//
// Invariants kept here: a profile is built once per distinct set of merged
// obstacle spans (ticks share it); the work is O(changes x live obstacles)
// plus O(ticks), and the map is left empty when the first term would pass
// kMaxBuildWork; usable() never counts a free range shorter than the class
// threshold and never counts obstacle bytes.
#include "core/planner_obstacles.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

namespace renaissance::planner::detail {
namespace {

// At most this many size classes; and at most this many suffix entries in
// all (beyond it, one class: the plain free bytes).
constexpr std::size_t kMaxClasses = 16;
constexpr std::size_t kMaxSuffix = std::size_t{1} << 22;
// At most this many live obstacles copied over all the ticks where the live
// set changes; beyond it (obstacles with many different lifetimes, many of
// them live at once) the map is left empty, which every user reads as "no
// obstacle information": bounds and pruning are then only weaker.
constexpr std::size_t kMaxBuildWork = std::size_t{1} << 20;

}  // namespace

void merge_spans(std::vector<Span>& spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.off != b.off ? a.off < b.off : a.end < b.end;
  });
  std::size_t w = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (w > 0 && spans[i].off <= spans[w - 1].end) {
      spans[w - 1].end = std::max(spans[w - 1].end, spans[i].end);
    } else {
      spans[w++] = spans[i];
    }
  }
  spans.resize(w);
}

ObstacleMap::ObstacleMap(const Instance& inst) {
  const std::uint32_t n = inst.num_free;
  if (inst.num_items == n || inst.ticks <= 0) return;
  // Ticks where the set of live obstacles changes.
  // (tick, item) for a start, (tick, item + num_items) for an end; all the
  // events of a tick are applied before its profile is built.
  std::vector<std::pair<std::int32_t, std::uint32_t>> events;
  for (std::uint32_t i = n; i < inst.num_items; ++i) {
    for (std::uint32_t k = inst.piece_begin[i]; k < inst.piece_begin[i + 1]; ++k) {
      events.push_back({inst.pieces[k].lo, i});
      events.push_back({inst.pieces[k].hi, i + inst.num_items});
    }
  }
  std::sort(events.begin(), events.end(),
            Stop::polled(inst.stop, std::less<std::pair<std::int32_t, std::uint32_t>>()));
  profile_of_.assign(static_cast<std::size_t>(inst.ticks), kNone);
  std::multiset<std::pair<std::uint64_t, std::uint64_t>> live;
  std::map<std::vector<std::pair<std::uint64_t, std::uint64_t>>, std::uint32_t> known;
  std::vector<Span> spans;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> key;
  std::size_t e = 0, built = 0;
  while (e < events.size()) {
    poll(inst.stop);
    const std::int32_t t = events[e].first;
    for (; e < events.size() && events[e].first == t; ++e) {
      const bool end = events[e].second >= inst.num_items;
      const std::uint32_t item = end ? events[e].second - inst.num_items : events[e].second;
      const std::uint64_t o = inst.fixed_offset[item - n];
      if (end) {
        live.erase(live.find({o, o + inst.size[item]}));
      } else {
        live.insert({o, o + inst.size[item]});
      }
    }
    if (t >= inst.ticks) break;
    const std::int32_t next =
        e < events.size() ? std::min(events[e].first, inst.ticks) : inst.ticks;
    if (live.empty()) continue;
    built += live.size();
    if (built > kMaxBuildWork) {
      profiles_.clear();
      break;
    }
    spans.clear();
    for (const auto& s : live) spans.push_back({s.first, s.second});
    merge_spans(spans);
    key.clear();
    for (const Span& s : spans) key.push_back({s.off, s.end});
    auto it = known.find(key);
    if (it == known.end()) {
      it = known.emplace(key, static_cast<std::uint32_t>(profiles_.size())).first;
      Profile p;
      p.spans = spans;
      p.below.assign(spans.size() + 1, 0);
      std::uint64_t cur = 0;
      for (std::size_t k = 0; k < spans.size(); ++k) {
        p.below[k + 1] = p.below[k] + (spans[k].end - spans[k].off);
        if (spans[k].off > cur) p.gaps.push_back({cur, spans[k].off});
        cur = spans[k].end;
      }
      p.top = cur;
      profiles_.push_back(std::move(p));
    }
    for (std::int32_t x = t; x < next; ++x) profile_of_[static_cast<std::size_t>(x)] = it->second;
  }
  if (profiles_.empty()) {
    profile_of_.clear();
    return;
  }
  // Size classes.
  std::vector<std::uint64_t> sizes(inst.size.begin(), inst.size.begin() + n);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (!sizes.empty()) {
    thresholds_.push_back(sizes.front());
    std::size_t entries = 0;
    for (const Profile& p : profiles_) {
      entries += p.gaps.size() + 1;
      for (const Span& g : p.gaps) {
        auto it = std::upper_bound(sizes.begin(), sizes.end(), g.end - g.off);
        if (it != sizes.end()) thresholds_.push_back(*it);
      }
    }
    std::sort(thresholds_.begin(), thresholds_.end());
    thresholds_.erase(std::unique(thresholds_.begin(), thresholds_.end()), thresholds_.end());
    if (thresholds_.size() > kMaxClasses) {
      std::vector<std::uint64_t> keep;
      for (std::size_t k = 0; k < kMaxClasses; ++k) {
        keep.push_back(thresholds_[k * (thresholds_.size() - 1) / (kMaxClasses - 1)]);
      }
      keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
      thresholds_.swap(keep);
    }
    if (entries * thresholds_.size() > kMaxSuffix) thresholds_.resize(1);
  } else {
    thresholds_.push_back(1);
  }
  const std::size_t classes = thresholds_.size();
  for (Profile& p : profiles_) {
    const std::size_t g = p.gaps.size();
    p.suffix.assign(classes * (g + 1), 0);
    for (std::size_t c = 0; c < classes; ++c) {
      std::uint64_t* s = p.suffix.data() + c * (g + 1);
      for (std::size_t k = g; k-- > 0;) {
        const std::uint64_t len = p.gaps[k].end - p.gaps[k].off;
        s[k] = s[k + 1] + (len >= thresholds_[c] ? len : 0);
      }
    }
  }
}

bool ObstacleMap::has_gaps() const {
  for (const Profile& p : profiles_) {
    for (const Span& g : p.gaps) {
      if (g.end - g.off >= thresholds_[0]) return true;
    }
  }
  return false;
}

std::uint32_t ObstacleMap::class_of(std::uint64_t size) const {
  const auto it = std::upper_bound(thresholds_.begin(), thresholds_.end(), size);
  return it == thresholds_.begin() ? 0
                                   : static_cast<std::uint32_t>(it - thresholds_.begin() - 1);
}

std::uint64_t ObstacleMap::bytes_below(const Profile& p, std::uint64_t x) const {
  const auto it = std::upper_bound(p.spans.begin(), p.spans.end(), x,
                                   [](std::uint64_t v, const Span& s) { return v < s.end; });
  const std::size_t k = static_cast<std::size_t>(it - p.spans.begin());
  std::uint64_t b = p.below[k];
  if (k < p.spans.size() && p.spans[k].off < x) b += x - p.spans[k].off;
  return b;
}

std::uint64_t ObstacleMap::bytes(std::uint32_t profile, std::uint64_t from,
                                 std::uint64_t to) const {
  if (to <= from) return 0;
  const Profile& p = profiles_[profile];
  return bytes_below(p, to) - bytes_below(p, from);
}

std::uint64_t ObstacleMap::usable(std::uint32_t profile, std::uint32_t cls, std::uint64_t from,
                                  std::uint64_t to) const {
  if (to <= from) return 0;
  const Profile& p = profiles_[profile];
  const std::uint64_t min_len = thresholds_[cls];
  // First gap ending after `from`.
  const auto it = std::upper_bound(p.gaps.begin(), p.gaps.end(), from,
                                   [](std::uint64_t v, const Span& s) { return v < s.end; });
  std::size_t g = static_cast<std::size_t>(it - p.gaps.begin());
  std::uint64_t sum = 0;
  if (to >= p.top) {
    if (g < p.gaps.size() && p.gaps[g].off <= from) {
      const std::uint64_t len = p.gaps[g].end - from;
      if (len >= min_len) sum += len;
      ++g;
    }
    sum += p.suffix[cls * (p.gaps.size() + 1) + g];
    const std::uint64_t base = std::max(from, p.top);
    if (to - base >= min_len) sum += to - base;
    return sum;
  }
  for (; g < p.gaps.size() && p.gaps[g].off < to; ++g) {
    const std::uint64_t a = std::max(from, p.gaps[g].off), b = std::min(to, p.gaps[g].end);
    if (b - a >= min_len) sum += b - a;
  }
  return sum;
}

}  // namespace renaissance::planner::detail
