// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// CudaDevice: Device on the CUDA runtime. Device memory comes from cudaMalloc
// (zero-filled with cudaMemset before it is handed out), staging from
// cudaHostAlloc, copies are cudaMemcpyAsync on the caller's stream and events
// are timing-free cudaEvents. CudaStatus is the one place that turns a
// cudaError_t into an absl::Status.
#include "device/device_cuda.h"

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/launchers.h"
#include "kvblock/status_macros.h"

namespace kvblock::internal {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", cudaGetErrorString(error),
                                     " (", cudaGetErrorName(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    // No usable driver or GPU. cudaErrorStubLibrary: the process loaded the
    // toolkit's libcuda stub (linking aid) because no real driver exists.
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

static_assert(sizeof(kernels::TablePatchRange) == sizeof(PageTablePatchRange));
static_assert(offsetof(kernels::TablePatchRange, entry) ==
              offsetof(PageTablePatchRange, entry));
static_assert(offsetof(kernels::TablePatchRange, count) ==
              offsetof(PageTablePatchRange, count));
static_assert(offsetof(kernels::TablePatchRange, clear) ==
              offsetof(PageTablePatchRange, clear));
static_assert(offsetof(kernels::TablePatchRange, ids_offset) ==
              offsetof(PageTablePatchRange, ids_offset));

cudaStream_t ToStream(Stream stream) {
  return static_cast<cudaStream_t>(stream);
}

cudaEvent_t ToEvent(void* handle) { return static_cast<cudaEvent_t>(handle); }

// A cudaMemcpyAsync's status. Its message is built only for an error: an
// upload copies every step, and a message on every call cost a heap
// allocation and a few hundred nanoseconds each.
absl::Status CopyStatus(cudaError_t error, cudaMemcpyKind kind, size_t bytes) {
  if (error == cudaSuccess) return absl::OkStatus();
  const absl::string_view direction =
      kind == cudaMemcpyHostToDevice   ? "host to device"
      : kind == cudaMemcpyDeviceToHost ? "device to host"
                                       : "device to device";
  return CudaStatus(error, absl::StrCat("cudaMemcpyAsync ", direction, " of ",
                                        bytes, " bytes"));
}

// The CUDA runtime allocates on the calling thread's current device.
absl::Status SetCurrentDevice(int ordinal) {
  return CudaStatus(cudaSetDevice(ordinal),
                    absl::StrCat("cudaSetDevice(", ordinal, ")"));
}

// Allocation and event creation make `ordinal_` the calling thread's current
// device (the CUDA runtime allocates on the current device); copies, events
// and synchronization follow the caller's stream.
class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name)
      : ordinal_(ordinal), name_(std::move(name)) {}

  Kind kind() const override { return Kind::kCuda; }
  std::string_view name() const override { return name_; }

  absl::Status CopyToHost(const void* src, void* dst, size_t bytes,
                          Stream stream) override {
    return Copy(src, dst, bytes, cudaMemcpyDeviceToHost, stream);
  }
  absl::Status CopyDeviceToDevice(const void* src, void* dst, size_t bytes,
                                  Stream stream) override {
    return Copy(src, dst, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  absl::Status Synchronize(Stream stream) override {
    return CudaStatus(cudaStreamSynchronize(ToStream(stream)),
                      "cudaStreamSynchronize");
  }
  absl::Status RecordEvent(DeviceEvent& event, Stream stream) override {
    return CudaStatus(
        cudaEventRecord(ToEvent(EventHandle(event)), ToStream(stream)),
        "cudaEventRecord");
  }
  absl::StatusOr<bool> EventDone(const DeviceEvent& event) override {
    const cudaError_t error = cudaEventQuery(ToEvent(EventHandle(event)));
    if (error == cudaErrorNotReady) return false;
    KVBLOCK_RETURN_IF_ERROR(CudaStatus(error, "cudaEventQuery"));
    return true;
  }
  absl::Status MakeCurrent() override { return SetCurrentDevice(ordinal_); }
  absl::Status WaitEvent(const DeviceEvent& event) override {
    return CudaStatus(cudaEventSynchronize(ToEvent(EventHandle(event))),
                      "cudaEventSynchronize");
  }
  absl::Status StreamWaitEvent(Stream stream,
                               const DeviceEvent& event) override {
    return CudaStatus(
        cudaStreamWaitEvent(ToStream(stream), ToEvent(EventHandle(event)), 0),
        "cudaStreamWaitEvent");
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    KVBLOCK_RETURN_IF_ERROR(SetCurrentDevice(ordinal_));
    void* data = nullptr;
    KVBLOCK_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&data, bytes),
                   absl::StrCat("cudaMalloc of ", bytes, " bytes on ", name_)));
    // cudaMemset is asynchronous: wait, so that the zeros are in place before
    // any stream of the caller's (blocking or not) touches the buffer.
    absl::Status status = CudaStatus(cudaMemset(data, 0, bytes), "cudaMemset");
    if (status.ok()) {
      status = CudaStatus(cudaStreamSynchronize(nullptr),
                          "cudaStreamSynchronize after cudaMemset");
    }
    if (!status.ok()) {
      cudaFree(data);
      return status;
    }
    return data;
  }
  void FreeRaw(void* ptr) override { cudaFree(ptr); }
  absl::StatusOr<void*> AllocatePinnedRaw(size_t bytes) override {
    KVBLOCK_RETURN_IF_ERROR(SetCurrentDevice(ordinal_));
    void* data = nullptr;
    KVBLOCK_RETURN_IF_ERROR(
        CudaStatus(cudaHostAlloc(&data, bytes, cudaHostAllocDefault),
                   absl::StrCat("cudaHostAlloc of ", bytes, " bytes")));
    std::memset(data, 0, bytes);
    return data;
  }
  void FreePinnedRaw(void* ptr) override { cudaFreeHost(ptr); }
  absl::StatusOr<void*> CreateEventRaw() override {
    KVBLOCK_RETURN_IF_ERROR(SetCurrentDevice(ordinal_));
    cudaEvent_t event = nullptr;
    KVBLOCK_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags"));
    return static_cast<void*>(event);
  }
  void DestroyEventRaw(void* handle) override {
    cudaEventDestroy(ToEvent(handle));
  }
  absl::Status CopyToDeviceRaw(const void* src, void* dst, size_t bytes,
                               Stream stream) override {
    return Copy(src, dst, bytes, cudaMemcpyHostToDevice, stream);
  }
  absl::Status ApplyPageTablePatchRaw(const PageTablePatch& patch,
                                      Stream stream) override {
    // The launch goes to the current device; a launch reports
    // cudaGetLastError(), so drop what an unrelated call left before it.
    KVBLOCK_RETURN_IF_ERROR(SetCurrentDevice(ordinal_));
    (void)cudaGetLastError();
    const cudaError_t error =
        static_cast<cudaError_t>(kernels::LaunchApplyPageTablePatch(
            patch.table, patch.max_batch, patch.max_pages_per_seq,
            patch.num_pages, patch.ids,
            reinterpret_cast<const kernels::TablePatchRange*>(patch.ranges),
            patch.num_ranges, stream));
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaStatus(error, absl::StrCat("page table patch of ",
                                          patch.num_ranges, " ranges"));
  }

 private:
  // cudaMemcpyAsync of `bytes` (none for 0) in direction `kind`.
  static absl::Status Copy(const void* src, void* dst, size_t bytes,
                           cudaMemcpyKind kind, Stream stream) {
    if (bytes == 0) return absl::OkStatus();
    return CopyStatus(cudaMemcpyAsync(dst, src, bytes, kind, ToStream(stream)),
                      kind, bytes);
  }

  const int ordinal_;
  const std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal) {
  int count = 0;
  if (absl::Status status =
          CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
      !status.ok()) {
    // Whatever the driver says, no device count means no usable GPU here.
    return absl::UnavailableError(status.message());
  }
  if (ordinal >= count) {
    return absl::UnavailableError(absl::StrCat(
        "cuda device ", ordinal, " does not exist: ", count, " devices"));
  }
  KVBLOCK_RETURN_IF_ERROR(SetCurrentDevice(ordinal));
  cudaDeviceProp properties;
  KVBLOCK_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&properties, ordinal),
                 absl::StrCat("cudaGetDeviceProperties(", ordinal, ")")));
  return std::make_unique<CudaDevice>(
      ordinal, absl::StrCat("cuda:", ordinal, " ", properties.name));
}

}  // namespace kvblock::internal
