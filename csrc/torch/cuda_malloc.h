// cuda_malloc.h - the allocation path shared by the CUDAAllocator
// (cuda_allocator.cpp) and the plain path's C symbols (cuda_pluggable.cpp):
// route a request to the default arena or a window's private pool, run the
// one out-of-memory ladder, free through the pointer table, and empty caches.
//
// Invariants:
//   * malloc_on's result is in the pointer table (cuda_pointer_table.h)
//     before it is returned; a free takes it out before the arena frees it.
//   * The out-of-memory ladder runs at most once per request
//     (num_alloc_retries += 1 at most); its hooks (give back unused pools,
//     then borrow from use_on_oom pools) run outside the arena lock.
//   * A free makes no CUDA call unless it leaves a private pool idle
//     (destroying it gives memory back, with the device made current).
//   * Errors become c10 errors: out of memory -> c10::OutOfMemoryError with
//     PyTorch-style text naming the size; a device error -> c10::Error.
// Compiled only with TR_WITH_CUDA.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>

namespace renaissance::cuda::detail {

// `size` bytes on `device` for use on `stream`; nullptr for size 0. Raises
// c10::OutOfMemoryError or c10::Error (never returns nullptr otherwise).
void* malloc_on(std::size_t size, int device, cudaStream_t stream);

// Frees `ptr` (nullptr: nothing). strict: raise c10::Error for a pointer we
// did not hand out (raw_delete); otherwise report it on stderr.
void free_pointer(void* ptr, bool strict);

// The DataPtr deleter: free_pointer(ptr, false), never throws.
void delete_cuda(void* ptr);

// Records a use of `ptr` on `stream`; a pointer not ours is ignored.
void record_stream_on(void* ptr, cudaStream_t stream);

// torch.cuda.empty_cache() (kDefaultPool) empties the default arena and every
// pool nothing uses any more; a pool's id (~MemPool) empties that pool only
// when nothing uses it. A live graph's pool keeps its free blocks.
void empty_cache_all(const c10::MempoolId_t& id);

// Reports an error that must not escape (a destructor's call, a deferred
// clean-up) on stderr, once per process and kind.
void report_once(std::atomic<bool>& said, const char* what, const char* error);

}  // namespace renaissance::cuda::detail
