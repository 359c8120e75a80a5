// test_util.h - what the planner's C++ tests share: the CHECK macro and its
// count, a seeded problem generator (Gen), brute-force references (validity,
// LOAD, optimum) and generators of large recorded steps. One file of tests
// per planner module includes it (tests/cpp/planner/*_test.cpp), as
// MiniMalloc keeps a test file per source file; main.cpp runs them all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>
#include "core/planner.h"
#include "core/planner_bound.h"
#include "core/planner_instance.h"
#include "core/planner_search.h"
#include "core/planner_obstacles.h"

namespace plan_test {

namespace pl = renaissance::planner;
// Options::clock_seconds for the checks of plan quality or determinism: the
// work count alone stops the search, however loaded the machine.
constexpr double kNoClock = std::numeric_limits<double>::infinity();
using pl::Buffer;
using pl::FixedBuffer;
using pl::Problem;

inline int g_checks = 0;  // checks run, over every file

#define CHECK(cond, ...)                                              \
  do {                                                                \
    ++g_checks;                                                       \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "FAIL %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                              \
      std::fprintf(stderr, "\n");                                     \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

// Live ticks of a lifetime, with cyclic wrap-around.
inline std::vector<std::int64_t> ticks_of(std::int64_t lower, std::int64_t upper, std::int64_t period) {
  std::vector<std::int64_t> t;
  for (std::int64_t x = lower; x < upper; ++x) t.push_back(period > 0 ? x % period : x);
  return t;
}

inline bool share_tick(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  for (std::int64_t x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  }
  return false;
}

// Independent validity check: pairwise, tick by tick.
inline bool brute_valid(const Problem& p, const std::vector<std::uint64_t>& off) {
  const std::size_t n = p.buffers.size();
  std::vector<std::vector<std::int64_t>> t(n + p.fixed.size());
  for (std::size_t i = 0; i < n; ++i) t[i] = ticks_of(p.buffers[i].lower, p.buffers[i].upper, p.period);
  for (std::size_t j = 0; j < p.fixed.size(); ++j) {
    t[n + j] = ticks_of(p.fixed[j].lower, p.fixed[j].upper, p.period);
  }
  auto overlap = [](std::uint64_t a, std::uint64_t as, std::uint64_t b, std::uint64_t bs) {
    return as > 0 && bs > 0 && a < b + bs && b < a + as;
  };
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = i + 1; k < n; ++k) {
      if (overlap(off[i], p.buffers[i].size, off[k], p.buffers[k].size) && share_tick(t[i], t[k])) {
        return false;
      }
    }
    for (std::size_t j = 0; j < p.fixed.size(); ++j) {
      if (overlap(off[i], p.buffers[i].size, p.fixed[j].offset, p.fixed[j].size) &&
          share_tick(t[i], t[n + j])) {
        return false;
      }
    }
  }
  return true;
}

// LOAD by brute force: per tick, the live buffer sizes plus the bytes
// covered by the live fixed obstacles (overlapping obstacles count once).
inline std::uint64_t brute_load(const Problem& p) {
  std::int64_t horizon = p.period;
  for (const Buffer& b : p.buffers) horizon = std::max(horizon, b.upper);
  for (const FixedBuffer& f : p.fixed) horizon = std::max(horizon, f.upper);
  std::vector<std::uint64_t> live(static_cast<std::size_t>(horizon) + 1, 0);
  for (const Buffer& b : p.buffers) {
    for (std::int64_t x : ticks_of(b.lower, b.upper, p.period)) live[x] += b.size;
  }
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> fixed(live.size());
  for (const FixedBuffer& f : p.fixed) {
    for (std::int64_t x : ticks_of(f.lower, f.upper, p.period)) {
      fixed[x].push_back({f.offset, f.offset + f.size});
    }
  }
  for (std::size_t x = 0; x < live.size(); ++x) {
    std::sort(fixed[x].begin(), fixed[x].end());
    std::uint64_t covered = 0, end = 0;
    for (const auto& r : fixed[x]) {
      const std::uint64_t a = std::max(r.first, end);
      if (r.second > a) covered += r.second - a;
      end = std::max(end, r.second);
    }
    live[x] += covered;
  }
  return *std::max_element(live.begin(), live.end());
}

inline std::uint64_t plan_size(const Problem& p, const std::vector<std::uint64_t>& off) {
  std::uint64_t s = 0;
  for (std::size_t i = 0; i < p.buffers.size(); ++i) s = std::max(s, off[i] + p.buffers[i].size);
  for (const FixedBuffer& f : p.fixed) s = std::max(s, f.offset + f.size);
  return s;
}

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(std::uint64_t seed) : rng(seed) {}
  std::int64_t uni(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  }

  // A random well-formed problem. align > 0 makes every size and fixed
  // offset a multiple of it.
  Problem problem(int n, std::int64_t horizon, bool cyclic, int fixed, std::uint64_t align) {
    Problem p;
    p.period = cyclic ? horizon : 0;
    auto lifetime = [&](std::int64_t& lower, std::int64_t& upper) {
      lower = uni(0, horizon - 1);
      const std::int64_t max_len = cyclic ? horizon : horizon - lower;
      upper = lower + uni(1, std::max<std::int64_t>(1, uni(0, 3) == 0 ? max_len : std::min<std::int64_t>(max_len, 4)));
    };
    auto size = [&]() -> std::uint64_t {
      if (uni(0, 15) == 0) return 0;
      const std::uint64_t s = static_cast<std::uint64_t>(uni(1, uni(0, 3) == 0 ? 64 : 8));
      return align > 0 ? s * align : s;
    };
    for (int i = 0; i < n; ++i) {
      Buffer b;
      lifetime(b.lower, b.upper);
      b.size = size();
      p.buffers.push_back(b);
    }
    for (int j = 0; j < fixed; ++j) {
      FixedBuffer f;
      lifetime(f.lower, f.upper);
      f.size = size();
      // Disjoint bands, so fixed obstacles never overlap one another.
      f.offset = (70 * static_cast<std::uint64_t>(j) + static_cast<std::uint64_t>(uni(0, 5))) *
                 (align > 0 ? align : 1);
      p.fixed.push_back(f);
    }
    return p;
  }
};

// True when two fixed obstacles overlap in time and memory (LOAD counts
// their union).
inline bool fixed_overlap(const Problem& p) {
  for (std::size_t i = 0; i < p.fixed.size(); ++i) {
    for (std::size_t j = i + 1; j < p.fixed.size(); ++j) {
      const FixedBuffer& a = p.fixed[i];
      const FixedBuffer& b = p.fixed[j];
      if (a.size > 0 && b.size > 0 && a.offset < b.offset + b.size &&
          b.offset < a.offset + a.size &&
          share_tick(ticks_of(a.lower, a.upper, p.period), ticks_of(b.lower, b.upper, p.period))) {
        return true;
      }
    }
  }
  return false;
}

inline void check_plan(const Problem& p, const pl::Result& r, std::uint64_t align, const char* what) {
  CHECK(r.offsets.size() == p.buffers.size(), "%s: offsets size", what);
  const std::string err = pl::validate(p, r.offsets);
  CHECK(err.empty(), "%s: validate: %s", what, err.c_str());
  CHECK(brute_valid(p, r.offsets), "%s: brute-force check disagrees", what);
  CHECK(r.size == plan_size(p, r.offsets), "%s: size %llu vs %llu", what,
        static_cast<unsigned long long>(r.size),
        static_cast<unsigned long long>(plan_size(p, r.offsets)));
  CHECK(r.size >= r.load, "%s: size below LOAD", what);
  CHECK(r.load == pl::load(p), "%s: load mismatch", what);
  CHECK(r.size <= r.greedy_size, "%s: worse than greedy", what);
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].size == 0) CHECK(r.offsets[i] == 0, "%s: zero-size buffer offset", what);
    if (align > 0) CHECK(r.offsets[i] % align == 0, "%s: unaligned offset", what);
  }
  CHECK(!r.method.empty(), "%s: empty method", what);
}

inline void expect_throw(const Problem& p, const std::string& needle, const char* what) {
  bool thrown = false;
  std::string msg;
  try {
    pl::plan(p);
  } catch (const std::invalid_argument& e) {
    thrown = true;
    msg = e.what();
  }
  CHECK(thrown, "%s: no std::invalid_argument", what);
  CHECK(msg.find(needle) != std::string::npos, "%s: message '%s' lacks '%s'", what, msg.c_str(),
        needle.c_str());
  bool load_threw = false;
  try {
    pl::load(p);
  } catch (const std::invalid_argument&) {
    load_threw = true;
  }
  CHECK(load_threw, "%s: load() did not throw", what);
  bool greedy_threw = false;
  try {
    pl::greedy_by_size(p);
  } catch (const std::invalid_argument& e) {
    greedy_threw = std::string(e.what()).find(needle) != std::string::npos;
  }
  CHECK(greedy_threw, "%s: greedy_by_size() did not throw naming '%s'", what, needle.c_str());
}

// A random problem shaped like the arena's runtime ones: obstacles (most
// live for the whole horizon, some for part of it, some overlapping each
// other) scattered over a band, leaving gaps of about buffer size; buffers
// with cyclic (wrapping) or linear lifetimes.
inline Problem obstacle_problem(Gen& g, int n, std::int64_t horizon, bool cyclic, int fixed,
                         std::uint64_t align) {
  Problem p;
  p.period = cyclic ? horizon : 0;
  const std::uint64_t unit = align > 0 ? align : 1;
  auto lifetime = [&](std::int64_t& lower, std::int64_t& upper) {
    lower = g.uni(0, horizon - 1);
    const std::int64_t max_len = cyclic ? horizon : horizon - lower;
    const std::int64_t cap = g.uni(0, 2) == 0 ? max_len : std::min<std::int64_t>(max_len, 5);
    upper = lower + g.uni(1, std::max<std::int64_t>(1, cap));
  };
  for (int i = 0; i < n; ++i) {
    Buffer b;
    lifetime(b.lower, b.upper);
    const std::int64_t units = g.uni(1, g.uni(0, 2) == 0 ? 48 : 12);
    b.size = g.uni(0, 20) == 0 ? 0 : static_cast<std::uint64_t>(units) * unit;
    p.buffers.push_back(b);
  }
  std::uint64_t at = 0;
  for (int j = 0; j < fixed; ++j) {
    FixedBuffer f;
    const int kind = static_cast<int>(g.uni(0, 5));
    if (kind <= 3) {  // the whole horizon (a persistent block)
      f.lower = 0;
      f.upper = horizon;
    } else {
      lifetime(f.lower, f.upper);
    }
    at += static_cast<std::uint64_t>(g.uni(0, 24));
    if (kind == 5 && at >= 4) at -= 4;  // overlaps the previous one
    f.offset = at * unit;
    f.size = static_cast<std::uint64_t>(g.uni(1, 10)) * unit;
    at += f.size / unit;
    p.fixed.push_back(f);
  }
  return p;
}

// Brute force with obstacles: every order, each buffer at the lowest offset
// above the earlier ones it overlaps and clear of the obstacles it overlaps
// (canonical placement is complete with obstacles too).
inline std::uint64_t brute_optimum(const Problem& p) {
  std::vector<std::size_t> perm;
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].size > 0) perm.push_back(i);
  }
  std::vector<std::vector<std::int64_t>> t(p.buffers.size()), tf(p.fixed.size());
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    t[i] = ticks_of(p.buffers[i].lower, p.buffers[i].upper, p.period);
  }
  std::uint64_t fixed_top = 0;
  for (std::size_t j = 0; j < p.fixed.size(); ++j) {
    tf[j] = ticks_of(p.fixed[j].lower, p.fixed[j].upper, p.period);
    if (p.fixed[j].size > 0) fixed_top = std::max(fixed_top, p.fixed[j].offset + p.fixed[j].size);
  }
  std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
  do {
    std::vector<std::uint64_t> off(p.buffers.size(), 0);
    std::uint64_t h = fixed_top;
    for (std::size_t k = 0; k < perm.size(); ++k) {
      const std::size_t i = perm[k];
      const std::uint64_t size = p.buffers[i].size;
      std::uint64_t o = 0;
      for (std::size_t j = 0; j < k; ++j) {
        if (share_tick(t[i], t[perm[j]])) o = std::max(o, off[perm[j]] + p.buffers[perm[j]].size);
      }
      for (bool moved = true; moved;) {
        moved = false;
        for (std::size_t j = 0; j < p.fixed.size(); ++j) {
          const FixedBuffer& f = p.fixed[j];
          if (f.size > 0 && f.offset < o + size && o < f.offset + f.size &&
              share_tick(t[i], tf[j])) {
            o = f.offset + f.size;
            moved = true;
          }
        }
      }
      off[i] = o;
      h = std::max(h, o + size);
    }
    best = std::min(best, h);
  } while (std::next_permutation(perm.begin(), perm.end()));
  return best;
}

// A buffer size of a generated step: 512-byte multiples from 512 B to
// 64 MiB, spread evenly over the powers of two.
inline std::uint64_t step_size(Gen& g) {
  const int e = static_cast<int>(g.uni(9, 26));
  return ((std::uint64_t{1} << e) + static_cast<std::uint64_t>(g.uni(0, (1 << e) - 1))) / 512 * 512;
}

// A random order of the n free items (a permutation drawn from g).
inline std::vector<std::uint32_t> shuffled_order(std::uint32_t n, Gen& g) {
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), g.rng);
  return order;
}

// A recorded training step of n allocations in event order: each event
// allocates a new buffer or frees a random live one (equally likely, so the
// live set wanders); sizes are 512-byte multiples from 512 B to 64 MiB,
// spread evenly over the powers of two.
inline Problem step_random_frees(Gen& g, int n) {
  Problem p;
  std::vector<std::size_t> live;
  std::int64_t t = 0;
  int made = 0;
  while (made < n || !live.empty()) {
    if (made < n && (live.empty() || g.uni(0, 99) < 52)) {
      Buffer b;
      b.size = step_size(g);
      b.lower = t;
      b.upper = t + 1;
      p.buffers.push_back(b);
      live.push_back(p.buffers.size() - 1);
      ++made;
    } else {
      const std::size_t k = static_cast<std::size_t>(g.uni(0, static_cast<std::int64_t>(live.size()) - 1));
      p.buffers[live[k]].upper = t;
      live[k] = live.back();
      live.pop_back();
    }
    ++t;
  }
  return p;
}

// n buffers, buffer i allocated at i and freed at a random later time
// (uniform up to the step's end): long, overlapping lifetimes.
inline Problem step_random_lifetimes(Gen& g, int n) {
  Problem p;
  for (int i = 0; i < n; ++i) {
    Buffer b;
    b.size = step_size(g);
    b.lower = i;
    b.upper = g.uni(i + 1, n);
    p.buffers.push_back(b);
  }
  return p;
}

// n short-lived buffers: buffer i allocated at i, freed 1 to `max_len` ticks
// later.
inline Problem step_short_lived(Gen& g, int n, std::int64_t max_len) {
  Problem p;
  for (int i = 0; i < n; ++i) {
    Buffer b;
    b.size = step_size(g);
    b.lower = i;
    b.upper = i + g.uni(1, max_len);
    p.buffers.push_back(b);
  }
  return p;
}

}  // namespace plan_test
