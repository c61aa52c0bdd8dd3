// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: the CUDA implementation of Device and the one translation of
// cudaError_t to absl::Status, compiled only when kvblock is built with CUDA
// (include this header only under KVBLOCK_HAVE_CUDA). Device::Cuda validates
// the ordinal and calls OpenCudaDevice.
//
// Thread safety: as Device.
#ifndef KVBLOCK_LIB_DEVICE_DEVICE_CUDA_H_
#define KVBLOCK_LIB_DEVICE_DEVICE_CUDA_H_

#include <cuda_runtime.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvblock/device.h"

namespace kvblock::internal {

// OK for cudaSuccess; otherwise `what` and CUDA's name for the error, as
// ResourceExhausted (out of memory), Unavailable (no usable driver or GPU) or
// Internal (anything else).
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

// The CUDA device `ordinal` (REQUIRES: ordinal >= 0), made the calling
// thread's current device. Unavailable when no driver or GPU is present or
// `ordinal` is not a device; Internal on any other CUDA failure.
absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal);

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_DEVICE_DEVICE_CUDA_H_
