// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "manager/group_coordinator.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/reservation.h"
#include "kvblock/status_macros.h"
#include "manager/admission_planner.h"

namespace kvblock::internal {

absl::StatusOr<GroupCoordinator::Created> GroupCoordinator::Create(
    const PagedKvConfig& config, const BlockManagerOptions& options) {
  const std::vector<KvCacheGroupSpec>& specs = options.kv_cache_groups;
  KVBLOCK_RETURN_IF_ERROR(ValidateKvCacheGroups(specs));
  const bool windows = std::any_of(specs.begin(), specs.end(), [](auto& g) {
    return g.kind != AttentionKind::kFull;
  });
  if (windows && config.num_pages < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: a model with a window group needs num_pages >= 2 "
        "(one is the null page), got ",
        config.num_pages));
  }
  // Every group's table holds the tokens max_pages_per_seq pages of the
  // config's size hold.
  const int64_t max_tokens =
      int64_t{config.max_pages_per_seq} * int64_t{config.page_size};
  std::vector<PagedKvConfig> group_configs;
  internal::Reservation reservation("block manager");
  for (size_t g = 0; g < specs.size(); ++g) {
    PagedKvConfig group = config;
    group.page_size = specs[g].page_size;
    group.max_pages_per_seq = static_cast<int32_t>(std::min<int64_t>(
        PagesForTokens(max_tokens, specs[g].page_size), INT32_MAX));
    if (absl::Status status = group.Validate(); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block manager: KV cache group ", g, ": ", status.message()));
    }
    BlockManagerImpl::Reserve(group, options, reservation);
    // The coordinator's own: the group's chain of a sequence's page hashes
    // and its pages pinned while a hit is taken.
    reservation.Add(group.max_pages_per_seq,
                    sizeof(BlockHash) + sizeof(PageId));
    group_configs.push_back(group);
  }
  // With several page sizes, the chain of a sequence's hash blocks.
  const int32_t hash_block_size = HashPageSize(specs);
  if (std::any_of(specs.begin(), specs.end(), [&](const auto& spec) {
        return spec.page_size != hash_block_size;
      })) {
    reservation.Add(max_tokens / hash_block_size, sizeof(BlockHash));
  }
  // The pool's too: each part may fit where the sum does not.
  reservation.Add(1, BlockPool::ReservedBytes(config.num_pages));
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                           BlockPool::Create(config.num_pages));
  // A fresh pool hands out page 0 first: vLLM's null block.
  const PageId null_page = windows ? *pool->Allocate() : kNoPage;
  // Without prefix caching nothing looks hits up (nor asks what they need).
  std::optional<GroupCacheHitFinder> finder;
  if (options.enable_prefix_caching) {
    KVBLOCK_ASSIGN_OR_RETURN(finder,
                             GroupCacheHitFinder::Create(specs, null_page));
  }
  // Every group hashes pages as blocks of one size (hash_block_size), as
  // vLLM does: one prompt chain names every group's pages.
  std::vector<BlockHasher> hashers;
  for (const KvCacheGroupSpec& spec : specs) {
    KVBLOCK_ASSIGN_OR_RETURN(
        BlockHasher hasher,
        BlockHasher::Create(options.hash_algorithm, spec.page_size,
                            hash_block_size));
    hashers.push_back(std::move(hasher));
  }
  std::optional<BlockHasher> block_hasher;
  if (std::any_of(specs.begin(), specs.end(), [&](const auto& spec) {
        return spec.page_size != hash_block_size;
      })) {
    KVBLOCK_ASSIGN_OR_RETURN(
        block_hasher,
        BlockHasher::Create(options.hash_algorithm, hash_block_size));
  }
  Created created;
  KVBLOCK_RETURN_IF_ERROR(reservation.Run([&] {
    created.coordinator.reset(new GroupCoordinator(
        config, options, specs, std::move(pool), null_page, std::move(finder)));
    GroupCoordinator& self = *created.coordinator;
    self.hash_block_size_ = hash_block_size;
    if (block_hasher.has_value()) {
      self.block_hasher_ = std::move(block_hasher);
      self.block_chain_.resize(
          static_cast<size_t>(max_tokens / hash_block_size));
    }
    // Groups of one page size share a memo: a page that fills in each is
    // hashed once. Two slots a batch row.
    std::vector<PageHashMemo*> memo_of(specs.size(), nullptr);
    for (size_t g = 0; g < specs.size(); ++g) {
      for (size_t h = 0; h < g; ++h) {
        if (specs[h].page_size != specs[g].page_size) continue;
        if (memo_of[h] == nullptr) {
          self.memos_.push_back(std::make_unique<PageHashMemo>(
              2 * static_cast<size_t>(config.max_batch), specs[h].page_size));
          memo_of[h] = self.memos_.back().get();
        }
        memo_of[g] = memo_of[h];
        break;
      }
    }
    int32_t largest_page = 0;
    for (const KvCacheGroupSpec& spec : specs) {
      largest_page = std::max(largest_page, spec.page_size);
    }
    for (size_t g = 0; g < specs.size(); ++g) {
      const GroupScope scope{
          .index = static_cast<int32_t>(g),
          .spec = specs[g],
          .alignment_tokens = AlignmentTokens(specs),
          .null_page = self.null_page_,
          .reserved_pages = &self.reserved_pages_,
          .hash_memo = memo_of[g],
          // Group 0 keeps the log; the others record
          // into it.
          .events = g == 0 ? nullptr : self.groups_[0]->events_,
          .event_page_size = largest_page};
      auto group = std::make_unique<BlockManagerImpl>(
          group_configs[g], options, *self.pool_, std::move(hashers[g]), scope);
      self.groups_.push_back(group.get());
      self.chains_.emplace_back(group_configs[g].max_pages_per_seq);
      if (g == 0) {
        created.first_group = std::move(group);
      } else {
        self.owned_.push_back(std::move(group));
      }
    }
  }));
  return created;
}

GroupCoordinator::GroupCoordinator(const PagedKvConfig& config,
                                   const BlockManagerOptions& options,
                                   std::vector<KvCacheGroupSpec> specs,
                                   std::unique_ptr<BlockPool> pool,
                                   PageId null_page,
                                   std::optional<GroupCacheHitFinder> finder)
    : config_(config),
      options_(options),
      specs_(std::move(specs)),
      pool_(std::move(pool)),
      null_page_(null_page),
      finder_(std::move(finder)) {
  for (const KvCacheGroupSpec& spec : specs_) {
    one_page_size_ = one_page_size_ && spec.page_size == specs_[0].page_size;
  }
  transactions_.reserve(specs_.size());
  pinned_.reserve(static_cast<size_t>(config_.max_pages_per_seq) *
                  specs_.size());
  hit_.pages.resize(specs_.size());
  plans_.resize(specs_.size());
  hashes_.resize(specs_.size());
}

GroupCoordinator::~GroupCoordinator() = default;

template <typename Change>
absl::Status GroupCoordinator::Transact(Change&& change) {
  transactions_.clear();
  for (BlockManagerImpl* group : groups_) {
    transactions_.push_back(group->BeginTransaction());
  }
  absl::Status status = change();
  // Innermost first: the last group's savepoint undoes the pool for all.
  for (size_t g = groups_.size(); g-- > 0;) {
    if (status.ok()) {
      groups_[g]->CommitTransaction(transactions_[g]);
    } else {
      groups_[g]->RollbackTransaction(transactions_[g]);
    }
  }
  return status;
}

// Admission -------------------------------------------------------------------

absl::StatusOr<int64_t> GroupCoordinator::HashBlocks(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<BlockHash> out) const {
  if (!block_hasher_.has_value()) {
    return groups_[0]->HashPrompt(prompt, extra, out);
  }
  return HashChain(*block_hasher_, prompt, extra, out);
}

absl::Status GroupCoordinator::HashPrompt(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes) {
  const auto blocks = static_cast<int64_t>(prompt.size()) / hash_block_size_;
  if (!prompt_hashes.empty() &&
      static_cast<int64_t>(prompt_hashes.size()) != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: ", prompt_hashes.size(),
        " prompt hashes for a prompt of ", blocks, " full pages",
        one_page_size_ ? ""
                       : absl::StrCat(" of ", hash_block_size_,
                                      " tokens (the groups' hash block)")));
  }
  absl::Span<const BlockHash> chain = prompt_hashes;
  if (chain.empty()) {
    // One page size: group 0's chain is the chain of blocks.
    const absl::Span<BlockHash> out = block_hasher_.has_value()
                                          ? absl::MakeSpan(block_chain_)
                                          : absl::MakeSpan(chains_[0]);
    KVBLOCK_ASSIGN_OR_RETURN(const int64_t n, HashBlocks(prompt, extra, out));
    chain = absl::MakeConstSpan(out).first(static_cast<size_t>(n));
  }
  for (int32_t g = 0; g < static_cast<int32_t>(specs_.size()); ++g) {
    hashes_[g] = PageHashes(g, chain);
  }
  return absl::OkStatus();
}

absl::Span<const BlockHash> GroupCoordinator::PageHashes(
    int32_t group, absl::Span<const BlockHash> blocks) {
  const auto per_page =
      static_cast<size_t>(specs_[group].page_size / hash_block_size_);
  if (per_page == 1) return blocks;
  const size_t pages = blocks.size() / per_page;
  std::vector<BlockHash>& own = chains_[group];
  for (size_t page = 0; page < pages; ++page) {
    own[page] = blocks[(page + 1) * per_page - 1];
  }
  return absl::MakeConstSpan(own).first(pages);
}

BlockHash GroupCoordinator::FirstBlockHash(absl::Span<const TokenId> prompt,
                                           const HashExtraKeys& extra) {
  const absl::Span<const TokenId> block =
      prompt.first(static_cast<size_t>(hash_block_size_));
  if (!block_hasher_.has_value()) {
    return groups_[0]->planner_.FirstPageHash(block, extra);
  }
  return block_hasher_->HashPage(block_hasher_->RootHash(extra), block);
}

absl::StatusOr<absl::Span<const BlockHash>> GroupCoordinator::ChunkHashes(
    int32_t group, SequenceId id, absl::Span<const BlockHash> prompt_hashes) {
  if (one_page_size_ || prompt_hashes.empty()) return prompt_hashes;
  BlockManagerImpl& first = *groups_[0];
  KVBLOCK_ASSIGN_OR_RETURN(const SequenceHandle handle, first.HandleOf(id));
  const int64_t blocks =
      first.slab_.sequence(handle.index).prompt_end() / hash_block_size_;
  if (static_cast<int64_t>(prompt_hashes.size()) != blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: the ", prompt_hashes.size(),
                     " prompt hashes of a chunk of sequence ", id,
                     " are not its prompt's (", blocks, " full pages of ",
                     hash_block_size_, " tokens, the groups' hash block)"));
  }
  return PageHashes(group, prompt_hashes);
}

absl::StatusOr<AdmissionPlan> GroupCoordinator::PlanGroups(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  const bool caching = options_.enable_prefix_caching;
  const int32_t num_groups = static_cast<int32_t>(groups_.size());
  for (int32_t g = 0; g < num_groups; ++g) {
    KVBLOCK_RETURN_IF_ERROR(
        AdmissionPlanner::CheckPrompt(groups_[g]->config_, prompt, admit));
  }
  std::vector<absl::Span<const BlockHash>>& chains = hashes_;
  if (caching) {
    KVBLOCK_RETURN_IF_ERROR(HashPrompt(prompt, extra, prompt_hashes));
  }
  if (caching && admit.read_prefix_cache) {
    finder_->Find(
        static_cast<int64_t>(prompt.size()) - 1,
        [&](int32_t g, int64_t page) {
          BlockHash salted;
          const std::optional<PageId> cached =
              pool_->Lookup(groups_[g]->Key(chains[g][page], salted));
          return cached.value_or(kNoPage);
        },
        hit_);
  } else {
    hit_.hit_tokens = 0;
    for (std::vector<PageId>& pages : hit_.pages) pages.clear();
  }
  AdmissionPlan total;
  for (int32_t g = 0; g < num_groups; ++g) {
    const absl::Span<const PageId> hits = hit_.pages[g];
    absl::Span<const BlockHash> registered;
    KVBLOCK_ASSIGN_OR_RETURN(
        plans_[g], groups_[g]->planner_.Plan(
                       *pool_, prompt, extra,
                       caching ? chains[g] : absl::Span<const BlockHash>(),
                       admit, registered, &hits));
    chains[g] = registered;
    const AdmissionPlan& plan = plans_[g];
    total.hit_pages += plan.hit_pages;
    total.revived_pages += plan.revived_pages;
    total.new_pages += plan.new_pages;
    total.reserved_pages += plan.reserved_pages;
  }
  total.hit_tokens = plans_[0].hit_tokens;
  total.computed_tokens = plans_[0].computed_tokens;
  return total;
}

absl::StatusOr<AdmissionPlan> GroupCoordinator::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  return PlanGroups(prompt, extra, prompt_hashes, admit);
}

absl::StatusOr<AdmissionPlan> GroupCoordinator::Admit(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  BlockManagerImpl& first = *groups_[0];
  KVBLOCK_RETURN_IF_ERROR(first.CheckNewId(id, "sequence"));
  KVBLOCK_ASSIGN_OR_RETURN(const AdmissionPlan plan,
                           PlanGroups(prompt, extra, prompt_hashes, admit));
  // As one group's Admit: the caller's chain must start from this prompt
  // (PlanGroups checked that it holds the prompt's blocks).
  if (!prompt_hashes.empty() && options_.enable_prefix_caching &&
      FirstBlockHash(prompt, extra) != prompt_hashes[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: prompt_hashes of sequence ", id,
                     " do not start from its prompt and extra keys"));
  }
  const int64_t needed = int64_t{plan.pages_consumed()} + plan.reserved_pages;
  const int32_t allocatable = first.NumAllocatable();
  if (needed > allocatable - options_.watermark_pages) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", id, " needs ", plan.pages_consumed(),
        " pages in its ", groups_.size(), " KV cache groups",
        (plan.reserved_pages > 0 ? absl::StrCat(" and ", plan.reserved_pages,
                                                " reserved for its prompt")
                                 : ""),
        ", ", allocatable, " are allocatable and ", options_.watermark_pages,
        " are kept as watermark"));
  }
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    // Every group's evictable hits are pinned before any group allocates:
    // a group's allocation may evict another group's (a used page cannot
    // be evicted: it needs no pin).
    pinned_.clear();
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const PageId page : hit_.pages[g]) {
        if (page == null_page_ || pool_->RefCount(page) > 0) continue;
        KVBLOCK_RETURN_IF_ERROR(
            pool_->AcquireCached(absl::MakeConstSpan(&page, 1)));
        pinned_.push_back(page);
      }
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      KVBLOCK_RETURN_IF_ERROR(
          groups_[g]->AdmitPlanned(id, prompt, extra, plans_[g], hashes_[g]));
    }
    for (const PageId page : pinned_) {
      KVBLOCK_RETURN_IF_ERROR(pool_->Release(page));
    }
    return absl::OkStatus();
  }));
  return plan;
}

// Appends ---------------------------------------------------------------------

absl::Status GroupCoordinator::ReleaseSkipped(SequenceId id) {
  for (BlockManagerImpl* group : groups_) {
    if (!group->skips_pages()) continue;
    KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, group->EntryToChange(id));
    KVBLOCK_RETURN_IF_ERROR(group->SkipEntry(entry).status());
  }
  return absl::OkStatus();
}

void GroupCoordinator::AddAppend(int32_t group, const AppendResult& part,
                                 AppendResult& total) {
  total.new_pages += part.new_pages;
  total.released_pages += part.released_pages;
  if (part.copy.has_value()) {
    if (group == 0) total.copy = part.copy;
    total.group_copies.push_back(
        GroupPageCopy{.group = group, .copy = *part.copy});
  }
}

absl::StatusOr<AppendResult> GroupCoordinator::AppendPrompt(
    SequenceId id, absl::Span<const TokenId> tokens,
    absl::Span<const BlockHash> prompt_hashes) {
  AppendResult total;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    // No token computed, nothing released: the window still holds the last
    // token (BatchCommit too skips only for sequences that compute).
    if (!tokens.empty()) KVBLOCK_RETURN_IF_ERROR(ReleaseSkipped(id));
    for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
      KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const BlockHash> hashes,
                               ChunkHashes(g, id, prompt_hashes));
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult part,
                               groups_[g]->AppendPrompt(id, tokens, hashes));
      AddAppend(g, part, total);
    }
    return absl::OkStatus();
  }));
  return total;
}

absl::StatusOr<AppendResult> GroupCoordinator::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  AppendResult total;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    // No token computed, nothing released: the window still holds the last
    // token (BatchCommit too skips only for sequences that compute).
    if (!tokens.empty()) KVBLOCK_RETURN_IF_ERROR(ReleaseSkipped(id));
    for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult part,
                               groups_[g]->Append(id, tokens));
      AddAppend(g, part, total);
    }
    return absl::OkStatus();
  }));
  return total;
}

absl::StatusOr<AppendResult> GroupCoordinator::SetDrafts(SequenceId id,
                                                         int32_t count) {
  AppendResult total;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult part,
                               groups_[g]->SetDrafts(id, count));
      AddAppend(g, part, total);
    }
    return absl::OkStatus();
  }));
  return total;
}

// Fork and removal ------------------------------------------------------------

absl::Status GroupCoordinator::Fork(SequenceId parent, SequenceId child) {
  return Transact([&]() -> absl::Status {
    for (BlockManagerImpl* group : groups_) {
      KVBLOCK_RETURN_IF_ERROR(group->Fork(parent, child));
    }
    return absl::OkStatus();
  });
}

absl::Status GroupCoordinator::Remove(SequenceId id, bool preempted) {
  return Transact([&]() -> absl::Status {
    for (BlockManagerImpl* group : groups_) {
      KVBLOCK_RETURN_IF_ERROR(group->Remove(id, preempted));
    }
    return absl::OkStatus();
  });
}

// Observers -------------------------------------------------------------------

absl::StatusOr<absl::Span<const PageId>> GroupCoordinator::GroupPages(
    SequenceId id, int32_t group) const {
  if (group < 0 || group >= static_cast<int32_t>(groups_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: KV cache group ", group, " is not in [0, ",
                     groups_.size(), ")"));
  }
  return groups_[group]->Pages(id);
}

absl::Status GroupCoordinator::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(pool_->CheckInvariants());
  if (pool_->transaction_depth() != 0) {
    return absl::InternalError(
        absl::StrCat("block manager: ", pool_->transaction_depth(),
                     " pool transactions open between calls"));
  }
  std::vector<int32_t> references(config_.num_pages, 0);
  int64_t reserved = 0;
  const BlockManagerImpl& first = *groups_[0];
  for (size_t g = 0; g < groups_.size(); ++g) {
    const BlockManagerImpl& group = *groups_[g];
    KVBLOCK_RETURN_IF_ERROR(
        group.CheckSequences(absl::MakeSpan(references), reserved));
    if (group.slab_.num_live() != first.slab_.num_live()) {
      return absl::InternalError(absl::StrCat(
          "block manager: KV cache group ", g, " has ", group.slab_.num_live(),
          " sequences, group 0 has ", first.slab_.num_live()));
    }
    for (const auto& [id, entry] : group.slab_.live()) {
      const Sequence& seq = group.slab_.sequence(entry);
      const int32_t in_first = first.slab_.Find(id);
      if (in_first < 0 ||
          first.slab_.sequence(in_first).num_tokens() != seq.num_tokens() ||
          first.slab_.sequence(in_first).drafts() != seq.drafts() ||
          first.slab_.sequence(in_first).prompt_end() != seq.prompt_end()) {
        return absl::InternalError(absl::StrCat("block manager: sequence ", id,
                                                " of KV cache group ", g,
                                                " disagrees with group 0"));
      }
    }
  }
  if (null_page_ != kNoPage) ++references[null_page_];  // the manager's own.
  for (PageId page = 0; page < config_.num_pages; ++page) {
    if (pool_->RefCount(page) != references[page]) {
      return absl::InternalError(absl::StrCat(
          "block manager: page ", page, " has refcount ", pool_->RefCount(page),
          " but ", references[page], " references",
          (page == null_page_ ? " (the null page)" : "")));
    }
  }
  if (null_page_ != kNoPage && pool_->CachedHash(null_page_).has_value()) {
    return absl::InternalError("block manager: the null page is cached");
  }
  if (reserved != reserved_pages_ || reserved_pages_ > pool_->NumFree()) {
    return absl::InternalError(
        absl::StrCat("block manager: ", reserved_pages_,
                     " pages reserved, the sequences' reservations add up to ",
                     reserved, ", ", pool_->NumFree(), " are allocatable"));
  }
  return absl::OkStatus();
}

BlockManagerSnapshot GroupCoordinator::Snapshot() const {
  BlockManagerSnapshot snapshot = groups_[0]->Snapshot();
  for (BlockManagerSnapshot::SequenceState& state : snapshot.sequences) {
    for (size_t g = 1; g < groups_.size(); ++g) {
      const absl::StatusOr<absl::Span<const PageId>> pages =
          groups_[g]->Pages(state.id);
      state.group_pages.emplace_back();
      if (pages.ok())
        state.group_pages.back().assign(pages->begin(), pages->end());
    }
  }
  return snapshot;
}

}  // namespace kvblock::internal
