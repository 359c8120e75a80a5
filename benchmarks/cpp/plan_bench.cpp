// plan_bench.cpp - standalone benchmark of the static memory planner.
//
// Build (from the repository root):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/cpp/plan_bench.cpp csrc/core/planner*.cpp -o /tmp/plan_bench
// Run:
//   /tmp/plan_bench [--budget=SECONDS] [--seed=N] [--no-clock] FILE.csv|FILE.json...
//
// Each CSV has the header `id,lower,upper,size` (lifetime [lower, upper),
// size in bytes). A .json file is a runtime problem recorded by the arena:
// an object with `sizes`, `lowers`, `uppers` (arrays of integers), `period`
// (integer) and `fixed` (array of [offset, size, lower, upper] obstacles);
// other keys are ignored. Prints one row per file: buffers, obstacles, LOAD,
// the obstacle-aware lower bound (% over LOAD, and the seconds it took), best
// fit by decreasing size, the planner's result (bytes and % over LOAD),
// planning seconds and the method that produced the plan. Every plan is
// checked with validate() and against the bound; an invalid plan, or one
// below the bound, makes the program exit with status 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/planner.h"
#include "core/planner_bound.h"
#include "core/planner_instance.h"

namespace {

using renaissance::planner::Buffer;
using renaissance::planner::FixedBuffer;
using renaissance::planner::Problem;

// A tiny JSON reader: enough for the fixed shape of the runtime problems
// (objects, arrays, integers, strings, true/false/null); numbers with a
// fraction or exponent are rejected where an integer is needed.
class Json {
 public:
  enum Kind { kNull, kNumber, kString, kArray, kObject };
  Kind kind = kNull;
  std::string text;  // number or string
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  static Json parse(const std::string& s) {
    std::size_t i = 0;
    Json j = value(s, i, 0);
    skip(s, i);
    if (i != s.size()) fail(i, "trailing characters");
    return j;
  }
  const Json* get(const std::string& key) const {
    for (const auto& f : fields) {
      if (f.first == key) return &f.second;
    }
    return nullptr;
  }
  std::int64_t integer() const {
    if (kind != kNumber) throw std::runtime_error("json: expected an integer");
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size()) throw std::runtime_error("json: bad integer " + text);
    return v;
  }
  std::uint64_t size() const {
    const std::int64_t v = integer();
    if (v < 0) throw std::runtime_error("json: negative size or offset " + text);
    return static_cast<std::uint64_t>(v);
  }

 private:
  [[noreturn]] static void fail(std::size_t at, const std::string& why) {
    throw std::runtime_error("json: " + why + " at byte " + std::to_string(at));
  }
  static void skip(const std::string& s, std::size_t& i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  static std::string string(const std::string& s, std::size_t& i) {
    std::string out;
    ++i;  // opening quote
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;  // keep the escaped char as is
      out += s[i++];
    }
    if (i >= s.size()) fail(i, "unterminated string");
    ++i;
    return out;
  }
  static Json value(const std::string& s, std::size_t& i, int depth) {
    if (depth > 64) fail(i, "nested too deeply");
    skip(s, i);
    if (i >= s.size()) fail(i, "unexpected end");
    Json j;
    const char c = s[i];
    if (c == '{' || c == '[') {
      const bool obj = c == '{';
      j.kind = obj ? kObject : kArray;
      ++i;
      skip(s, i);
      if (i < s.size() && s[i] == (obj ? '}' : ']')) {
        ++i;
        return j;
      }
      for (;;) {
        skip(s, i);
        if (obj) {
          if (i >= s.size() || s[i] != '"') fail(i, "expected a key");
          std::string key = string(s, i);
          skip(s, i);
          if (i >= s.size() || s[i] != ':') fail(i, "expected ':'");
          ++i;
          j.fields.emplace_back(std::move(key), value(s, i, depth + 1));
        } else {
          j.items.push_back(value(s, i, depth + 1));
        }
        skip(s, i);
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == (obj ? '}' : ']')) {
          ++i;
          return j;
        }
        fail(i, "expected ',' or a closing bracket");
      }
    }
    if (c == '"') {
      j.kind = kString;
      j.text = string(s, i);
      return j;
    }
    const std::size_t b = i;
    while (i < s.size() && std::string(",]} \n\r\t").find(s[i]) == std::string::npos) ++i;
    j.text = s.substr(b, i - b);
    if (j.text == "null" || j.text == "true" || j.text == "false") return j;
    if (j.text.empty()) fail(b, "expected a value");
    j.kind = kNumber;
    return j;
  }
};

Problem read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream buf;
  buf << in.rdbuf();
  const Json root = Json::parse(buf.str());
  auto array = [&](const char* key) -> const std::vector<Json>& {
    const Json* j = root.get(key);
    if (j == nullptr || j->kind != Json::kArray) {
      throw std::runtime_error(path + ": missing array '" + key + "'");
    }
    return j->items;
  };
  const auto& sizes = array("sizes");
  const auto& lowers = array("lowers");
  const auto& uppers = array("uppers");
  if (lowers.size() != sizes.size() || uppers.size() != sizes.size()) {
    throw std::runtime_error(path + ": sizes, lowers and uppers differ in length");
  }
  Problem problem;
  if (const Json* period = root.get("period")) problem.period = period->integer();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Buffer b;
    b.size = sizes[i].size();
    b.lower = lowers[i].integer();
    b.upper = uppers[i].integer();
    problem.buffers.push_back(b);
  }
  if (root.get("fixed") != nullptr) {
    for (const Json& f : array("fixed")) {
      if (f.kind != Json::kArray || f.items.size() != 4) {
        throw std::runtime_error(path + ": a fixed entry is not [offset, size, lower, upper]");
      }
      FixedBuffer fb;
      fb.offset = f.items[0].size();
      fb.size = f.items[1].size();
      fb.lower = f.items[2].integer();
      fb.upper = f.items[3].integer();
      problem.fixed.push_back(fb);
    }
  }
  return problem;
}

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
  const std::size_t dot = name.rfind('.');
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
    } else if (arg == "--no-clock") {
      // The work count alone stops the search: the plan an idle reference
      // machine gets, on any machine (planner.h, Options::clock_seconds).
      options.clock_seconds = std::numeric_limits<double>::infinity();
    } else if (arg.rfind("--seed=", 0) == 0) {
      options.seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: %s [--budget=SECONDS] [--seed=N] [--no-clock] FILE.csv|FILE.json...\n",
                  argv[0]);
      return 0;
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--budget=SECONDS] [--seed=N] [--no-clock] FILE.csv|FILE.json...\n",
                 argv[0]);
    return 2;
  }
  std::printf("budget %.2f s, seed %llu\n", options.budget_seconds,
              static_cast<unsigned long long>(options.seed));
  std::printf("%-36s %7s %5s %15s %8s %6s %15s %8s %15s %8s %7s  %s\n", "instance",
              "buffers", "fixed", "LOAD", "bound%", "b_sec", "greedy_by_size", "greedy%", "ours",
              "ours%", "sec", "method [stopped by]");
  namespace detail = renaissance::planner::detail;
  int status = 0;
  for (const std::string& file : files) {
    try {
      const bool json = file.size() > 5 && file.compare(file.size() - 5, 5, ".json") == 0;
      const Problem problem = json ? read_json(file) : read_csv(file);
      const auto result = renaissance::planner::plan(problem, options);
      const std::string error = renaissance::planner::validate(problem, result.offsets);
      // The obstacle-aware lower bound (planner_bound.h), timed on its own.
      const auto b0 = std::chrono::steady_clock::now();
      const std::uint64_t bound = detail::lower_bound(detail::Instance(problem));
      const double bound_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
      const char* flag = !error.empty() ? "  INVALID" : result.size < bound ? "  BELOW-BOUND" : "";
      std::printf(
          "%-36s %7zu %5zu %15llu %+7.3f%% %6.3f %15llu %+7.3f%% %15llu %+7.3f%% %7.3f  %s [%s]%s\n",
          base_name(file).c_str(), problem.buffers.size(), problem.fixed.size(),
          static_cast<unsigned long long>(result.load), over(bound, result.load), bound_seconds,
          static_cast<unsigned long long>(result.greedy_size),
          over(result.greedy_size, result.load), static_cast<unsigned long long>(result.size),
          over(result.size, result.load), result.seconds, result.method.c_str(),
          result.stopped_by.c_str(), flag);
      if (!error.empty()) {
        std::fprintf(stderr, "%s: invalid plan: %s\n", file.c_str(), error.c_str());
        status = 1;
      } else if (result.size < bound) {
        std::fprintf(stderr, "%s: plan below the lower bound (bound bug)\n", file.c_str());
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
