// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Fuzzes the library's calls: the input is a stream of operations on
//   - a BatchCommit over a BlockManager and a KVPageTable (host device):
//     steps whose leaves, joins (prompts, whole or a first chunk, forks,
//     ids that may be live, unknown or negative), append counts and tokens,
//     prompt chunks and draft counts come from the input, and uploads;
//   - a second KVPageTable: SetRow, SetRows, Apply (moves and updates) and
//     CompactRows with any slots, counts, firsts and ids;
//   - a BlockPool: Allocate, Retain, Release and Writable of any page id;
//   - a second BlockManager: Admit (whole or a first chunk), Append,
//     AppendPrompt, SetDrafts, Fork, Free and Preempt of any
//     id with any tokens.
// After each: a failed call left its object's observable state unchanged
// (snapshots), the invariants hold, and an upload makes the device table
// equal the host rows.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/block_pool.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace kvblock::fuzz {
namespace {

constexpr int32_t kPages = 24;
constexpr int32_t kBatch = 6;
constexpr int32_t kWidth = 5;
constexpr int32_t kPageSize = 2;

std::vector<PageId> Rows(const KVPageTable& table) {
  std::vector<PageId> rows;
  for (SlotId slot = 0; slot < table.max_batch(); ++slot) {
    const absl::Span<const PageId> row = *table.HostRow(slot);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  return rows;
}

// The device image equals the host rows (host device: readable memory).
void CheckMirror(const KVPageTable& table) {
  const int32_t* mirror = table.kernel_view().data();
  const int32_t width = table.max_pages_per_seq();
  for (SlotId slot = 0; slot < table.max_batch(); ++slot) {
    const absl::Span<const PageId> row = *table.HostRow(slot);
    for (int32_t i = 0; i < width; ++i) {
      const int32_t* device_row = mirror + int64_t{slot} * 2 * width;
      FUZZ_CHECK(device_row[i] == row[i], "device K id differs");
      FUZZ_CHECK(device_row[width + i] ==
                     (row[i] == kNoPage ? kNoPage : row[i] + table.num_pages()),
                 "device V id differs");
    }
  }
}

std::vector<TokenId> Tokens(FuzzInput& in, int64_t max) {
  std::vector<TokenId> tokens(static_cast<size_t>(in.Int(0, max)));
  for (TokenId& token : tokens) token = static_cast<TokenId>(in.Int(-1, 5));
  return tokens;
}

// Any id: a small one (often live), or a negative or far one.
SequenceId AnyId(FuzzInput& in) { return in.Int(-2, 12); }

struct Stack {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<KVPageTable> table;
  std::unique_ptr<BatchCommit> commit;
  std::unique_ptr<KVPageTable> loose_table;  // driven directly.
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<BlockManager> loose_manager;  // driven directly.

  Stack(FuzzInput& in) {
    PagedKvConfig config;
    config.num_pages = kPages;
    config.page_size = kPageSize;
    config.max_batch = kBatch;
    config.max_pages_per_seq = kWidth;
    config.num_kv_heads = 1;
    config.head_dim = 1;
    BlockManagerOptions options;
    options.enable_prefix_caching = in.Bool();
    options.hash_algorithm =
        in.Bool() ? HashAlgorithm::kSha256 : HashAlgorithm::kXxh3_128;
    options.watermark_pages = static_cast<int32_t>(in.Int(0, 2));
    manager = *BlockManager::Create(config, options);
    loose_manager = *BlockManager::Create(config, options);
    const KVPageTableOptions staging{
        .staging_bytes = in.Bool() ? KVPageTable::MinStagingBytes(kWidth) : 0};
    table = *KVPageTable::Create(kBatch, kWidth, kPages, *device, staging);
    loose_table =
        *KVPageTable::Create(kBatch, kWidth, kPages, *device, staging);
    commit = *BatchCommit::Create(*manager, *table);
    pool = *BlockPool::Create(kPages);
  }
};

void Step(Stack& s, FuzzInput& in) {
  const absl::Span<const SequenceId> running = s.commit->slots();
  std::vector<SequenceId> finished, preempted;
  std::vector<std::vector<TokenId>> join_tokens;
  std::vector<JoinRequest> joins;
  for (const SequenceId id : running) {
    const int64_t leave = in.Int(0, 7);
    if (leave == 0) finished.push_back(id);
    if (leave == 1) preempted.push_back(id);
  }
  if (in.Int(0, 7) == 0) finished.push_back(AnyId(in));
  const int64_t num_joins = in.Int(0, 3);
  join_tokens.reserve(num_joins);
  for (int64_t j = 0; j < num_joins; ++j) {
    const bool fork = in.Bool();
    join_tokens.push_back(Tokens(in, fork ? 2 : 2 * kWidth * kPageSize));
    joins.push_back({.id = AnyId(in),
                     .fork_of = fork ? AnyId(in) : kNoSequence,
                     .tokens = join_tokens.back(),
                     .extra = {.cache_salt = in.Bool() ? "b" : ""}});
    if (in.Int(0, 3) == 0) joins.back().admit.prefill_tokens = in.Int(0, 6);
  }
  // Prompt chunks (chunked prefill), of any sequence.
  std::vector<std::vector<TokenId>> chunk_tokens;
  std::vector<PromptChunk> chunks;
  const int64_t num_chunks = in.Int(0, 2);
  chunk_tokens.reserve(num_chunks);
  for (int64_t c = 0; c < num_chunks; ++c) {
    chunk_tokens.push_back(Tokens(in, 2 * kPageSize));
    chunks.push_back({.id = AnyId(in), .tokens = chunk_tokens.back()});
  }
  std::vector<int32_t> counts;
  if (in.Int(0, 7) != 0) {
    counts.resize(running.size() + (in.Int(0, 15) == 0 ? 1 : 0));
    for (int32_t& count : counts) count = static_cast<int32_t>(in.Int(-1, 3));
  }
  int64_t total = 0;
  for (const int32_t count : counts) total += std::max(count, 0);
  std::vector<TokenId> tokens(static_cast<size_t>(
      std::max<int64_t>(0, total + (in.Int(0, 15) == 0 ? 1 : 0))));
  for (TokenId& token : tokens) token = static_cast<TokenId>(in.Int(0, 5));
  // Draft slots (speculative decoding), now and then.
  std::vector<int32_t> drafts;
  if (in.Int(0, 3) == 0) {
    drafts.resize(running.size() + (in.Int(0, 15) == 0 ? 1 : 0));
    for (int32_t& count : drafts) count = static_cast<int32_t>(in.Int(-1, 6));
  }

  const BlockManagerSnapshot manager_before = s.manager->Snapshot();
  const std::vector<PageId> rows_before = Rows(*s.table);
  const std::vector<SequenceId> slots_before(running.begin(), running.end());
  const absl::StatusOr<StepResult> result =
      s.commit->Commit({.finished = finished,
                        .preempted = preempted,
                        .joins = joins,
                        .append_counts = counts,
                        .append_tokens = tokens,
                        .prompt_chunks = chunks,
                        .draft_counts = drafts});
  if (!result.ok()) {
    FUZZ_CHECK(
        s.manager->Snapshot() == manager_before,
        "a refused step changed the manager: " + result.status().ToString());
    FUZZ_CHECK(
        Rows(*s.table) == rows_before,
        "a refused step changed the table: " + result.status().ToString());
    const absl::Span<const SequenceId> slots = s.commit->slots();
    FUZZ_CHECK(
        std::vector<SequenceId>(slots.begin(), slots.end()) == slots_before,
        "a refused step changed the slots");
  }
  const absl::Status invariants = s.commit->CheckInvariants();
  FUZZ_CHECK(invariants.ok(), invariants.ToString());
}

void TableCall(KVPageTable& table, FuzzInput& in) {
  const std::vector<PageId> before = Rows(table);
  const KVPageTableUploadStats stats_before = table.upload_stats();
  std::vector<std::vector<PageId>> storage;
  std::vector<KVPageTableRowUpdate> updates;
  std::vector<KVPageTableRowMove> moves;
  const auto any_slot = [&] { return static_cast<SlotId>(in.Int(-1, kBatch)); };
  const auto add_updates = [&] {
    const int64_t n = in.Int(0, 3);
    storage.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<PageId> ids(static_cast<size_t>(in.Int(0, kWidth + 1)));
      for (PageId& id : ids) id = static_cast<PageId>(in.Int(-1, kPages));
      storage.push_back(std::move(ids));
      updates.push_back(
          {.slot = any_slot(),
           .k_page_ids = in.Int(0, 15) == 0 ? nullptr : storage.back().data(),
           .count = static_cast<int32_t>(storage.back().size()) -
                    static_cast<int32_t>(in.Int(0, 1)),
           .first = static_cast<int32_t>(in.Int(-1, 3))});
    }
  };
  absl::Status status;
  switch (in.Int(0, 3)) {
    case 0: {
      std::vector<PageId> ids(static_cast<size_t>(in.Int(0, kWidth + 1)));
      for (PageId& id : ids) id = static_cast<PageId>(in.Int(-1, kPages));
      status = table.SetRow(any_slot(), ids);
      break;
    }
    case 1:
      add_updates();
      status = table.SetRows(updates);
      break;
    case 2: {
      const int64_t n = in.Int(0, 4);
      for (int64_t i = 0; i < n; ++i) moves.push_back({any_slot(), any_slot()});
      add_updates();
      status = table.Apply({.moves = moves, .rows = updates});
      break;
    }
    default: {
      std::vector<SlotId> map(kBatch + (in.Int(0, 15) == 0 ? 1 : 0));
      for (SlotId& slot : map) slot = static_cast<SlotId>(in.Int(-2, kBatch));
      status = table.CompactRows(map, static_cast<int32_t>(in.Int(-1, kBatch)));
      break;
    }
  }
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
               status.ToString());
    FUZZ_CHECK(Rows(table) == before, "a refused table call changed rows");
    FUZZ_CHECK(table.upload_stats() == stats_before,
               "a refused table call changed the upload stats");
  }
  const absl::Status invariants = table.CheckInvariants();
  FUZZ_CHECK(invariants.ok(), invariants.ToString());
}

void Upload(KVPageTable& table) {
  const absl::StatusOr<bool> uploaded = table.Upload(nullptr);
  FUZZ_CHECK(uploaded.ok(), uploaded.status().ToString());
  CheckMirror(table);
}

void PoolCall(BlockPool& pool, FuzzInput& in) {
  const BlockPoolSnapshot before = pool.Snapshot();
  const PageId page = static_cast<PageId>(in.Int(-1, kPages));
  absl::Status status;
  switch (in.Int(0, 3)) {
    case 0:
      status = pool.Allocate().status();
      break;
    case 1:
      status = pool.Retain(page);
      break;
    case 2:
      status = pool.Release(page);
      break;
    default:
      status = pool.Writable(page).status();
      break;
  }
  if (!status.ok()) {
    FUZZ_CHECK(pool.Snapshot() == before,
               "a refused pool call changed the pool: " + status.ToString());
  }
  const absl::Status invariants = pool.CheckInvariants();
  FUZZ_CHECK(invariants.ok(), invariants.ToString());
}

void ManagerCall(BlockManager& manager, FuzzInput& in) {
  const BlockManagerSnapshot before = manager.Snapshot();
  const SequenceId id = AnyId(in);
  const std::vector<TokenId> tokens = Tokens(in, 2 * kWidth * kPageSize + 2);
  absl::Status status;
  switch (in.Int(0, 6)) {
    case 0:
      status = manager
                   .Admit(id, tokens, {}, {},
                          {.prefill_tokens =
                               in.Bool() ? in.Int(0, 9) : int64_t{1} << 40,
                           .read_prefix_cache = in.Bool()})
                   .status();
      break;
    case 1:
      status = manager.Append(id, tokens).status();
      break;
    case 5:
      status = manager.AppendPrompt(id, tokens).status();
      break;
    case 6:
      status =
          manager.SetDrafts(id, static_cast<int32_t>(in.Int(-1, 12))).status();
      break;
    case 2:
      status = manager.Fork(id, AnyId(in));
      break;
    case 3:
      status = manager.Free(id);
      break;
    default:
      status = manager.Preempt(id);
      break;
  }
  if (!status.ok()) {
    FUZZ_CHECK(
        manager.Snapshot() == before,
        "a refused manager call changed the manager: " + status.ToString());
  }
  const absl::Status invariants = manager.CheckInvariants();
  FUZZ_CHECK(invariants.ok(), invariants.ToString());
}

}  // namespace
}  // namespace kvblock::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvblock::fuzz;
  FuzzInput in(data, size);
  Stack stack(in);
  for (int op = 0; op < 256 && !in.empty(); ++op) {
    switch (in.Int(0, 5)) {
      case 0:
      case 1:
        Step(stack, in);
        break;
      case 2:
        Upload(*stack.table);
        break;
      case 3:
        TableCall(*stack.loose_table, in);
        if (in.Bool()) Upload(*stack.loose_table);
        break;
      case 4:
        PoolCall(*stack.pool, in);
        break;
      default:
        ManagerCall(*stack.loose_manager, in);
        break;
    }
  }
  return 0;
}
