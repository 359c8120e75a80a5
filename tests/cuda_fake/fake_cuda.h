// fake_cuda.h - a fake CUDA runtime (and the driver's virtual-memory entry
// points) backed by host memory, so that CudaDevice and the Arena on top of
// it run, and fail, on a machine without a GPU.
//
// fake_cuda.cpp defines the CUDA runtime functions CudaDevice calls, with
// the signatures of the toolkit's own cuda_runtime_api.h; a test program
// links it INSTEAD of libcudart. What it models (and checks):
//   * devices: a count, a per-thread current device (cudaSetDevice), the
//     devices with a primary context (made by cudaSetDevice, as since
//     CUDA 12, or by any call that works on the current device), a
//     capacity per device shared by cudaMalloc and cuMemCreate, and
//     cudaMemGetInfo's free/total from it;
//   * the per-thread "last error" (cudaGetLastError) that a failing call
//     sets, as PyTorch checks it after kernel launches (cudaEventQuery's
//     "not ready" too, as HIP does: the caller must clear it);
//   * the per-thread stream-capture mode (cudaThreadExchangeStreamCaptureMode)
//     and the mode each cudaMalloc / cuMemCreate ran under;
//   * streams that can be made busy: an event recorded on a busy stream is
//     not complete until the test completes that stream, a synchronize on
//     it, cudaStreamSynchronize on it, or cudaDeviceSynchronize; cuMemUnmap
//     while a stream (other than those marked unrelated) has incomplete
//     work is counted as unsafe (the driver does not wait);
//   * a sticky error (set_sticky_error): every call doing device work fails;
//   * VMM: address reservations are real PROT_NONE mappings, handles are
//     charged to the device until released and unmapped (the driver frees a
//     released handle at its last unmap), cuMemSetAccess makes granules readable and
//     writable (and records which devices may access them), cuMemUnmap
//     makes them inaccessible again, and freeing a
//     reservation that still has mappings is refused;
//   * fault injection: the n-th next call of a named function returns a
//     given code; a driver symbol can be hidden from the entry-point query.
//   * a capture flag: calls that a CUDA-graph capture forbids are counted;
//   * copies (cudaMemcpy*: host memcpy), cudaDeviceEnablePeerAccess.
// Not modelled: kernels, the graphs themselves, IPC.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fake_cuda {

struct Config {
  int devices = 1;
  std::size_t capacity = std::size_t(256) << 20;   // bytes per device
  std::size_t granularity = std::size_t(2) << 20;  // VMM granule
  bool vmm = true;  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
};

struct Counters {
  std::int64_t live_mallocs = 0;       // cudaMalloc'ed, not yet freed
  std::int64_t live_handles = 0;       // cuMemCreate'd, not yet released (cuMemRelease)
  std::int64_t live_reservations = 0;  // cuMemAddressReserve'd, not yet freed
  std::int64_t live_mappings = 0;      // granules mapped
  std::int64_t live_events = 0;
  std::int64_t used_bytes = 0;         // all devices: mallocs + handles
  std::int64_t mallocs = 0;            // calls that succeeded
  std::int64_t handles_created = 0;
  std::int64_t allocations_not_relaxed = 0;  // cudaMalloc/cuMemCreate outside relaxed mode
  std::int64_t device_synchronizes = 0;
  std::int64_t stream_synchronizes = 0;  // cudaStreamSynchronize calls that succeeded
  std::int64_t stream_queries = 0;       // cudaStreamQuery calls
  std::int64_t event_synchronizes = 0;
  std::int64_t unsafe_unmaps = 0;      // cuMemUnmap while a stream had incomplete work
  // Event record/query/synchronize/wait, device synchronize, cudaFree,
  // cuMemUnmap or cuMemRelease while set_capturing(true): illegal in a
  // CUDA-graph capture (or they would enter the graph).
  std::int64_t calls_during_capture = 0;
  std::int64_t peer_enables = 0;       // cudaDeviceEnablePeerAccess that succeeded
};

// Resets everything (frees what is still live) and applies `config`.
void reset(const Config& config);
Counters counters();
// The (skip + 1)-th next call of `function` (e.g. "cudaMalloc",
// "cuMemCreate") returns `code` (a cudaError_t or CUresult value) instead of
// doing anything.
void fail_next(const std::string& function, int code, int skip = 0);
// The entry-point query answers "symbol not found" for `symbol`.
void hide_symbol(const std::string& symbol);
// From now on every call that does work on a device (memory, events,
// synchronization; not the device queries) fails with `err`, as after a
// kernel's illegal memory access (a "sticky" error), until
// set_sticky_error(cudaSuccess).
void set_sticky_error(cudaError_t err);
// Work on `stream` never touches the memory under test (an NCCL stream, a
// data loader's): unmapping while it is busy is not unsafe.
void set_unrelated(cudaStream_t stream);
// True once a call did work on `device` (or made it current with
// cudaSetDevice, which since CUDA 12 creates the primary context).
bool has_context(int device);
// Sets the calling thread's current device without creating a context: a
// fresh thread, whose current device is 0 whether or not 0 has a context.
void set_thread_device_without_context(int device);
// A CUDA graph is being captured (cudaStreamIsCapturing answers "active"
// for every stream) until set_capturing(false).
void set_capturing(bool on);
// Work enqueued on `stream` from now on stays incomplete until complete().
void set_busy(cudaStream_t stream, bool busy);
void complete(cudaStream_t stream);
// True when every byte of [p, p + bytes) lies in granules mapped with
// read-write access for `device`.
bool accessible(const void* p, std::size_t bytes, int device = 0);
// The calling thread's stream-capture mode.
cudaStreamCaptureMode capture_mode();
// (stream, event) of every cudaStreamWaitEvent since reset.
std::vector<std::pair<cudaStream_t, cudaEvent_t>> waits();

}  // namespace fake_cuda
