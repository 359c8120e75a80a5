// cuda_device.h - CudaDevice: the device backend for one CUDA GPU, through
// the CUDA runtime API only (no libcuda link; the driver's virtual-memory
// functions are reached through cudaGetDriverEntryPoint when present).
//
// Invariants:
//   * Every CUDA call runs with this device current (a guard switches and
//     restores the calling thread's device) and every return code is
//     checked: a failure throws DeviceError naming the call, the device and
//     cudaGetErrorString's text. The one exception is running out of memory:
//     reserve() returns nullptr and map() returns false, after clearing the
//     runtime's last error, so the arena can free cached memory and retry.
//   * reserve() is cudaMalloc (256-byte aligned or better; we promise 512).
//     cudaMalloc / cuMemCreate run in relaxed stream-capture mode, so they
//     are legal while another thread captures a CUDA graph; release(),
//     unmap() and release_range() are never legal during a capture and the
//     arena does not call them then.
//   * Address ranges (expandable segments) are offered only when the driver
//     exposes the VMM entry points, the device reports
//     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
//     TORCH_RENAISSANCE_CUDA_VMM is not 0, and a probe of one granule
//     (reserve, create, map, set access, unmap, release, free: at the first
//     use, i.e. when the device's first arena starts) passes. Some
//     virtualized GPUs report the attribute and then refuse the mapping; a
//     probe that fails with anything but out-of-memory turns address ranges
//     off for the device (vmm_status() and vmm_refusal() name the driver's
//     error) and the arena serves from cudaMalloc segments instead.
//   * Physical handles: map() backs each run of unmapped granules with
//     handles of at most kMaxHandleBytes (20 MiB, PyTorch's segment size for
//     the large pool), so a large growth costs one cuMemCreate per 20 MiB,
//     not per granule; a handle starts and ends inside one map() call.
//   * unmap() takes any granule-aligned, mapped sub-range, whatever handles
//     it cuts. Handles wholly inside it are unmapped and released (their
//     memory goes back). A handle it only partly covers cannot give back
//     part of its memory (CUDA frees a handle whole): its granules in the
//     range are marked unmapped but stay mapped and held (held_bytes();
//     a stale pointer into them reads old memory instead of faulting),
//     and the handle is unmapped and released with its last granule; a
//     later map() of a held granule takes it back without a new handle. So
//     device memory is given back exactly where a release covers whole
//     handles; a cut handle holds at most kMaxHandleBytes minus a granule.
//   * unmap() synchronizes the device first: unlike cudaFree, cuMemUnmap
//     does not wait for kernels that may still use the memory.
//     unmap_used_by() synchronizes only the streams it is given (the arena
//     passes the streams blocks of the segment were allocated on), as
//     PyTorch's expandable segments synchronize their stream.
//     map() grants access to this device and to every peer added with
//     add_peer_access().
//   * Events are created with cudaEventDisableTiming; an EventId is the
//     cudaEvent_t, a StreamId the cudaStream_t (0: the legacy default
//     stream).
//   * stream_idle() is cudaStreamQuery (true: all work enqueued so far is
//     done), so freed blocks whose use streams went quiet are reused without
//     waiting for their group's event; a stream being captured is never
//     queried (that would invalidate the capture) and answers false. The
//     arena calls it only outside capture windows, as it does query_event.
//   * Thread safe: the VMM handle table has its own mutex (a leaf of
//     core/lock_order.h: nothing is locked under it); everything else
//     is stateless or the CUDA runtime's.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"

namespace renaissance {

class CudaDevice final : public Device {
 public:
  // Raises DeviceError when CUDA cannot be used (no driver, no device) or
  // `index` is not a device of this machine.
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // Number of CUDA devices; raises DeviceError with the runtime's reason
  // when there is no usable driver or device.
  static int device_count();

  int index() const { return index_; }
  std::string name() const override { return "cuda:" + std::to_string(index_); }
  bool is_device_memory() const override { return true; }
  std::size_t alignment() const override { return 512; }

  void* reserve(std::size_t bytes) override;
  void release(void* ptr, std::size_t bytes) override;
  MemInfo mem_info() const override;

  bool supports_address_ranges() const override;
  std::size_t range_granularity() const override;
  void* reserve_range(std::size_t bytes) override;
  void release_range(void* base, std::size_t bytes) override;
  bool map(void* ptr, std::size_t bytes) override;
  void unmap(void* ptr, std::size_t bytes) override;
  void unmap_used_by(void* ptr, std::size_t bytes, const std::vector<StreamId>& streams) override;

  // Largest physical handle map() creates, in bytes.
  static constexpr std::size_t kMaxHandleBytes = std::size_t(20) << 20;
  // Bytes of granules unmap() was given that stay held by a handle it cut.
  std::size_t held_bytes() const;

  EventId create_event() override;
  void destroy_event(EventId event) override;
  void record_event(EventId event, StreamId stream) override;
  bool query_event(EventId event) override;
  bool stream_idle(StreamId stream) override;
  void synchronize_event(EventId event) override;
  void stream_wait_event(StreamId stream, EventId event) override;

  // Lets device `peer` read and write the memory of this device's address
  // ranges, mapped now and later (PyTorch's addPeerAccess for expandable
  // segments): cudaDeviceEnablePeerAccess covers cudaMalloc memory only. The
  // caller enables peer access itself. A no-op without address ranges, for
  // this device and for a peer added before. Raises DeviceError (bad index,
  // or the driver refused; access granted to granules before the failure
  // stays).
  void add_peer_access(int peer);

  // Why address ranges are (not) offered, e.g. "on (granularity 2 MiB)" or
  // "off: cuMemCreate not found in the driver". For diagnostics and tests.
  std::string vmm_status() const;
  // When the probe of address ranges failed with an error other than out of
  // memory: a one-line warning naming the driver's error (for the caller to
  // show once); empty otherwise.
  std::string vmm_refusal() const;

 private:
  struct Vmm;  // driver entry points and the table of mapped handles
  void init_vmm() const;
  // Why one granule cannot be reserved, mapped, accessed and unmapped here
  // ("" when it can, or when only memory ran out).
  std::string probe_vmm(const Vmm& v) const;
  void unmap_impl(void* ptr, std::size_t bytes, const std::vector<StreamId>* streams);

  int index_;
  mutable std::once_flag vmm_once_;
  mutable std::unique_ptr<Vmm> vmm_;  // null when address ranges are off
  mutable std::string vmm_status_;
  mutable std::string vmm_refusal_;
};

}  // namespace renaissance
