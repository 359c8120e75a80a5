// search_test.cpp - tests of the canonical search (core/planner_search.h): exact on tiny instances, raise, the failed-state table, MiniMalloc B and E at LOAD.
// Run by tests/cpp/planner/main.cpp (build/plan_test).
#include <string>

#include "test_util.h"

namespace plan_test {

// The canonical search is exact: on tiny instances it finds the optimum
// (brute force over all placement orders, each buffer at the top of the
// earlier ones it overlaps) and proves one byte less infeasible.
void test_search_exact(int iterations) {
  namespace d = renaissance::planner::detail;
  Gen g(4);
  for (int it = 0; it < iterations; ++it) {
    const Problem p = g.problem(static_cast<int>(g.uni(2, 7)), g.uni(2, 10), it % 3 == 0, 0, 0);
    const d::Instance inst(p);
    if (inst.num_free < 2) continue;
    const std::uint64_t best = brute_optimum(p);
    const d::ObstacleMap map(inst);
    d::CanonicalSearch search(inst, map);
    std::vector<std::uint32_t> order = shuffled_order(inst.num_free, g);
    d::Work work(std::numeric_limits<std::uint64_t>::max(), 60);
    std::vector<std::uint64_t> offs(inst.num_items, d::kUnplaced);
    CHECK(search.solve(best, order, std::numeric_limits<std::uint64_t>::max(), work, offs) ==
              d::CanonicalSearch::Status::kFound,
          "search misses the optimum %llu (iteration %d)", static_cast<unsigned long long>(best), it);
    std::vector<std::uint64_t> full(p.buffers.size(), 0);
    for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = offs[i];
    CHECK(pl::validate(p, full).empty() && plan_size(p, full) <= best, "search plan invalid");
    CHECK(search.solve(best - 1, order, std::numeric_limits<std::uint64_t>::max(), work, offs) ==
              d::CanonicalSearch::Status::kInfeasible,
          "search beats the optimum (iteration %d)", it);
    // The same with each part re-ordered by MiniMalloc-style keys.
    std::uint64_t rng = static_cast<std::uint64_t>(it);
    const d::OrderKeys keys = d::order_keys(inst, it % 2 ? "TWA" : "WAT", it % 3 ? 0.3 : 0.0, rng);
    offs.assign(inst.num_items, d::kUnplaced);
    CHECK(search.solve(best, order, std::numeric_limits<std::uint64_t>::max(), work, offs, &keys) ==
              d::CanonicalSearch::Status::kFound,
          "re-ordering search misses the optimum (iteration %d)", it);
    for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = offs[i];
    CHECK(pl::validate(p, full).empty() && plan_size(p, full) <= best,
          "re-ordering search plan invalid");
    CHECK(search.solve(best - 1, order, std::numeric_limits<std::uint64_t>::max(), work, offs,
                       &keys) == d::CanonicalSearch::Status::kInfeasible,
          "re-ordering search beats the optimum (iteration %d)", it);
    // plan() with a budget reaches the optimum on such tiny instances.
    pl::Options o;
    o.budget_seconds = 0.05;
    o.clock_seconds = kNoClock;  // quality and determinism are asserted
    const pl::Result r = pl::plan(p, o);
    CHECK(r.size == best, "plan %llu vs optimum %llu (iteration %d)",
          static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(best), it);
  }
}

// Large steps. Regression: plan() took 13-63 s on such 100,000-buffer
// steps with the runtime budget of 0.25 s (55 s to minutes with budget 0),
// and later up to 2 x budget + 0.25 s (the old safety cap). Validity,
// determinism (whenever the work count stopped the search) and the Result
// fields are checked always; wall time only with `timings` (100,000 buffers
// then, 20,000 otherwise), since it depends on the machine's load.
// search_small with the capacity-targeted raise (the schedule plan() runs on
// whole instances), started from best fit by size: on tiny instances with a
// brute-force optimum, every plan it returns is valid and never below the
// optimum, the lower bound it raises by proving capacities infeasible never
// passes the optimum, and with ample work it ends at the optimum. Some
// iterations start from a height above the bound by more than one raise
// step, so that the raise levels run (not only the search at the bound).
void test_search_raise(int iterations) {
  namespace d = renaissance::planner::detail;
  Gen g(41);
  int raised = 0;
  for (int it = 0; it < iterations; ++it) {
    const Problem p = g.problem(static_cast<int>(g.uni(3, 7)), g.uni(2, 10), it % 4 == 0, 0, 0);
    const d::Instance inst(p);
    if (inst.num_free < 2) continue;
    const std::uint64_t best = brute_optimum(p);
    const d::ObstacleMap map(inst);
    std::uint64_t lb = inst.load;
    // A stacked start (every buffer above the one before): valid, and
    // usually far above the bound.
    std::vector<std::uint64_t> offs = d::initial_offsets(inst);
    std::uint64_t height = 0;
    for (std::uint32_t i = 0; i < inst.num_free; ++i) {
      offs[i] = height;
      height += inst.size[i];
    }
    raised += height > lb + lb / 100 + 1;
    std::string method = "stacked";
    d::Work work(std::uint64_t{1} << 32, 60.0);
    d::search_small(inst, map, lb, static_cast<std::uint64_t>(it), work, height, offs, method,
                    /*raise=*/true);
    std::vector<std::uint64_t> full(p.buffers.size(), 0);
    for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = offs[i];
    CHECK(pl::validate(p, full).empty(), "raise: invalid plan (iteration %d)", it);
    CHECK(plan_size(p, full) <= height, "raise: height %llu below the plan's %llu (iteration %d)",
          static_cast<unsigned long long>(height),
          static_cast<unsigned long long>(plan_size(p, full)), it);
    CHECK(lb <= best, "raise: bound %llu passes the optimum %llu (iteration %d)",
          static_cast<unsigned long long>(lb), static_cast<unsigned long long>(best), it);
    CHECK(height == best, "raise: height %llu vs optimum %llu (iteration %d)",
          static_cast<unsigned long long>(height), static_cast<unsigned long long>(best), it);
  }
  CHECK(raised > iterations / 4, "raise: only %d of %d starts above the first raise level",
        raised, iterations);
}

// The memo tests' instances: 8-16 buffers, every third cyclic, every fourth
// with obstacles.
Problem memo_problem(Gen& g, int it) {
  return g.problem(static_cast<int>(g.uni(8, 16)), g.uni(4, 12), it % 3 == 1, it % 4 == 0 ? 2 : 0, 0);
}

// The canonical search's table of failed states changes no verdict: on
// random instances of 8-16 buffers (some cyclic, some with obstacles), at
// every capacity from LOAD up to the first feasible one, the search with
// the table and without it (the reference) agree on found / infeasible,
// so both find the same optimum, and a found plan is valid and within the
// capacity. The table must also be used (hits > 0 over the run), or this
// would test nothing.
void test_search_memo(int iterations) {
  namespace d = renaissance::planner::detail;
  Gen g(11);
  std::uint64_t hits = 0;
  int compared = 0;
  for (int it = 0; it < iterations; ++it) {
    const Problem p = memo_problem(g, it);
    const d::Instance inst(p);
    if (inst.num_free < 2) continue;
    const d::ObstacleMap map(inst);
    d::CanonicalSearch with(inst, map), without(inst, map);
    without.set_failure_memo(false);
    std::vector<std::uint32_t> order = shuffled_order(inst.num_free, g);
    std::uint64_t rng = static_cast<std::uint64_t>(it);
    const d::OrderKeys keys = d::order_keys(inst, it % 2 ? "TWA" : "WAT", 0.0, rng);
    const d::OrderKeys* rerank = it % 2 ? &keys : nullptr;
    const std::uint64_t limit = 200000;
    for (std::uint64_t cap = std::max(inst.load, inst.fixed_top);; ++cap) {
      d::Work w1(std::numeric_limits<std::uint64_t>::max(), 600.0);
      d::Work w2(std::numeric_limits<std::uint64_t>::max(), 600.0);
      std::vector<std::uint64_t> o1 = d::initial_offsets(inst), o2 = o1;
      const auto ref = without.solve(cap, order, limit, w2, o2, rerank);
      if (ref == d::CanonicalSearch::Status::kAborted) break;  // too hard to compare
      const auto got = with.solve(cap, order, limit, w1, o1, rerank);
      hits += with.memo_hits();
      ++compared;
      CHECK(got == ref, "memo: verdict %d vs %d without the table at capacity %llu (iteration %d)",
            static_cast<int>(got), static_cast<int>(ref), static_cast<unsigned long long>(cap), it);
      CHECK(with.nodes() <= without.nodes(), "memo: %llu nodes vs %llu without (iteration %d)",
            static_cast<unsigned long long>(with.nodes()),
            static_cast<unsigned long long>(without.nodes()), it);
      if (got != d::CanonicalSearch::Status::kFound) continue;
      std::vector<std::uint64_t> full(p.buffers.size(), 0);
      for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = o1[i];
      CHECK(pl::validate(p, full).empty() && plan_size(p, full) <= cap,
            "memo: plan invalid or above %llu (iteration %d)", static_cast<unsigned long long>(cap),
            it);
      break;
    }
  }
  std::printf("plan_test: table of failed states: same verdict with and without it in %d searches, "
              "%llu earlier failures reused (statistics, not errors)\n", compared,
              static_cast<unsigned long long>(hits));
  CHECK(compared >= iterations / 2, "memo: only %d searches compared", compared);
  CHECK(hits > 0, "memo: the table of failed states was never used (%d searches)", compared);
}

// The table of failed states kept from one solve() to the next (same
// capacity, pre-order and re-ordering keys; emptied when any differs) changes
// no verdict: on random instances of 8-16 buffers (some cyclic, some with
// obstacles), one search object is asked capacities from LOAD up to the
// first feasible one in a shuffled sequence, under four (pre-order,
// re-ordering keys) pairs (two pre-orders without re-ordering, one with
// each of two keys) and small node limits doubling after every aborted
// call, as search_small's rounds do; each verdict other than "aborted" must
// equal that of a fresh search without the table and without a node limit
// (the reference), so a table carried over to another capacity or order
// or keys (whose entries do not hold there) would show as a wrong
// "infeasible".
// The carried table must be used: hits in calls that were not the first for
// their (capacity, order), summed over the run.
void test_search_memo_kept(int iterations) {
  namespace d = renaissance::planner::detail;
  Gen g(23);
  std::uint64_t carried_hits = 0;
  int compared = 0;
  // At least 8 instances: the first few seeded ones carry no failed state
  // from one call to the next (`plan_test 4` failed the check below before
  // any search change), and the check is about the table, not the count.
  iterations = std::max(iterations, 8);
  for (int it = 0; it < iterations; ++it) {
    const Problem p = memo_problem(g, it);
    const d::Instance inst(p);
    if (inst.num_free < 2) continue;
    const d::ObstacleMap map(inst);
    d::CanonicalSearch kept(inst, map), ref(inst, map);
    ref.set_failure_memo(false);
    constexpr int kConfigs = 4;
    const std::vector<std::uint32_t> o0 = shuffled_order(inst.num_free, g);
    const std::vector<std::uint32_t> o1 = shuffled_order(inst.num_free, g);
    std::uint64_t rng = static_cast<std::uint64_t>(it);
    const d::OrderKeys twa = d::order_keys(inst, "TWA", 0.0, rng);
    const d::OrderKeys wat = d::order_keys(inst, "WAT", 0.0, rng);
    const std::vector<std::uint32_t>* orders[kConfigs] = {&o0, &o1, &o0, &o0};
    const d::OrderKeys* rerank[kConfigs] = {nullptr, nullptr, &twa, &wat};
    // Capacities from LOAD up to the first feasible one (the reference
    // decides; a search too long for it ends the range).
    std::vector<std::uint64_t> caps;
    std::vector<d::CanonicalSearch::Status> verdict[kConfigs];
    for (std::uint64_t cap = std::max(inst.load, inst.fixed_top); caps.size() < 6; ++cap) {
      d::CanonicalSearch::Status v[kConfigs];
      bool aborted = false;
      for (int o = 0; o < kConfigs; ++o) {
        d::Work w(std::numeric_limits<std::uint64_t>::max(), 600.0);
        std::vector<std::uint64_t> offs = d::initial_offsets(inst);
        v[o] = ref.solve(cap, *orders[o], 400000, w, offs, rerank[o]);
        aborted |= v[o] == d::CanonicalSearch::Status::kAborted;
      }
      if (aborted) break;
      caps.push_back(cap);
      for (int o = 0; o < kConfigs; ++o) verdict[o].push_back(v[o]);
      if (v[0] == d::CanonicalSearch::Status::kFound) break;
    }
    if (caps.empty()) continue;
    // (capacity index, order) pairs, each asked until it gives a verdict,
    // interleaved at random; a pair's limit doubles after each abort.
    struct Ask {
      std::size_t cap;
      int order;
      std::uint64_t limit;
      int calls;
      bool done;
    };
    std::vector<Ask> asks;
    for (std::size_t c = 0; c < caps.size(); ++c) {
      for (int o = 0; o < kConfigs; ++o) asks.push_back({c, o, 2, 0, false});
    }
    for (std::size_t left = asks.size(); left > 0;) {
      Ask& a = asks[static_cast<std::size_t>(g.uni(0, static_cast<std::int64_t>(asks.size()) - 1))];
      if (a.done) continue;
      // Repeat the same pair a few times in a row too (the table is kept
      // only then).
      for (int rep = static_cast<int>(g.uni(1, 3)); rep > 0 && !a.done; --rep) {
        d::Work w(std::numeric_limits<std::uint64_t>::max(), 600.0);
        std::vector<std::uint64_t> offs = d::initial_offsets(inst);
        const auto got =
            kept.solve(caps[a.cap], *orders[a.order], a.limit, w, offs, rerank[a.order]);
        if (a.calls++ > 0) carried_hits += kept.memo_hits();
        if (got == d::CanonicalSearch::Status::kAborted) {
          a.limit *= 2;
          continue;
        }
        a.done = true;
        --left;
        ++compared;
        CHECK(got == verdict[a.order][a.cap],
              "kept memo: verdict %d vs %d (reference) at capacity %llu, order %d, call %d "
              "(iteration %d)",
              static_cast<int>(got), static_cast<int>(verdict[a.order][a.cap]),
              static_cast<unsigned long long>(caps[a.cap]), a.order, a.calls, it);
        if (got != d::CanonicalSearch::Status::kFound) continue;
        std::vector<std::uint64_t> full(p.buffers.size(), 0);
        for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = offs[i];
        CHECK(pl::validate(p, full).empty() && plan_size(p, full) <= caps[a.cap],
              "kept memo: plan invalid or above %llu (iteration %d)",
              static_cast<unsigned long long>(caps[a.cap]), it);
      }
    }
  }
  std::printf("plan_test: kept memo: %d verdicts compared, %llu hits carried over\n", compared,
              static_cast<unsigned long long>(carried_hits));
  CHECK(compared >= iterations, "kept memo: only %d verdicts compared", compared);
  CHECK(carried_hits > 0, "kept memo: no state found failed by an earlier call (%d verdicts)",
        compared);
}

// Reads a MiniMalloc challenging instance
// (../shared/data/traces/dsa/minimalloc_X.csv) of `buffers` buffers whose
// LOAD is 1,048,576 bytes into `p`; false (and a line saying so) when the
// shared data is absent.
bool load_minimalloc(char letter, std::size_t buffers, Problem& p) {
  const std::string path = std::string("../shared/data/traces/dsa/minimalloc_") + letter + ".csv";
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    std::printf("plan_test: ../shared/data absent, MiniMalloc %c skipped\n", letter);
    return false;
  }
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long id = 0, lower = 0, upper = 0, size = 0;
    if (std::sscanf(line, "%lld,%lld,%lld,%lld", &id, &lower, &upper, &size) != 4) continue;
    p.buffers.push_back({static_cast<std::uint64_t>(size), lower, upper});
  }
  std::fclose(f);
  CHECK(p.buffers.size() == buffers, "MiniMalloc %c: %zu buffers, not %zu", letter,
        p.buffers.size(), buffers);
  CHECK(pl::load(p) == 1048576, "MiniMalloc %c: LOAD %llu", letter,
        static_cast<unsigned long long>(pl::load(p)));
  return true;
}

// A MiniMalloc challenging instance (skipped when absent) at its LOAD,
// 1,048,576 bytes: the canonical search with the pre-order `order_name`
// (parts re-ordered as they split) finds a plan there within `node_limit`
// nodes.
void check_minimalloc_at_load(char letter, std::size_t buffers, const char* order_name,
                              std::uint64_t node_limit) {
  namespace d = renaissance::planner::detail;
  Problem p;
  if (!load_minimalloc(letter, buffers, p)) return;
  const d::Instance inst(p);
  const d::ObstacleMap map(inst);
  d::CanonicalSearch search(inst, map);
  std::uint64_t rng = 0;
  const d::OrderKeys keys = d::order_keys(inst, order_name, 0.0, rng);
  const std::vector<std::uint32_t> order = d::preorder(keys, d::pressures(inst));
  d::Work work(std::numeric_limits<std::uint64_t>::max(), 600.0);
  std::vector<std::uint64_t> offs = d::initial_offsets(inst);
  const auto status = search.solve(inst.load, order, node_limit, work, offs, &keys);
  CHECK(status == d::CanonicalSearch::Status::kFound,
        "MiniMalloc %c at LOAD: status %d after %llu nodes", letter, static_cast<int>(status),
        static_cast<unsigned long long>(search.nodes()));
  std::vector<std::uint64_t> full(p.buffers.size(), 0);
  for (std::uint32_t i = 0; i < inst.num_free; ++i) full[inst.buffer_of[i]] = offs[i];
  CHECK(pl::validate(p, full).empty() && plan_size(p, full) == 1048576,
        "MiniMalloc %c: plan invalid or not at LOAD", letter);
}

// plan() on MiniMalloc B with the default 1 s budget, clock off (the work
// count alone, so the same plan on any machine): within +2% of LOAD, the
// issue's target (it is at LOAD, reported optimal, since the exact
// schedule's rounds keep their tables of failed states and it has half of
// the early work; before, +4.98%: the rounds redid their work, and LOAD
// took 3 s).
void test_plan_minimalloc_b_within_1s() {
  Problem p;
  if (!load_minimalloc('B', 170, p)) return;
  pl::Options o;
  o.budget_seconds = 1.0;
  o.clock_seconds = kNoClock;
  const pl::Result r = pl::plan(p, o);
  CHECK(pl::validate(p, r.offsets).empty(), "MiniMalloc B at 1 s: invalid plan");
  CHECK(r.size <= 1048576 + 1048576 / 50, "MiniMalloc B at 1 s: %llu, more than +2%% over LOAD",
        static_cast<unsigned long long>(r.size));
  std::printf("plan_test: MiniMalloc B at 1 s of work: %+.3f%% over LOAD%s\n",
              100.0 * (static_cast<double>(r.size) / 1048576.0 - 1.0),
              r.optimal ? ", optimal" : "");
}

// MiniMalloc B with the TAW pre-order: 167,709 nodes with the table of
// failed states, 207,457 without (the same path otherwise), so within
// 180,000.
void test_search_memo_minimalloc_b() { check_minimalloc_at_load('B', 170, "TAW", 180000); }

// MiniMalloc E with the TWA pre-order: within 700,000 nodes (507k here).
// Regression: the section bounds were checked only inside the first part of
// a split, so placements MiniMalloc prunes by checking the whole partition
// before it splits were searched below; that search gave up after 3,000,000
// nodes. MiniMalloc finds E with TWA too.
void test_search_checks_before_split() { check_minimalloc_at_load('E', 215, "TWA", 700000); }

}  // namespace plan_test
