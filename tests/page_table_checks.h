// Copyright 2026 The kvblock Authors.
//
// Checks of KVPageTable shared by the CPU tests (host and deferred devices)
// and the gpu suite (a CUDA device): snapshots for the strong guarantee, the
// expected device image, reading the mirror back, and UploadChecks, the
// upload behaviour every Device must show.
//
// Thread safety: none; one test thread.
#ifndef KVBLOCK_TESTS_PAGE_TABLE_CHECKS_H_
#define KVBLOCK_TESTS_PAGE_TABLE_CHECKS_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <vector>

#include "allocation_counter.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock::testing {

// What a caller can observe of a table without touching the device.
struct TableSnapshot {
  std::vector<PageId> rows;  // every HostRow, in slot order.
  bool is_identity = false;
  KVPageTableUploadStats upload_stats;
  const int32_t* mirror = nullptr;

  friend bool operator==(const TableSnapshot&, const TableSnapshot&) = default;
};

inline TableSnapshot Snapshot(const KVPageTable& table) {
  TableSnapshot snapshot;
  for (SlotId slot = 0; slot < table.max_batch(); ++slot) {
    const absl::Span<const PageId> row = *table.HostRow(slot);
    snapshot.rows.insert(snapshot.rows.end(), row.begin(), row.end());
  }
  snapshot.is_identity = table.is_identity();
  snapshot.upload_stats = table.upload_stats();
  snapshot.mirror = table.kernel_view().data();
  return snapshot;
}

// The device image the host rows call for: [max_batch, 2, max_pages_per_seq],
// K ids then V ids (K + num_pages; -1 stays -1).
inline std::vector<int32_t> ExpectedMirror(const KVPageTable& table) {
  std::vector<int32_t> image;
  for (SlotId slot = 0; slot < table.max_batch(); ++slot) {
    const absl::Span<const PageId> row = *table.HostRow(slot);
    image.insert(image.end(), row.begin(), row.end());
    for (PageId id : row) {
      image.push_back(id == kNoPage ? kNoPage : id + table.num_pages());
    }
  }
  return image;
}

// The device mirror, read back after all work on the default stream.
inline std::vector<int32_t> ReadMirror(const KVPageTable& table,
                                       Device& device) {
  const DeviceTensor view = table.kernel_view();
  std::vector<int32_t> image(static_cast<size_t>(view.num_elements()));
  REQUIRE_OK(device.Synchronize(nullptr));
  REQUIRE_OK(
      device.CopyToHost(view.data(), image.data(), view.size_bytes(), nullptr));
  REQUIRE_OK(device.Synchronize(nullptr));
  return image;
}

// What one Upload did, seen from its result and the device's counters.
struct UploadEffect {
  bool enqueued = false;
  int64_t copies = 0;
  int64_t bytes = 0;

  friend bool operator==(const UploadEffect&, const UploadEffect&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const UploadEffect& e) {
  return os << "{enqueued " << e.enqueued << ", copies " << e.copies
            << ", bytes " << e.bytes << "}";
}

// Uploads on the default stream; checks that the table's counters moved as
// the device's did.
inline UploadEffect UploadAndCount(KVPageTable& table, Device& device) {
  const DeviceStats before = device.stats();
  const KVPageTableUploadStats table_before = table.upload_stats();
  const absl::StatusOr<bool> enqueued = table.Upload(nullptr);
  REQUIRE_OK(enqueued);
  const UploadEffect effect{*enqueued, device.stats().copies - before.copies,
                            device.stats().bytes - before.bytes};
  REQUIRE(table.upload_stats().calls == table_before.calls + 1);
  REQUIRE(table.upload_stats().copies - table_before.copies == effect.copies);
  REQUIRE(table.upload_stats().bytes - table_before.bytes == effect.bytes);
  return effect;
}

// A table of `max_batch` rows of `width` pages over `num_pages` pages on
// `device`, uploaded once.
inline std::unique_ptr<KVPageTable> UploadedTable(Device& device,
                                                  int32_t max_batch,
                                                  int32_t width,
                                                  int32_t num_pages) {
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(max_batch, width, num_pages, device);
  REQUIRE_OK(created);
  REQUIRE(UploadAndCount(**created, device).enqueued);
  return *std::move(created);
}

inline void SetRowOk(KVPageTable& table, SlotId slot,
                     std::initializer_list<PageId> ids) {
  REQUIRE_OK(table.SetRow(slot, ids));
}

// Upload behaviour on `device`: the first upload copies everything, later
// ones copy runs of rows that differ from the last upload (runs close
// together as one, with the rows between), nothing else, and the mirror is
// exact after each. Uses Catch SECTIONs.
inline void UploadChecks(Device& device) {
  constexpr int32_t kBatch = 4;
  constexpr int32_t kWidth = 3;
  constexpr int32_t kPages = 16;
  constexpr int64_t kRowBytes = 2 * kWidth * sizeof(int32_t);
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(kBatch, kWidth, kPages, device);
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  const int32_t* const mirror = table.kernel_view().data();
  REQUIRE(mirror != nullptr);

  // The first upload copies the whole (empty) table in one copy.
  REQUIRE(UploadAndCount(table, device) ==
          UploadEffect{true, 1, kBatch * kRowBytes});
  REQUIRE(ReadMirror(table, device) ==
          std::vector<int32_t>(kBatch * 2 * kWidth, kNoPage));

  SECTION("nothing changed: no device operation") {
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
    REQUIRE(table.upload_stats().calls == 2);
  }
  SECTION("one changed row is one copy of one row, V ids derived") {
    SetRowOk(table, 2, {5, 15});
    REQUIRE(UploadAndCount(table, device) == UploadEffect{true, 1, kRowBytes});
    const std::vector<int32_t> image = ReadMirror(table, device);
    REQUIRE(std::vector<int32_t>(image.begin() + 2 * 2 * kWidth,
                                 image.begin() + 3 * 2 * kWidth) ==
            std::vector<int32_t>{5, 15, -1, 21, 31, -1});
    REQUIRE(image == ExpectedMirror(table));
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
  }
  SECTION("close runs of changed rows are one copy, the rows between too") {
    SetRowOk(table, 0, {1});
    SetRowOk(table, 1, {2, 3});
    SetRowOk(table, 3, {4, 5, 6});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, kBatch * kRowBytes});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
    REQUIRE(table.upload_stats().rows == 2 * kBatch);
  }
  SECTION("runs more than kMaxBridgedRows rows apart are copied apart") {
    constexpr int32_t kGap = KVPageTable::kMaxBridgedRows;
    const std::unique_ptr<KVPageTable> wide =
        UploadedTable(device, kGap + 3, kWidth, kPages);
    KVPageTable& rows = *wide;
    // kGap unchanged rows between: bridged.
    SetRowOk(rows, 0, {1});
    SetRowOk(rows, kGap + 1, {2});
    REQUIRE(UploadAndCount(rows, device) ==
            UploadEffect{true, 1, (kGap + 2) * kRowBytes});
    REQUIRE(ReadMirror(rows, device) == ExpectedMirror(rows));
    // kGap + 1: two copies of one row each.
    SetRowOk(rows, 0, {3, 4});
    SetRowOk(rows, kGap + 2, {5});
    REQUIRE(UploadAndCount(rows, device) ==
            UploadEffect{true, 2, 2 * kRowBytes});
    REQUIRE(ReadMirror(rows, device) == ExpectedMirror(rows));
  }
  SECTION("a row edited and edited back is not uploaded") {
    SetRowOk(table, 1, {7, 8});
    SetRowOk(table, 1, {});
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
    SetRowOk(table, 1, {7, 8});
    REQUIRE(UploadAndCount(table, device) == UploadEffect{true, 1, kRowBytes});
    SetRowOk(table, 1, {9});
    SetRowOk(table, 2, {9});
    SetRowOk(table, 1, {7, 8});
    REQUIRE(UploadAndCount(table, device) == UploadEffect{true, 1, kRowBytes});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
  }
  SECTION("compaction uploads the rows whose contents moved") {
    for (SlotId slot = 0; slot < kBatch; ++slot) SetRowOk(table, slot, {slot});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, kBatch * kRowBytes});
    // Slot 0 stays, 1 retires, 2 and 3 move down, 3 empties.
    REQUIRE_OK(table.CompactRows({0, kNoSlot, 1, 2}, 3));
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, 3 * kRowBytes});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
    // Swapping two rows and swapping back leaves nothing to upload.
    REQUIRE_OK(table.CompactRows({1, 0, 2, 3}, 4));
    REQUIRE_OK(table.CompactRows({1, 0, 2, 3}, 4));
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
  }
  SECTION("the identity layout is uploaded whole") {
    REQUIRE_OK(table.SetIdentity());
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, kBatch * kRowBytes});
    const std::vector<int32_t> image = ReadMirror(table, device);
    REQUIRE(image == ExpectedMirror(table));
    REQUIRE(image[2 * 2 * kWidth + kWidth] == 6 + kPages);
  }
  SECTION("every upload leaves an exact mirror as staging slots rotate") {
    // Rows i % 4 and (i + 2) % 4 change at every step: one copy of three
    // rows, the one between restaged from whatever its staging slot held.
    for (int i = 0; i < 3 * KVPageTable::kStagingSlots + 1; ++i) {
      SetRowOk(table, i % kBatch, {static_cast<PageId>(i % kPages)});
      SetRowOk(table, (i + 2) % kBatch,
               {static_cast<PageId>((i * 7) % kPages), 1});
      REQUIRE(UploadAndCount(table, device) ==
              UploadEffect{true, 1, 3 * kRowBytes});
      REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
    }
  }
  REQUIRE(table.kernel_view().data() == mirror);
}

// Steady-state SetRow, SetRows, CompactRows and Upload calls on `device`
// allocate no host memory (the commit layer makes them every step).
// REQUIRES: the test binary links allocation_counter.cc.
inline void SteadyStateCallsAllocateNothing(Device& device) {
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(64, 32, 4096, device);
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  std::vector<PageId> ids(32);
  std::vector<KVPageTableRowUpdate> updates;
  std::vector<SlotId> rotate(64);
  for (SlotId slot = 0; slot < 64; ++slot) rotate[slot] = (slot + 1) % 64;
  for (int step = 0; step < 3; ++step) {  // the first round warms up.
    const int64_t before = HeapAllocations();
    bool ok = true;
    for (int i = 0; i < 100; ++i) {
      for (int32_t j = 0; j < 32; ++j) ids[j] = (i * 32 + j) % 4096;
      ok &= table.SetRow(i % 64, absl::MakeConstSpan(ids).subspan(0, i % 33))
                .ok();
      updates.assign(
          {{(i + 7) % 64, ids.data(), 5}, {(i + 9) % 64, nullptr, 0}});
      ok &= table.SetRows(updates).ok();
      ok &= table.CompactRows(rotate, 64).ok();
      ok &= table.Upload(nullptr).ok();
    }
    const int64_t allocated = HeapAllocations() - before;
    REQUIRE(ok);
    if (step > 0) REQUIRE(allocated == 0);
  }
  REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
}

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_PAGE_TABLE_CHECKS_H_
