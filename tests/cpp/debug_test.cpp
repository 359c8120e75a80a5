// debug_test.cpp - TR_DEBUG (core/debug.h): built twice by `make test-cpp`,
// at TR_DEBUG=0 and TR_DEBUG=1. At level 0 a stat decreased below zero is
// clamped and reported (Stat::decrease returns false; the arena counts it in
// stat_underflows); at level >= 1 it is an assertion that aborts with a
// message naming the condition. The abort is checked in a forked child.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/debug.h"
#include "core/stats.h"

using namespace renaissance;

namespace {

// Runs f in a child with stderr on a pipe; returns (terminating signal or
// -exit status, what the child wrote to stderr).
template <typename F>
std::pair<int, std::string> in_child(F f) {
  int fds[2];
  if (pipe(fds) != 0) return {-999, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    f();
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return {WTERMSIG(status), err};
  return {-WEXITSTATUS(status), err};
}

}  // namespace

int main() {
  int failures = 0;
  // Within range: the same in every build.
  Stat ok;
  ok.increase(10);
  if (!ok.decrease(10) || ok.current != 0 || ok.freed != 10) {
    std::fprintf(stderr, "FAIL: a decrease to zero\n");
    ++failures;
  }
  const auto [sig, err] = in_child([] {
    Stat s;
    s.increase(5);
    const bool kept = s.decrease(6);  // one below zero
    _exit(kept ? 3 : (s.current == 0 ? 4 : 5));
  });
  if (debug::kLevel >= 1) {
    if (sig != SIGABRT || err.find("TR_DEBUG assertion failed: current >= amount") == std::string::npos ||
        err.find("stats.h") == std::string::npos) {
      std::fprintf(stderr, "FAIL: level %d: a stat below zero did not abort (signal %d, '%s')\n",
                   debug::kLevel, sig, err.c_str());
      ++failures;
    }
  } else if (sig != -4) {  // clamped at zero and reported as an underflow
    std::fprintf(stderr, "FAIL: level 0: a stat below zero gave %d, not a reported clamp\n", sig);
    ++failures;
  }
  if (failures) return 1;
  std::printf("debug_test (TR_DEBUG=%d): ok\n", debug::kLevel);
  return 0;
}
