// bound_test.cpp - tests of the lower bounds (core/planner_bound.h): hand-made cases.
// Run by tests/cpp/planner/main.cpp (build/plan_test).
#include "test_util.h"

namespace plan_test {

// The obstacle-aware bound on hand-made cases: a buffer larger than every
// gap must go on top; small buffers share the gaps.
void test_bound_cases() {
  namespace d = renaissance::planner::detail;
  Problem p;
  p.period = 10;
  // Obstacles [0,8) [16,24) [32,40) for the whole period: gaps of 8 at 8 and 24.
  p.fixed = {{0, 8, 0, 10}, {16, 8, 0, 10}, {32, 8, 0, 10}};
  p.buffers = {{12, 0, 10}};  // fits no gap: top bin [40, 52)
  CHECK(pl::load(p) == 36, "load of the gap case");
  CHECK(d::lower_bound(d::Instance(p)) == 52, "bound of a buffer larger than the gaps: %llu",
        static_cast<unsigned long long>(d::lower_bound(d::Instance(p))));
  const pl::Result r = pl::plan(p);
  CHECK(r.size == 52 && r.method == "greedy_by_size", "plan of the gap case: %llu %s",
        static_cast<unsigned long long>(r.size), r.method.c_str());
  // Two buffers of 6 live together: one per gap (the knapsack leaves 2 free
  // in each); a third one goes on top.
  p.buffers = {{6, 2, 12}, {6, 3, 8}, {6, 4, 6}};
  CHECK(d::lower_bound(d::Instance(p)) == 46, "bound of the knapsack case: %llu",
        static_cast<unsigned long long>(d::lower_bound(d::Instance(p))));
  check_plan(p, pl::plan(p), 0, "knapsack case");
  CHECK(pl::plan(p).size == 46, "plan of the knapsack case");
}

}  // namespace plan_test
