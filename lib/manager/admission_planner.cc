// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "manager/admission_planner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"

namespace kvblock::internal {

AdmissionPlanner::AdmissionPlanner(const PagedKvConfig& config,
                                   bool prefix_caching,
                                   bool reserve_prompt_pages,
                                   BlockHasher& hasher)
    : config_(config),
      prefix_caching_(prefix_caching),
      reserve_prompt_pages_(reserve_prompt_pages),
      hasher_(hasher),
      chain_(config.max_pages_per_seq),
      hit_pages_(config.max_pages_per_seq) {
  first_page_tokens_.reserve(config.page_size);
}

absl::Status AdmissionPlanner::CheckPrompt(const PagedKvConfig& config,
                                           absl::Span<const TokenId> prompt,
                                           const AdmitOptions& admit) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("block manager: the prompt is empty");
  }
  if (admit.prefill_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: prefill_tokens ", admit.prefill_tokens,
                     " is less than 1"));
  }
  const int64_t size = static_cast<int64_t>(prompt.size());
  const int64_t pages = config.PagesFor(size);
  if (pages > config.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: a prompt of ", size, " tokens needs ", pages,
        " pages, more than max_pages_per_seq = ", config.max_pages_per_seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdmissionPlan> AdmissionPlanner::Plan(
    const BlockPool& pool, absl::Span<const TokenId> prompt,
    const HashExtraKeys& extra, absl::Span<const BlockHash> prompt_hashes,
    const AdmitOptions& admit, absl::Span<const BlockHash>& hashes,
    const absl::Span<const PageId>* group_hits) {
  KVBLOCK_RETURN_IF_ERROR(CheckPrompt(config_, prompt, admit));
  const int64_t page_size = config_.page_size;
  const int64_t size = static_cast<int64_t>(prompt.size());
  const int64_t pages = config_.PagesFor(size);
  const int64_t full_pages = size / page_size;
  if (prefix_caching_ && !prompt_hashes.empty() &&
      static_cast<int64_t>(prompt_hashes.size()) != full_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: ", prompt_hashes.size(),
        " prompt hashes for a prompt of ", full_pages, " full pages"));
  }
  // Hashes the chain up to page `n` (exclusive), from where it stands.
  int64_t hashed = 0;
  const auto hash_through = [&](int64_t n) {
    if (!prompt_hashes.empty()) return;
    for (; hashed < n; ++hashed) {
      chain_[hashed] = hasher_.HashPage(
          hashed == 0 ? hasher_.RootHash(extra) : chain_[hashed - 1],
          prompt.subspan(hashed * page_size, page_size));
    }
  };
  const absl::Span<const BlockHash> chain =
      prompt_hashes.empty() ? absl::MakeConstSpan(chain_) : prompt_hashes;
  AdmissionPlan plan;
  if (group_hits != nullptr) {
    if (prefix_caching_ && admit.read_prefix_cache) {
      for (const PageId page : *group_hits) {
        hit_pages_[plan.hit_pages++] = page;
        if (pool.RefCount(page) == 0) ++plan.revived_pages;
      }
    }
  } else if (prefix_caching_ && admit.read_prefix_cache) {
    // vLLM's rule: at least one prompt token is computed, so a fully cached
    // prompt recomputes its last page.
    const int64_t max_hits = std::min(full_pages, (size - 1) / page_size);
    for (int64_t i = 0; i < max_hits; ++i) {
      hash_through(i + 1);
      const std::optional<PageId> page = pool.Lookup(chain[i]);
      if (page.has_value()) {
        hit_pages_[plan.hit_pages++] = *page;
        if (pool.RefCount(*page) == 0) ++plan.revived_pages;
        continue;
      }
      // Not on the device: a page the host tier holds is a hit too, loaded
      // into a new page (kNoPage here).
      if (!pool.HostLookup(chain[i]).has_value()) break;
      hit_pages_[plan.hit_pages++] = kNoPage;
      ++plan.host_hit_pages;
    }
  }
  plan.hit_tokens = int64_t{plan.hit_pages} * page_size;
  plan.computed_tokens = std::min(admit.prefill_tokens, size - plan.hit_tokens);
  const int64_t end = plan.hit_tokens + plan.computed_tokens;
  const int64_t end_pages = config_.PagesFor(end);
  plan.new_pages = static_cast<int32_t>(end_pages) - plan.hit_pages;
  if (reserve_prompt_pages_) {
    plan.reserved_pages = static_cast<int32_t>(pages - end_pages);
  }
  if (prefix_caching_) {
    hash_through(end / page_size);  // the full pages the admission fills.
    hashes =
        chain.first(prompt_hashes.empty() ? static_cast<size_t>(hashed)
                                          : static_cast<size_t>(full_pages));
  } else {
    hashes = {};
  }
  return plan;
}

BlockHash AdmissionPlanner::FirstPageHash(absl::Span<const TokenId> first_page,
                                          const HashExtraKeys& extra) {
  const BlockHash root = hasher_.RootHash(extra);
  if (root != first_page_root_ ||
      !std::equal(first_page.begin(), first_page.end(),
                  first_page_tokens_.begin(), first_page_tokens_.end())) {
    first_page_tokens_.assign(first_page.begin(), first_page.end());
    first_page_root_ = root;
    first_page_hash_ = hasher_.HashPage(root, first_page);
  }
  return first_page_hash_;
}

}  // namespace kvblock::internal
