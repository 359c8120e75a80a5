// free_cache.cpp - which front is the calling thread's (see free_cache.h),
// and giving fronts back when a thread exits.
#include "core/free_cache.h"

#include <algorithm>

#include "core/arena.h"

namespace renaissance {

namespace {

// Owns the calling thread's fronts; its destructor runs at thread exit.
struct ThreadFronts {
  std::vector<std::shared_ptr<Front>> fronts;
  ~ThreadFronts();
};

thread_local ThreadFronts t_fronts;
// Set once t_fronts is being destroyed: later calls (other thread-local
// destructors freeing memory) take the arena's slow path.
thread_local bool t_exiting = false;

ThreadFronts::~ThreadFronts() {
  t_exiting = true;
  front_tls::t_last_front = {0, nullptr};
  {
    for (auto& f : fronts) {
      std::lock_guard<std::mutex> g(f->registry->mu);  // the arena cannot go away meanwhile
      if (f->registry->arena) f->registry->arena->retire_front(*f);
    }
  }
}

}  // namespace

void lock_fronts(const std::vector<std::shared_ptr<Front>>& fronts) noexcept {
  bool remote = false;
  for (const auto& f : fronts) {
    f->lock.acquire_flag();
    remote |= !f->lock.owned_by_caller();
  }
  if (!remote) return;  // only the caller's own front: it is not in its fast path
  asym::heavy_fence();
  for (const auto& f : fronts) {
    if (!f->lock.owned_by_caller()) f->lock.wait_owner_out();
  }
}

void unlock_fronts(const std::vector<std::shared_ptr<Front>>& fronts) noexcept {
  for (auto it = fronts.rbegin(); it != fronts.rend(); ++it) (*it)->lock.unlock();
}

Front::Bin* Front::put_bin_hashed(std::size_t rounded, std::uint64_t stream) noexcept {
  return bins::put_bin<kDepth>(
      bins, bin_home(rounded, stream), kProbes,
      [&](const Bin& x) { return x.size == rounded && x.stream == stream; },
      [&](Bin& x) { set_key(x, rounded, stream); });
}

void Front::set_key(Bin& bin, std::size_t rounded, std::uint64_t stream) noexcept {
  // An empty bin that had another key (or none: size 0) takes this one; the
  // direct map follows both.
  forget_last();  // the hint's bin must keep its key
  if (std::uint8_t* d = direct_entry(bin.size, bin.stream); d && bin.size != 0) *d = 0;
  bin.size = rounded;
  bin.stream = stream;
  if (std::uint8_t* d = direct_entry(rounded, stream)) {
    *d = static_cast<std::uint8_t>(&bin - bins + 1);
  }
}

namespace front_tls {

#if defined(__GNUC__) && defined(__linux__)
__thread LastFront t_last_front __attribute__((tls_model("initial-exec"))) = {0, nullptr};
#else
thread_local LastFront t_last_front = {0, nullptr};
#endif

Front* find_slow(std::uint64_t serial) noexcept {
  if (t_exiting) return nullptr;
  for (auto& f : t_fronts.fronts) {
    if (f->arena_serial == serial) {
      t_last_front = {serial, f.get()};
      return f.get();
    }
  }
  return nullptr;
}

bool adopt(std::shared_ptr<Front> f) {
  if (t_exiting) return false;
  auto& v = t_fronts.fronts;
  // Fronts of arenas that are gone are dropped here (nothing to give back).
  // Called under an arena's lock: no registry mutex is taken here.
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const std::shared_ptr<Front>& x) { return !x->registry->alive.load(); }),
          v.end());
  t_last_front = {f->arena_serial, f.get()};
  v.push_back(std::move(f));
  return true;
}

}  // namespace front_tls

}  // namespace renaissance
