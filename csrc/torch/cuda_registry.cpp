// cuda_registry.cpp - see cuda_registry.h.
#include "torch/cuda_registry.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>

#include "core/cuda_device.h"
#include "core/errors.h"
#include "torch/no_destructor.h"

namespace renaissance::cuda::detail {

Registry& registry() {
  static NoDestructor<Registry> r;
  return r.get();
}

DeviceState* find_state(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return registry().devices[device].load(std::memory_order_acquire);
}

std::size_t effective_limit(std::size_t install_limit, double fraction, std::size_t total) {
  const auto limit = std::max<std::size_t>(
      static_cast<std::size_t>(fraction * static_cast<double>(total)), 1);
  return install_limit == 0 ? limit : std::min(install_limit, limit);
}

DeviceState& state(int device) {
  if (DeviceState* s = find_state(device)) return *s;
  if (device < 0 || device >= kMaxDevices) {
    throw DeviceError("torch_renaissance: invalid CUDA device index " + std::to_string(device));
  }
  Registry& r = registry();
  DeviceState* s = nullptr;
  {
    std::lock_guard g(r.mu);
    if (DeviceState* known = r.devices[device].load(std::memory_order_acquire)) return *known;
    ArenaConfig config = r.config;
    auto f = r.fractions.find(device);
    if (f != r.fractions.end()) {
      const std::size_t total = CudaDevice(device).mem_info().total_bytes;
      config.max_reserved_bytes = effective_limit(config.max_reserved_bytes, f->second, total);
    }
    // The arena's first use of the device probes its virtual memory: with
    // the device made current the way PyTorch does it, so that CudaDevice's
    // own guard switches nothing (switching back with cudaSetDevice would
    // put a context on the caller's device).
    std::optional<DeviceScope> scope;
    if (device < CudaDevice::device_count()) scope.emplace(static_cast<c10::DeviceIndex>(device));
    r.owned.push_back(std::make_unique<DeviceState>(device, config));
    s = r.owned.back().get();
    r.devices[device].store(s, std::memory_order_release);
  }
  // Once per device (its state is made once), outside the lock: the
  // warning handler may run Python.
  if (const std::string refused = s->device->vmm_refusal(); !refused.empty()) {
    TORCH_WARN(refused);
  }
  return *s;
}

}  // namespace renaissance::cuda::detail
