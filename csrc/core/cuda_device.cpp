// cuda_device.cpp - see cuda_device.h for the invariants.
#include "core/cuda_device.h"
#include "core/cuda_stream.h"

#include <cuda.h>  // driver API types only: the functions come from entry points
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/errors.h"
#include "core/lock_order.h"

namespace renaissance {

namespace {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, int device) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  std::string where = device >= 0 ? " on cuda:" + std::to_string(device) : std::string();
  throw DeviceError(std::string("torch_renaissance: ") + call + " failed" + where + ": " +
                    cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

}  // namespace

// Checks a cudaError_t; throws DeviceError naming the call and the error.
#define TR_CUDA_CHECK(expr)                                    \
  do {                                                         \
    const cudaError_t tr_err_ = (expr);                        \
    if (tr_err_ != cudaSuccess) throw_cuda(tr_err_, #expr, index_); \
  } while (0)

namespace {

// Makes `index` the calling thread's device for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cudaError_t err = cudaGetDevice(&prev_);
    if (err != cudaSuccess) throw_cuda(err, "cudaGetDevice", index);
    if (prev_ != index) {
      err = cudaSetDevice(index);
      if (err != cudaSuccess) throw_cuda(err, "cudaSetDevice", index);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(prev_);  // best effort: a destructor cannot throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// Relaxed stream-capture mode for this thread while the guard lives: lets
// cudaMalloc / cuMemCreate run while a CUDA graph is being captured
// (PyTorch's caching allocator does the same).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(int index) {
    const cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode_);
    if (err != cudaSuccess) throw_cuda(err, "cudaThreadExchangeStreamCaptureMode", index);
  }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

cudaEvent_t to_event(EventId e) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(e)); }

bool env_disables_vmm() {
  const char* v = std::getenv("TORCH_RENAISSANCE_CUDA_VMM");
  return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 ||
               std::strcmp(v, "False") == 0 || std::strcmp(v, "no") == 0);
}

}  // namespace

// ---------------------------------------------------------------------------
// VMM: driver entry points and mapped handles
// ---------------------------------------------------------------------------

struct CudaDevice::Vmm {
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;  // optional
  decltype(&::cuDeviceGetAttribute) get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) get_granularity = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;

  std::size_t granularity = 0;
  std::size_t max_handle = 0;  // kMaxHandleBytes rounded down to granules (>= one)
  CUmemAllocationProp prop{};
  std::vector<CUmemAccessDesc> access;  // this device, then each peer (guarded by mu)

  lock_order::Mutex<lock_order::kLeaf> mu;  // held while calling the driver only
  struct Handle {
    CUmemGenericAllocationHandle handle = 0;
    std::size_t bytes = 0;  // mapped whole at its offset
    std::size_t live = 0;   // its granules not unmapped by unmap()
  };
  struct Granule {
    std::size_t handle = 0;  // offset of the handle backing it
    bool unmapped = false;   // unmap() was given it; still held by its handle
  };
  struct Range {
    std::size_t bytes = 0;
    std::map<std::size_t, Handle> handles;    // by offset
    std::map<std::size_t, Granule> granules;  // by offset: every granule a handle maps
  };
  std::map<std::uintptr_t, Range> ranges;  // by base address
  std::size_t held = 0;                    // bytes of unmapped granules still held

  std::string text(CUresult r) const {
    const char* s = nullptr;
    std::string out = error_string && error_string(r, &s) == CUDA_SUCCESS && s
                          ? std::string(s)
                          : "CUresult " + std::to_string(static_cast<int>(r));
    const char* n = nullptr;
    if (error_name && error_name(r, &n) == CUDA_SUCCESS && n) out += std::string(" (") + n + ")";
    return out;
  }
  [[noreturn]] void fail(CUresult r, const char* call, int device) const {
    throw DeviceError(std::string("torch_renaissance: ") + call + " failed on cuda:" +
                      std::to_string(device) + ": " + text(r));
  }
  // The range holding [p, p + bytes), or nullptr.
  Range* find(std::uintptr_t p, std::size_t bytes, std::uintptr_t* base) {
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return nullptr;
    --it;
    if (p - it->first > it->second.bytes || bytes > it->second.bytes - (p - it->first)) {
      return nullptr;
    }
    *base = it->first;
    return &it->second;
  }
};

namespace {

template <typename Fn>
bool resolve(const char* symbol, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  // The signatures we declare are those of CUDA 12.0's driver API.
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return false;
  }
  *out = reinterpret_cast<Fn>(fn);
  return true;
}

}  // namespace

void CudaDevice::init_vmm() const {
  std::call_once(vmm_once_, [this] {
    if (env_disables_vmm()) {
      vmm_status_ = "off: TORCH_RENAISSANCE_CUDA_VMM=0";
      return;
    }
    auto v = std::make_unique<Vmm>();
    struct Sym {
      const char* name;
      bool ok;
    };
    const Sym syms[] = {
        {"cuGetErrorString", resolve("cuGetErrorString", &v->error_string)},
        {"cuDeviceGetAttribute", resolve("cuDeviceGetAttribute", &v->get_attribute)},
        {"cuMemGetAllocationGranularity",
         resolve("cuMemGetAllocationGranularity", &v->get_granularity)},
        {"cuMemAddressReserve", resolve("cuMemAddressReserve", &v->address_reserve)},
        {"cuMemAddressFree", resolve("cuMemAddressFree", &v->address_free)},
        {"cuMemCreate", resolve("cuMemCreate", &v->create)},
        {"cuMemRelease", resolve("cuMemRelease", &v->release)},
        {"cuMemMap", resolve("cuMemMap", &v->map)},
        {"cuMemUnmap", resolve("cuMemUnmap", &v->unmap)},
        {"cuMemSetAccess", resolve("cuMemSetAccess", &v->set_access)},
    };
    (void)resolve("cuGetErrorName", &v->error_name);  // optional: names the error in messages
    for (const Sym& s : syms) {
      if (!s.ok) {
        vmm_status_ = std::string("off: ") + s.name + " not found in the CUDA driver";
        return;
      }
    }
    int supported = 0;
    CUresult r = v->get_attribute(
        &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, index_);
    if (r != CUDA_SUCCESS || !supported) {
      vmm_status_ = "off: the device does not support virtual memory management";
      return;
    }
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = index_;
    r = v->get_granularity(&v->granularity, &v->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || v->granularity == 0 ||
        (v->granularity & (v->granularity - 1)) != 0 || v->granularity % 512 != 0) {
      vmm_status_ = "off: cuMemGetAllocationGranularity failed: " + v->text(r);
      return;
    }
    v->max_handle = std::max(v->granularity, kMaxHandleBytes / v->granularity * v->granularity);
    CUmemAccessDesc own{};
    own.location = v->prop.location;
    own.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    v->access.push_back(own);
    const std::string refused = probe_vmm(*v);
    if (!refused.empty()) {
      vmm_status_ = "off: the driver refused a probe mapping: " + refused;
      vmm_refusal_ = "torch_renaissance: " + name() + " refused CUDA virtual memory (" + refused +
                     "): expandable segments are off on this device; memory comes from "
                     "cudaMalloc segments";
      return;
    }
    vmm_status_ = "on (granularity " + format_bytes(v->granularity) + ")";
    vmm_ = std::move(v);
  });
}

std::string CudaDevice::probe_vmm(const Vmm& v) const {
  DeviceGuard guard(index_);
  RelaxedCapture relaxed(index_);
  const std::size_t g = v.granularity;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  bool have_va = false, have_h = false, mapped = false;
  const char* call = "cuMemAddressReserve";
  CUresult r = v.address_reserve(&va, g, g, 0, 0);
  if (r == CUDA_SUCCESS) {
    have_va = true;
    call = "cuMemCreate";
    r = v.create(&h, g, &v.prop, 0);
  }
  if (r == CUDA_SUCCESS) {
    have_h = true;
    call = "cuMemMap";
    r = v.map(va, g, 0, h, 0);
  }
  if (r == CUDA_SUCCESS) {
    mapped = true;
    call = "cuMemSetAccess";
    r = v.set_access(va, g, v.access.data(), 1);
  }
  if (r == CUDA_SUCCESS) {
    call = "cuMemUnmap";
    r = v.unmap(va, g);
    mapped = r != CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) {
    call = "cuMemRelease";
    r = v.release(h);
    have_h = r != CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) {
    call = "cuMemAddressFree";
    r = v.address_free(va, g);
    have_va = r != CUDA_SUCCESS;
  }
  // Undo what a failure left (best effort: the answer is already known).
  if (mapped) (void)v.unmap(va, g);
  if (have_h) (void)v.release(h);
  if (have_va) (void)v.address_free(va, g);
  (void)cudaGetLastError();
  // Out of memory says nothing about support: the arena copes with it.
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY) return std::string();
  return std::string(call) + " failed: " + v.text(r);
}

// ---------------------------------------------------------------------------
// device
// ---------------------------------------------------------------------------

int CudaDevice::device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(std::string("torch_renaissance: CUDA is not usable here: "
                                  "cudaGetDeviceCount failed: ") +
                      cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
  }
  if (n <= 0) throw DeviceError("torch_renaissance: CUDA is not usable here: no CUDA device found");
  return n;
}

CudaDevice::CudaDevice(int index) : index_(index) {
  const int n = device_count();
  if (index < 0 || index >= n) {
    throw DeviceError("torch_renaissance: cuda:" + std::to_string(index) +
                      " does not exist (this machine has " + std::to_string(n) +
                      " CUDA device" + (n == 1 ? "" : "s") + ")");
  }
}

CudaDevice::~CudaDevice() {
  if (!vmm_) return;
  // Normally empty: arenas give back what they reserved. Best effort only:
  // the driver may already be shutting down.
  std::lock_guard g(vmm_->mu);
  for (auto& [base, range] : vmm_->ranges) {
    for (auto& [off, h] : range.handles) {
      (void)vmm_->unmap(static_cast<CUdeviceptr>(base + off), h.bytes);
      (void)vmm_->release(h.handle);
    }
    (void)vmm_->address_free(static_cast<CUdeviceptr>(base), range.bytes);
  }
}

void* CudaDevice::reserve(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceGuard guard(index_);
  RelaxedCapture relaxed(index_);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err == cudaErrorInvalidValue) {
    // Some drivers answer absurd sizes (beyond the device) this way.
    (void)cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && bytes > total_b) return nullptr;
    (void)cudaGetLastError();
    throw_cuda(err, "cudaMalloc", index_);
  }
  if (err != cudaSuccess) throw_cuda(err, "cudaMalloc", index_);
  return p;
}

void CudaDevice::release(void* ptr, std::size_t) {
  DeviceGuard guard(index_);
  TR_CUDA_CHECK(cudaFree(ptr));
}

MemInfo CudaDevice::mem_info() const {
  DeviceGuard guard(index_);
  RelaxedCapture relaxed(index_);
  MemInfo info;
  TR_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

// ---------------------------------------------------------------------------
// address ranges
// ---------------------------------------------------------------------------

bool CudaDevice::supports_address_ranges() const {
  init_vmm();
  return vmm_ != nullptr;
}

std::size_t CudaDevice::range_granularity() const {
  init_vmm();
  return vmm_ ? vmm_->granularity : 0;
}

std::string CudaDevice::vmm_status() const {
  init_vmm();
  return vmm_status_;
}

std::string CudaDevice::vmm_refusal() const {
  init_vmm();
  return vmm_refusal_;
}

std::size_t CudaDevice::held_bytes() const {
  init_vmm();
  if (!vmm_) return 0;
  std::lock_guard g(vmm_->mu);
  return vmm_->held;
}

void* CudaDevice::reserve_range(std::size_t bytes) {
  if (!supports_address_ranges() || bytes == 0 || bytes % vmm_->granularity) return nullptr;
  std::lock_guard g(vmm_->mu);
  RelaxedCapture relaxed(index_);
  CUdeviceptr p = 0;
  const CUresult r = vmm_->address_reserve(&p, bytes, vmm_->granularity, 0, 0);
  if (r != CUDA_SUCCESS) return nullptr;  // refused: the arena tries less, then fixed segments
  Vmm::Range range;
  range.bytes = bytes;
  vmm_->ranges.emplace(static_cast<std::uintptr_t>(p), std::move(range));
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}

void CudaDevice::release_range(void* base, std::size_t bytes) {
  if (!supports_address_ranges()) {
    throw DeviceError("torch_renaissance: release_range on " + name() + " without address ranges");
  }
  std::lock_guard g(vmm_->mu);
  auto it = vmm_->ranges.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == vmm_->ranges.end() || it->second.bytes != bytes) {
    throw DeviceError("torch_renaissance: release_range of an address range " + name() +
                      " did not reserve");
  }
  if (!it->second.handles.empty()) {
    throw DeviceError("torch_renaissance: release_range of a range that still has mapped memory");
  }
  const CUresult r = vmm_->address_free(static_cast<CUdeviceptr>(it->first), bytes);
  if (r != CUDA_SUCCESS) vmm_->fail(r, "cuMemAddressFree", index_);
  vmm_->ranges.erase(it);
}

bool CudaDevice::map(void* ptr, std::size_t bytes) {
  if (!supports_address_ranges()) return false;
  Vmm& v = *vmm_;
  const std::size_t gran = v.granularity;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard g(v.mu);
  std::uintptr_t base = 0;
  Vmm::Range* range = v.find(p, bytes, &base);
  if (!range || bytes == 0 || bytes % gran || (p - base) % gran) {
    throw DeviceError("torch_renaissance: map of a range that is not granule aligned inside an "
                      "address range of " + name());
  }
  const std::size_t first = p - base, end = first + bytes;
  std::size_t fresh = 0;  // bytes that need new handles (the rest is held, unmapped granules)
  for (std::size_t off = first; off < end; off += gran) {
    auto it = range->granules.find(off);
    if (it == range->granules.end()) {
      fresh += gran;
    } else if (!it->second.unmapped) {
      throw DeviceError("torch_renaissance: map of memory that is already mapped on " + name());
    }
  }
  DeviceGuard guard(index_);
  RelaxedCapture relaxed(index_);
  std::vector<std::pair<std::size_t, Vmm::Handle>> made;  // by offset
  auto rollback = [&] {
    for (auto& [off, h] : made) {
      (void)v.unmap(static_cast<CUdeviceptr>(base + off), h.bytes);
      (void)v.release(h.handle);
    }
  };
  if (fresh) {
    // Refuse at once what cannot fit, instead of creating handles until the
    // device runs out (and undoing them all).
    std::size_t free_b = 0, total_b = 0;
    TR_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (fresh > free_b) return false;
    // Each run of granules without a handle gets handles of at most
    // max_handle bytes.
    for (std::size_t off = first; off < end;) {
      if (range->granules.count(off)) {
        off += gran;
        continue;
      }
      std::size_t run_end = off;
      while (run_end < end && !range->granules.count(run_end)) run_end += gran;
      for (; off < run_end;) {
        const std::size_t sz = std::min(v.max_handle, run_end - off);
        Vmm::Handle h;
        h.bytes = sz;
        h.live = sz / gran;
        CUresult r = v.create(&h.handle, sz, &v.prop, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
          rollback();
          return false;
        }
        if (r != CUDA_SUCCESS) {
          rollback();
          v.fail(r, "cuMemCreate", index_);
        }
        r = v.map(static_cast<CUdeviceptr>(base + off), sz, 0, h.handle, 0);
        if (r != CUDA_SUCCESS) {
          (void)v.release(h.handle);
          rollback();
          v.fail(r, "cuMemMap", index_);
        }
        made.emplace_back(off, h);
        off += sz;
      }
    }
    // One call may span several mappings (held granules keep their access).
    const CUresult r = v.set_access(static_cast<CUdeviceptr>(p), bytes, v.access.data(), v.access.size());
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      rollback();
      return false;
    }
    if (r != CUDA_SUCCESS) {
      rollback();
      v.fail(r, "cuMemSetAccess", index_);
    }
  }
  for (std::size_t off = first; off < end; off += gran) {  // held granules come back
    auto it = range->granules.find(off);
    if (it == range->granules.end()) continue;
    it->second.unmapped = false;
    ++range->handles[it->second.handle].live;
    v.held -= gran;
  }
  for (auto& [off, h] : made) {
    for (std::size_t o = off; o < off + h.bytes; o += gran) range->granules[o] = Vmm::Granule{off, false};
    range->handles.emplace(off, h);
  }
  return true;
}

void CudaDevice::unmap(void* ptr, std::size_t bytes) { unmap_impl(ptr, bytes, nullptr); }

void CudaDevice::unmap_used_by(void* ptr, std::size_t bytes, const std::vector<StreamId>& streams) {
  unmap_impl(ptr, bytes, &streams);
}

void CudaDevice::unmap_impl(void* ptr, std::size_t bytes, const std::vector<StreamId>* streams) {
  if (!supports_address_ranges()) {
    throw DeviceError("torch_renaissance: unmap on " + name() + " without address ranges");
  }
  Vmm& v = *vmm_;
  const std::size_t gran = v.granularity;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard g(v.mu);
  std::uintptr_t base = 0;
  Vmm::Range* range = v.find(p, bytes, &base);
  if (!range || bytes % gran || (p - base) % gran) {
    throw DeviceError("torch_renaissance: unmap of a range that is not granule aligned inside "
                      "an address range of " + name());
  }
  const std::size_t first = p - base, end = first + bytes;
  std::map<std::size_t, std::size_t> covered;  // handle offset -> its granules in the range
  for (std::size_t off = first; off < end; off += gran) {
    auto it = range->granules.find(off);
    if (it == range->granules.end() || it->second.unmapped) {
      throw DeviceError("torch_renaissance: unmap of memory that is not mapped on " + name());
    }
    ++covered[it->second.handle];
  }
  DeviceGuard guard(index_);
  // Kernels still queued may use the memory: cuMemUnmap does not wait.
  if (!streams) {
    TR_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    std::vector<StreamId> done;
    for (StreamId s : *streams) {
      if (std::find(done.begin(), done.end(), s) != done.end()) continue;
      done.push_back(s);
      TR_CUDA_CHECK(cudaStreamSynchronize(to_stream(s)));
    }
  }
  // Handles whose last mapped granules these are go back to the driver; a
  // failure leaves the ones not yet given back as they were.
  std::vector<std::size_t> freed;
  for (auto& [hoff, n] : covered) {
    Vmm::Handle& h = range->handles[hoff];
    if (h.live != n) continue;
    CUresult r = v.unmap(static_cast<CUdeviceptr>(base + hoff), h.bytes);
    if (r != CUDA_SUCCESS) {
      for (std::size_t f : freed) {
        const Vmm::Handle& fh = range->handles[f];
        for (std::size_t o = f; o < f + fh.bytes; o += gran) {
          if (range->granules[o].unmapped) v.held -= gran;
          range->granules.erase(o);
        }
        range->handles.erase(f);
      }
      v.fail(r, "cuMemUnmap", index_);
    }
    freed.push_back(hoff);
  }
  CUresult release_error = CUDA_SUCCESS;
  for (std::size_t f : freed) {
    const Vmm::Handle& fh = range->handles[f];
    for (std::size_t o = f; o < f + fh.bytes; o += gran) {
      if (range->granules[o].unmapped) v.held -= gran;  // held by it until now
      range->granules.erase(o);
    }
    const CUresult r = v.release(fh.handle);
    if (r != CUDA_SUCCESS && release_error == CUDA_SUCCESS) release_error = r;
    range->handles.erase(f);
  }
  for (std::size_t off = first; off < end; off += gran) {  // the rest stays held
    auto it = range->granules.find(off);
    if (it == range->granules.end()) continue;
    it->second.unmapped = true;
    --range->handles[it->second.handle].live;
    v.held += gran;
  }
  if (release_error != CUDA_SUCCESS) v.fail(release_error, "cuMemRelease", index_);
}

void CudaDevice::add_peer_access(int peer) {
  if (peer == index_) return;
  const int n = device_count();
  if (peer < 0 || peer >= n) {
    throw DeviceError("torch_renaissance: peer access from cuda:" + std::to_string(peer) +
                      ", which does not exist (this machine has " + std::to_string(n) +
                      " CUDA device" + (n == 1 ? "" : "s") + ")");
  }
  if (!supports_address_ranges()) return;
  Vmm& v = *vmm_;
  std::lock_guard g(v.mu);
  for (const CUmemAccessDesc& a : v.access) {
    if (a.location.id == peer) return;
  }
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = peer;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DeviceGuard guard(index_);
  RelaxedCapture relaxed(index_);
  // One call per run of contiguous handles (a call may span several mappings).
  for (auto& [base, range] : v.ranges) {
    auto it = range.handles.begin();
    while (it != range.handles.end()) {
      const std::size_t start = it->first;
      std::size_t end = start + it->second.bytes;
      for (++it; it != range.handles.end() && it->first == end; ++it) end += it->second.bytes;
      const CUresult r = v.set_access(static_cast<CUdeviceptr>(base + start), end - start, &desc, 1);
      if (r != CUDA_SUCCESS) v.fail(r, "cuMemSetAccess", index_);
    }
  }
  v.access.push_back(desc);
}

// ---------------------------------------------------------------------------
// events
// ---------------------------------------------------------------------------

EventId CudaDevice::create_event() {
  DeviceGuard guard(index_);
  cudaEvent_t e = nullptr;
  TR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return static_cast<EventId>(reinterpret_cast<std::uintptr_t>(e));
}

void CudaDevice::destroy_event(EventId event) {
  DeviceGuard guard(index_);
  TR_CUDA_CHECK(cudaEventDestroy(to_event(event)));
}

void CudaDevice::record_event(EventId event, StreamId stream) {
  DeviceGuard guard(index_);
  TR_CUDA_CHECK(cudaEventRecord(to_event(event), to_stream(stream)));
}

bool CudaDevice::query_event(EventId event) {
  const cudaError_t err = cudaEventQuery(to_event(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  throw_cuda(err, "cudaEventQuery", index_);
}

bool CudaDevice::stream_idle(StreamId stream) {
  DeviceGuard guard(index_);
  cudaStream_t s = to_stream(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TR_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  if (status != cudaStreamCaptureStatusNone) return false;
  const cudaError_t err = cudaStreamQuery(s);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  throw_cuda(err, "cudaStreamQuery", index_);
}

void CudaDevice::synchronize_event(EventId event) {
  TR_CUDA_CHECK(cudaEventSynchronize(to_event(event)));
}

void CudaDevice::stream_wait_event(StreamId stream, EventId event) {
  DeviceGuard guard(index_);
  TR_CUDA_CHECK(cudaStreamWaitEvent(to_stream(stream), to_event(event), 0));
}

}  // namespace renaissance
