// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/page_table.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "commit/page_table_checks.h"
#include "device/deferred_device.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::DeferredDevice;
using ::kvblock::testing::ExpectedMirror;
using ::kvblock::testing::PatchBytes;
using ::kvblock::testing::ReadMirror;
using ::kvblock::testing::SetRowOk;
using ::kvblock::testing::Snapshot;
using ::kvblock::testing::TableSnapshot;
using ::kvblock::testing::UploadAndCount;
using ::kvblock::testing::UploadEffect;

constexpr int32_t kBatch = 4;
constexpr int32_t kWidth = 3;
constexpr int32_t kPages = 16;

std::unique_ptr<KVPageTable> MakeTable(Device& device,
                                       int32_t num_pages = kPages) {
  absl::StatusOr<std::unique_ptr<KVPageTable>> table =
      KVPageTable::Create(kBatch, kWidth, num_pages, device);
  REQUIRE_OK(table);
  return *std::move(table);
}

std::vector<PageId> Row(const KVPageTable& table, SlotId slot) {
  absl::StatusOr<absl::Span<const PageId>> row = table.HostRow(slot);
  REQUIRE_OK(row);
  return std::vector<PageId>(row->begin(), row->end());
}

// REQUIRE that `expr` fails with `code` and leaves `table` as it was.
#define REQUIRE_FAILS_UNCHANGED(table, expr, status_code) \
  do {                                                    \
    const TableSnapshot before_ = Snapshot(table);        \
    REQUIRE_STATUS_IS(expr, status_code);                 \
    REQUIRE(Snapshot(table) == before_);                  \
  } while (false)

TEST_CASE("create rejects non-positive arguments, naming them") {
  std::unique_ptr<Device> device = Device::Host();
  const int32_t bad = GENERATE(0, -1, std::numeric_limits<int32_t>::min());
  struct Case {
    int32_t max_batch, width, pages;
    const char* name;
  };
  for (const Case& c : {Case{bad, kWidth, kPages, "max_batch"},
                        Case{kBatch, bad, kPages, "max_pages_per_seq"},
                        Case{kBatch, kWidth, bad, "num_pages"}}) {
    absl::StatusOr<std::unique_ptr<KVPageTable>> table =
        KVPageTable::Create(c.max_batch, c.width, c.pages, *device);
    REQUIRE_STATUS_IS(table, kInvalidArgument);
    REQUIRE(table.status().message().find(c.name) != absl::string_view::npos);
  }
}

TEST_CASE("create takes num_pages up to the pool's limit, 2^30 - 1") {
  std::unique_ptr<Device> device = Device::Host();
  REQUIRE_OK(KVPageTable::Create(1, 1, (1 << 30) - 1, *device));
  REQUIRE_STATUS_IS(KVPageTable::Create(1, 1, 1 << 30, *device),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(
      KVPageTable::Create(1, 1, std::numeric_limits<int32_t>::max(), *device),
      kInvalidArgument);
}

TEST_CASE("create rejects tables beyond 32-bit indexing") {
  std::unique_ptr<Device> device = Device::Host();
  // 2^15 x 2 x 2^15 = 2^31 entries, one more than int32 can index.
  REQUIRE_STATUS_IS(KVPageTable::Create(1 << 15, 1 << 15, kPages, *device),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(
      KVPageTable::Create(std::numeric_limits<int32_t>::max(),
                          std::numeric_limits<int32_t>::max(), kPages, *device),
      kInvalidArgument);
}

TEST_CASE("a new table is empty, not identity, and has its geometry") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  REQUIRE(table->max_batch() == kBatch);
  REQUIRE(table->max_pages_per_seq() == kWidth);
  REQUIRE(table->num_pages() == kPages);
  REQUIRE_FALSE(table->is_identity());
  for (SlotId slot = 0; slot < kBatch; ++slot) {
    REQUIRE(Row(*table, slot) == std::vector<PageId>(kWidth, kNoPage));
  }
  REQUIRE_STATUS_IS(table->HostRow(-1), kInvalidArgument);
  REQUIRE_STATUS_IS(table->HostRow(kBatch), kInvalidArgument);
  const DeviceTensor view = table->kernel_view();
  REQUIRE(view.data() != nullptr);
  REQUIRE(view.shape() == std::array<int64_t, 3>{kBatch, 2, kWidth});
  REQUIRE(view.size_bytes() == kBatch * 2 * kWidth * sizeof(int32_t));
  REQUIRE_OK(table->CheckInvariants());
  REQUIRE(device->stats().copies == 0);
}

TEST_CASE("set row writes the live prefix and clears the rest") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 1, {3, 4, 5});
  REQUIRE(Row(*table, 1) == std::vector<PageId>{3, 4, 5});
  SetRowOk(*table, 1, {0, kPages - 1});
  REQUIRE(Row(*table, 1) == std::vector<PageId>{0, kPages - 1, kNoPage});
  SetRowOk(*table, 1, {});
  REQUIRE(Row(*table, 1) == std::vector<PageId>(kWidth, kNoPage));
  REQUIRE(Row(*table, 0) == std::vector<PageId>(kWidth, kNoPage));
  REQUIRE_OK(table->CheckInvariants());
  REQUIRE(device->stats().copies == 0);
}

TEST_CASE("set row rejects a bad slot, count or id and changes nothing") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 2, {1, 2});
  const std::vector<PageId> too_long = {1, 2, 3, 4};
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(-1, {1}), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(kBatch, {1}), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(2, too_long), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(2, {1, kPages}),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(2, {-2}), kInvalidArgument);
  // kNoPage is not a page: only the live prefix is passed.
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(2, {kNoPage, 3}),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(2, {3, kNoPage}),
                          kInvalidArgument);
  const absl::Status status = table->SetRow(2, {1, 99});
  REQUIRE(
      status.message() ==
      "page table: slot 2: page id 99 at index 1 is outside [0, num_pages 16)");
}

TEST_CASE("set rows applies every update as one commit") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 1, {9});
  SetRowOk(*table, 3, {8, 7});
  const PageId row0[] = {1, 2, 3};
  const PageId row2[] = {4};
  const KVPageTableRowUpdate updates[] = {
      {2, row2, 1}, {0, row0, 3}, {3, nullptr, 0}};
  REQUIRE_OK(table->SetRows(updates));
  REQUIRE(Row(*table, 0) == std::vector<PageId>{1, 2, 3});
  REQUIRE(Row(*table, 1) == std::vector<PageId>{9, kNoPage, kNoPage});
  REQUIRE(Row(*table, 2) == std::vector<PageId>{4, kNoPage, kNoPage});
  REQUIRE(Row(*table, 3) == std::vector<PageId>(kWidth, kNoPage));
  REQUIRE_OK(table->SetRows({}));
  REQUIRE(Row(*table, 0) == std::vector<PageId>{1, 2, 3});
  REQUIRE_OK(table->CheckInvariants());
}

TEST_CASE("set rows validates every update before applying any") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {5});
  const PageId good[] = {1, 2};
  const PageId bad_id[] = {1, kPages};
  const PageId four[] = {1, 2, 3, 4};
  SECTION("a bad update after good ones") {
    const KVPageTableRowUpdate updates[] = {{0, good, 2}, {1, bad_id, 2}};
    REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(updates), kInvalidArgument);
    REQUIRE(table->SetRows(updates).message().substr(0, 28) ==
            "page table: update 1: slot 1");
  }
  SECTION("a slot at most once") {
    const KVPageTableRowUpdate updates[] = {
        {1, good, 2}, {2, good, 1}, {1, nullptr, 0}};
    REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(updates), kInvalidArgument);
    REQUIRE(table->SetRows(updates).message() ==
            "page table: update 2: slot 1 is already set by update 0");
  }
  SECTION("bad slots, counts and null ids") {
    for (const KVPageTableRowUpdate& update :
         {KVPageTableRowUpdate{kBatch, good, 2},
          KVPageTableRowUpdate{kNoSlot, good, 2},
          KVPageTableRowUpdate{1, four, 4}, KVPageTableRowUpdate{1, good, -1},
          KVPageTableRowUpdate{1, nullptr, 1}}) {
      const KVPageTableRowUpdate updates[] = {{0, good, 2}, update};
      REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(updates),
                              kInvalidArgument);
    }
  }
  REQUIRE(Row(*table, 0) == std::vector<PageId>{5, kNoPage, kNoPage});
}

TEST_CASE("set rows writes a row from its first changed page") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {5, 6});
  SetRowOk(*table, 1, {7, 8, 9});
  REQUIRE_OK(table->Upload(nullptr));
  // Entries before `first` are the row's own, whatever the update holds
  // there: only the ids from `first` on are read.
  const PageId grown[] = {kNoPage, 99, 10};
  const PageId shrunk[] = {7, 8};
  const KVPageTableRowUpdate updates[] = {{0, grown, 3, 2}, {1, shrunk, 2, 2}};
  REQUIRE_OK(table->SetRows(updates));
  REQUIRE(Row(*table, 0) == std::vector<PageId>{5, 6, 10});
  REQUIRE(Row(*table, 1) == std::vector<PageId>{7, 8, kNoPage});
  REQUIRE_OK(table->CheckInvariants());
  // Both rows changed from entry 2 on: one patch of one id and a clear.
  REQUIRE(UploadAndCount(*table, *device) ==
          UploadEffect{true, 1, PatchBytes(1, 2)});
  REQUIRE(ReadMirror(*table, *device) == ExpectedMirror(*table));
}

TEST_CASE("set rows rejects a first outside the row's live ids or the count") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {5, 6});
  const PageId ids[] = {5, 6, 7};
  for (const KVPageTableRowUpdate& update :
       {KVPageTableRowUpdate{0, ids, 3, 3}, KVPageTableRowUpdate{0, ids, 1, 2},
        KVPageTableRowUpdate{0, ids, 3, -1},
        KVPageTableRowUpdate{1, ids, 1, 1}}) {
    const KVPageTableRowUpdate updates[] = {update};
    REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(updates), kInvalidArgument);
  }
  const KVPageTableRowUpdate past_live[] = {{0, ids, 3, 3}};
  REQUIRE(table->SetRows(past_live).message() ==
          "page table: update 0: slot 0: first 3 is outside [0, min(count 3, "
          "live ids 2)]");
}

TEST_CASE("set rows writes only [first, end) of a row, the rest kept") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {5, 6, 7});
  REQUIRE_OK(table->Upload(nullptr));
  // A window released page 1: the null page (0 here) in its place, the
  // entries around it as they were, whatever the update holds there.
  const PageId released[] = {kNoPage, 0, kNoPage};
  const KVPageTableRowUpdate updates[] = {
      {.slot = 0, .k_page_ids = released, .count = 3, .first = 1, .end = 2}};
  REQUIRE_OK(table->SetRows(updates));
  REQUIRE(Row(*table, 0) == std::vector<PageId>{5, 0, 7});
  REQUIRE_OK(table->CheckInvariants());
  // One id and its V id: not the row's tail.
  REQUIRE(UploadAndCount(*table, *device) ==
          UploadEffect{true, 1, PatchBytes(1, 1)});
  REQUIRE(ReadMirror(*table, *device) == ExpectedMirror(*table));

  // An end with a count other than the live ids, or before first, is
  // refused with nothing changed.
  const PageId ids[] = {5, 6, 7};
  // Nor past the count (it read past the ids and wrote into the next row)
  // or below -1.
  std::vector<PageId> many(64, 5);
  for (const KVPageTableRowUpdate& bad :
       {KVPageTableRowUpdate{0, ids, 2, 1, 1},
        KVPageTableRowUpdate{0, ids, 3, 2, 1},
        KVPageTableRowUpdate{0, many.data(), 3, 0, 8},
        KVPageTableRowUpdate{0, many.data(), 3, 0, 64},
        KVPageTableRowUpdate{0, ids, 3, 0, -2},
        KVPageTableRowUpdate{0, ids, 3, 0, INT32_MIN}}) {
    const KVPageTableRowUpdate one[] = {bad};
    REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(one), kInvalidArgument);
  }
  const KVPageTableRowUpdate shorter[] = {{0, ids, 2, 1, 1}};
  REQUIRE(absl::StrContains(table->SetRows(shorter).message(),
                            "end 1 of a row of 2 ids"));
  const KVPageTableRowUpdate past[] = {{0, many.data(), 3, 0, 64}};
  REQUIRE(absl::StrContains(table->SetRows(past).message(),
                            "end 64 of a row of 3 ids"));
  // With the end at the count, the row takes the count as before.
  const KVPageTableRowUpdate cut[] = {{0, ids, 2, 2, 2}};
  REQUIRE_OK(table->SetRows(cut));
  REQUIRE(Row(*table, 0) == std::vector<PageId>{5, 0, kNoPage});
  REQUIRE_OK(table->CheckInvariants());
}

TEST_CASE("create refuses staging no machine holds, before allocating") {
  std::unique_ptr<Device> device = Device::Host();
  const auto table = KVPageTable::Create(
      kBatch, kWidth, kPages, *device,
      {.staging_bytes = std::numeric_limits<int64_t>::max()});
  REQUIRE_STATUS_IS(table, kResourceExhausted);
  REQUIRE(absl::StrContains(table.status().message(), "page table: reserving"));
}

TEST_CASE("create rejects staging that cannot hold one row") {
  std::unique_ptr<Device> device = Device::Host();
  const int64_t least = KVPageTable::MinStagingBytes(kWidth);
  for (const int64_t bytes : {int64_t{-1}, int64_t{1}, least - 1}) {
    absl::StatusOr<std::unique_ptr<KVPageTable>> table = KVPageTable::Create(
        kBatch, kWidth, kPages, *device, {.staging_bytes = bytes});
    REQUIRE_STATUS_IS(table, kInvalidArgument);
    REQUIRE(table.status().message().find("staging_bytes") !=
            absl::string_view::npos);
  }
  absl::StatusOr<std::unique_ptr<KVPageTable>> table = KVPageTable::Create(
      kBatch, kWidth, kPages, *device, {.staging_bytes = least});
  REQUIRE_OK(table);
  REQUIRE((*table)->staging_bytes() == least);
  // The default holds the whole table's worst patch when that is small.
  REQUIRE(MakeTable(*device)->staging_bytes() ==
          PatchBytes(kBatch * kWidth, kBatch));
}

TEST_CASE("apply moves rows at once, then updates them") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {0});
  SetRowOk(*table, 1, {1, 2});
  SetRowOk(*table, 2, {3, 4, 5});
  SetRowOk(*table, 3, {6});
  SECTION("a hole filled by the last row, which empties") {
    const KVPageTableRowMove moves[] = {{3, 1}};
    REQUIRE_OK(table->Apply({.moves = moves}));
    REQUIRE(Row(*table, 1) == std::vector<PageId>{6, kNoPage, kNoPage});
    REQUIRE(Row(*table, 3) == std::vector<PageId>(kWidth, kNoPage));
    REQUIRE(Row(*table, 2) == std::vector<PageId>{3, 4, 5});
  }
  SECTION("two moves each way swap rows; a cycle rotates them") {
    const KVPageTableRowMove swap[] = {{0, 2}, {2, 0}};
    REQUIRE_OK(table->Apply({.moves = swap}));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{3, 4, 5});
    REQUIRE(Row(*table, 2) == std::vector<PageId>{0, kNoPage, kNoPage});
    const KVPageTableRowMove cycle[] = {{0, 1}, {1, 3}, {3, 0}};
    REQUIRE_OK(table->Apply({.moves = cycle}));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{6, kNoPage, kNoPage});
    REQUIRE(Row(*table, 1) == std::vector<PageId>{3, 4, 5});
    REQUIRE(Row(*table, 3) == std::vector<PageId>{1, 2, kNoPage});
  }
  SECTION("updates see the rows after the moves") {
    // Row 2 moves to slot 0 and grows there from its third page; slot 2,
    // emptied by the move, takes a new row.
    const KVPageTableRowMove moves[] = {{2, 0}};
    const PageId grown[] = {kNoPage, kNoPage, 9};
    const PageId fresh[] = {7, 8};
    const KVPageTableRowUpdate updates[] = {{0, grown, 3, 2}, {2, fresh, 2}};
    // A first past the moved row's length is refused: row 0 held 1 id.
    const PageId four[] = {1, 2, 3};
    const KVPageTableRowUpdate past[] = {{2, four, 3, 1}};
    REQUIRE_FAILS_UNCHANGED(
        *table, table->Apply({.moves = moves, .rows = past}), kInvalidArgument);
    REQUIRE_OK(table->Apply({.moves = moves, .rows = updates}));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{3, 4, 9});
    REQUIRE(Row(*table, 2) == std::vector<PageId>{7, 8, kNoPage});
  }
  SECTION("a move onto itself keeps the row") {
    const KVPageTableRowMove moves[] = {{1, 1}};
    REQUIRE_OK(table->Apply({.moves = moves}));
    REQUIRE(Row(*table, 1) == std::vector<PageId>{1, 2, kNoPage});
  }
  REQUIRE_OK(table->CheckInvariants());
  REQUIRE(device->stats().copies == 0);  // page ids move, KV data never does.
}

TEST_CASE("apply rejects a bad move or update and changes nothing") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  for (SlotId slot = 0; slot < kBatch; ++slot) SetRowOk(*table, slot, {slot});
  using Moves = std::vector<KVPageTableRowMove>;
  const auto apply = [&](const Moves& moves) {
    return table->Apply({.moves = moves});
  };
  REQUIRE_FAILS_UNCHANGED(*table, apply(Moves{{0, 1}, {kBatch, 0}}),
                          kInvalidArgument);
  REQUIRE(apply(Moves{{0, 1}, {kBatch, 0}}).message() ==
          "page table: move 1: slot 4 (from 4 to 0) is outside [0, 4)");
  REQUIRE_FAILS_UNCHANGED(*table, apply(Moves{{0, -1}}), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, apply(Moves{{0, 1}, {0, 2}}),
                          kInvalidArgument);
  REQUIRE(apply(Moves{{0, 1}, {0, 2}}).message() ==
          "page table: move 1: slot 0 is already moved by move 0");
  REQUIRE_FAILS_UNCHANGED(*table, apply(Moves{{0, 1}, {2, 1}}),
                          kInvalidArgument);
  REQUIRE(apply(Moves{{0, 1}, {2, 1}}).message() ==
          "page table: move 1: slot 1 already receives move 0");
  const PageId ids[] = {1};
  const KVPageTableRowMove move{0, 1};
  const KVPageTableRowUpdate twice[] = {{1, ids, 1}, {1, nullptr, 0}};
  REQUIRE_FAILS_UNCHANGED(*table,
                          table->Apply({.moves = {&move, 1}, .rows = twice}),
                          kInvalidArgument);
  REQUIRE(table->Apply({.moves = {&move, 1}, .rows = twice}).message() ==
          "page table: update 1: slot 1 is already set by update 0");
  // The source of a move that no move fills is empty: first 1 is past it.
  const KVPageTableRowUpdate into_emptied[] = {{0, ids, 1, 1}};
  REQUIRE_FAILS_UNCHANGED(
      *table, table->Apply({.moves = {&move, 1}, .rows = into_emptied}),
      kInvalidArgument);
  REQUIRE(table->Apply({.moves = {&move, 1}, .rows = into_emptied}).message() ==
          "page table: update 0: slot 0: first 1 is outside [0, min(count 1, "
          "live ids "
          "0)]");
}

TEST_CASE("compaction moves surviving rows and clears the rest") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 0, {0});
  SetRowOk(*table, 1, {1, 2});
  SetRowOk(*table, 2, {3, 4, 5});
  SetRowOk(*table, 3, {6});
  SECTION("survivors keep their order, retired slots leave") {
    REQUIRE_OK(table->CompactRows({0, kNoSlot, 1, 2}, 3));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{0, kNoPage, kNoPage});
    REQUIRE(Row(*table, 1) == std::vector<PageId>{3, 4, 5});
    REQUIRE(Row(*table, 2) == std::vector<PageId>{6, kNoPage, kNoPage});
    REQUIRE(Row(*table, 3) == std::vector<PageId>(kWidth, kNoPage));
  }
  SECTION("rows can be permuted") {
    REQUIRE_OK(table->CompactRows({3, 2, 1, 0}, 4));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{6, kNoPage, kNoPage});
    REQUIRE(Row(*table, 1) == std::vector<PageId>{3, 4, 5});
    REQUIRE(Row(*table, 2) == std::vector<PageId>{1, 2, kNoPage});
    REQUIRE(Row(*table, 3) == std::vector<PageId>{0, kNoPage, kNoPage});
  }
  SECTION("a retired slot can receive a survivor") {
    REQUIRE_OK(table->CompactRows({kNoSlot, 0, kNoSlot, kNoSlot}, 1));
    REQUIRE(Row(*table, 0) == std::vector<PageId>{1, 2, kNoPage});
    for (SlotId slot = 1; slot < kBatch; ++slot) {
      REQUIRE(Row(*table, slot) == std::vector<PageId>(kWidth, kNoPage));
    }
  }
  SECTION("retiring every slot empties the table") {
    REQUIRE_OK(table->CompactRows({kNoSlot, kNoSlot, kNoSlot, kNoSlot}, 0));
    for (SlotId slot = 0; slot < kBatch; ++slot) {
      REQUIRE(Row(*table, slot) == std::vector<PageId>(kWidth, kNoPage));
    }
  }
  REQUIRE_OK(table->CheckInvariants());
  REQUIRE(device->stats().copies == 0);  // page ids move, KV data never does.
}

TEST_CASE("compaction rejects a bad map and changes nothing") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  for (SlotId slot = 0; slot < kBatch; ++slot) SetRowOk(*table, slot, {slot});
  using Map = std::vector<SlotId>;
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 2}, 3),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 2, 3, 4}, 4),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 2, 3}, -1),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 2, 3}, 5),
                          kInvalidArgument);
  // A destination at or past new_batch, or a negative one other than -1.
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 3, kNoSlot}, 3),
                          kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, -2, 2}, 3),
                          kInvalidArgument);
  // A destination twice.
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows(Map{0, 1, 1, 2}, 3),
                          kInvalidArgument);
  REQUIRE(table->CompactRows(Map{0, 1, 1, 2}, 3).message() ==
          "page table: compact rows: new slot 1 receives old slots 1 and 2");
  // A destination not at all.
  REQUIRE_FAILS_UNCHANGED(*table,
                          table->CompactRows(Map{0, kNoSlot, 2, kNoSlot}, 3),
                          kInvalidArgument);
  REQUIRE(table->CompactRows(Map{0, kNoSlot, 2, kNoSlot}, 3).message() ==
          "page table: compact rows: new slot 1 receives no old slot (2 old "
          "slots map to "
          "new_batch 3)");
}

TEST_CASE("the identity layout is set only by SetIdentity and fails closed") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  REQUIRE_OK(table->SetIdentity());
  REQUIRE(table->is_identity());
  for (SlotId slot = 0; slot < kBatch; ++slot) {
    REQUIRE(Row(*table, slot) == std::vector<PageId>{slot * kWidth,
                                                     slot * kWidth + 1,
                                                     slot * kWidth + 2});
  }
  REQUIRE_OK(table->CheckInvariants());
  SECTION("a failed call keeps it") {
    REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(0, {kPages}),
                            kInvalidArgument);
    REQUIRE(table->is_identity());
  }
  SECTION("rewriting a row with its own identity contents clears it") {
    SetRowOk(*table, 0, {0, 1, 2});
    REQUIRE_FALSE(table->is_identity());
  }
  SECTION("set rows with no update clears it") {
    REQUIRE_OK(table->SetRows({}));
    REQUIRE_FALSE(table->is_identity());
  }
  SECTION("compaction that moves nothing clears it") {
    REQUIRE_OK(table->CompactRows({0, 1, 2, 3}, 4));
    REQUIRE_FALSE(table->is_identity());
    REQUIRE_OK(table->SetIdentity());
    REQUIRE(table->is_identity());
  }
}

TEST_CASE("the identity layout needs max_batch x max_pages_per_seq pages") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> small = MakeTable(*device, kBatch * kWidth - 1);
  REQUIRE_FAILS_UNCHANGED(*small, small->SetIdentity(), kFailedPrecondition);
  REQUIRE_FALSE(small->is_identity());
  std::unique_ptr<KVPageTable> exact = MakeTable(*device, kBatch * kWidth);
  REQUIRE_OK(exact->SetIdentity());
  REQUIRE(Row(*exact, kBatch - 1).back() == kBatch * kWidth - 1);
}

TEST_CASE("upload behaviour on the host device") {
  std::unique_ptr<Device> device = Device::Host();
  testing::UploadChecks(*device);
}

TEST_CASE("upload behaviour on a device whose copies run late") {
  DeferredDevice device;
  testing::UploadChecks(device);
}

TEST_CASE("a failed call leaves nothing to upload") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table = MakeTable(*device);
  SetRowOk(*table, 1, {1});
  REQUIRE(UploadAndCount(*table, *device).enqueued);
  const PageId ids[] = {2};
  const KVPageTableRowUpdate updates[] = {{0, ids, 1}, {0, ids, 1}};
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRows(updates), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->SetRow(0, {kPages}), kInvalidArgument);
  REQUIRE_FAILS_UNCHANGED(*table, table->CompactRows({1, 0, 2, 2}, 4),
                          kInvalidArgument);
  const KVPageTableRowMove moves[] = {{1, 0}, {1, 2}};
  REQUIRE_FAILS_UNCHANGED(*table, table->Apply({.moves = moves}),
                          kInvalidArgument);
  REQUIRE(UploadAndCount(*table, *device) == UploadEffect{false, 0, 0});
}

TEST_CASE("upload waits only when every staging slot is in flight") {
  DeferredDevice device;
  std::unique_ptr<KVPageTable> table = MakeTable(device);
  const DeviceTensor view = table->kernel_view();
  auto device_image = [&] {  // the deferred device's memory, as it is now.
    std::vector<int32_t> image(static_cast<size_t>(view.num_elements()));
    std::memcpy(image.data(), view.data(), view.size_bytes());
    return image;
  };

  // Three uploads, none run yet: one per staging slot, no wait.
  std::vector<std::vector<int32_t>> images;
  for (int i = 0; i < KVPageTable::kStagingSlots; ++i) {
    SetRowOk(*table, i, {static_cast<PageId>(i + 1)});
    REQUIRE(UploadAndCount(*table, device).enqueued);
    images.push_back(ExpectedMirror(*table));
  }
  REQUIRE(table->upload_stats().host_waits == 0);
  REQUIRE(device_image() == std::vector<int32_t>(view.num_elements(), 0));

  // Nothing changed: no wait even though every slot is in flight.
  REQUIRE(UploadAndCount(*table, device) == UploadEffect{false, 0, 0});
  REQUIRE(table->upload_stats().host_waits == 0);

  // Rewriting row 0 needs a slot: the upload waits for the oldest, and only
  // it, so the device now holds exactly the first image.
  SetRowOk(*table, 0, {9, 10});
  REQUIRE(UploadAndCount(*table, device) ==
          UploadEffect{true, 1, PatchBytes(2, 1)});
  REQUIRE(table->upload_stats().host_waits == 1);
  REQUIRE(device_image() == images[0]);
  images.push_back(ExpectedMirror(*table));

  // Once the second upload has run, a slot is free: no wait.
  REQUIRE(device.RunToNextEvent());
  REQUIRE(device_image() == images[1]);
  SetRowOk(*table, 3, {11});
  REQUIRE(UploadAndCount(*table, device).enqueued);
  REQUIRE(table->upload_stats().host_waits == 1);
  images.push_back(ExpectedMirror(*table));

  // Every staged upload lands intact, in order.
  for (size_t i = 2; i < images.size(); ++i) {
    REQUIRE(device.RunToNextEvent());
    REQUIRE(device_image() == images[i]);
  }
  REQUIRE_FALSE(device.RunToNextEvent());
  REQUIRE(ReadMirror(*table, device) == ExpectedMirror(*table));
}

TEST_CASE("a failed copy changes no host state and the next upload is whole") {
  DeferredDevice device;
  // Staging of one row: two changed rows are two patches.
  absl::StatusOr<std::unique_ptr<KVPageTable>> created = KVPageTable::Create(
      kBatch, kWidth, kPages, device,
      {.staging_bytes = KVPageTable::MinStagingBytes(kWidth)});
  REQUIRE_OK(created);
  KVPageTable& table = **created;
  REQUIRE(UploadAndCount(table, device).enqueued);
  SetRowOk(table, 0, {1, 2, 3});
  SetRowOk(table, 3, {2, 3, 4});
  const TableSnapshot before = Snapshot(table);
  device.FailCopyAfter(1);  // the first patch goes, the second fails.
  REQUIRE_STATUS_IS(table.Upload(nullptr), kInternal);
  REQUIRE(Snapshot(table) == before);
  // Row 0 reached the device; setting it back must still be uploaded, and
  // the whole table is: every row, its clears too, in patches of at most a
  // row's size: rows 0 and 1, row 2, row 3 (3 ids).
  SetRowOk(table, 0, {});
  REQUIRE(UploadAndCount(table, device) ==
          UploadEffect{true, 3,
                       PatchBytes(0, 2) + PatchBytes(0, 1) + PatchBytes(3, 1)});
  REQUIRE(ReadMirror(table, device) == ExpectedMirror(table));
}

TEST_CASE("a bad id in the host rows fails the upload before it sends") {
  // Only memory corruption can put one there: reach the row through its
  // host view, as such a bug would.
  DeferredDevice device;
  std::unique_ptr<KVPageTable> table = MakeTable(device);
  REQUIRE(UploadAndCount(*table, device).enqueued);
  SetRowOk(*table, 2, {1, 2});
  PageId* row = const_cast<PageId*>(table->HostRow(2)->data());
  row[1] = kPages + 3;
  const DeviceStats before = device.stats();
  const absl::StatusOr<bool> uploaded = table->Upload(nullptr);
  REQUIRE_STATUS_IS(uploaded, kInternal);
  REQUIRE(uploaded.status().message() ==
          "page table: row 2: entry 1 is 19, want a page in [0, 16)");
  REQUIRE(device.stats().copies == before.copies);
  REQUIRE_STATUS_IS(table->CheckInvariants(), kInternal);
  row[1] = 2;
  REQUIRE(UploadAndCount(*table, device) ==
          UploadEffect{true, 1, PatchBytes(2, 1)});
  REQUIRE(ReadMirror(*table, device) == ExpectedMirror(*table));
}

TEST_CASE("a table waits for its staging before it is destroyed") {
  DeferredDevice device;
  {
    std::unique_ptr<KVPageTable> table = MakeTable(device);
    SetRowOk(*table, 0, {1});
    REQUIRE(UploadAndCount(*table, device).enqueued);
    REQUIRE(device.pending_ops() == 2);  // the patch's copy and its kernel.
  }
  REQUIRE(device.pending_ops() == 0);
  REQUIRE(device.live_allocations() == 0);
  REQUIRE(device.live_events() == 0);
}

TEST_CASE("steady-state set, compact and upload calls do not allocate") {
  std::unique_ptr<Device> device = Device::Host();
  testing::SteadyStateCallsAllocateNothing(*device);
}

}  // namespace
}  // namespace kvblock
