// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// GroupCacheHitFinder: the longest prefix of a prompt that every KV cache
// group of a model (kvblock/kv_cache_groups.h) can serve from the prefix
// cache, found as vLLM finds it (`find_longest_cache_hit` of
// `vllm/v1/core/single_type_kv_cache_manager.py` and of the hybrid
// coordinator in `kv_cache_coordinator.py`, vllm-project/vllm 28be48fa):
//
//   full attention    the cached pages from the first, left to right, up to
//                     the first miss; hits are downward closed, so a later
//                     round only trims them.
//   sliding window W  right to left, the last ceil((W - 1) / page_size)
//                     contiguous cached pages (one more with EAGLE), the
//                     pages before them null: a hit needs only the window
//                     before its end. With no such run, the cached run from
//                     page 0.
//   chunked local C   the pages of the chunks before the prompt's last one
//                     are null, then the cached pages of that chunk left to
//                     right.
//   several groups    groups of the same attention are looked up together
//                     (a page hits only where all have it); full attention
//                     goes first, then each kind cuts the candidate length
//                     and the rounds repeat until no kind cuts it (one round
//                     for one full kind and one other). Every length is a
//                     multiple of the page sizes' least common multiple.
//   EAGLE             a drafting group's hit drops its last page, once per
//                     candidate length (vLLM issue 32802).
// One group alone is vLLM's unitary coordinator: its own page size is the
// unit.
//
// Where kvblock differs: vLLM trims only the first kind's pages to the final
// length, so a second full-attention kind of another page size can come back
// longer than the hit (and its extra pages would be recomputed in place);
// here every group's pages are exactly the hit's.
//
// Complexity: Find does O(prompt pages) lookups per round, and at most one
// round per kind that cuts the length; the output's vectors are reused, so a
// steady caller allocates nothing. Thread safety: Find is const and keeps no
// state; the lookup is the caller's.
#ifndef KVBLOCK_GROUP_CACHE_HIT_H_
#define KVBLOCK_GROUP_CACHE_HIT_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/types.h"

namespace kvblock {

// The cached page of group `group` that holds the prompt's page `page`
// (counted at that group's page size), or kNoPage.
using GroupPageLookup = absl::FunctionRef<PageId(int32_t group, int64_t page)>;

struct GroupCacheHit {
  // Prompt tokens served from the cache: a multiple of every group's page
  // size.
  int64_t hit_tokens = 0;
  // Per group, hit_tokens / page_size pages: the cached ones, and the null
  // page where the group skips them.
  std::vector<std::vector<PageId>> pages;
};

class GroupCacheHitFinder {
 public:
  // A finder for `groups` whose skipped pages are `null_page`. Errors:
  // ValidateKvCacheGroups's and ValidateGroupCacheHits's.
  static absl::StatusOr<GroupCacheHitFinder> Create(
      absl::Span<const KvCacheGroupSpec> groups, PageId null_page);

  // The longest hit within `max_length` prompt tokens (vLLM passes the
  // prompt's length less one, so that one token is left to compute), into
  // `hit` (its vectors reused). A negative max_length finds nothing.
  void Find(int64_t max_length, GroupPageLookup lookup,
            GroupCacheHit& hit) const;

  // The unit of a hit: the page sizes' least common multiple (one group:
  // its page size).
  int64_t alignment_tokens() const { return alignment_tokens_; }
  int32_t num_groups() const { return num_groups_; }

 private:
  // Groups of the same attention, looked up together.
  struct Kind {
    KvCacheGroupSpec spec;
    std::vector<int32_t> groups;
    bool eagle = false;  // one of its groups drafts.
  };

  GroupCacheHitFinder() = default;
  // One kind's hit within `max_length` tokens, in pages, its groups' pages
  // written into `hit`.
  int64_t FindKind(const Kind& kind, int64_t max_length, bool eagle,
                   GroupPageLookup lookup, GroupCacheHit& hit) const;
  int64_t FindFull(const Kind& kind, int64_t max_length, bool eagle,
                   GroupPageLookup lookup, GroupCacheHit& hit) const;
  int64_t FindSlidingWindow(const Kind& kind, int64_t max_length, bool eagle,
                            GroupPageLookup lookup, GroupCacheHit& hit) const;
  int64_t FindChunkedLocal(const Kind& kind, int64_t max_length,
                           GroupPageLookup lookup, GroupCacheHit& hit) const;
  // Appends to the kind's pages (every group's list as long) the cached
  // pages from there on, up to `max_pages` in all; returns the pages then.
  int64_t Extend(const Kind& kind, int64_t max_pages, GroupPageLookup lookup,
                 GroupCacheHit& hit) const;
  // Drops the kind's last pages until `pages` * page_size is a multiple of
  // the alignment; returns the pages left.
  int64_t Align(const Kind& kind, int64_t pages, GroupCacheHit& hit) const;
  // Whether every group of `kind` has page `page` cached; writes the pages
  // at `page` of each group's list (sized past it) when so.
  bool Probe(const Kind& kind, int64_t page, GroupPageLookup lookup,
             GroupCacheHit& hit) const;
  // Cuts every group of `kind` to `pages` pages.
  static void Resize(const Kind& kind, int64_t pages, PageId fill,
                     GroupCacheHit& hit);

  // Full attention first, each kind in the order its first group comes.
  std::vector<Kind> kinds_;
  int64_t alignment_tokens_ = 1;
  int32_t num_groups_ = 0;
  PageId null_page_ = kNoPage;
};

}  // namespace kvblock

#endif  // KVBLOCK_GROUP_CACHE_HIT_H_
