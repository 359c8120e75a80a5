// cpu_allocator.cpp - see cpu_allocator.h.
#include "torch/cpu_allocator.h"
#include "torch/no_destructor.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <new>

#include "core/host_device.h"

namespace renaissance {
namespace {

std::atomic<Arena*> g_arena{nullptr};

void free_cpu(void* ptr) noexcept {
  Arena* a = g_arena.load(std::memory_order_acquire);
  if (!a || !ptr) return;
  try {
    a->deallocate(ptr);
  } catch (const std::exception& e) {
    // A deleter cannot throw; this only happens if memory was corrupted.
    std::fprintf(stderr, "torch_renaissance: error freeing CPU memory: %s\n", e.what());
  }
}

class CpuArenaAllocator final : public c10::Allocator {
 public:
  explicit CpuArenaAllocator(Arena& arena) : arena_(arena) {}

  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    try {
      p = arena_.allocate(n, 0);
    } catch (const OutOfMemoryError& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    return {p, p, &free_cpu, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  Arena& arena_;
};

struct Registry {
  std::mutex mu;
  std::shared_ptr<Arena> arena;
  std::unique_ptr<CpuArenaAllocator> allocator;
};

Registry& registry() {
  static NoDestructor<Registry> r;
  return r.get();
}

}  // namespace

std::shared_ptr<Arena> install_cpu_allocator(const ArenaConfig& config) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.arena) return r.arena;
  r.arena = std::make_shared<Arena>(std::make_shared<HostDevice>(), config);
  r.allocator = std::make_unique<CpuArenaAllocator>(*r.arena);
  g_arena.store(r.arena.get(), std::memory_order_release);
  // A fork while another thread allocates must not leave the child with the
  // arena's lock held forever.
  static std::once_flag atfork;
  std::call_once(atfork, [] {
    pthread_atfork([] { if (Arena* a = g_arena.load()) a->lock_for_fork(); },
                   [] { if (Arena* a = g_arena.load()) a->unlock_after_fork(); },
                   [] { if (Arena* a = g_arena.load()) a->unlock_after_fork(); });
  });
  // Priority 1 wins over the default CPU allocator (registered at 0).
  c10::SetCPUAllocator(r.allocator.get(), /*priority=*/1);
  return r.arena;
}

}  // namespace renaissance
