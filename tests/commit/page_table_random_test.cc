// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Randomized runs of KVPageTable against a trivially correct model (see
// page_table_random_run.h), on the host device and on a device whose copies
// run late; after every upload the device image is checked against a
// brute-force rebuild from the model's rows.
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "commit/page_table_checks.h"
#include "commit/page_table_random_run.h"
#include "device/deferred_device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::DeferredDevice;
using ::kvblock::testing::Geometry;
using ::kvblock::testing::kRandomGeometries;
using ::kvblock::testing::PageTableModel;
using ::kvblock::testing::PageTableRandomRun;
using ::kvblock::testing::ReadMirror;

constexpr int kOps = ::kvblock::testing::RandomRunLength(10000);

// The default staging, or the least that holds one row (so that most
// patches split).
int64_t StagingBytes(bool small, const Geometry& g) {
  return small ? KVPageTable::MinStagingBytes(g.max_pages_per_seq) : 0;
}

TEST_CASE("random calls match a model; every upload is exact", "[random]") {
  const uint32_t seed = GENERATE(1u, 2u, 3u);
  const Geometry geometry = GENERATE(
      from_range(std::begin(kRandomGeometries), std::end(kRandomGeometries)));
  const bool small_staging = GENERATE(false, true);
  INFO("seed " << seed << ", geometry " << geometry.max_batch << " x "
               << geometry.max_pages_per_seq << " over " << geometry.num_pages
               << " pages, small staging " << small_staging);
  std::unique_ptr<Device> device = Device::Host();
  PageTableRandomRun run(seed, geometry, *device,
                         StagingBytes(small_staging, geometry));
  for (int op = 0; op < kOps; ++op) {
    INFO("op " << op);
    if (run.Uniform(0, 99) >= 30) {
      run.Mutate();
      continue;
    }
    run.UploadAndCheck(*device);
    REQUIRE(ReadMirror(run.table(), *device) ==
            run.model().Image(run.model().rows));
    if (op % 64 == 0) REQUIRE_OK(run.table().CheckInvariants());
  }
  REQUIRE_OK(run.table().CheckInvariants());
}

TEST_CASE("random calls with patches in flight: each upload lands intact",
          "[random]") {
  const uint32_t seed = GENERATE(11u, 12u, 13u);
  const Geometry geometry = GENERATE(
      from_range(std::begin(kRandomGeometries), std::end(kRandomGeometries)));
  const bool small_staging = GENERATE(false, true);
  INFO("seed " << seed << ", geometry " << geometry.max_batch << " x "
               << geometry.max_pages_per_seq << " over " << geometry.num_pages
               << " pages, small staging " << small_staging);
  DeferredDevice device;
  PageTableRandomRun run(seed, geometry, device,
                         StagingBytes(small_staging, geometry));
  const DeviceTensor view = run.table().kernel_view();
  auto device_image = [&] {  // the deferred device's memory, as it is now.
    std::vector<int32_t> image(static_cast<size_t>(view.num_elements()));
    std::memcpy(image.data(), view.data(), view.size_bytes());
    return image;
  };
  // Per pending patch (recorded event), the image it completes: the image of
  // its upload when it is that upload's last patch, else none to check.
  std::deque<std::vector<int32_t>> in_flight;
  int64_t waits = 0;
  for (int op = 0; op < kOps; ++op) {
    INFO("op " << op);
    const int kind = run.Uniform(0, 99);
    if (kind < 55) {
      run.Mutate();
      continue;
    }
    if (kind < 70) {  // the device finishes the oldest patch.
      REQUIRE(device.RunToNextEvent() == !in_flight.empty());
      if (in_flight.empty()) continue;
      if (!in_flight.front().empty()) {
        REQUIRE(device_image() == in_flight.front());
      }
      in_flight.pop_front();
      continue;
    }
    PageTableModel& model = run.model();
    const KVPageTableUploadStats before = run.table().upload_stats();
    run.UploadAndCheck(device);
    const KVPageTableUploadStats& after = run.table().upload_stats();
    // Every patch the upload sent waited for a free slot when all were
    // busy; each wait ran the oldest pending patch, and only it.
    const int64_t copies = after.copies - before.copies;
    for (int64_t i = 0; i < copies; ++i) {
      if (in_flight.size() == static_cast<size_t>(KVPageTable::kStagingSlots)) {
        ++waits;
        in_flight.pop_front();
      }
      in_flight.emplace_back();
    }
    // Upload waits only for patches it has to: in_flight never overflows.
    REQUIRE(after.host_waits == waits);
    if (copies > 0) in_flight.back() = model.Image(model.rows);
  }
  while (device.RunToNextEvent()) {
    if (!in_flight.front().empty())
      REQUIRE(device_image() == in_flight.front());
    in_flight.pop_front();
  }
  REQUIRE(in_flight.empty());
  REQUIRE(ReadMirror(run.table(), device) ==
          run.model().Image(run.model().uploaded));
}

}  // namespace
}  // namespace kvblock
