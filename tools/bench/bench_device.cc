// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "bench_device.h"

#include <memory>
#include <utility>

#include "absl/status/statusor.h"

namespace kvblock {

Device& BenchDevice() {
  static Device* const device = [] {
    absl::StatusOr<std::unique_ptr<Device>> cuda = Device::Cuda(0);
    return (cuda.ok() ? *std::move(cuda) : Device::Host()).release();
  }();
  return *device;
}

}  // namespace kvblock
