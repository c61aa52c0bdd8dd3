// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Device: where the KV pool and the batched page table live, and how bytes get
// there. Two implementations share this interface:
//   - Device::Host(): host emulation. Device memory is host memory, copies are
//     memcpy, events complete at once. Every CPU test and every machine
//     without a GPU uses it.
//   - Device::Cuda(ordinal): a CUDA device. Copies are cudaMemcpyAsync on the
//     caller's stream, staging memory is pinned (cudaHostAlloc), events are
//     cudaEvents. Creating it without a GPU or driver is an error, not a crash.
//
// Copy accounting: `stats()` counts the host-to-device copies enqueued
// (`copies`) and their bytes (`bytes`), for host and CUDA alike, so upload
// behaviour is testable on a CPU. Filling pinned staging is not a copy.
//
// Page-table patches: ApplyPageTablePatch enqueues the one device operation
// KVPageTable::Upload needs besides copies, so that a device decides where it
// runs: a small kernel on CUDA, the CPU reference on the host device.
//
// Buffers are RAII handles (`DeviceBuffer`, `PinnedBuffer`, `DeviceEvent`)
// that must not outlive the Device that made them. A device address never
// changes while its buffer lives (safe to capture in CUDA graphs).
//
// Public headers compile without CUDA headers: a stream is the opaque
// `kvblock::Stream` (the caller's cudaStream_t; nullptr = default stream).
//
// Complexity: every call is O(1) host work plus the copy it enqueues.
// Thread safety: thread-compatible. A Device and its buffers are used by one
// thread at a time (the scheduler thread that owns them).
#ifndef KVBLOCK_DEVICE_H_
#define KVBLOCK_DEVICE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvblock/types.h"

namespace kvblock {

class Device;

// Host-to-device copies enqueued by one Device since its creation.
struct DeviceStats {
  int64_t copies = 0;  // CopyToDevice calls that moved at least one byte.
  int64_t bytes = 0;   // bytes of those copies.
};

enum class MemoryKind { kDevice, kPinned };

// Owns `size_bytes` of memory of one kind, zero-filled at allocation:
// device memory (DeviceBuffer) or pinned, page-locked host memory
// (PinnedBuffer). Move-only; frees through the Device that allocated it.
template <MemoryKind kKind>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  OwnedMemory(OwnedMemory&& other) noexcept;
  OwnedMemory& operator=(OwnedMemory&& other) noexcept;
  ~OwnedMemory();

  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  friend class Device;
  OwnedMemory(Device* device, void* data, size_t size_bytes)
      : device_(device), data_(data), size_bytes_(size_bytes) {}
  void Reset();

  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

using DeviceBuffer = OwnedMemory<MemoryKind::kDevice>;
using PinnedBuffer = OwnedMemory<MemoryKind::kPinned>;
extern template class OwnedMemory<MemoryKind::kDevice>;
extern template class OwnedMemory<MemoryKind::kPinned>;

// A point in a stream's work (a cudaEvent on CUDA). A new event counts as
// complete until it is first recorded.
class DeviceEvent {
 public:
  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  ~DeviceEvent();

  bool valid() const { return device_ != nullptr; }

 private:
  friend class Device;
  DeviceEvent(Device* device, void* handle)
      : device_(device), handle_(handle) {}
  void Reset();

  Device* device_ = nullptr;
  void* handle_ = nullptr;
};

// One range of a page-table patch, as KVPageTable::Upload builds it: the K
// entries [first, first + count) of row `slot` get the K ids
// `ids[ids_offset, ids_offset + count)` and half 1 of the row the V ids
// (`id + num_pages`); the `clear` entries after them get kNoPage in both
// halves. `entry` is `slot * max_pages_per_seq + first` (the table has at
// most INT32_MAX entries, so it fits).
struct PageTablePatchRange {
  int32_t entry = 0;
  int32_t count = 0;
  int32_t clear = 0;
  int32_t ids_offset = 0;
};

// A patch in device memory and the device page table it applies to.
struct PageTablePatch {
  int32_t* table = nullptr;  // int32 [max_batch, 2, max_pages_per_seq].
  int32_t max_batch = 0;
  int32_t max_pages_per_seq = 0;
  int32_t num_pages = 0;
  const int32_t* ids = nullptr;                 // K ids the ranges point into.
  const PageTablePatchRange* ranges = nullptr;  // [num_ranges].
  int32_t num_ranges = 0;
};

// A non-owning view of an int32 device tensor of rank 3, contiguous and
// unpadded (the kernel view of the page table: [max_batch, 2, max_pages]).
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(int32_t* data, std::array<int64_t, 3> shape)
      : data_(data), shape_(shape) {}

  int32_t* data() const { return data_; }  // a device pointer.
  const std::array<int64_t, 3>& shape() const { return shape_; }
  int64_t num_elements() const { return shape_[0] * shape_[1] * shape_[2]; }
  size_t size_bytes() const {
    return static_cast<size_t>(num_elements()) * sizeof(int32_t);
  }

 private:
  int32_t* data_ = nullptr;
  std::array<int64_t, 3> shape_ = {0, 0, 0};
};

class Device {
 public:
  enum class Kind { kHost, kCuda };

  // Host emulation; never fails.
  static std::unique_ptr<Device> Host();

  // CUDA device `ordinal`. Unavailable when kvblock was built without CUDA,
  // when no driver or GPU is present, or when `ordinal` is not a device
  // (the message says which); InvalidArgument for a negative ordinal.
  static absl::StatusOr<std::unique_ptr<Device>> Cuda(int ordinal);

  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual Kind kind() const = 0;
  // "host" or e.g. "cuda:0 NVIDIA H200".
  virtual std::string_view name() const = 0;

  // Zero-filled device memory. InvalidArgument for 0 bytes; ResourceExhausted
  // when the device is out of memory.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // Zero-filled pinned host memory; errors as Allocate.
  absl::StatusOr<PinnedBuffer> AllocatePinned(size_t bytes);
  // An event, complete until first recorded. Internal on a CUDA failure.
  absl::StatusOr<DeviceEvent> CreateEvent();

  // Enqueues a host-to-device copy of `bytes` from `src` (pinned for true
  // asynchrony) to device address `dst` on `stream`; counted in stats().
  // `src` must stay unchanged until the copy completes (record an event).
  // A copy of 0 bytes does nothing and is not counted. Internal on CUDA error.
  absl::Status CopyToDevice(const void* src, void* dst, size_t bytes,
                            Stream stream);
  // Enqueues a device-to-host copy; `dst` is valid after Synchronize(stream).
  // An error, not a crash, for a null pointer and bytes > 0 (InvalidArgument
  // on the host device; CUDA's own error on a GPU), here and below.
  virtual absl::Status CopyToHost(const void* src, void* dst, size_t bytes,
                                  Stream stream) = 0;
  // Enqueues a device-to-device copy (not counted in stats()).
  virtual absl::Status CopyDeviceToDevice(const void* src, void* dst,
                                          size_t bytes, Stream stream) = 0;
  // Blocks until all work enqueued on `stream` is done.
  virtual absl::Status Synchronize(Stream stream) = 0;

  // Enqueues on `stream` the application of `patch`, whose ranges and ids
  // are in device memory (copied there earlier on the same stream), to its
  // table. Ranges are independent (the ranges of one patch write disjoint
  // entries), so they may run in any order; a range that does not fit the
  // table is skipped. The ids are written as they are: they must be page ids
  // in [0, num_pages) (a kernel cannot refuse what device memory holds;
  // KVPageTable::Upload sends no other). Nothing is enqueued for 0 ranges.
  // InvalidArgument for a null pointer or a non-positive geometry; Internal
  // on a launch failure.
  absl::Status ApplyPageTablePatch(const PageTablePatch& patch, Stream stream);

  // Makes this device the calling thread's current one (cudaSetDevice), as
  // kernel launches need; OK and nothing to do on the host device. Errors as
  // Cuda().
  virtual absl::Status MakeCurrent() = 0;

  // Marks the current end of `stream`'s work in `event`.
  virtual absl::Status RecordEvent(DeviceEvent& event, Stream stream) = 0;
  // True when the work before the last RecordEvent is done (never waits).
  virtual absl::StatusOr<bool> EventDone(const DeviceEvent& event) = 0;
  // Blocks the host until the event's work is done.
  virtual absl::Status WaitEvent(const DeviceEvent& event) = 0;
  // Makes the work enqueued on `stream` from now on wait for the work
  // before the event's last RecordEvent, without blocking the host
  // (cudaStreamWaitEvent): how another stream reads what this one wrote.
  // Nothing to do on the host device.
  virtual absl::Status StreamWaitEvent(Stream stream,
                                       const DeviceEvent& event) = 0;

  const DeviceStats& stats() const { return stats_; }

 protected:
  Device() = default;

  // Raw hooks of the implementations, called by the non-virtual wrappers
  // above and by the buffer and event destructors. Allocations get a positive
  // size and return zero-filled memory, ResourceExhausted when out of memory,
  // Internal on any other failure. Free and destroy hooks get what the
  // matching hook returned and cannot fail.
  virtual absl::StatusOr<void*> AllocateRaw(size_t bytes) = 0;
  virtual void FreeRaw(void* ptr) = 0;
  virtual absl::StatusOr<void*> AllocatePinnedRaw(size_t bytes) = 0;
  virtual void FreePinnedRaw(void* ptr) = 0;
  virtual absl::StatusOr<void*> CreateEventRaw() = 0;
  virtual void DestroyEventRaw(void* handle) = 0;
  virtual absl::Status CopyToDeviceRaw(const void* src, void* dst, size_t bytes,
                                       Stream stream) = 0;
  // Gets a validated patch with at least one range.
  virtual absl::Status ApplyPageTablePatchRaw(const PageTablePatch& patch,
                                              Stream stream) = 0;

  static void* EventHandle(const DeviceEvent& event) { return event.handle_; }

 private:
  template <MemoryKind>
  friend class OwnedMemory;
  friend class DeviceEvent;

  DeviceStats stats_;
};

}  // namespace kvblock

#endif  // KVBLOCK_DEVICE_H_
