// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: AdmissionPlanner, how BlockManager plans the admission of a
// prompt: its page hashes (the caller's, or hashed here page by page, as far
// as the lookups and the pages the admission fills need), its whole-page
// prefix hits in the pool's cache and its host tier (walking the chain until
// the first page neither holds,
// and leaving the last page to recompute when the whole prompt is cached, as
// vLLM does), the tokens the admitting step computes (chunked prefill), and
// the pages it needs now and reserves for later. The hit pages stay here for
// the Admit that follows. It also remembers the hash of the last prompt's first
// page it computed: Admit checks a caller's hashes against the prompt's first
// page, and prompts behind one system prompt share that page.
//
// Complexity: O(prompt pages) lookups, plus O(prompt tokens) hashing when the
// caller gives no hashes. Scratch is sized at construction: nothing
// allocates.
//
// Thread safety: thread-compatible; its scratch makes even planning a
// mutation.
#ifndef KVBLOCK_LIB_MANAGER_ADMISSION_PLANNER_H_
#define KVBLOCK_LIB_MANAGER_ADMISSION_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/admission.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/types.h"

namespace kvblock::internal {

class AdmissionPlanner {
 public:
  // Plans with `hasher` (which must outlive the planner) under `config`;
  // `prefix_caching` and `reserve_prompt_pages` as BlockManagerOptions'.
  AdmissionPlanner(const PagedKvConfig& config, bool prefix_caching,
                   bool reserve_prompt_pages, BlockHasher& hasher);

  // The plan of admitting `prompt` with `extra` under `admit` now.
  // `prompt_hashes` is empty (hashed here) or the prompt's full-page hashes;
  // `hashes` is set to the ones used, at least the hits' and those of the
  // pages the admission fills (valid until the next call). The hit pages are
  // hits(plan.hit_pages). InvalidArgument for an empty prompt, hashes of the
  // wrong length or a prefill_tokens below 1; OutOfRange past
  // max_pages_per_seq. `group_hits`, when not null, are the hits (a KV
  // cache group's share of the hit every group of a model can serve, null
  // pages included): no lookup is made.
  absl::StatusOr<AdmissionPlan> Plan(
      const BlockPool& pool, absl::Span<const TokenId> prompt,
      const HashExtraKeys& extra, absl::Span<const BlockHash> prompt_hashes,
      const AdmitOptions& admit, absl::Span<const BlockHash>& hashes,
      const absl::Span<const PageId>* group_hits = nullptr);
  // Plan's checks of `prompt` and `admit` under `config`: its errors but
  // the hashes' length.
  static absl::Status CheckPrompt(const PagedKvConfig& config,
                                  absl::Span<const TokenId> prompt,
                                  const AdmitOptions& admit);

  // The first `n` hit pages the last Plan found; kNoPage for a page of the
  // host tier.
  absl::Span<const PageId> hits(int32_t n) const {
    return absl::MakeConstSpan(hit_pages_).first(n);
  }

  // The hash of a prompt's first page under `extra`, remembered for the last
  // first page hashed.
  BlockHash FirstPageHash(absl::Span<const TokenId> first_page,
                          const HashExtraKeys& extra);

 private:
  const PagedKvConfig config_;
  const bool prefix_caching_;
  const bool reserve_prompt_pages_;
  BlockHasher& hasher_;
  std::vector<BlockHash> chain_;
  std::vector<PageId> hit_pages_;
  // FirstPageHash's last page: its tokens (empty before the first), root
  // and hash.
  std::vector<TokenId> first_page_tokens_;
  BlockHash first_page_root_;
  BlockHash first_page_hash_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_MANAGER_ADMISSION_PLANNER_H_
