// host_device.cpp - see host_device.h for the invariants.
#include "core/host_device.h"

#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/errors.h"

namespace renaissance {

void* host_reserve(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t align = bytes >= (std::size_t(64) << 10) ? 4096 : 64;
  void* p = nullptr;
  if (posix_memalign(&p, align, bytes) != 0) return nullptr;
  return p;
}

void host_release(void* ptr) { std::free(ptr); }

MemInfo host_mem_info() {
  const long page = sysconf(_SC_PAGESIZE);
  const long total = sysconf(_SC_PHYS_PAGES);
  const long avail = sysconf(_SC_AVPHYS_PAGES);
  MemInfo info;
  if (page > 0 && total > 0) info.total_bytes = std::size_t(page) * std::size_t(total);
  if (page > 0 && avail > 0) info.free_bytes = std::size_t(page) * std::size_t(avail);
  return info;
}

std::size_t host_request_limit() {
  struct sysinfo si;
  if (sysinfo(&si) != 0) return 0;
  return static_cast<std::size_t>((static_cast<unsigned long long>(si.totalram) + si.totalswap) *
                                  si.mem_unit);
}

void* HostRanges::reserve_range(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void HostRanges::release_range(void* base, std::size_t bytes) {
  if (munmap(base, bytes) != 0) {
    throw DeviceError(std::string("munmap of an address range failed: ") +
                      std::strerror(errno));
  }
}

bool HostRanges::map(void* ptr, std::size_t bytes) {
  // mprotect on a MAP_NORESERVE range commits nothing, so the kernel's
  // overcommit heuristic never sees the request: refuse what it would refuse
  // for malloc (one request larger than RAM + swap), as PyTorch's default
  // CPU allocator would fail.
  const std::size_t limit = host_request_limit();
  if (limit && bytes > limit) return false;
  return mprotect(ptr, bytes, PROT_READ | PROT_WRITE) == 0;
}

void HostRanges::unmap(void* ptr, std::size_t bytes) {
  // Give the pages back first, then make the range inaccessible again.
  if (madvise(ptr, bytes, MADV_DONTNEED) != 0 ||
      mprotect(ptr, bytes, PROT_NONE) != 0) {
    throw DeviceError(std::string("unmapping host memory failed: ") +
                      std::strerror(errno));
  }
}

}  // namespace renaissance
