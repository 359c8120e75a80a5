// plan_wallcheck.cpp - the planner's wall-clock promise, measured: plans the
// given CSV instances round robin at budgets 0.25 / 0.5 / 1 s and prints each
// run's plan_seconds - budget (Result::seconds, measured by plan() itself),
// then the worst and how many runs passed budget + 0.1 s (issue 12's target).
//
// Build (from the repository root):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/cpp/plan_wallcheck.cpp
//       csrc/core/planner*.cpp -o /tmp/plan_wallcheck   (one line)
// Run:
//   /tmp/plan_wallcheck RUNS FILE.csv...   (CSV header `id,lower,upper,size`)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/planner.h"

namespace {

using renaissance::planner::Buffer;
using renaissance::planner::Problem;

Problem load(const char* path) {
  Problem p;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(2);
  }
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string id, lower, upper, size;
    std::getline(ss, id, ',');
    std::getline(ss, lower, ',');
    std::getline(ss, upper, ',');
    std::getline(ss, size, ',');
    Buffer b;
    b.lower = std::stoll(lower);
    b.upper = std::stoll(upper);
    b.size = std::stoull(size);
    p.buffers.push_back(b);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s RUNS FILE.csv...\n", argv[0]);
    return 2;
  }
  const int runs = std::atoi(argv[1]);
  std::vector<Problem> problems;
  for (int i = 2; i < argc; ++i) problems.push_back(load(argv[i]));
  const double budgets[] = {0.25, 0.5, 1.0};
  double worst = -1e9;
  int over = 0;
  for (int k = 0; k < runs; ++k) {
    renaissance::planner::Options o;
    o.budget_seconds = budgets[k % 3];
    const std::size_t i = static_cast<std::size_t>(k) % problems.size();
    const renaissance::planner::Result r = renaissance::planner::plan(problems[i], o);
    const double d = r.seconds - o.budget_seconds;
    worst = d > worst ? d : worst;
    over += d > 0.1;
    std::printf("%-40s %.2f: %+.3f %s\n", argv[2 + i], o.budget_seconds, d, r.stopped_by.c_str());
  }
  std::printf("worst %+.3f, over 0.1: %d of %d\n", worst, over, runs);
  return 0;
}
