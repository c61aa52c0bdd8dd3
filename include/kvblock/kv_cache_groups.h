// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KV cache groups: the attention kinds of a hybrid model (gpt-oss's full and
// 128-token sliding-window layers, Gemma 3's 1,024-token local layers, Llama
// 4's chunked-local ones), one group per kind and page size, every group
// drawing its pages from one pool. The spec math is vLLM's
// (`vllm/v1/kv_cache_interface.py`, `vllm/v1/core/
// single_type_kv_cache_manager.py` and `kv_cache_coordinator.py` at
// vllm-project/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268):
//
//   full attention    every token attends to every earlier one: nothing is
//                     ever skipped.
//   sliding window W  a token attends to the W tokens ending with itself:
//                     after `computed` tokens, the first computed - W + 1
//                     are skipped.
//   chunked local C   a token attends to the tokens of its own C-token chunk:
//                     after `computed` tokens, the whole chunks before them
//                     are skipped.
//
// A page whose tokens are all skipped is released and its table entry points
// at the null page. A prefix hit is a multiple of the least common multiple
// of the page sizes (kvblock/group_cache_hit.h); a BlockManager hashes a
// prompt once, in blocks of the page sizes' greatest common divisor, as
// vLLM does (a group's page is named by its last block's hash), and files
// each group's pages under keys of that group's own.
//
// Complexity: every function is O(groups). Thread safety: plain values.
#ifndef KVBLOCK_KV_CACHE_GROUPS_H_
#define KVBLOCK_KV_CACHE_GROUPS_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvblock {

enum class AttentionKind : int32_t {
  kFull = 0,
  kSlidingWindow = 1,
  kChunkedLocal = 2,
};

// vLLM's KVCacheSpecKind value, as KV cache events carry it:
// "full_attention", "sliding_window" or "chunked_local_attention".
absl::string_view AttentionKindName(AttentionKind kind);

// One KV cache group.
struct KvCacheGroupSpec {
  AttentionKind kind = AttentionKind::kFull;
  // Tokens a page holds, positive.
  int32_t page_size = 16;
  // kSlidingWindow: the tokens a query attends to, itself included (vLLM's
  // sliding_window), positive. 0 for the other kinds.
  int32_t sliding_window = 0;
  // kChunkedLocal: the tokens of one attention chunk, positive. 0 for the
  // other kinds.
  int32_t attention_chunk_size = 0;
  // EAGLE (or MTP) drafting reads this group (vLLM's is_eagle_group): a
  // prefix hit leaves its last page to be recomputed, for the hidden state
  // the draft head needs.
  bool eagle = false;

  friend bool operator==(const KvCacheGroupSpec&,
                         const KvCacheGroupSpec&) = default;
};

// Whether `a` and `b` are the same attention (kind, page size, window or
// chunk), eagle aside: such groups are looked up together, a page a hit only
// where every one of them has it, as vLLM looks up groups of equal specs.
bool SameAttention(const KvCacheGroupSpec& a, const KvCacheGroupSpec& b);

// The most KV cache groups a model may have, and the largest least common
// multiple of their page sizes (a prefix hit's unit).
inline constexpr int32_t kMaxKvCacheGroups = 64;
inline constexpr int64_t kMaxAlignmentTokens = int64_t{1} << 30;

// InvalidArgument, naming the group and the value, when `groups` is empty or
// longer than kMaxKvCacheGroups, a page size is not positive, a window or
// chunk is not positive for its kind (or not 0 for another), or the page
// sizes' least common multiple exceeds kMaxAlignmentTokens.
absl::Status ValidateKvCacheGroups(absl::Span<const KvCacheGroupSpec> groups);
// What prefix hits over `groups` need besides (GroupCacheHitFinder; vLLM's
// ChunkedLocalAttentionManager.find_longest_cache_hit asserts both):
// InvalidArgument, naming the group, when a chunked-local group's pages are
// not the page sizes' least common multiple or it drafts with EAGLE.
// REQUIRES: ValidateKvCacheGroups(groups) is OK.
absl::Status ValidateGroupCacheHits(absl::Span<const KvCacheGroupSpec> groups);

// The page size prompts are hashed at: the greatest common divisor of the
// groups' page sizes. REQUIRES: ValidateKvCacheGroups(groups) is OK.
int32_t HashPageSize(absl::Span<const KvCacheGroupSpec> groups);
// A prefix hit's unit in tokens: the least common multiple of the groups'
// page sizes. REQUIRES: ValidateKvCacheGroups(groups) is OK.
int64_t AlignmentTokens(absl::Span<const KvCacheGroupSpec> groups);

// The leading tokens no later token of a sequence that has computed
// `computed_tokens` (>= 0) attends to in `group` (vLLM's
// get_num_skipped_tokens): 0 for full attention.
// Inline: a step asks it for every sequence of every window group.
inline int64_t NumSkippedTokens(const KvCacheGroupSpec& group,
                                int64_t computed_tokens) {
  switch (group.kind) {
    case AttentionKind::kFull:
      return 0;
    case AttentionKind::kSlidingWindow:
      return std::max<int64_t>(0, computed_tokens - group.sliding_window + 1);
    case AttentionKind::kChunkedLocal:
      return computed_tokens / group.attention_chunk_size *
             group.attention_chunk_size;
  }
  return 0;
}

// The leading pages of `group` a sequence that has computed
// `computed_tokens` no longer reads: NumSkippedTokens / page_size.
inline int64_t NumSkippedPages(const KvCacheGroupSpec& group,
                               int64_t computed_tokens) {
  return NumSkippedTokens(group, computed_tokens) / group.page_size;
}

// The fewest computed tokens at which `group` skips more than `pages` (>= 0)
// leading pages: a sequence that has skipped `pages` need not look again
// before. INT64_MAX for full attention, which skips none.
int64_t NextSkipTokens(const KvCacheGroupSpec& group, int64_t pages);

// Whether full page `page` of a sequence in `group` goes into the prefix
// cache when hits come in units of `alignment_tokens`: a sliding-window group
// whose window reaches back fewer pages than a unit holds caches only the
// pages at the end of each unit, the ones a hit can use (vLLM's
// _cache_block_mask; an EAGLE group's, one page more and one page later);
// every other page is cached. A window of 1 reaches back no page: with
// pages smaller than the unit such a group caches none, and so never hits,
// as in vLLM (28be48fa), whose hit search also wants one cached page.
bool CachesFullPage(const KvCacheGroupSpec& group, int64_t page,
                    int64_t alignment_tokens);

}  // namespace kvblock

#endif  // KVBLOCK_KV_CACHE_GROUPS_H_
