// plan_bench.cpp - standalone benchmark of the static memory planner.
//
// Build (from the repository root):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/cpp/plan_bench.cpp csrc/core/planner*.cpp -o /tmp/plan_bench
// Run:
//   /tmp/plan_bench [--budget=SECONDS] [--seed=N] FILE.csv...
//
// Each CSV has the header `id,lower,upper,size` (lifetime [lower, upper),
// size in bytes). Prints one row per file: buffers, LOAD, best fit by
// decreasing size, the planner's result (bytes and % over LOAD), planning
// seconds and the method that produced the plan. Every plan is checked
// with validate(); an invalid plan makes the program exit with status 1.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/planner.h"

namespace {

using renaissance::planner::Buffer;
using renaissance::planner::Problem;

Problem read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  Problem problem;
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line_no == 1 && line.rfind("id", 0) == 0) continue;  // header
    std::stringstream ss(line);
    std::string id, lower, upper, size;
    if (!std::getline(ss, id, ',') || !std::getline(ss, lower, ',') ||
        !std::getline(ss, upper, ',') || !std::getline(ss, size, ',')) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": expected 4 fields");
    }
    try {
      Buffer b;
      b.lower = std::stoll(lower);
      b.upper = std::stoll(upper);
      b.size = std::stoull(size);
      problem.buffers.push_back(b);
    } catch (const std::exception&) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": bad number");
    }
  }
  return problem;
}

std::string base_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::size_t dot = name.rfind(".csv");
  return dot == std::string::npos ? name : name.substr(0, dot);
}

double over(std::uint64_t size, std::uint64_t load) {
  return load == 0 ? 0.0 : 100.0 * (static_cast<double>(size) / static_cast<double>(load) - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  renaissance::planner::Options options;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--budget=", 0) == 0) {
      options.budget_seconds = std::atof(arg.c_str() + 9);
    } else if (arg.rfind("--seed=", 0) == 0) {
      options.seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: %s [--budget=SECONDS] [--seed=N] FILE.csv...\n", argv[0]);
      return 0;
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--budget=SECONDS] [--seed=N] FILE.csv...\n", argv[0]);
    return 2;
  }
  std::printf("budget %.2f s, seed %llu\n", options.budget_seconds,
              static_cast<unsigned long long>(options.seed));
  std::printf("%-36s %7s %15s %15s %8s %15s %8s %7s  %s\n", "instance", "buffers", "LOAD",
              "greedy_by_size", "greedy%", "ours", "ours%", "sec", "method");
  int status = 0;
  for (const std::string& file : files) {
    try {
      const Problem problem = read_csv(file);
      const auto result = renaissance::planner::plan(problem, options);
      const std::string error = renaissance::planner::validate(problem, result.offsets);
      std::printf("%-36s %7zu %15llu %15llu %+7.3f%% %15llu %+7.3f%% %7.3f  %s%s\n",
                  base_name(file).c_str(), problem.buffers.size(),
                  static_cast<unsigned long long>(result.load),
                  static_cast<unsigned long long>(result.greedy_size),
                  over(result.greedy_size, result.load),
                  static_cast<unsigned long long>(result.size), over(result.size, result.load),
                  result.seconds, result.method.c_str(), error.empty() ? "" : "  INVALID");
      if (!error.empty()) {
        std::fprintf(stderr, "%s: invalid plan: %s\n", file.c_str(), error.c_str());
        status = 1;
      }
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", file.c_str(), e.what());
      status = 1;
    }
  }
  return status;
}
