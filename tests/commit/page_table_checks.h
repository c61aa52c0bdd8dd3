// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Checks of KVPageTable shared by the CPU tests (host and deferred devices)
// and the gpu suite (a CUDA device): snapshots for the strong guarantee, the
// expected device image, reading the mirror back, and UploadChecks, the
// upload behaviour every Device must show.
//
// Thread safety: none; one test thread.
#ifndef KVBLOCK_TESTS_COMMIT_PAGE_TABLE_CHECKS_H_
#define KVBLOCK_TESTS_COMMIT_PAGE_TABLE_CHECKS_H_

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

// Bytes of a patch of `ids` K ids and `ranges` ranges (the ids, padded to
// a range boundary, then the ranges).
constexpr int64_t PatchBytes(int64_t ids, int64_t ranges) {
  return (ids * 4 + 15) / 16 * 16 + ranges * KVPageTable::kRangeBytes;
}

// Upload behaviour on `device`: the first upload sets every entry, later ones
// send one patch of the entries written since the last upload (per changed
// row: its ids from the first written entry, and the clears after them),
// nothing else, and the mirror is exact after each. Uses Catch SECTIONs.
inline void UploadChecks(Device& device) {
  constexpr int32_t kBatch = 4;
  constexpr int32_t kWidth = 3;
  constexpr int32_t kPages = 16;
  absl::StatusOr<std::unique_ptr<KVPageTable>> created =
      KVPageTable::Create(kBatch, kWidth, kPages, device);
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  const int32_t* const mirror = table.kernel_view().data();
  REQUIRE(mirror != nullptr);

  // The first upload clears every entry of every row, in one patch.
  REQUIRE(UploadAndCount(table, device) ==
          UploadEffect{true, 1, PatchBytes(0, kBatch)});
  REQUIRE(table.upload_stats().entries == kBatch * kWidth);
  REQUIRE(ReadMirror(table, device) ==
          std::vector<int32_t>(kBatch * 2 * kWidth, kNoPage));

  SECTION("nothing changed: no device operation") {
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
    REQUIRE(table.upload_stats().calls == 2);
  }
  SECTION("one changed row is one range of its ids, V ids derived") {
    SetRowOk(table, 2, {5, 15});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(2, 1)});
    const std::vector<int32_t> image = ReadMirror(table, device);
    REQUIRE(std::vector<int32_t>(image.begin() + 2 * 2 * kWidth,
                                 image.begin() + 3 * 2 * kWidth) ==
            std::vector<int32_t>{5, 15, -1, 21, 31, -1});
    REQUIRE(image == ExpectedMirror(table));
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
  }
  SECTION("several changed rows are one patch of their ids alone") {
    SetRowOk(table, 0, {1});
    SetRowOk(table, 1, {2, 3});
    SetRowOk(table, 3, {4, 5, 6});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(6, 3)});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
    REQUIRE(table.upload_stats().ranges == kBatch + 3);
  }
  SECTION("a row that grew by one page sends one id") {
    SetRowOk(table, 1, {2, 3});
    REQUIRE(UploadAndCount(table, device).enqueued);
    const KVPageTableUploadStats before = table.upload_stats();
    const PageId grown[] = {2, 3, 9};
    const KVPageTableRowUpdate update{1, grown, 3, 2};
    REQUIRE_OK(table.SetRows({&update, 1}));
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(1, 1)});
    REQUIRE(table.upload_stats().entries - before.entries == 1);
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
  }
  SECTION("a row cut short sends its clears alone") {
    SetRowOk(table, 1, {2, 3, 4});
    REQUIRE(UploadAndCount(table, device).enqueued);
    const PageId kept[] = {2};
    const KVPageTableRowUpdate update{1, kept, 1, 1};
    REQUIRE_OK(table.SetRows({&update, 1}));
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(0, 1)});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
  }
  SECTION("a row edited and edited back is sent again: nothing compares") {
    SetRowOk(table, 1, {7, 8});
    SetRowOk(table, 1, {});
    // Never live on the device, empty now: nothing to send.
    REQUIRE(UploadAndCount(table, device) == UploadEffect{false, 0, 0});
    SetRowOk(table, 1, {7, 8});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(2, 1)});
    SetRowOk(table, 1, {9});
    SetRowOk(table, 1, {7, 8});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(2, 1)});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
  }
  SECTION("compaction sends the rows that moved and the rows it emptied") {
    for (SlotId slot = 0; slot < kBatch; ++slot) SetRowOk(table, slot, {slot});
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(kBatch, kBatch)});
    // Slot 0 stays, 1 retires, 2 and 3 move down, 3 empties.
    REQUIRE_OK(table.CompactRows({0, kNoSlot, 1, 2}, 3));
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(2, 3)});
    REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
  }
  SECTION("a move fills a hole with the last row, which empties") {
    for (SlotId slot = 0; slot < kBatch; ++slot) {
      SetRowOk(table, slot, {slot, static_cast<PageId>(slot + 8)});
    }
    REQUIRE(UploadAndCount(table, device).enqueued);
    const KVPageTableRowMove move{3, 1};
    REQUIRE_OK(table.Apply({.moves = {&move, 1}}));
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(2, 2)});
    const std::vector<int32_t> image = ReadMirror(table, device);
    REQUIRE(image == ExpectedMirror(table));
    REQUIRE(image[1 * 2 * kWidth] == 3);
    REQUIRE(image[3 * 2 * kWidth] == kNoPage);
  }
  SECTION("the identity layout is uploaded whole") {
    REQUIRE_OK(table.SetIdentity());
    REQUIRE(UploadAndCount(table, device) ==
            UploadEffect{true, 1, PatchBytes(kBatch * kWidth, kBatch)});
    const std::vector<int32_t> image = ReadMirror(table, device);
    REQUIRE(image == ExpectedMirror(table));
    REQUIRE(image[2 * 2 * kWidth + kWidth] == 6 + kPages);
  }
  SECTION("every upload leaves an exact mirror as staging slots rotate") {
    for (int i = 0; i < 3 * KVPageTable::kStagingSlots + 1; ++i) {
      SetRowOk(table, i % kBatch, {static_cast<PageId>(i % kPages)});
      SetRowOk(table, (i + 2) % kBatch,
               {static_cast<PageId>((i * 7) % kPages), 1});
      REQUIRE(UploadAndCount(table, device).copies == 1);
      REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
    }
  }
  SECTION("a patch bigger than a staging slot is split, row by row") {
    absl::StatusOr<std::unique_ptr<KVPageTable>> small = KVPageTable::Create(
        kBatch, kWidth, kPages, device,
        {.staging_bytes = KVPageTable::MinStagingBytes(kWidth)});
    REQUIRE_OK(small);
    // The first upload: 4 ranges of no ids, two to a slot.
    REQUIRE(UploadAndCount(**small, device) ==
            UploadEffect{true, 2, PatchBytes(0, kBatch)});
    for (int round = 0; round < 2 * KVPageTable::kStagingSlots; ++round) {
      for (SlotId slot = 0; slot < kBatch; ++slot) {
        const PageId id = static_cast<PageId>((slot + round) % kPages);
        SetRowOk(**small, slot, {id, id, id});
      }
      // One full row per patch: four patches, rotating over the slots.
      REQUIRE(UploadAndCount(**small, device) ==
              UploadEffect{true, kBatch, kBatch * PatchBytes(kWidth, 1)});
      REQUIRE(ReadMirror(**small, device) == ExpectedMirror(**small));
    }
  }
  REQUIRE(table.kernel_view().data() == mirror);
}

// Steady-state SetRow, SetRows, CompactRows, Apply and Upload calls on `device`
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
      const KVPageTableRowMove moves[] = {{i % 64, (i + 5) % 64},
                                          {(i + 5) % 64, i % 64}};
      ok &= table.Apply({.moves = moves, .rows = updates}).ok();
      ok &= table.Upload(nullptr).ok();
    }
    const int64_t allocated = HeapAllocations() - before;
    REQUIRE(ok);
    if (step > 0) REQUIRE(allocated == 0);
  }
  REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
}

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_COMMIT_PAGE_TABLE_CHECKS_H_
