// errors.h - the exceptions the core throws. The torch glue turns
// OutOfMemoryError into torch.OutOfMemoryError and the others into
// RuntimeError / ValueError; the core itself never aborts on bad input.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace renaissance {

// A request that cannot be met within the limit or that the backend refused,
// after cached memory was released and the request retried.
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const std::string& what, std::size_t requested)
      : std::runtime_error(what), requested_(requested) {}
  std::size_t requested() const { return requested_; }

 private:
  std::size_t requested_;
};

// A pointer given to the arena that it did not hand out, or no longer holds
// as a live allocation (double free, interior or foreign pointer). The arena
// is unchanged when this is thrown.
class InvalidPointerError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A backend call failed for a reason other than out-of-memory (e.g. a CUDA
// error code). The message names the call and the backend's error text.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Human-readable byte count in PyTorch's style ("1.50 GiB").
std::string format_bytes(std::size_t bytes);

}  // namespace renaissance
