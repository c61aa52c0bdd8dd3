// Copyright 2026 The kvblock Authors.
#include "admission_planner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"

namespace kvblock::internal {

AdmissionPlanner::AdmissionPlanner(const PagedKvConfig& config,
                                   const BlockManagerOptions& options,
                                   BlockHasher& hasher)
    : config_(config),
      prefix_caching_(options.enable_prefix_caching),
      hasher_(hasher),
      chain_(config.max_pages_per_seq),
      hit_pages_(config.max_pages_per_seq) {
  first_page_tokens_.reserve(config.page_size);
}

absl::StatusOr<AdmissionPlan> AdmissionPlanner::Plan(
    const BlockPool& pool, absl::Span<const TokenId> prompt,
    const HashExtraKeys& extra, absl::Span<const BlockHash> prompt_hashes,
    absl::Span<const BlockHash>& hashes) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("block manager: the prompt is empty");
  }
  const int64_t size = static_cast<int64_t>(prompt.size());
  const int64_t pages = (size + config_.page_size - 1) / config_.page_size;
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: a prompt of ", size, " tokens needs ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  AdmissionPlan plan;
  if (prefix_caching_) {
    const int64_t full_pages = size / config_.page_size;
    if (prompt_hashes.empty()) {
      KVBLOCK_RETURN_IF_ERROR(
          HashChain(hasher_, prompt, extra, absl::MakeSpan(chain_)).status());
      hashes = absl::MakeConstSpan(chain_).first(full_pages);
    } else if (static_cast<int64_t>(prompt_hashes.size()) == full_pages) {
      hashes = prompt_hashes;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "block manager: ", prompt_hashes.size(),
          " prompt hashes for a prompt of ", full_pages, " full pages"));
    }
    // vLLM's rule: at least one prompt token is computed, so a fully cached
    // prompt recomputes its last page.
    const int64_t max_hits =
        std::min<int64_t>(full_pages, (size - 1) / config_.page_size);
    for (int64_t i = 0; i < max_hits; ++i) {
      const std::optional<PageId> page = pool.Lookup(hashes[i]);
      if (!page.has_value()) break;
      hit_pages_[plan.hit_pages++] = *page;
      if (pool.RefCount(*page) == 0) ++plan.revived_pages;
    }
  }
  plan.hit_tokens = int64_t{plan.hit_pages} * config_.page_size;
  plan.new_pages = static_cast<int32_t>(pages) - plan.hit_pages;
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
