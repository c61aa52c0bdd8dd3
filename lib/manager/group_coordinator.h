// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: GroupCoordinator, a BlockManager for a model of several KV cache
// groups (kvblock/kv_cache_groups.h), as vLLM's hybrid coordinator
// (`vllm/v1/core/kv_cache_coordinator.py`, 28be48fa) runs one
// SingleTypeKVCacheManager per group: one BlockManagerImpl per group, all on
// the coordinator's pool, each sequence in every group under the same id.
//
//   Admit     the hit every group can serve (GroupCacheHitFinder over each
//             group's chain of prompt hashes, looked up under the group's
//             keys), then each group admits with its share of it; the pages
//             every group needs are checked against the pool at once.
//   Append, AppendPrompt
//             every window group first releases the pages no token from
//             here on attends to (NumSkippedPages of the tokens computed so
//             far, their entries pointing at the null page; cached ones stay
//             evictable), then every group appends; an append of no tokens
//             releases nothing.
//   SetDrafts, Fork, Free, Preempt
//             every group.
// Each call is one transaction over every group: the groups' transactions
// are opened together (the pool's savepoints coincide) and closed innermost
// first, so a failure in any group undoes them all.
//
// The null page is a page the coordinator allocates at creation (the pool's
// first, page 0 of a fresh pool) and holds for ever; every table entry
// pointing at it holds a reference too, so forks and releases need no case
// of their own, and it is never handed out, cached or written.
//
// KV cache events: group 0 keeps the log, every group records into it, and
// each record names its group (the pool keeps a cached page's group, the
// log turns keys back into hashes). Every group hashes its pages in hash
// blocks of the groups' greatest common page size, so one chain of blocks
// (the prompt_hashes of Admit and AppendPrompt, and a router's hashes of
// the events' tokens) names every group's pages; an event's tokens are its
// group's pages.
//
// Thread safety: as BlockManager.
#ifndef KVBLOCK_LIB_MANAGER_GROUP_COORDINATOR_H_
#define KVBLOCK_LIB_MANAGER_GROUP_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/admission.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/group_cache_hit.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/types.h"
#include "manager/block_manager_impl.h"
#include "manager/page_hash_memo.h"

namespace kvblock::internal {

class GroupCoordinator {
 public:
  // The coordinator of `options.kv_cache_groups` (two or more) under
  // `config`, and group 0's manager, which the BlockManager holds (the
  // others are the coordinator's). Errors: ValidateKvCacheGroups's; a
  // group's table or pool that does not fit (InvalidArgument naming it);
  // ResourceExhausted as BlockManager::Create. With KV events on, the
  // groups record into group 0's log, which reserves for the largest page.
  struct Created {
    std::unique_ptr<GroupCoordinator> coordinator;
    std::unique_ptr<BlockManagerImpl> first_group;
  };
  static absl::StatusOr<Created> Create(const PagedKvConfig& config,
                                        const BlockManagerOptions& options);

  GroupCoordinator(const GroupCoordinator&) = delete;
  GroupCoordinator& operator=(const GroupCoordinator&) = delete;
  ~GroupCoordinator();

  // BlockManager's calls, as documented there.
  absl::StatusOr<AdmissionPlan> PlanAdmission(
      absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
      absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit);
  absl::StatusOr<AdmissionPlan> Admit(SequenceId id,
                                      absl::Span<const TokenId> prompt,
                                      const HashExtraKeys& extra,
                                      absl::Span<const BlockHash> prompt_hashes,
                                      const AdmitOptions& admit);
  absl::StatusOr<AppendResult> AppendPrompt(
      SequenceId id, absl::Span<const TokenId> tokens,
      absl::Span<const BlockHash> prompt_hashes);
  absl::StatusOr<AppendResult> Append(SequenceId id,
                                      absl::Span<const TokenId> tokens);
  absl::StatusOr<AppendResult> SetDrafts(SequenceId id, int32_t count);
  absl::Status Fork(SequenceId parent, SequenceId child);
  absl::Status Remove(SequenceId id, bool preempted);
  absl::StatusOr<absl::Span<const PageId>> GroupPages(SequenceId id,
                                                      int32_t group) const;
  absl::Status CheckInvariants() const;
  BlockManagerSnapshot Snapshot() const;

  // The coordinator of `manager`'s groups; null for a manager of one
  // default group.
  static GroupCoordinator* Of(BlockManager& manager) {
    return manager.groups_.get();
  }

  absl::Span<const KvCacheGroupSpec> groups() const { return specs_; }
  // Every group's manager, group 0 first.
  absl::Span<BlockManagerImpl* const> group_managers() const { return groups_; }
  // BlockManager::HashPrompt: the prompt's chain of hash blocks.
  absl::StatusOr<int64_t> HashBlocks(absl::Span<const TokenId> prompt,
                                     const HashExtraKeys& extra,
                                     absl::Span<BlockHash> out) const;
  // Group `group`'s page hashes for a prompt chunk of sequence `id`, from
  // `prompt_hashes`, its whole prompt's chain of hash blocks (empty: none).
  // BatchCommit passes them to the group's AppendPrompt. InvalidArgument
  // unless the chain has the prompt's full hash blocks, or `id` is unknown.
  absl::StatusOr<absl::Span<const BlockHash>> ChunkHashes(
      int32_t group, SequenceId id, absl::Span<const BlockHash> prompt_hashes);
  // Whether the groups have one page size (a prompt's hashes are every
  // group's page hashes).
  bool one_page_size() const { return one_page_size_; }
  PageId null_page() const { return null_page_; }
  const PagedKvConfig& config() const { return config_; }
  BlockPool& pool() { return *pool_; }
  const BlockPool& pool() const { return *pool_; }

 private:
  GroupCoordinator(const PagedKvConfig& config,
                   const BlockManagerOptions& options,
                   std::vector<KvCacheGroupSpec> specs,
                   std::unique_ptr<BlockPool> pool, PageId null_page,
                   std::optional<GroupCacheHitFinder> finder);

  // Runs `change` in one transaction over every group: kept when it returns
  // OK, undone in every group else.
  template <typename Change>
  absl::Status Transact(Change&& change);
  // Sets hashes_[g] to the prompt's page hashes in each group g: one chain
  // of hash blocks (prompt_hashes, when given, or hashed here), of which
  // PageHashes takes each group's.
  absl::Status HashPrompt(absl::Span<const TokenId> prompt,
                          const HashExtraKeys& extra,
                          absl::Span<const BlockHash> prompt_hashes);
  // The hash of the prompt's first hash block. REQUIRES: the prompt holds
  // one.
  BlockHash FirstBlockHash(absl::Span<const TokenId> prompt,
                           const HashExtraKeys& extra);
  // Group `group`'s page hashes in a chain of hash blocks: the chain for
  // pages of one block, else every k-th for pages of k (a page is named by
  // its last block's hash), in chains_[group].
  absl::Span<const BlockHash> PageHashes(int32_t group,
                                         absl::Span<const BlockHash> blocks);
  // Plans the admission in every group (plans_, and each group's planner
  // holding its hits) and returns the whole: pages summed over the groups.
  // `hashes_[g]` are set to the hashes each group registers under.
  absl::StatusOr<AdmissionPlan> PlanGroups(
      absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
      absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit);
  // Releases, in every window group, the pages of sequence `id` that no
  // token it computes from now on attends to (before any group allocates,
  // as vLLM's allocate_slots removes skipped blocks first).
  absl::Status ReleaseSkipped(SequenceId id);
  // Adds `part` (one group's) to `total`: pages summed, group 0's copy in
  // `copy` and every group's in group_copies.
  static void AddAppend(int32_t group, const AppendResult& part,
                        AppendResult& total);

  const PagedKvConfig config_;
  const BlockManagerOptions options_;
  const std::vector<KvCacheGroupSpec> specs_;
  // Declared before the groups: they use it until they are gone.
  std::unique_ptr<BlockPool> pool_;
  // Every group's reservations, which each group's Transaction saves.
  int32_t reserved_pages_ = 0;
  PageId null_page_ = kNoPage;
  // Whether the groups have one page size.
  bool one_page_size_ = true;
  // The tokens of a hash block (HashPageSize), and with groups of several
  // page sizes a hasher of pages of that size.
  int32_t hash_block_size_ = 0;
  mutable std::optional<BlockHasher> block_hasher_;
  // With prefix caching.
  std::optional<GroupCacheHitFinder> finder_;
  // groups_[0] is the BlockManager's; owned_ holds groups 1, 2, ....
  std::vector<BlockManagerImpl*> groups_;
  std::vector<std::unique_ptr<BlockManagerImpl>> owned_;
  // One page hash memo for each page size more than one group has.
  std::vector<std::unique_ptr<PageHashMemo>> memos_;
  // Scratch: a transaction's savepoints, each group's chain, the hit, each
  // group's plan and registered hashes, the pinned hits.
  std::vector<BlockManagerImpl::Transaction> transactions_;
  std::vector<std::vector<BlockHash>> chains_;
  std::vector<BlockHash> block_chain_;  // with several page sizes.
  GroupCacheHit hit_;
  std::vector<AdmissionPlan> plans_;
  std::vector<absl::Span<const BlockHash>> hashes_;
  // Admit's evictable hits, pinned while the groups allocate.
  std::vector<PageId> pinned_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_MANAGER_GROUP_COORDINATOR_H_
