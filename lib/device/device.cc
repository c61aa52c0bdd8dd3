// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The device-independent half of Device (RAII handles, the accounting
// wrappers) and the host emulation device.
#include "kvblock/device.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "device/page_table_patch_reference.h"
#include "kvblock/status_macros.h"

#ifdef KVBLOCK_HAVE_CUDA
#include "device/device_cuda.h"
#endif

namespace kvblock {

template <MemoryKind kKind>
OwnedMemory<kKind>::OwnedMemory(OwnedMemory&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

template <MemoryKind kKind>
OwnedMemory<kKind>& OwnedMemory<kKind>::operator=(
    OwnedMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

template <MemoryKind kKind>
OwnedMemory<kKind>::~OwnedMemory() {
  Reset();
}

template <MemoryKind kKind>
void OwnedMemory<kKind>::Reset() {
  if (device_ != nullptr) {
    if constexpr (kKind == MemoryKind::kDevice) {
      device_->FreeRaw(data_);
    } else {
      device_->FreePinnedRaw(data_);
    }
  }
  device_ = nullptr;
  data_ = nullptr;
  size_bytes_ = 0;
}

template class OwnedMemory<MemoryKind::kDevice>;
template class OwnedMemory<MemoryKind::kPinned>;

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)) {}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

DeviceEvent::~DeviceEvent() { Reset(); }

void DeviceEvent::Reset() {
  if (device_ != nullptr) device_->DestroyEventRaw(handle_);
  device_ = nullptr;
  handle_ = nullptr;
}

absl::StatusOr<DeviceBuffer> Device::Allocate(size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("device: allocation of 0 bytes");
  }
  KVBLOCK_ASSIGN_OR_RETURN(void* data, AllocateRaw(bytes));
  return DeviceBuffer(this, data, bytes);
}

absl::StatusOr<PinnedBuffer> Device::AllocatePinned(size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("device: pinned allocation of 0 bytes");
  }
  KVBLOCK_ASSIGN_OR_RETURN(void* data, AllocatePinnedRaw(bytes));
  return PinnedBuffer(this, data, bytes);
}

absl::StatusOr<DeviceEvent> Device::CreateEvent() {
  KVBLOCK_ASSIGN_OR_RETURN(void* handle, CreateEventRaw());
  return DeviceEvent(this, handle);
}

namespace {

// InvalidArgument for a copy (`what`: "to device", ...) of bytes > 0 with a
// null pointer.
absl::Status CheckCopy(absl::string_view what, const void* src, void* dst,
                       size_t bytes) {
  if (bytes == 0 || (src != nullptr && dst != nullptr)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: copy ", what, " of ", bytes, " bytes with a null ",
                   src == nullptr ? "source" : "destination"));
}

}  // namespace

absl::Status Device::CopyToDevice(const void* src, void* dst, size_t bytes,
                                  Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(CheckCopy("to device", src, dst, bytes));
  KVBLOCK_RETURN_IF_ERROR(CopyToDeviceRaw(src, dst, bytes, stream));
  ++stats_.copies;
  stats_.bytes += static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

absl::Status Device::ApplyPageTablePatch(const PageTablePatch& patch,
                                         Stream stream) {
  if (patch.num_ranges == 0) return absl::OkStatus();
  if (patch.num_ranges < 0 || patch.max_batch <= 0 ||
      patch.max_pages_per_seq <= 0 || patch.num_pages <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: page table patch: num_ranges ", patch.num_ranges,
                     ", max_batch ", patch.max_batch, ", max_pages_per_seq ",
                     patch.max_pages_per_seq, ", num_pages ", patch.num_pages,
                     ": want positive values"));
  }
  if (patch.table == nullptr || patch.ids == nullptr ||
      patch.ranges == nullptr) {
    return absl::InvalidArgumentError(
        "device: page table patch: null table, ids or ranges");
  }
  return ApplyPageTablePatchRaw(patch, stream);
}

namespace {

// Host emulation: device and pinned memory are calloc'ed host memory, every
// copy is a memcpy done before the call returns, so streams and events have
// nothing to wait for.
class HostDevice final : public Device {
 public:
  Kind kind() const override { return Kind::kHost; }
  std::string_view name() const override { return "host"; }

  // A null pointer is an error, as CUDA's copies return one.
  absl::Status CopyToHost(const void* src, void* dst, size_t bytes,
                          Stream /*stream*/) override {
    KVBLOCK_RETURN_IF_ERROR(CheckCopy("to host", src, dst, bytes));
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyDeviceToDevice(const void* src, void* dst, size_t bytes,
                                  Stream /*stream*/) override {
    KVBLOCK_RETURN_IF_ERROR(CheckCopy("device to device", src, dst, bytes));
    if (bytes != 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(Stream /*stream*/) override {
    return absl::OkStatus();
  }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  absl::Status RecordEvent(DeviceEvent& /*event*/, Stream /*stream*/) override {
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventDone(const DeviceEvent& /*event*/) override {
    return true;
  }
  absl::Status WaitEvent(const DeviceEvent& /*event*/) override {
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(Stream /*stream*/,
                               const DeviceEvent& /*event*/) override {
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    return Calloc(bytes);
  }
  void FreeRaw(void* ptr) override { std::free(ptr); }
  absl::StatusOr<void*> AllocatePinnedRaw(size_t bytes) override {
    return Calloc(bytes);
  }
  void FreePinnedRaw(void* ptr) override { std::free(ptr); }
  // Host events carry no state: every recorded point is already reached.
  absl::StatusOr<void*> CreateEventRaw() override { return nullptr; }
  void DestroyEventRaw(void* /*handle*/) override {}
  absl::Status CopyToDeviceRaw(const void* src, void* dst, size_t bytes,
                               Stream /*stream*/) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status ApplyPageTablePatchRaw(const PageTablePatch& patch,
                                      Stream /*stream*/) override {
    internal::ApplyPageTablePatchReference(patch);
    return absl::OkStatus();
  }

 private:
  static absl::StatusOr<void*> Calloc(size_t bytes) {
    void* data = std::calloc(1, bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device: host: out of memory allocating ", bytes, " bytes"));
    }
    return data;
  }
};

}  // namespace

std::unique_ptr<Device> Device::Host() {
  return std::make_unique<HostDevice>();
}

absl::StatusOr<std::unique_ptr<Device>> Device::Cuda(int ordinal) {
  if (ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device: cuda ordinal must be non-negative, got ", ordinal));
  }
#ifdef KVBLOCK_HAVE_CUDA
  return internal::OpenCudaDevice(ordinal);
#else
  return absl::UnavailableError("device: kvblock was built without CUDA");
#endif
}

}  // namespace kvblock
