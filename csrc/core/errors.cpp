// errors.cpp - see errors.h.
#include "core/errors.h"

#include <cstdio>
#include <string>

namespace renaissance {

std::string format_bytes(std::size_t bytes) {
  // Same thresholds as c10::CachingAllocator::format_size.
  char buf[64];
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  } else if (bytes <= (std::size_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  } else if (bytes <= (std::size_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  } else if (bytes <= (std::size_t(1) << 40)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  } else if (bytes <= (std::size_t(1) << 50)) {
    std::snprintf(buf, sizeof buf, "%.2f TiB", bytes / 1099511627776.0);
  } else if (bytes <= (std::size_t(1) << 60)) {
    std::snprintf(buf, sizeof buf, "%.2f PiB", bytes / 1125899906842624.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f EiB", bytes / 1152921504606846976.0);
  }
  return buf;
}

}  // namespace renaissance
