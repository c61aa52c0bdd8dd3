// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A BlockManager + KVPageTable (host device) + BatchCommit stack for tests,
// with a canonical snapshot of everything a step may change; and a step run
// as the manager's own calls, one at a time, to set a commit against.
#ifndef KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_
#define KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "kvblock/status_macros.h"
#include "manager/block_manager_impl.h"
#include "manager/group_coordinator.h"
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

// `plan`'s calls to the manager, one at a time, in the order BatchCommit
// documents: the leaving sequences' Free and Preempt; each join's Admit or
// Fork; the survivors' Append (and SetDrafts, with draft counts) in slot
// order, `slots` being the commit's at the start of the step; the prompt
// chunks' AppendPrompt; the joined forks' Append. The first error, else OK.
inline absl::Status StepCallByCall(BlockManager& manager,
                                   absl::Span<const SequenceId> slots,
                                   const StepPlan& plan) {
  for (const SequenceId id : plan.finished) {
    KVBLOCK_RETURN_IF_ERROR(manager.Free(id));
  }
  for (const SequenceId id : plan.preempted) {
    KVBLOCK_RETURN_IF_ERROR(manager.Preempt(id));
  }
  for (const JoinRequest& join : plan.joins) {
    if (join.fork_of == kNoSequence) {
      KVBLOCK_RETURN_IF_ERROR(manager
                                  .Admit(join.id, join.tokens, join.extra,
                                         join.prompt_hashes, join.admit)
                                  .status());
    } else {
      KVBLOCK_RETURN_IF_ERROR(manager.Fork(join.fork_of, join.id));
    }
  }
  const auto in = [](auto ids, SequenceId id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  absl::Span<const TokenId> tokens = plan.append_tokens;
  for (size_t slot = 0; slot < slots.size(); ++slot) {
    const SequenceId id = slots[slot];
    const size_t count =
        plan.append_counts.empty() ? 0 : plan.append_counts[slot];
    const absl::Span<const TokenId> appended = tokens.first(count);
    tokens.remove_prefix(count);
    if (in(plan.finished, id) || in(plan.preempted, id)) continue;
    if (std::any_of(plan.prompt_chunks.begin(), plan.prompt_chunks.end(),
                    [id](const PromptChunk& c) { return c.id == id; })) {
      continue;
    }
    if (count > 0) {
      KVBLOCK_RETURN_IF_ERROR(manager.Append(id, appended).status());
    }
    if (!plan.draft_counts.empty()) {
      KVBLOCK_RETURN_IF_ERROR(
          manager.SetDrafts(id, plan.draft_counts[slot]).status());
    }
  }
  for (const PromptChunk& chunk : plan.prompt_chunks) {
    KVBLOCK_RETURN_IF_ERROR(
        manager.AppendPrompt(chunk.id, chunk.tokens, chunk.prompt_hashes)
            .status());
  }
  for (const JoinRequest& join : plan.joins) {
    if (join.fork_of != kNoSequence && !join.tokens.empty()) {
      KVBLOCK_RETURN_IF_ERROR(manager.Append(join.id, join.tokens).status());
    }
  }
  return absl::OkStatus();
}

// What the calls of a step did, one at a time (StepCallByCall).
struct CallByCall {
  absl::Status status;         // the first call's error, or OK.
  BlockManagerSnapshot after;  // the manager after them, when OK.
};

// Runs StepCallByCall on the manager a BatchCommit runs, then undoes it:
// inside the step transaction of every group, with the commit's sequences
// opened to the calls as a commit opens them to its own. The manager is
// then as before (its Snapshot compares equal).
inline CallByCall TryCallByCall(BlockManager& manager,
                                absl::Span<const SequenceId> slots,
                                const StepPlan& plan) {
  std::vector<internal::BlockManagerImpl*> groups;
  if (const internal::GroupCoordinator* coordinator =
          internal::GroupCoordinator::Of(manager)) {
    groups.assign(coordinator->group_managers().begin(),
                  coordinator->group_managers().end());
  } else {
    groups.push_back(&internal::BlockManagerImpl::Of(manager));
  }
  for (internal::BlockManagerImpl* group : groups) {
    REQUIRE_OK(group->BeginStep());
    group->set_commit_applying(true);
  }
  CallByCall result;
  result.status = StepCallByCall(manager, slots, plan);
  if (result.status.ok()) result.after = manager.Snapshot();
  for (internal::BlockManagerImpl* group : groups) {
    group->set_commit_applying(false);
  }
  for (size_t g = groups.size(); g-- > 0;)
    REQUIRE_OK(groups[g]->RollbackStep());
  return result;
}

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_COMMIT_BATCH_COMMIT_TEST_UTIL_H_
