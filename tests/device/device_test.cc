// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/device.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "device/deferred_device.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::DeferredDevice;

bool AllZero(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST_CASE("host device allocations are zero-filled") {
  std::unique_ptr<Device> device = Device::Host();
  REQUIRE(device->kind() == Device::Kind::kHost);
  REQUIRE(device->name() == "host");
  absl::StatusOr<DeviceBuffer> buffer = device->Allocate(4096);
  REQUIRE_OK(buffer);
  REQUIRE(buffer->size_bytes() == 4096);
  REQUIRE(AllZero(buffer->data(), 4096));
  absl::StatusOr<PinnedBuffer> pinned = device->AllocatePinned(100);
  REQUIRE_OK(pinned);
  REQUIRE(pinned->size_bytes() == 100);
  REQUIRE(AllZero(pinned->data(), 100));
}

TEST_CASE("allocations of zero bytes are rejected") {
  std::unique_ptr<Device> device = Device::Host();
  REQUIRE_STATUS_IS(device->Allocate(0), kInvalidArgument);
  REQUIRE_STATUS_IS(device->AllocatePinned(0), kInvalidArgument);
}

TEST_CASE("copies to the device are counted exactly, other copies are not") {
  std::unique_ptr<Device> device = Device::Host();
  absl::StatusOr<DeviceBuffer> buffer = device->Allocate(64);
  REQUIRE_OK(buffer);
  const std::vector<int32_t> source = {1, 2, 3, 4};
  char* dst = static_cast<char*>(buffer->data());

  REQUIRE_OK(device->CopyToDevice(source.data(), dst, 16, nullptr));
  REQUIRE_OK(device->CopyToDevice(source.data(), dst + 16, 8, nullptr));
  SECTION("a copy of zero bytes is no copy") {
    REQUIRE_OK(device->CopyToDevice(source.data(), dst, 0, nullptr));
    REQUIRE(device->stats().copies == 2);
    REQUIRE(device->stats().bytes == 24);
  }
  SECTION("a null source or destination is rejected and not counted") {
    REQUIRE_STATUS_IS(device->CopyToDevice(nullptr, dst, 4, nullptr),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(device->CopyToDevice(source.data(), nullptr, 4, nullptr),
                      kInvalidArgument);
    REQUIRE(device->stats().copies == 2);
    REQUIRE(device->stats().bytes == 24);
  }
  SECTION("copies back and within the device are not counted") {
    REQUIRE_OK(device->CopyDeviceToDevice(dst, dst + 32, 24, nullptr));
    std::vector<int32_t> back(6, 0);
    REQUIRE_OK(device->CopyToHost(dst + 32, back.data(), 24, nullptr));
    REQUIRE_OK(device->Synchronize(nullptr));
    REQUIRE(back == std::vector<int32_t>{1, 2, 3, 4, 1, 2});
    REQUIRE(device->stats().copies == 2);
    REQUIRE(device->stats().bytes == 24);
  }
}

TEST_CASE("a host copy with a null pointer is an error, not a crash") {
  const auto device = Device::Host();
  int32_t value = 7;
  for (const auto& [status, message] :
       {std::pair{device->CopyToHost(nullptr, &value, 4, nullptr),
                  "copy to host of 4 bytes with a null source"},
        std::pair{device->CopyToHost(&value, nullptr, 4, nullptr),
                  "with a null destination"},
        std::pair{device->CopyDeviceToDevice(nullptr, &value, 4, nullptr),
                  "copy device to device of 4 bytes with a null source"}}) {
    REQUIRE_STATUS_IS(status, kInvalidArgument);
    REQUIRE(status.message().find(message) != absl::string_view::npos);
  }
  REQUIRE(value == 7);
  REQUIRE_OK(device->CopyToHost(nullptr, nullptr, 0, nullptr));
}

TEST_CASE("host events are complete before and after recording") {
  std::unique_ptr<Device> device = Device::Host();
  absl::StatusOr<DeviceEvent> event = device->CreateEvent();
  REQUIRE_OK(event);
  REQUIRE(event->valid());
  absl::StatusOr<bool> done = device->EventDone(*event);
  REQUIRE_OK(done);
  REQUIRE(*done);
  REQUIRE_OK(device->RecordEvent(*event, nullptr));
  done = device->EventDone(*event);
  REQUIRE_OK(done);
  REQUIRE(*done);
  REQUIRE_OK(device->WaitEvent(*event));
}

TEST_CASE("buffers and events release what they own exactly once") {
  DeferredDevice device;
  {
    absl::StatusOr<DeviceBuffer> a = device.Allocate(8);
    absl::StatusOr<PinnedBuffer> b = device.AllocatePinned(8);
    absl::StatusOr<DeviceEvent> e = device.CreateEvent();
    REQUIRE_OK(a);
    REQUIRE_OK(b);
    REQUIRE_OK(e);
    REQUIRE(device.live_allocations() == 2);
    REQUIRE(device.live_events() == 1);

    DeviceBuffer moved(std::move(*a));
    REQUIRE(a->data() == nullptr);
    REQUIRE(a->size_bytes() == 0);
    REQUIRE(moved.size_bytes() == 8);
    absl::StatusOr<DeviceBuffer> c = device.Allocate(16);
    REQUIRE_OK(c);
    moved = std::move(*c);  // frees the 8 bytes it held.
    REQUIRE(device.live_allocations() == 2);
    REQUIRE(moved.size_bytes() == 16);

    PinnedBuffer pinned = std::move(*b);
    REQUIRE(b->data() == nullptr);
    DeviceEvent event = std::move(*e);
    REQUIRE_FALSE(e->valid());
    REQUIRE(event.valid());
    REQUIRE(device.live_allocations() == 2);
    REQUIRE(device.live_events() == 1);
  }
  REQUIRE(device.live_allocations() == 0);
  REQUIRE(device.live_events() == 0);
}

TEST_CASE("the deferred test device runs copies only when waited for") {
  DeferredDevice device;
  absl::StatusOr<DeviceBuffer> buffer = device.Allocate(4);
  absl::StatusOr<DeviceEvent> event = device.CreateEvent();
  REQUIRE_OK(buffer);
  REQUIRE_OK(event);
  int32_t value = 7;
  REQUIRE_OK(device.CopyToDevice(&value, buffer->data(), 4, nullptr));
  REQUIRE_OK(device.RecordEvent(*event, nullptr));
  REQUIRE(*device.EventDone(*event) == false);
  value = 8;  // the copy has not read its source yet.
  REQUIRE(device.pending_ops() == 1);
  REQUIRE_OK(device.WaitEvent(*event));
  REQUIRE(*device.EventDone(*event));
  int32_t seen = 0;
  std::memcpy(&seen, buffer->data(), 4);
  REQUIRE(seen == 8);
  REQUIRE_FALSE(device.RunToNextEvent());
}

TEST_CASE("cuda device is an error, not a crash, without a GPU") {
  REQUIRE_STATUS_IS(Device::Cuda(-1), kInvalidArgument);
  REQUIRE_STATUS_IS(Device::Cuda(1 << 20), kUnavailable);
  absl::StatusOr<std::unique_ptr<Device>> cuda = Device::Cuda(0);
  if (cuda.ok()) {
    REQUIRE((*cuda)->kind() == Device::Kind::kCuda);
    REQUIRE((*cuda)->name().substr(0, 7) == "cuda:0 ");
  } else {
    INFO(cuda.status().ToString());
    REQUIRE(cuda.status().code() == absl::StatusCode::kUnavailable);
  }
}

TEST_CASE("a page-table patch sets K ids, derives V ids and clears") {
  std::unique_ptr<Device> device = Device::Host();
  // A table of 2 rows of 4 pages over 10 pages, every entry 5 (stale).
  std::vector<int32_t> table(2 * 2 * 4, 5);
  const int32_t ids[] = {1, 2, 3};
  const PageTablePatchRange ranges[] = {
      {.entry = 1 * 4 + 1, .count = 2, .clear = 1, .ids_offset = 1},
      {.entry = 0, .count = 1, .clear = 3, .ids_offset = 0},
      // Past the row's end, past the table, negative: skipped.
      {.entry = 3, .count = 2, .clear = 0, .ids_offset = 0},
      {.entry = 8, .count = 1, .clear = 0, .ids_offset = 0},
      {.entry = -1, .count = 1, .clear = 0, .ids_offset = 0},
  };
  PageTablePatch patch{.table = table.data(),
                       .max_batch = 2,
                       .max_pages_per_seq = 4,
                       .num_pages = 10,
                       .ids = ids,
                       .ranges = ranges,
                       .num_ranges = 5};
  REQUIRE_OK(device->ApplyPageTablePatch(patch, nullptr));
  REQUIRE(table == std::vector<int32_t>{1, -1, -1, -1, 11, -1, -1, -1,  //
                                        5, 2, 3, -1, 5, 12, 13, -1});
  REQUIRE(device->stats().copies == 0);

  patch.num_ranges = 0;
  patch.table = nullptr;  // no ranges: nothing is read.
  REQUIRE_OK(device->ApplyPageTablePatch(patch, nullptr));
  patch.num_ranges = 1;
  REQUIRE_STATUS_IS(device->ApplyPageTablePatch(patch, nullptr),
                    kInvalidArgument);
  patch.table = table.data();
  patch.max_pages_per_seq = 0;
  REQUIRE_STATUS_IS(device->ApplyPageTablePatch(patch, nullptr),
                    kInvalidArgument);
}

TEST_CASE("the deferred test device runs patches in order with copies") {
  DeferredDevice device;
  absl::StatusOr<DeviceBuffer> table = device.Allocate(2 * sizeof(int32_t));
  absl::StatusOr<DeviceBuffer> ids = device.Allocate(sizeof(int32_t));
  absl::StatusOr<DeviceEvent> event = device.CreateEvent();
  REQUIRE_OK(table);
  REQUIRE_OK(ids);
  REQUIRE_OK(event);
  const int32_t id = 4;
  const PageTablePatchRange range{.entry = 0, .count = 1};
  REQUIRE_OK(device.CopyToDevice(&id, ids->data(), sizeof(id), nullptr));
  REQUIRE_OK(device.ApplyPageTablePatch(
      {.table = static_cast<int32_t*>(table->data()),
       .max_batch = 1,
       .max_pages_per_seq = 1,
       .num_pages = 6,
       .ids = static_cast<const int32_t*>(ids->data()),
       .ranges = &range,
       .num_ranges = 1},
      nullptr));
  REQUIRE_OK(device.RecordEvent(*event, nullptr));
  REQUIRE(device.pending_ops() == 2);
  int32_t seen[2] = {};
  std::memcpy(seen, table->data(), sizeof(seen));
  REQUIRE(seen[0] == 0);  // not run yet.
  REQUIRE(device.RunToNextEvent());
  std::memcpy(seen, table->data(), sizeof(seen));
  REQUIRE(seen[0] == 4);
  REQUIRE(seen[1] == 10);
}

}  // namespace
}  // namespace kvblock
