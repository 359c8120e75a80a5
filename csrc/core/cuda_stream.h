// cuda_stream.h - StreamId <-> cudaStream_t (a StreamId is the cudaStream_t).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/device.h"

namespace renaissance {

inline StreamId stream_id(cudaStream_t s) {
  return static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(s));
}
inline cudaStream_t to_stream(StreamId s) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s));
}

}  // namespace renaissance
