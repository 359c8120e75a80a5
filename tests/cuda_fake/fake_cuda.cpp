// fake_cuda.cpp - see fake_cuda.h. Defines the CUDA runtime functions that
// csrc/core/cuda_device.cpp calls (their declarations come from the
// toolkit's cuda_runtime_api.h, so a signature that drifts fails to
// compile) and hands out fake driver VMM functions through the entry-point
// query. One mutex guards all state; per-thread state is thread_local.
#include "fake_cuda.h"

#include <cuda.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

namespace fake_cuda {
namespace {

struct Handle {
  std::size_t bytes = 0;
  int device = 0;
  bool released = false;  // cuMemRelease'd while mapped: freed at the last unmap
};
struct Reservation {
  std::size_t bytes = 0;
  void* mmap_base = nullptr;
  std::size_t mmap_bytes = 0;
};
struct Mapping {
  CUmemGenericAllocationHandle handle = 0;
  std::set<int> access;  // devices that may read and write it
};
struct Stream {
  bool busy = false;
  bool unrelated = false;  // its work never touches the memory under test
  std::uint64_t issued = 0;  // work items enqueued while busy
  std::uint64_t done = 0;    // of those, completed
  // Nothing enqueued since the last complete() / synchronize (the fake sees
  // event records only, so a busy stream is idle only once completed).
  bool quiet = true;
};
struct Event {
  cudaStream_t stream = nullptr;
  std::uint64_t seq = 0;
  bool recorded = false;
};
struct Malloc {
  std::size_t bytes = 0;
  int device = 0;
};

struct State {
  std::mutex mu;
  Config config;
  Counters counters;
  std::map<int, std::size_t> used;  // by device
  std::map<void*, Malloc> mallocs;
  std::map<CUmemGenericAllocationHandle, Handle> handles;
  CUmemGenericAllocationHandle next_handle = 1;
  std::map<std::uintptr_t, Reservation> reservations;
  std::map<std::uintptr_t, Mapping> mappings;  // by granule address
  std::map<cudaStream_t, Stream> streams;
  std::map<cudaEvent_t, Event> events;
  std::uintptr_t next_event = 0x10000;
  std::map<std::string, std::pair<int, int>> faults;  // function -> (skip, code)
  std::set<std::string> hidden;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> waits;
  bool capturing = false;
  std::set<std::pair<int, int>> peers;  // (device, peer) with peer access enabled
  std::set<int> contexts;  // devices with a primary context
  cudaError_t sticky = cudaSuccess;
};

State& state() {
  static State* s = new State();  // never destroyed: used until exit
  return *s;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

// Caller holds the lock. True when a fault is injected for this call.
bool injected(State& s, const char* function, int* code) {
  auto it = s.faults.find(function);
  if (it == s.faults.end()) return false;
  if (it->second.first > 0) {
    --it->second.first;
    return false;
  }
  *code = it->second.second;
  s.faults.erase(it);
  return true;
}

// Caller holds the lock: the calling thread's device gets a context (any
// runtime call that does work on the device creates it).
void touch(State& s) { s.contexts.insert(t_device); }

// Caller holds the lock: counts a call that a capture forbids.
void capture_check(State& s) {
  if (s.capturing) ++s.counters.calls_during_capture;
}

// A failing runtime call leaves its error for cudaGetLastError. So does
// "not ready" here: the CUDA runtime is not documented to keep it, but HIP
// does and PyTorch clears it after every query; so must we.
cudaError_t fail(cudaError_t err) {
  if (err != cudaSuccess) t_last_error = err;
  return err;
}

// Caller holds the lock: frees a handle's memory (its last mapping is gone).
void free_handle(State& s, std::map<CUmemGenericAllocationHandle, Handle>::iterator it) {
  s.used[it->second.device] -= it->second.bytes;
  s.counters.used_bytes -= static_cast<std::int64_t>(it->second.bytes);
  s.handles.erase(it);
}

bool handle_mapped(const State& s, CUmemGenericAllocationHandle h) {
  for (const auto& [addr, m] : s.mappings) {
    if (m.handle == h) return true;
  }
  return false;
}

bool incomplete_work(const State& s) {
  for (const auto& [stream, st] : s.streams) {
    if (!st.unrelated && st.done < st.issued) return true;
  }
  return false;
}

bool event_complete(State& s, const Event& e) {
  if (!e.recorded) return true;
  return s.streams[e.stream].done >= e.seq;
}

// --- fake driver functions (reached through the entry-point query) --------

// The driver's name and text of each error the fake can return.
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
};

const ErrorText* error_text(CUresult r) {
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == r) return &e;
  }
  return nullptr;
}

CUresult fake_cuGetErrorString(CUresult r, const char** out) {
  const ErrorText* e = error_text(r);
  *out = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult fake_cuGetErrorName(CUresult r, const char** out) {
  const ErrorText* e = error_text(r);
  *out = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult fake_cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuDeviceGetAttribute", &code)) return static_cast<CUresult>(code);
  if (dev < 0 || dev >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  if (attrib != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) return CUDA_ERROR_INVALID_VALUE;
  *pi = s.config.vmm ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                             CUmemAllocationGranularity_flags) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemGetAllocationGranularity", &code)) return static_cast<CUresult>(code);
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = s.config.granularity;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                   unsigned long long) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemAddressReserve", &code)) return static_cast<CUresult>(code);
  const std::size_t gran = s.config.granularity;
  if (size == 0 || size % gran || addr != 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t align = alignment ? alignment : gran;
  const std::size_t total = size + align;
  void* base = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uintptr_t aligned = (reinterpret_cast<std::uintptr_t>(base) + align - 1) / align * align;
  s.reservations[aligned] = Reservation{size, base, total};
  ++s.counters.live_reservations;
  *ptr = static_cast<CUdeviceptr>(aligned);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemAddressFree", &code)) return static_cast<CUresult>(code);
  auto it = s.reservations.find(static_cast<std::uintptr_t>(ptr));
  if (it == s.reservations.end() || it->second.bytes != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mappings.lower_bound(it->first);
  if (m != s.mappings.end() && m->first < it->first + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(it->second.mmap_base, it->second.mmap_bytes);
  s.reservations.erase(it);
  --s.counters.live_reservations;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned long long) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemCreate", &code)) return static_cast<CUresult>(code);
  if (s.sticky != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (t_mode != cudaStreamCaptureModeRelaxed) ++s.counters.allocations_not_relaxed;
  const int dev = prop->location.id;
  if (size == 0 || size % s.config.granularity || dev < 0 || dev >= s.config.devices) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (s.used[dev] + size > s.config.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
  s.used[dev] += size;
  s.counters.used_bytes += static_cast<std::int64_t>(size);
  *handle = s.next_handle++;
  s.handles[*handle] = Handle{size, dev};
  ++s.counters.live_handles;
  ++s.counters.handles_created;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemRelease", &code)) return static_cast<CUresult>(code);
  capture_check(s);
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  --s.counters.live_handles;
  // As the driver: memory still mapped is freed when its last mapping goes.
  if (handle_mapped(s, handle)) {
    it->second.released = true;
  } else {
    free_handle(s, it);
  }
  return CUDA_SUCCESS;
}

// Granule addresses of [ptr, ptr + size) when it lies granule-aligned inside
// one reservation; empty otherwise.
std::vector<std::uintptr_t> granules(State& s, CUdeviceptr ptr, size_t size) {
  const std::size_t gran = s.config.granularity;
  const auto p = static_cast<std::uintptr_t>(ptr);
  auto it = s.reservations.upper_bound(p);
  if (size == 0 || size % gran || it == s.reservations.begin()) return {};
  --it;
  if (p < it->first || (p - it->first) % gran || p + size > it->first + it->second.bytes) return {};
  std::vector<std::uintptr_t> out;
  for (std::uintptr_t a = p; a < p + size; a += gran) out.push_back(a);
  return out;
}

CUresult fake_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemMap", &code)) return static_cast<CUresult>(code);
  if (s.sticky != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  auto h = s.handles.find(handle);
  const auto gs = granules(s, ptr, size);
  if (h == s.handles.end() || h->second.released || offset != 0 || gs.empty() ||
      h->second.bytes != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (auto a : gs) {
    if (s.mappings.count(a)) return CUDA_ERROR_INVALID_VALUE;  // already mapped
  }
  for (auto a : gs) s.mappings[a] = Mapping{handle, {}};
  s.counters.live_mappings += static_cast<std::int64_t>(gs.size());
  return CUDA_SUCCESS;
}

CUresult fake_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemSetAccess", &code)) return static_cast<CUresult>(code);
  const auto gs = granules(s, ptr, size);
  if (gs.empty() || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE ||
        desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= s.config.devices) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (auto a : gs) {
    if (!s.mappings.count(a)) return CUDA_ERROR_INVALID_VALUE;
  }
  for (auto a : gs) {
    for (size_t i = 0; i < count; ++i) s.mappings[a].access.insert(desc[i].location.id);
  }
  mprotect(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), size, PROT_READ | PROT_WRITE);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  int code = 0;
  if (injected(s, "cuMemUnmap", &code)) return static_cast<CUresult>(code);
  if (s.sticky != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  capture_check(s);
  const auto gs = granules(s, ptr, size);
  if (gs.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto a : gs) {
    if (!s.mappings.count(a)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (incomplete_work(s)) ++s.counters.unsafe_unmaps;
  std::set<CUmemGenericAllocationHandle> unmapped;
  for (auto a : gs) {
    unmapped.insert(s.mappings[a].handle);
    s.mappings.erase(a);
  }
  s.counters.live_mappings -= static_cast<std::int64_t>(gs.size());
  for (auto h : unmapped) {
    auto it = s.handles.find(h);
    if (it != s.handles.end() && it->second.released && !handle_mapped(s, h)) free_handle(s, it);
  }
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
  madvise(p, size, MADV_DONTNEED);
  mprotect(p, size, PROT_NONE);
  return CUDA_SUCCESS;
}

const std::map<std::string, void*>& driver_table() {
  static const std::map<std::string, void*> table = {
      {"cuGetErrorString", reinterpret_cast<void*>(&fake_cuGetErrorString)},
      {"cuGetErrorName", reinterpret_cast<void*>(&fake_cuGetErrorName)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&fake_cuDeviceGetAttribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&fake_cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&fake_cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&fake_cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&fake_cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&fake_cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&fake_cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&fake_cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&fake_cuMemSetAccess)},
  };
  return table;
}

}  // namespace

// --- control API ------------------------------------------------------------

void reset(const Config& config) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  for (auto& [p, m] : s.mallocs) std::free(p);
  for (auto& [base, r] : s.reservations) munmap(r.mmap_base, r.mmap_bytes);
  s.config = config;
  s.counters = Counters{};
  s.used.clear();
  s.mallocs.clear();
  s.handles.clear();
  s.reservations.clear();
  s.mappings.clear();
  s.streams.clear();
  s.events.clear();
  s.faults.clear();
  s.hidden.clear();
  s.waits.clear();
  s.capturing = false;
  s.peers.clear();
  s.contexts.clear();
  s.sticky = cudaSuccess;
  t_device = 0;
  t_last_error = cudaSuccess;
  t_mode = cudaStreamCaptureModeGlobal;
}

Counters counters() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.counters;
}

void fail_next(const std::string& function, int code, int skip) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.faults[function] = {skip, code};
}

void set_sticky_error(cudaError_t err) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.sticky = err;
}

void set_unrelated(cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.streams[stream].unrelated = true;
}

void hide_symbol(const std::string& symbol) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.hidden.insert(symbol);
}

bool has_context(int device) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.contexts.count(device) > 0;
}

void set_thread_device_without_context(int device) { t_device = device; }

void set_capturing(bool on) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.capturing = on;
}

void set_busy(cudaStream_t stream, bool busy) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.streams[stream].busy = busy;
  if (busy) s.streams[stream].quiet = false;
}

void complete(cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  Stream& st = s.streams[stream];
  st.done = st.issued;
  st.quiet = true;
}

bool accessible(const void* p, std::size_t bytes, int device) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  const std::size_t gran = s.config.granularity;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::uintptr_t gr = a / gran * gran; gr < a + bytes; gr += gran) {
    auto it = s.mappings.find(gr);
    if (it == s.mappings.end() || !it->second.access.count(device)) return false;
  }
  return bytes > 0;
}

cudaStreamCaptureMode capture_mode() { return t_mode; }

std::vector<std::pair<cudaStream_t, cudaEvent_t>> waits() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.waits;
}

}  // namespace fake_cuda

// --- the CUDA runtime functions CudaDevice calls ------------------------------

using fake_cuda::state;
using fake_cuda::t_device;
using fake_cuda::t_last_error;
using fake_cuda::t_mode;

#define FAKE_INJECT(s, name)                                         \
  do {                                                               \
    int fake_code_ = 0;                                              \
    if (fake_cuda::injected(s, name, &fake_code_)) {                 \
      return fake_cuda::fail(static_cast<cudaError_t>(fake_code_));  \
    }                                                                \
  } while (0)

// FAKE_INJECT, then the sticky error, for calls that do work on a device.
#define FAKE_WORK(s, name)                                           \
  do {                                                               \
    FAKE_INJECT(s, name);                                            \
    if (s.sticky != cudaSuccess) return fake_cuda::fail(s.sticky);   \
  } while (0)

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    default: return "unrecognized error code";
  }
}

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int* count) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_INJECT(s, "cudaGetDeviceCount");
  if (s.config.devices <= 0) return fake_cuda::fail(cudaErrorNoDevice);
  *count = s.config.devices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_INJECT(s, "cudaGetDevice");
  if (s.config.devices <= 0) return fake_cuda::fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_INJECT(s, "cudaSetDevice");
  if (device < 0 || device >= s.config.devices) return fake_cuda::fail(cudaErrorInvalidDevice);
  t_device = device;
  fake_cuda::touch(s);  // since CUDA 12, cudaSetDevice creates the primary context
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  const cudaStreamCaptureMode prev = t_mode;
  t_mode = *mode;
  *mode = prev;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaMalloc");
  fake_cuda::touch(s);
  if (t_mode != cudaStreamCaptureModeRelaxed) ++s.counters.allocations_not_relaxed;
  const int dev = t_device;
  if (size > s.config.capacity || s.used[dev] + size > s.config.capacity) {
    return fake_cuda::fail(cudaErrorMemoryAllocation);
  }
  const std::size_t rounded = (size + 511) / 512 * 512;
  void* p = std::aligned_alloc(512, rounded);
  if (!p) return fake_cuda::fail(cudaErrorMemoryAllocation);
  s.mallocs[p] = fake_cuda::Malloc{size, dev};
  s.used[dev] += size;
  s.counters.used_bytes += static_cast<std::int64_t>(size);
  ++s.counters.live_mallocs;
  ++s.counters.mallocs;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaFree");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  if (!ptr) return cudaSuccess;
  auto it = s.mallocs.find(ptr);
  if (it == s.mallocs.end()) return fake_cuda::fail(cudaErrorInvalidValue);
  s.used[it->second.device] -= it->second.bytes;
  s.counters.used_bytes -= static_cast<std::int64_t>(it->second.bytes);
  std::free(ptr);
  s.mallocs.erase(it);
  --s.counters.live_mallocs;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaMemGetInfo");
  fake_cuda::touch(s);
  *total_bytes = s.config.capacity;
  *free_bytes = s.config.capacity - s.used[t_device];
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaDeviceSynchronize");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  for (auto& [stream, st] : s.streams) {
    st.done = st.issued;
    st.quiet = true;
  }
  ++s.counters.device_synchronizes;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaStreamSynchronize");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  fake_cuda::Stream& st = s.streams[stream];
  st.done = st.issued;
  st.quiet = true;
  ++s.counters.stream_synchronizes;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaStreamQuery");
  fake_cuda::capture_check(s);
  ++s.counters.stream_queries;
  const fake_cuda::Stream& st = s.streams[stream];
  return !st.busy || st.quiet ? cudaSuccess : fake_cuda::fail(cudaErrorNotReady);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaEventCreateWithFlags");
  fake_cuda::touch(s);
  if (flags != cudaEventDisableTiming) return fake_cuda::fail(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(s.next_event);
  s.next_event += 16;
  s.events[*event] = fake_cuda::Event{};
  ++s.counters.live_events;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaEventDestroy");
  if (!s.events.erase(event)) return fake_cuda::fail(cudaErrorInvalidResourceHandle);
  --s.counters.live_events;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaEventRecord");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  auto it = s.events.find(event);
  if (it == s.events.end()) return fake_cuda::fail(cudaErrorInvalidResourceHandle);
  fake_cuda::Stream& st = s.streams[stream];
  if (st.busy) {
    ++st.issued;
    st.quiet = false;
  }
  it->second = fake_cuda::Event{stream, st.issued, true};
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaEventQuery");
  fake_cuda::capture_check(s);
  auto it = s.events.find(event);
  if (it == s.events.end()) return fake_cuda::fail(cudaErrorInvalidResourceHandle);
  return fake_cuda::event_complete(s, it->second) ? cudaSuccess : fake_cuda::fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaEventSynchronize");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  auto it = s.events.find(event);
  if (it == s.events.end()) return fake_cuda::fail(cudaErrorInvalidResourceHandle);
  if (it->second.recorded) {
    fake_cuda::Stream& st = s.streams[it->second.stream];
    st.done = std::max(st.done, it->second.seq);
  }
  ++s.counters.event_synchronizes;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_WORK(s, "cudaStreamWaitEvent");
  fake_cuda::touch(s);
  fake_cuda::capture_check(s);
  if (!s.events.count(event) || flags != 0) return fake_cuda::fail(cudaErrorInvalidResourceHandle);
  s.waits.emplace_back(stream, event);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  *status = s.capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  FAKE_INJECT(s, "cudaDeviceEnablePeerAccess");
  if (peer < 0 || peer >= s.config.devices || peer == t_device || flags != 0) {
    return fake_cuda::fail(cudaErrorInvalidDevice);
  }
  if (!s.peers.insert({t_device, peer}).second) return fake_cuda::fail(cudaErrorPeerAccessAlreadyEnabled);
  ++s.counters.peer_enables;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t count, cudaStream_t) {
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t) {
  return fake_cuda::fail(cudaErrorInvalidResourceHandle);  // events are timing-free
}

#if CUDART_VERSION >= 12050
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  (void)flags;
  if (version < 12000) return fake_cuda::fail(cudaErrorInvalidValue);
#else
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  (void)flags;
#endif
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  const auto& table = fake_cuda::driver_table();
  auto it = table.find(symbol);
  if (it == table.end() || s.hidden.count(symbol)) {
    *fn = nullptr;
    if (status) *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
  }
  *fn = it->second;
  if (status) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
