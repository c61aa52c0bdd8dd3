// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Vocabulary types shared by every layer of kvblock.
//
// A page id, a batch slot and a sequence id are distinct named aliases so that
// no raw `int` crosses a layer boundary without saying what it is.
//
// Thread safety: plain values; nothing here has state.
#ifndef KVBLOCK_TYPES_H_
#define KVBLOCK_TYPES_H_

#include <cstdint>

namespace kvblock {

// A physical K page of the pool: live ids are in [0, num_pages). The V page of
// K page `p` is `p + num_pages` (derived only in the device table).
using PageId = int32_t;
inline constexpr PageId kNoPage = -1;
// The most K pages a pool may have, in every layer that takes a page count
// (PagedKvConfig, BlockPool, KVPageTable): V ids `id + num_pages` stay below
// 2^31.
inline constexpr int32_t kMaxNumPages = (1 << 30) - 1;

// A page of the host tier (BlockPoolOptions::host_pages): pinned host memory
// that keeps evicted cached pages, in [0, host_pages).
using HostPageId = int32_t;
inline constexpr HostPageId kNoHostPage = -1;

// A row of the batched device page table, in [0, max_batch).
using SlotId = int32_t;
inline constexpr SlotId kNoSlot = -1;

// A scheduler's name for one sequence (one sample / beam of a request).
using SequenceId = int64_t;
inline constexpr SequenceId kNoSequence = -1;

// A live sequence's place in the manager's slab, what the per-step paths
// (BatchCommit) use to address many sequences without a lookup by id. The
// generation tells the sequences that take the same entry in turn apart, so
// the handle of a sequence that left never reaches the next one.
struct SequenceHandle {
  int32_t index = -1;
  uint32_t generation = 0;
  friend bool operator==(const SequenceHandle&,
                         const SequenceHandle&) = default;
};

// A token id of the model's vocabulary.
using TokenId = int32_t;

// The caller's CUDA stream (`cudaStream_t`), nullptr for the default stream.
// Kept opaque so that public headers compile without CUDA headers.
using Stream = void*;

}  // namespace kvblock

#endif  // KVBLOCK_TYPES_H_
