// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A BlockManager + KVPageTable (host device) + BatchCommit stack for tests,
// with a canonical snapshot of everything a step may change.
#ifndef KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_
#define KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock::testing {

// Everything a step may change: the manager (pool included), every host row
// of the page table, and the slot assignment.
struct CommitState {
  BlockManagerSnapshot manager;
  std::vector<std::vector<PageId>> rows;
  std::vector<SequenceId> slots;
  friend bool operator==(const CommitState&, const CommitState&) = default;
};

struct CommitFixture {
  explicit CommitFixture(const PagedKvConfig& config,
                         const BlockManagerOptions& options = {})
      : device(Device::Host()) {
    auto made_manager = BlockManager::Create(config, options);
    REQUIRE_OK(made_manager);
    manager = *std::move(made_manager);
    auto made_table = KVPageTable::Create(
        config.max_batch, config.max_pages_per_seq, config.num_pages, *device);
    REQUIRE_OK(made_table);
    table = *std::move(made_table);
    auto made_commit = BatchCommit::Create(*manager, *table);
    REQUIRE_OK(made_commit);
    commit = *std::move(made_commit);
  }

  // The live ids of row `slot`.
  std::vector<PageId> Row(SlotId slot) const {
    auto row = table->HostRow(slot);
    REQUIRE_OK(row);
    std::vector<PageId> live;
    for (PageId page : *row) {
      if (page == kNoPage) break;
      live.push_back(page);
    }
    return live;
  }

  CommitState Capture() const {
    CommitState state{manager->Snapshot(), {}, {}};
    for (SlotId slot = 0; slot < table->max_batch(); ++slot) {
      state.rows.push_back(Row(slot));
    }
    state.slots.assign(commit->slots().begin(), commit->slots().end());
    return state;
  }

  // Uploads, reads the device view back and compares it with the host rows:
  // K half = host ids, V half = K + num_pages, -1 stays -1.
  absl::Status UploadAndCheck() {
    if (absl::Status s = table->Upload(nullptr).status(); !s.ok()) return s;
    const DeviceTensor view = table->kernel_view();
    std::vector<int32_t> image(view.num_elements());
    if (absl::Status s = device->CopyToHost(view.data(), image.data(),
                                            view.size_bytes(), nullptr);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = device->Synchronize(nullptr); !s.ok()) return s;
    const int64_t width = table->max_pages_per_seq();
    for (SlotId slot = 0; slot < table->max_batch(); ++slot) {
      auto row = table->HostRow(slot);
      if (!row.ok()) return row.status();
      for (int64_t i = 0; i < width; ++i) {
        const PageId k = (*row)[i];
        const PageId v = k == kNoPage ? kNoPage : k + table->num_pages();
        const int32_t* device_row = image.data() + slot * 2 * width;
        if (device_row[i] != k || device_row[width + i] != v) {
          return absl::InternalError(absl::StrCat(
              "device row ", slot, " entry ", i, ": K ", device_row[i], " V ",
              device_row[width + i], ", host K ", k));
        }
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Device> device;
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<KVPageTable> table;
  std::unique_ptr<BatchCommit> commit;
};

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_
