// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KVPageTable on a CUDA device: the upload checks of the CPU tests, and the
// staging guard against a stream that is really busy.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "commit/page_table_checks.h"
#include "commit/page_table_random_run.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

std::unique_ptr<Device> CudaDevice() {
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Cuda(0);
  REQUIRE_OK(device);
  return *std::move(device);
}

// Keeps the default stream busy for tens of milliseconds with a 1 GiB
// copy (its buffers live as long as it does), so that what is enqueued
// after it stays in flight.
struct BusyCopy {
  explicit BusyCopy(Device& device) {
    constexpr size_t kBytes = size_t{1} << 30;
    absl::StatusOr<PinnedBuffer> pinned = device.AllocatePinned(kBytes);
    absl::StatusOr<DeviceBuffer> buffer = device.Allocate(kBytes);
    REQUIRE_OK(pinned);
    REQUIRE_OK(buffer);
    source = *std::move(pinned);
    target = *std::move(buffer);
    REQUIRE_OK(
        device.CopyToDevice(source.data(), target.data(), kBytes, nullptr));
  }
  PinnedBuffer source;
  DeviceBuffer target;
};

TEST_CASE("upload behaviour on a cuda device", "[gpu]") {
  std::unique_ptr<Device> device = CudaDevice();
  REQUIRE(device->kind() == Device::Kind::kCuda);
  testing::UploadChecks(*device);
}

TEST_CASE("random calls on a cuda device: every upload is exact", "[gpu]") {
  std::unique_ptr<Device> device = CudaDevice();
  const testing::Geometry geometry =
      GENERATE(from_range(std::begin(testing::kRandomGeometries),
                          std::end(testing::kRandomGeometries)));
  const bool small_staging = GENERATE(false, true);
  INFO("geometry " << geometry.max_batch << " x " << geometry.max_pages_per_seq
                   << ", small staging " << small_staging);
  testing::PageTableRandomRun run(
      7, geometry, *device,
      small_staging ? KVPageTable::MinStagingBytes(geometry.max_pages_per_seq)
                    : 0);
  for (int op = 0; op < 2000; ++op) {
    INFO("op " << op);
    if (run.Uniform(0, 99) >= 30) {
      run.Mutate();
      continue;
    }
    run.UploadAndCheck(*device);
    REQUIRE(testing::ReadMirror(run.table(), *device) ==
            run.model().Image(run.model().rows));
  }
}

TEST_CASE("steady-state calls on a cuda device do not allocate", "[gpu]") {
  std::unique_ptr<Device> device = CudaDevice();
  testing::SteadyStateCallsAllocateNothing(*device);
}

TEST_CASE("cuda allocations are zero-filled and copies round-trip", "[gpu]") {
  std::unique_ptr<Device> device = CudaDevice();
  constexpr size_t kBytes = 1 << 20;
  absl::StatusOr<DeviceBuffer> buffer = device->Allocate(kBytes);
  absl::StatusOr<PinnedBuffer> pinned = device->AllocatePinned(kBytes);
  REQUIRE_OK(buffer);
  REQUIRE_OK(pinned);
  std::vector<unsigned char> back(kBytes, 0xff);
  REQUIRE_OK(device->CopyToHost(buffer->data(), back.data(), kBytes, nullptr));
  REQUIRE_OK(device->Synchronize(nullptr));
  REQUIRE(back == std::vector<unsigned char>(kBytes, 0));

  std::memset(pinned->data(), 0x5a, kBytes);
  const DeviceStats before = device->stats();
  REQUIRE_OK(
      device->CopyToDevice(pinned->data(), buffer->data(), kBytes, nullptr));
  REQUIRE(device->stats().copies == before.copies + 1);
  REQUIRE(device->stats().bytes == before.bytes + static_cast<int64_t>(kBytes));
  REQUIRE_OK(device->CopyToHost(buffer->data(), back.data(), kBytes, nullptr));
  REQUIRE_OK(device->Synchronize(nullptr));
  REQUIRE(back == std::vector<unsigned char>(kBytes, 0x5a));
}

TEST_CASE("upload waits for a staging slot only when all are in flight",
          "[gpu]") {
  std::unique_ptr<Device> device = CudaDevice();
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(8, 64, 1024, *device);
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  REQUIRE_OK(table.Upload(nullptr));
  REQUIRE_OK(device->Synchronize(nullptr));

  // The uploads below stay in flight behind it.
  const BusyCopy busy(*device);
  for (int i = 0; i < KVPageTable::kStagingSlots; ++i) {
    const std::vector<PageId> row(i + 1, static_cast<PageId>(i));
    REQUIRE_OK(table.SetRow(i, row));
    REQUIRE_OK(table.Upload(nullptr));
  }
  REQUIRE(table.upload_stats().host_waits == 0);
  REQUIRE_OK(table.SetRow(0, {99}));
  REQUIRE_OK(table.Upload(nullptr));
  REQUIRE(table.upload_stats().host_waits == 1);
  REQUIRE(testing::ReadMirror(table, *device) ==
          testing::ExpectedMirror(table));
}

TEST_CASE("a stream made to wait for an upload's event reads the upload",
          "[gpu]") {
  // What the Python table's __dlpack__(stream=s) does for a consumer's
  // stream: an event recorded on the default stream after the upload, then
  // StreamWaitEvent. The upload is held behind a 1 GiB copy, so a
  // non-blocking stream that did not wait would read the old row.
  std::unique_ptr<Device> device = CudaDevice();
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(8, 64, 1024, *device);
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  REQUIRE_OK(table.Upload(nullptr));
  REQUIRE_OK(device->Synchronize(nullptr));
  const BusyCopy busy(*device);
  REQUIRE_OK(table.SetRow(3, {7, 8, 9}));
  REQUIRE_OK(table.Upload(nullptr));
  absl::StatusOr<DeviceEvent> uploaded = device->CreateEvent();
  REQUIRE_OK(uploaded);
  REQUIRE_OK(device->RecordEvent(*uploaded, nullptr));

  cudaStream_t consumer = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) ==
          cudaSuccess);
  REQUIRE_OK(device->StreamWaitEvent(consumer, *uploaded));
  const DeviceTensor view = table.kernel_view();
  std::vector<int32_t> image(static_cast<size_t>(view.num_elements()));
  REQUIRE_OK(device->CopyToHost(view.data(), image.data(), view.size_bytes(),
                                consumer));
  REQUIRE_OK(device->Synchronize(consumer));
  REQUIRE(cudaStreamDestroy(consumer) == cudaSuccess);
  REQUIRE(image == testing::ExpectedMirror(table));
}

}  // namespace
}  // namespace kvblock
