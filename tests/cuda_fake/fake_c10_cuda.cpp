// fake_c10_cuda.cpp - the few functions of PyTorch's libc10_cuda (and one of
// libtorch_cuda) that the torch glue (csrc/torch/cuda_*.cpp) calls, on top of the
// fake CUDA runtime, so that the torch glue runs without a GPU and without a
// CUDA build of PyTorch. Declarations come from the installed torch's own
// headers, so a signature that drifts fails to compile.
//
// Streams: a CUDAStream's id IS the fake cudaStream_t (0: the default
// stream); each thread has a current stream per device.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "fake_cuda.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace c10::cuda {

namespace CUDACachingAllocator {
std::atomic<CUDAAllocator*> allocator{nullptr};
}  // namespace CUDACachingAllocator

namespace {
thread_local std::map<DeviceIndex, StreamId> t_current_stream;
// As c10's targetDeviceIndex: the device MaybeSetDevice chose without
// making it current (it has no context yet); GetDevice reports it.
thread_local DeviceIndex t_target = -1;

DeviceIndex resolve(DeviceIndex device) {
  if (device >= 0) return device;
  int d = 0;
  C10_CUDA_CHECK(cudaGetDevice(&d));
  return static_cast<DeviceIndex>(d);
}

CUDAStream make_stream(DeviceIndex device, StreamId id) {
  return CUDAStream(CUDAStream::UNCHECKED, Stream(Stream::UNSAFE, Device(DeviceType::CUDA, device), id));
}
}  // namespace

void c10_cuda_check_implementation(const int32_t err, const char* filename, const char* function_name,
                                   const uint32_t line_number, const bool) {
  const auto e = static_cast<cudaError_t>(err);
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  TORCH_CHECK(false, "CUDA error: ", cudaGetErrorString(e), " (", function_name, " at ", filename, ":",
              line_number, ")");
}

DeviceIndex device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<DeviceIndex>(n);
}

// Device selection as c10/cuda/CUDAFunctions.cpp does it: MaybeSetDevice
// does not create a context on a device that has none, it only remembers it.
cudaError_t GetDevice(DeviceIndex* device) {
  if (t_target >= 0) {
    *device = t_target;
    return cudaSuccess;
  }
  int d = 0;
  const cudaError_t e = cudaGetDevice(&d);
  *device = static_cast<DeviceIndex>(d);
  return e;
}

cudaError_t SetDevice(DeviceIndex device, const bool) {
  t_target = -1;
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == device) return cudaSuccess;
  return cudaSetDevice(device);
}

cudaError_t MaybeSetDevice(DeviceIndex device) {
  if (fake_cuda::has_context(device)) return SetDevice(device, false);
  t_target = device;
  return cudaSuccess;
}

DeviceIndex ExchangeDevice(DeviceIndex device) {
  DeviceIndex cur = t_target;
  t_target = -1;
  if (cur < 0) {
    C10_CUDA_CHECK(GetDevice(&cur));
    if (cur == device) return cur;
  }
  C10_CUDA_CHECK(cudaSetDevice(device));
  return cur;
}

CUDAStream getStreamFromPool(const bool, DeviceIndex) {
  TORCH_CHECK(false, "fake c10_cuda: no stream pool");
}

CUDAStream getStreamFromPool(const int, DeviceIndex) {
  TORCH_CHECK(false, "fake c10_cuda: no stream pool");
}

CUDAStream getDefaultCUDAStream(DeviceIndex device) { return make_stream(resolve(device), 0); }

CUDAStream getCurrentCUDAStream(DeviceIndex device) {
  const DeviceIndex d = resolve(device);
  auto it = t_current_stream.find(d);
  return make_stream(d, it == t_current_stream.end() ? 0 : it->second);
}

void setCurrentCUDAStream(CUDAStream stream) { t_current_stream[stream.device_index()] = stream.id(); }

cudaStream_t CUDAStream::stream() const {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream_.id()));
}

bool CUDAStream::query() const {
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(e, stream()));
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();  // an answer, not an error
  C10_CUDA_CHECK(cudaEventDestroy(e));
  return r == cudaSuccess;
}

void CUDAStream::synchronize() const {
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(e, stream()));
  C10_CUDA_CHECK(cudaEventSynchronize(e));
  C10_CUDA_CHECK(cudaEventDestroy(e));
}

}  // namespace c10::cuda

namespace torch::cuda::CUDAPluggableAllocator {

// As PyTorch's: refuses to swap an initialized allocator, keeps the new one.
void changeCurrentAllocator(
    const std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>& allocator) {
  static std::mutex mu;
  static std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> current;
  std::lock_guard<std::mutex> g(mu);
  auto* now = c10::cuda::CUDACachingAllocator::allocator.load();
  TORCH_CHECK(!now || !now->initialized(), "Can't swap an already initialized allocator");
  c10::cuda::CUDACachingAllocator::allocator.store(allocator.get());
  current = allocator;
}

}  // namespace torch::cuda::CUDAPluggableAllocator
