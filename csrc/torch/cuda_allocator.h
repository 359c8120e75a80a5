// cuda_allocator.h - the allocator behind torch.cuda: a subclass of PyTorch's
// c10::cuda::CUDACachingAllocator::CUDAAllocator that serves every CUDA
// tensor from torch_renaissance arenas (CudaDevice backend), keeps PyTorch's
// statistics, snapshots, record_stream and CUDA-graph pools working, and the
// exported C functions for the plain CUDAPluggableAllocator path.
//
// Invariants:
//   * One default arena per device, created on the first allocation of that
//     device (the device index comes from the call), living until the
//     process exits; one more arena per private pool (CUDA graph capture or
//     torch.cuda.MemPool), created by beginAllocateToPool /
//     createOrIncrefPool and destroyed once its use count is 0 and it holds
//     no live or pending block: when its last block is freed, or at the
//     next allocation or emptyCache of the device after releasePool (which,
//     as PyTorch's, makes no CUDA call and never throws: ~CUDAGraph and
//     ~MemPool call it). A pool with a positive use count never gives
//     memory back; a use_on_oom pool lends only its cached free blocks.
//   * Every pointer handed out is in a pointer table that names its arena,
//     so frees, record_stream and block lookups reach the right arena; a
//     pointer not in it is not ours (recordStream ignores it, raw_delete
//     raises).
//   * While any beginAllocateToPool window is open on a device (a capture or
//     a use_mem_pool scope), every arena of that device is in capture mode:
//     no event is recorded, queried or synchronized and no memory is given
//     back, so pending cross-stream blocks stay pending until the windows
//     close. Addresses handed out to a graph stay valid while its pool is
//     alive.
//   * Installing swaps the allocator only before CUDA is initialized; later
//     it raises and changes nothing (tensors that exist stay valid).
//   * Errors become c10 errors: out of memory -> c10::OutOfMemoryError
//     (torch.OutOfMemoryError) with PyTorch-style text naming the size.
#pragma once

#include <memory>
#include <string>

#include "core/arena.h"

namespace renaissance::cuda {

// Sets the configuration of arenas created from now on (used by the plain
// path before its first allocation). Returns false, changing nothing, once a
// CUDA arena exists.
bool configure(const ArenaConfig& config);

// Replaces the allocator behind torch.cuda (and c10::GetAllocator(kCUDA),
// which torch.accelerator reads) with ours. A no-op when already installed.
// Raises std::runtime_error, changing nothing, when PyTorch's CUDA allocator
// is already initialized.
void install(const ArenaConfig& config);
bool installed();

// The default arena of `device` (created on first use). Raises DeviceError
// when CUDA or the device is not usable.
std::shared_ptr<Arena> arena(int device);

// "on (granularity 2.00 MiB)" or "off: <reason>" for the device's backend.
std::string vmm_status(int device);

// Live private pools on `device` (graph pools and MemPools), for tests.
int private_pool_count(int device);

}  // namespace renaissance::cuda
