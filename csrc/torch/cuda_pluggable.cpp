// cuda_pluggable.cpp - the plain path: C functions for
// torch.cuda.memory.CUDAPluggableAllocator, exported from the extension
// (the only symbols of the glue with default visibility; make check-cuda
// checks they are there). They share the allocation path of the
// CUDAAllocator (cuda_malloc.h) and so its pointer table and arenas.
//
// Invariants: the malloc symbols raise (a C++ exception through PyTorch's
// caller) or return nullptr only as documented below; free, record_stream
// and empty_cache never throw (an error is reported on stderr).
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdio>
#include <exception>

#include "torch/cuda_malloc.h"
#include "torch/cuda_pointer_table.h"

#define TR_EXPORT extern "C" __attribute__((visibility("default")))

// void* alloc(ssize_t size, int device, cudaStream_t stream). Raises
// torch.OutOfMemoryError (a C++ exception through PyTorch's caller): for
// torch.cuda.memory.change_current_allocator, whose callers do not check for
// nullptr.
TR_EXPORT void* torch_renaissance_cuda_malloc(ssize_t size, int device, cudaStream_t stream) {
  TORCH_CHECK(size >= 0, "torch_renaissance: negative allocation size ", size);
  return renaissance::cuda::detail::malloc_on(static_cast<std::size_t>(size), device, stream);
}

// The same, returning nullptr when out of memory: for a torch.cuda.MemPool
// over PyTorch's allocator, which treats nullptr as "out of memory", frees
// its own cached blocks and retries before it raises.
TR_EXPORT void* torch_renaissance_cuda_malloc_or_null(ssize_t size, int device,
                                                      cudaStream_t stream) {
  TORCH_CHECK(size >= 0, "torch_renaissance: negative allocation size ", size);
  try {
    return renaissance::cuda::detail::malloc_on(static_cast<std::size_t>(size), device, stream);
  } catch (const c10::OutOfMemoryError&) {
    return nullptr;
  }
}

// void free(void* ptr, ssize_t size, int device, cudaStream_t stream).
TR_EXPORT void torch_renaissance_cuda_free(void* ptr, ssize_t /*size*/, int /*device*/,
                                           cudaStream_t /*stream*/) {
  renaissance::cuda::detail::delete_cuda(ptr);
}

// For CUDAPluggableAllocator.set_record_stream_fn: void(void*, cudaStream_t).
TR_EXPORT void torch_renaissance_cuda_record_stream(void* ptr, cudaStream_t stream) {
  try {
    renaissance::cuda::detail::record_stream_on(ptr, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_renaissance: record_stream failed: %s\n", e.what());
  }
}

// For CUDAPluggableAllocator.set_reset_fn: void().
TR_EXPORT void torch_renaissance_cuda_empty_cache() {
  try {
    renaissance::cuda::detail::empty_cache_all(renaissance::cuda::detail::kDefaultPool);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_renaissance: empty_cache failed: %s\n", e.what());
  }
}
