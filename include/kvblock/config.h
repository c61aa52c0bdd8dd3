// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// PagedKvConfig: the geometry of one model's paged KV cache.
//
// The pool holds `num_pages` K pages and as many V pages per layer; a page
// holds `page_size` tokens x `num_kv_heads` x `head_dim` elements of `dtype`.
// The batched device page table is int32 [max_batch, 2, max_pages_per_seq].
// Every derived size is computed in 64 bits and `Validate()` rejects a config
// whose sizes overflow, so callers can use the accessors without checks.
//
// Complexity: every function is O(1).
// Thread safety: a plain value type; const methods are safe to call
// concurrently.
#ifndef KVBLOCK_CONFIG_H_
#define KVBLOCK_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvblock/types.h"

namespace kvblock {

// Element type of the KV pool.
enum class DType : int32_t { kF16 = 0, kBf16 = 1, kF32 = 2 };

// Bytes of one element of `dtype` (2, 2 or 4).
int64_t DTypeSize(DType dtype);

// "f16", "bf16" or "f32".
absl::string_view DTypeName(DType dtype);

// The pages of `page_size` tokens that hold `tokens` tokens (>= 0): the one
// place the ceiling is taken. Inline: appends ask it for every sequence of a
// step.
inline int64_t PagesForTokens(int64_t tokens, int32_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

struct PagedKvConfig {
  // Counts a caller must choose: 0 is invalid on purpose.
  int32_t num_pages = 0;          // K pages per layer (V pages: as many more).
  int32_t max_batch = 0;          // rows of the device page table.
  int32_t max_pages_per_seq = 0;  // columns of one K (or V) half of a row.

  // KV geometry, with the defaults of a typical 8-KV-head, 128-dim model.
  int32_t page_size = 16;  // tokens per page.
  int32_t num_layers = 1;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  DType dtype = DType::kBf16;

  // OK when every count is positive, the dtype is known, num_pages is at
  // most kMaxNumPages (V ids `num_pages + id` fit int32), and every derived
  // size below fits int64. InvalidArgument naming the first bad field and its
  // value otherwise.
  absl::Status Validate() const;

  // `num_layers * max_pages_per_seq`: the pages one sequence of maximal length
  // needs over all layers (the size of the identity plan).
  int64_t RequiredSingleSequencePages() const;

  // `max_pages_per_seq * page_size`.
  int64_t MaxTokensPerSeq() const;

  // The pages that hold `tokens` tokens (PagesForTokens).
  int64_t PagesFor(int64_t tokens) const {
    return PagesForTokens(tokens, page_size);
  }

  // Elements of one page: `page_size * num_kv_heads * head_dim`.
  int64_t PageElements() const;

  // Bytes of one page of one layer.
  int64_t PageBytes() const;

  // Bytes of one layer's pool, K and V: `2 * num_pages * PageBytes()`.
  int64_t LayerPoolBytes() const;

  // int32 entries of the device page table: `max_batch * 2 *
  // max_pages_per_seq`.
  int64_t PageTableEntries() const;
};

}  // namespace kvblock

#endif  // KVBLOCK_CONFIG_H_
