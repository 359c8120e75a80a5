// planner_instance.cpp - validation, time compression and the LOAD profile.
//
// Invariants kept here (see planner_instance.h): a Problem is either rejected
// with std::invalid_argument naming the first bad entry, or normalized into
// pieces over compressed ticks that overlap exactly when the original
// lifetimes do; the total is checked against kMaxTotal (2^63); LOAD merges
// overlapping obstacles (a measure tree over their offsets and ends).
#include "core/planner_instance.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::planner::detail {
namespace {

[[noreturn]] void bad(const char* what, std::size_t index, const std::string& why) {
  throw std::invalid_argument(std::string("planner: ") + what + " " +
                              std::to_string(index) + ": " + why);
}

}  // namespace

int split_lifetime(std::int64_t lower, std::int64_t upper, std::int64_t period,
                   const char* what, std::size_t index, std::int64_t lo[2],
                   std::int64_t hi[2]) {
  if (lower < 0) {
    bad(what, index, "negative lower time " + std::to_string(lower));
  }
  if (upper <= lower) {
    bad(what, index,
        "upper (" + std::to_string(upper) + ") must be greater than lower (" +
            std::to_string(lower) + ")");
  }
  if (period == 0) {
    lo[0] = lower;
    hi[0] = upper;
    return 1;
  }
  if (lower >= period) {
    bad(what, index,
        "lower " + std::to_string(lower) + " not below period " +
            std::to_string(period));
  }
  if (upper - lower > period) {
    bad(what, index,
        "lifetime [" + std::to_string(lower) + ", " + std::to_string(upper) +
            ") longer than period " + std::to_string(period));
  }
  if (upper <= period) {
    lo[0] = lower;
    hi[0] = upper;
    return 1;
  }
  if (upper - lower == period) {  // the whole cycle
    lo[0] = 0;
    hi[0] = period;
    return 1;
  }
  lo[0] = lower;
  hi[0] = period;
  lo[1] = 0;
  hi[1] = upper - period;
  return 2;
}

void check_period(const Problem& problem) {
  if (problem.period < 0) {
    throw std::invalid_argument("planner: negative period " +
                                std::to_string(problem.period));
  }
  if (problem.buffers.size() + problem.fixed.size() >=
      static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() / 4)) {
    throw std::invalid_argument("planner: too many buffers");
  }
}

std::uint64_t check_sizes(const Problem& problem) {
  // Every fixed end, and the total (highest fixed end + every buffer size),
  // must be at most kMaxTotal: any offset + size the planner computes is
  // then at most kMaxTotal, and a sum of two of them still fits in 64 bits.
  std::uint64_t fixed_top = 0;
  for (std::size_t i = 0; i < problem.fixed.size(); ++i) {
    const FixedBuffer& f = problem.fixed[i];
    if (f.size > kMaxTotal || f.offset > kMaxTotal - f.size) {
      bad("fixed buffer", i,
          "end (offset " + std::to_string(f.offset) + " + size " + std::to_string(f.size) +
              ") exceeds 2^63");
    }
    fixed_top = std::max(fixed_top, f.offset + f.size);
  }
  std::uint64_t sum = fixed_top;
  for (std::size_t i = 0; i < problem.buffers.size(); ++i) {
    if (problem.buffers[i].size > kMaxTotal - sum) {
      bad("buffer", i,
          "total size (sum of buffer sizes + highest fixed end) exceeds 2^63, so offsets + "
          "sizes could overflow");
    }
    sum += problem.buffers[i].size;
  }
  return fixed_top;
}

namespace {

// Length of the union of a dynamic set of ranges over fixed coordinates
// (the classic measure tree): count_[v] is the number of ranges stored at
// node v (covering all of v's part), len_[v] the length of v's part covered
// by the ranges stored at v or below it. O(log m) an update.
class MeasureTree {
 public:
  explicit MeasureTree(std::vector<std::uint64_t> coords) : x_(std::move(coords)) {
    const std::size_t leaves = x_.size() > 1 ? x_.size() - 1 : 1;
    count_.assign(4 * leaves, 0);
    len_.assign(4 * leaves, 0);
  }
  // Adds (delta = +1) or removes (-1) the range [a, b), both in x_.
  void update(std::uint64_t a, std::uint64_t b, int delta) {
    const auto l = static_cast<std::size_t>(std::lower_bound(x_.begin(), x_.end(), a) - x_.begin());
    const auto r = static_cast<std::size_t>(std::lower_bound(x_.begin(), x_.end(), b) - x_.begin());
    if (l < r) update(1, 0, x_.size() - 1, l, r, delta);
  }
  std::uint64_t covered() const { return len_[1]; }

 private:
  void update(std::size_t v, std::size_t lo, std::size_t hi, std::size_t l, std::size_t r,
              int delta) {
    if (r <= lo || hi <= l) return;
    if (l <= lo && hi <= r) {
      count_[v] += delta;
    } else {
      const std::size_t m = lo + (hi - lo) / 2;
      update(2 * v, lo, m, l, r, delta);
      update(2 * v + 1, m, hi, l, r, delta);
    }
    if (count_[v] > 0) {
      len_[v] = x_[hi] - x_[lo];
    } else if (hi - lo == 1) {
      len_[v] = 0;
    } else {
      len_[v] = len_[2 * v] + len_[2 * v + 1];
    }
  }

  std::vector<std::uint64_t> x_;
  std::vector<std::int32_t> count_;
  std::vector<std::uint64_t> len_;
};

}  // namespace

std::int64_t Instance::length(std::uint32_t item) const {
  std::int64_t n = 0;
  for (std::uint32_t k = piece_begin[item]; k < piece_begin[item + 1]; ++k) {
    n += pieces[k].hi - pieces[k].lo;
  }
  return n;
}

Instance::Instance(const Problem& problem) {
  check_period(problem);
  fixed_top = check_sizes(problem);
  const std::int64_t period = problem.period;

  // Raw parts in original time, item by item.
  struct Raw {
    std::int64_t lo, hi;
    std::uint32_t item;
  };
  std::vector<Raw> raw;
  raw.reserve(problem.buffers.size() + problem.fixed.size());
  std::int64_t lo[2], hi[2];
  std::uint32_t item = 0;
  for (std::size_t i = 0; i < problem.buffers.size(); ++i) {
    const Buffer& b = problem.buffers[i];
    const int parts = split_lifetime(b.lower, b.upper, period, "buffer", i, lo, hi);
    if (b.size == 0) continue;
    for (int k = 0; k < parts; ++k) raw.push_back({lo[k], hi[k], item});
    size.push_back(b.size);
    start.push_back(b.lower);
    duration.push_back(b.upper - b.lower);
    buffer_of.push_back(static_cast<std::uint32_t>(i));
    ++item;
  }
  num_free = item;
  for (std::size_t i = 0; i < problem.fixed.size(); ++i) {
    const FixedBuffer& f = problem.fixed[i];
    const int parts =
        split_lifetime(f.lower, f.upper, period, "fixed buffer", i, lo, hi);
    if (f.size == 0) continue;
    for (int k = 0; k < parts; ++k) raw.push_back({lo[k], hi[k], item});
    size.push_back(f.size);
    start.push_back(f.lower);
    duration.push_back(f.upper - f.lower);
    fixed_offset.push_back(f.offset);
    ++item;
  }
  num_items = item;

  // Compress time: tick j is [times[j], times[j+1]).
  std::vector<std::int64_t> times;
  times.reserve(raw.size() * 2);
  for (const Raw& r : raw) {
    times.push_back(r.lo);
    times.push_back(r.hi);
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  ticks = times.empty() ? 0 : static_cast<std::int32_t>(times.size() - 1);
  auto tick_of = [&](std::int64_t t) {
    return static_cast<std::int32_t>(
        std::lower_bound(times.begin(), times.end(), t) - times.begin());
  };

  piece_begin.assign(num_items + 1, 0);
  pieces.reserve(raw.size());
  for (const Raw& r : raw) {
    pieces.push_back({tick_of(r.lo), tick_of(r.hi), r.item});
    ++piece_begin[r.item + 1];
  }
  for (std::uint32_t i = 0; i < num_items; ++i) {
    piece_begin[i + 1] += piece_begin[i];
    if (piece_begin[i + 1] - piece_begin[i] > 1) multi_piece = true;
  }

  // Live profile and LOAD: free buffers by size, fixed obstacles by the
  // union of their ranges (overlapping obstacles count once).
  live.assign(static_cast<std::size_t>(ticks) + 1, 0);
  std::vector<std::uint64_t> ends(static_cast<std::size_t>(ticks) + 1, 0);
  for (const Piece& p : pieces) {
    if (p.item >= num_free) continue;
    live[p.lo] += size[p.item];
    ends[p.hi] += size[p.item];
  }
  std::uint64_t cur = 0;
  for (std::int32_t t = 0; t < ticks; ++t) {
    cur = cur + live[t] - ends[t];
    live[t] = cur;
  }
  live.resize(static_cast<std::size_t>(ticks));
  if (num_items > num_free) {
    std::vector<std::uint64_t> coords;
    coords.reserve(2 * static_cast<std::size_t>(num_items - num_free));
    for (std::uint32_t i = num_free; i < num_items; ++i) {
      coords.push_back(fixed_offset[i - num_free]);
      coords.push_back(fixed_offset[i - num_free] + size[i]);
    }
    std::sort(coords.begin(), coords.end());
    coords.erase(std::unique(coords.begin(), coords.end()), coords.end());
    MeasureTree union_of(std::move(coords));
    // (tick, +1 start / -1 end, item): ends of a tick before its starts.
    struct Event {
      std::int32_t t;
      int delta;
      std::uint32_t item;
    };
    std::vector<Event> events;
    for (std::uint32_t k = piece_begin[num_free]; k < pieces.size(); ++k) {
      events.push_back({pieces[k].lo, 1, pieces[k].item});
      events.push_back({pieces[k].hi, -1, pieces[k].item});
    }
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      return a.t != b.t ? a.t < b.t : a.delta < b.delta;
    });
    std::size_t e = 0;
    for (std::int32_t t = 0; t < ticks; ++t) {
      for (; e < events.size() && events[e].t == t; ++e) {
        const std::uint64_t off = fixed_offset[events[e].item - num_free];
        union_of.update(off, off + size[events[e].item], events[e].delta);
      }
      live[t] += union_of.covered();
    }
  }
  load = 0;
  for (const std::uint64_t x : live) load = std::max(load, x);
}

}  // namespace renaissance::planner::detail
