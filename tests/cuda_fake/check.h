// check.h - the small test harness of tests/cuda_fake's C++ programs:
// CHECK / CHECK_EQ / EXPECT_THROW (each throws Failure naming the line) and
// run_tests(), which runs named cases in order, prints PASS / FAIL per case
// and returns the exit status (0: all passed).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fake_cuda {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs fn, which must throw E whose message contains every one of `parts`.
template <typename E>
void expect_throw(const std::function<void()>& fn, const std::vector<std::string>& parts, int line) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& p : parts) {
      if (what.find(p) == std::string::npos) {
        throw Failure("line " + std::to_string(line) + ": message lacks '" + p + "': " + what);
      }
    }
    return;
  }
  throw Failure("line " + std::to_string(line) + ": expected an exception");
}

using TestList = std::vector<std::pair<const char*, std::function<void()>>>;

inline int run_tests(const TestList& tests) {
  int failed = 0;
  for (const auto& [name, fn] : tests) {
    try {
      fn();
      std::printf("PASS %s\n", name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s: %s\n", name, e.what());
    }
  }
  std::printf("%zu tests, %d failed\n", tests.size(), failed);
  return failed ? 1 : 0;
}

}  // namespace fake_cuda

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      throw ::fake_cuda::Failure(std::string(__FILE__ ":") + std::to_string(__LINE__) +        \
                                 ": CHECK(" #cond ") failed");                                 \
    }                                                                                          \
  } while (0)

#define CHECK_EQ(a, b)                                                                         \
  do {                                                                                         \
    const auto va_ = (a);                                                                      \
    const auto vb_ = (b);                                                                      \
    if (!(va_ == vb_)) {                                                                       \
      throw ::fake_cuda::Failure(std::string(__FILE__ ":") + std::to_string(__LINE__) +        \
                                 ": " #a " == " #b " failed: " + std::to_string(va_) + " vs " + \
                                 std::to_string(vb_));                                         \
    }                                                                                          \
  } while (0)

#define EXPECT_THROW(E, stmt, ...) \
  ::fake_cuda::expect_throw<E>([&] { stmt; }, {__VA_ARGS__}, __LINE__)
