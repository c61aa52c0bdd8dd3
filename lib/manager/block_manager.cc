// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManager: creation, the public calls (forwarded to BlockManagerImpl),
// transactions, KV events and the observers. Admission, fork and removal are
// in block_manager_lifecycle.cc, the append paths in
// block_manager_append.cc.
#include "kvblock/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/reservation.h"
#include "cache/cache_event_log.h"
#include "cache/group_key.h"
#include "kvblock/status_macros.h"
#include "manager/admission_planner.h"
#include "manager/block_manager_impl.h"
#include "manager/group_coordinator.h"
#include "manager/step_journal.h"
#include "sequence/sequence_slab.h"

namespace kvblock::internal {

int32_t BlockManagerImpl::MaxSequences(const PagedKvConfig& config,
                                       const BlockManagerOptions& options) {
  if (options.max_sequences > 0) return options.max_sequences;
  return static_cast<int32_t>(std::min<int64_t>(
      4 * int64_t{config.max_batch}, std::numeric_limits<int32_t>::max()));
}

void BlockManagerImpl::Reserve(const PagedKvConfig& config,
                               const BlockManagerOptions& options,
                               Reservation& reservation) {
  const int64_t sequences = BlockManagerImpl::MaxSequences(config, options);
  const int64_t page_size = config.page_size;
  const int64_t width = config.max_pages_per_seq;
  reservation.Add(sequences, sizeof(Sequence) + sizeof(SequenceCold));
  reservation.Add(sequences, width * int64_t{sizeof(PageId)});  // tables.
  reservation.Add(sequences, 2 * page_size * int64_t{sizeof(TokenId)});
  reservation.Add(sequences, 2 * int64_t{sizeof(JournalRecord)} +
                                 int64_t{sizeof(InPlaceAppend)} +
                                 int64_t{sizeof(BlockHash)} +
                                 2 * int64_t{sizeof(int32_t)});
  reservation.Add(sequences,
                  2 * int64_t{sizeof(std::pair<SequenceId, int32_t>)});
  reservation.Add(width,
                  2 * int64_t{sizeof(BlockHash)} + 2 * int64_t{sizeof(PageId)});
  reservation.Add(width, int64_t{config.max_batch} * int64_t{sizeof(PageId)});
  reservation.Add(page_size, sizeof(TokenId));
  if (options.enable_kv_events) {  // the log, and a batch taken into.
    reservation.Add(2 * int64_t{options.reserved_kv_changes},
                    CacheEventLog::ReservedBytesPerChange(page_size));
  }
}

BlockManagerImpl::BlockManagerImpl(const PagedKvConfig& config,
                                   const BlockManagerOptions& options,
                                   std::unique_ptr<BlockPool> pool,
                                   BlockHasher hasher)
    : BlockManagerImpl(config, options, *pool, std::move(hasher),
                       GroupScope{.index = 0,
                                  .spec = {.kind = AttentionKind::kFull,
                                           .page_size = config.page_size,
                                           .sliding_window = 0,
                                           .attention_chunk_size = 0,
                                           .eagle = false},
                                  .alignment_tokens = config.page_size,
                                  .null_page = kNoPage,
                                  .reserved_pages = nullptr,
                                  .hash_memo = nullptr,
                                  .events = nullptr}) {
  owned_pool_ = std::move(pool);
}

BlockManagerImpl::BlockManagerImpl(const PagedKvConfig& config,
                                   const BlockManagerOptions& options,
                                   BlockPool& pool, BlockHasher hasher,
                                   const GroupScope& scope)
    : config_(config),
      options_(options),
      scope_(scope),
      key_salt_(GroupKeySalt(scope.index)),
      pool_(&pool),
      hasher_(std::move(hasher)),
      planner_(config, options.enable_prefix_caching,
               options.reserve_prompt_pages, hasher_),
      slab_(MaxSequences(config, options), config.max_pages_per_seq,
            config.page_size),
      journal_(MaxSequences(config, options), config.page_size,
               static_cast<size_t>(config.max_pages_per_seq) *
                   static_cast<size_t>(config.max_batch)),
      page_scratch_(config.max_pages_per_seq),
      hash_scratch_(config.max_pages_per_seq),
      reserved_pages_(scope.reserved_pages != nullptr ? *scope.reserved_pages
                                                      : own_reserved_pages_) {
  if (!options_.enable_kv_events) return;
  if (scope.events != nullptr) {
    events_ = scope.events;
    return;
  }
  const auto changes = static_cast<size_t>(options_.reserved_kv_changes);
  const auto page_size =
      static_cast<size_t>(std::max(config.page_size, scope.event_page_size));
  owned_events_ = std::make_unique<internal::CacheEventLog>();
  owned_events_->Reserve(changes, page_size);
  spare_events_ = std::make_unique<internal::CacheEventLog>();
  spare_events_->Reserve(changes, page_size);
  events_ = owned_events_.get();
  pool_->set_event_log(events_);
}

BlockManagerImpl::~BlockManagerImpl() = default;

// Transactions ----------------------------------------------------------------

BlockManagerImpl::Transaction BlockManagerImpl::BeginTransaction() {
  return Transaction{pool_->BeginTransaction(), journal_.Begin(), stats_,
                     reserved_pages_};
}

void BlockManagerImpl::CommitTransaction(const Transaction& transaction) {
  // Only the innermost transaction is ever committed, so this cannot fail.
  (void)pool_->CommitTransaction(transaction.pool);
  if (journal_.Commit()) slab_.ReleaseRemoved();
}

void BlockManagerImpl::RollbackTransaction(const Transaction& transaction) {
  journal_.Rollback(transaction.journal, slab_);
  stats_ = transaction.stats;
  reserved_pages_ = transaction.reserved_pages;
  (void)pool_->RollbackTransaction(transaction.pool);
}

absl::Status BlockManagerImpl::BeginStep() {
  if (in_step_) {
    return absl::FailedPreconditionError(
        "block manager: a step is already open");
  }
  step_ = BeginTransaction();
  in_step_ = true;
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::CommitStep() { return EndStep(/*commit=*/true); }

absl::Status BlockManagerImpl::RollbackStep() {
  return EndStep(/*commit=*/false);
}

absl::Status BlockManagerImpl::EndStep(bool commit) {
  if (!in_step_) {
    return absl::FailedPreconditionError("block manager: no step is open");
  }
  if (commit) {
    CommitTransaction(step_);
  } else {
    RollbackTransaction(step_);
  }
  in_step_ = false;
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::CheckKvEventsTakeable() const {
  if (events_ == nullptr) {
    return absl::FailedPreconditionError(
        "block manager: KV cache events are off "
        "(BlockManagerOptions::enable_kv_events)");
  }
  if (in_step_) {
    return absl::FailedPreconditionError(
        "block manager: KV cache events are taken between steps, and a step "
        "is open");
  }
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::TakeKvEvents(std::vector<KvCacheEvent>& out) {
  KVBLOCK_RETURN_IF_ERROR(CheckKvEventsTakeable());
  // Built here; the log keeps its buffers.
  events_->AppendEventsTo(out);
  events_->Clear();
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::TakeKvEvents(KvEventBatch& batch) {
  KVBLOCK_RETURN_IF_ERROR(CheckKvEventsTakeable());
  if (batch.log_ == nullptr) {
    batch.log_ = spare_events_ != nullptr
                     ? std::move(spare_events_)
                     : std::make_unique<internal::CacheEventLog>();
  }
  // Swapped with the batch's emptied buffers: a caller that keeps taking
  // into one batch passes the same grown buffers back and forth.
  batch.log_->Clear();
  batch.log_->Swap(*events_);
  return absl::OkStatus();
}

// Observers -------------------------------------------------------------------

int64_t BlockManagerImpl::pending_kv_changes() const {
  return events_ == nullptr ? 0 : events_->num_records();
}

absl::Status BlockManagerImpl::NotLiveError(SequenceId id) {
  return absl::NotFoundError(
      absl::StrCat("block manager: sequence ", id, " is not live"));
}

absl::StatusOr<absl::Span<const PageId>> BlockManagerImpl::Pages(
    SequenceId id) const {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, LiveEntry(id));
  return slab_.sequence(entry).pages();
}

absl::StatusOr<absl::Span<const PageId>> BlockManagerImpl::PagesAt(
    SequenceHandle handle) const {
  if (!slab_.IsLive(handle)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: handle (", handle.index, ", generation ",
                     handle.generation, ") is not live"));
  }
  const SequenceBlockTable& table = slab_.sequence(handle.index).table();
  return table.entries().first(table.num_pages());
}

absl::StatusOr<int64_t> BlockManagerImpl::PagesForAppend(SequenceHandle handle,
                                                         int64_t count,
                                                         int32_t drafts) const {
  if (!slab_.IsLive(handle) || count < 0 || drafts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: pages for appending ", count,
                     " tokens and ", drafts, " drafts to handle (",
                     handle.index, ", generation ", handle.generation, ")"));
  }
  const Sequence& seq = slab_.sequence(handle.index);
  if (count == 0 && drafts == seq.drafts()) return 0;
  const int64_t pages = config_.PagesFor(seq.num_tokens() + count + drafts);
  // Only a sequence without drafts shares its partial (last) page.
  const bool copy =
      seq.offset() != 0 && seq.tail_maybe_shared() &&
      pool_->RefCount(*seq.table().Get(seq.table().num_pages() - 1)) > 1;
  const int64_t more = std::max<int64_t>(0, pages - seq.table().num_pages());
  return std::max<int64_t>(0, more - ReservationOf(handle.index)) +
         (copy ? 1 : 0);
}

int32_t BlockManagerImpl::NumAllocatable() const {
  return pool_->NumFree() - reserved_pages_;
}

int32_t BlockManagerImpl::ReservationOf(int32_t entry) const {
  if (!slab_.cold(entry).reserves) return 0;
  const Sequence& seq = slab_.sequence(entry);
  const int64_t prompt_pages = config_.PagesFor(seq.prompt_end());
  return static_cast<int32_t>(
      std::max<int64_t>(0, prompt_pages - seq.table().num_pages()));
}

void BlockManagerImpl::DrawReservation(int32_t entry, int32_t pages) {
  if (reserved_pages_ == 0 || pages == 0) return;
  if (!slab_.cold(entry).reserves) return;
  const Sequence& seq = slab_.sequence(entry);
  const int64_t prompt_pages = config_.PagesFor(seq.prompt_end());
  const int64_t after = seq.table().num_pages();
  const int64_t drawn = std::max<int64_t>(0, prompt_pages - (after - pages)) -
                        std::max<int64_t>(0, prompt_pages - after);
  reserved_pages_ -= static_cast<int32_t>(drawn);
}

absl::StatusOr<int64_t> BlockManagerImpl::NumTokens(SequenceId id) const {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, LiveEntry(id));
  return slab_.sequence(entry).num_tokens();
}

absl::StatusOr<int64_t> BlockManagerImpl::PromptTokensLeft(
    SequenceId id) const {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, LiveEntry(id));
  return slab_.sequence(entry).prompt_left();
}

absl::StatusOr<int32_t> BlockManagerImpl::NumDrafts(SequenceId id) const {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, LiveEntry(id));
  return slab_.sequence(entry).drafts();
}

absl::StatusOr<SequenceHandle> BlockManagerImpl::HandleOf(SequenceId id) const {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, LiveEntry(id));
  return slab_.HandleAt(entry);
}

BlockManagerStats BlockManagerImpl::stats() const {
  BlockManagerStats stats = stats_;
  const BlockPoolStats& pool = pool_->stats();
  stats.cow_copies = pool.cow_copies;
  stats.evictions = pool.evictions;
  stats.host_stores = pool.host_stores;
  stats.host_loads = pool.host_loads;
  stats.host_evictions = pool.host_evictions;
  stats.pages_in_use = pool_->NumUsed();
  stats.peak_pages_in_use = pool.peak_used;
  return stats;
}

}  // namespace kvblock::internal

namespace kvblock {

using internal::BlockManagerImpl;
using internal::Sequence;
using internal::SequenceCold;

absl::StatusOr<std::unique_ptr<BlockManager>> BlockManager::Create(
    const PagedKvConfig& config, const BlockManagerOptions& options) {
  KVBLOCK_RETURN_IF_ERROR(config.Validate());
  if (options.watermark_pages < 0 ||
      options.watermark_pages > config.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: watermark_pages must be in [0, num_pages = ",
        config.num_pages, "], got ", options.watermark_pages));
  }
  if (options.max_sequences < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: max_sequences must not be negative, got ",
                     options.max_sequences));
  }
  if (options.reserved_kv_changes < 0 ||
      options.reserved_kv_changes > kMaxReservedKvChanges) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: reserved_kv_changes must be in [0, ",
        kMaxReservedKvChanges, "], got ", options.reserved_kv_changes));
  }
  if (options.host_pages < 0 || options.host_pages > kMaxNumPages) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: host_pages must be in [0, ", kMaxNumPages,
                     "], got ", options.host_pages));
  }
  if (options.host_pages > 0 && !options.enable_prefix_caching) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: host_pages = ", options.host_pages,
        " needs prefix caching (the host tier keeps cached pages)"));
  }
  const bool one_default_group =
      options.kv_cache_groups.empty() ||
      (options.kv_cache_groups.size() == 1 &&
       options.kv_cache_groups[0] ==
           KvCacheGroupSpec{.kind = AttentionKind::kFull,
                            .page_size = config.page_size,
                            .sliding_window = 0,
                            .attention_chunk_size = 0,
                            .eagle = false});
  if (options.host_pages > 0 && !one_default_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: host_pages = ", options.host_pages, " with ",
        options.kv_cache_groups.size(),
        " KV cache groups: the host tier serves one full-attention group "
        "only, for now"));
  }
  if (!one_default_group) {
    KVBLOCK_ASSIGN_OR_RETURN(
        internal::GroupCoordinator::Created created,
        internal::GroupCoordinator::Create(config, options));
    return std::unique_ptr<BlockManager>(new BlockManager(
        std::move(created.first_group), std::move(created.coordinator)));
  }
  const BlockPoolOptions pool_options = {
      .host_pages = options.host_pages,
      .host_write_policy = options.host_write_policy};
  // What the constructor reserves, the pool's included, checked before
  // anything is built: a config that Validate() accepts may still need more
  // memory than the machine has, and two parts that each fit may not fit
  // together.
  internal::Reservation reservation("block manager");
  BlockManagerImpl::Reserve(config, options, reservation);
  reservation.Add(1, BlockPool::ReservedBytes(config.num_pages, pool_options));
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                           BlockPool::Create(config.num_pages, pool_options));
  KVBLOCK_ASSIGN_OR_RETURN(
      BlockHasher hasher,
      BlockHasher::Create(options.hash_algorithm, config.page_size));
  std::unique_ptr<BlockManager> manager;
  KVBLOCK_RETURN_IF_ERROR(reservation.Run([&] {
    manager.reset(new BlockManager(
        std::make_unique<BlockManagerImpl>(config, options, std::move(pool),
                                           std::move(hasher)),
        nullptr));
  }));
  return manager;
}

BlockManager::BlockManager(std::unique_ptr<BlockManagerImpl> impl,
                           std::unique_ptr<internal::GroupCoordinator> groups)
    : groups_(std::move(groups)), impl_(std::move(impl)) {}

BlockManager::~BlockManager() = default;

absl::StatusOr<int64_t> BlockManager::HashPrompt(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<BlockHash> out) const {
  if (groups_ != nullptr) return groups_->HashBlocks(prompt, extra, out);
  return impl_->HashPrompt(prompt, extra, out);
}

absl::StatusOr<AdmissionPlan> BlockManager::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes,
    const AdmitOptions& admit) const {
  if (groups_ != nullptr) {
    return groups_->PlanAdmission(prompt, extra, prompt_hashes, admit);
  }
  return impl_->PlanAdmission(prompt, extra, prompt_hashes, admit);
}

bool BlockManager::CanAdmit(absl::Span<const TokenId> prompt,
                            const HashExtraKeys& extra,
                            absl::Span<const BlockHash> prompt_hashes,
                            const AdmitOptions& admit) const {
  if (groups_ != nullptr) {
    const absl::StatusOr<AdmissionPlan> plan =
        groups_->PlanAdmission(prompt, extra, prompt_hashes, admit);
    return plan.ok() &&
           plan->pages_consumed() + plan->reserved_pages <=
               impl_->NumAllocatable() - impl_->options().watermark_pages;
  }
  return impl_->CanAdmit(prompt, extra, prompt_hashes, admit);
}

absl::StatusOr<AdmissionPlan> BlockManager::Admit(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  if (groups_ != nullptr) {
    return groups_->Admit(id, prompt, extra, prompt_hashes, admit);
  }
  return impl_->Admit(id, prompt, extra, prompt_hashes, admit);
}

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  if (groups_ != nullptr) return groups_->Fork(parent, child);
  return impl_->Fork(parent, child);
}

absl::Status BlockManager::Free(SequenceId id) {
  if (groups_ != nullptr) return groups_->Remove(id, /*preempted=*/false);
  return impl_->Remove(id, /*preempted=*/false);
}

absl::Status BlockManager::Preempt(SequenceId id) {
  if (groups_ != nullptr) return groups_->Remove(id, /*preempted=*/true);
  return impl_->Remove(id, /*preempted=*/true);
}

int32_t BlockManager::num_groups() const {
  return groups_ != nullptr ? static_cast<int32_t>(groups_->groups().size())
                            : 1;
}

bool BlockManager::has_kv_cache_groups() const { return groups_ != nullptr; }

PageId BlockManager::null_page() const {
  return groups_ != nullptr ? groups_->null_page() : kNoPage;
}

absl::StatusOr<absl::Span<const PageId>> BlockManager::GroupPages(
    SequenceId id, int32_t group) const {
  if (groups_ != nullptr) return groups_->GroupPages(id, group);
  if (group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: KV cache group ", group, " is not in [0, 1)"));
  }
  return impl_->Pages(id);
}

bool BlockManager::Contains(SequenceId id) const { return impl_->Contains(id); }

int32_t BlockManager::num_sequences() const { return impl_->slab().num_live(); }

absl::StatusOr<absl::Span<const PageId>> BlockManager::Pages(
    SequenceId id) const {
  return impl_->Pages(id);
}

absl::StatusOr<int64_t> BlockManager::NumTokens(SequenceId id) const {
  return impl_->NumTokens(id);
}

absl::StatusOr<int64_t> BlockManager::PromptTokensLeft(SequenceId id) const {
  return impl_->PromptTokensLeft(id);
}

absl::StatusOr<int32_t> BlockManager::NumDrafts(SequenceId id) const {
  return impl_->NumDrafts(id);
}

int32_t BlockManager::NumAllocatable() const { return impl_->NumAllocatable(); }

int32_t BlockManager::reserved_pages() const { return impl_->reserved_pages(); }

absl::Status BlockManager::ResetPrefixCache() {
  return impl_->pool().ResetPrefixCache();
}

absl::Status BlockManager::TakeKvEvents(std::vector<KvCacheEvent>& out) {
  return impl_->TakeKvEvents(out);
}

absl::Status BlockManager::TakeKvEvents(KvEventBatch& batch) {
  return impl_->TakeKvEvents(batch);
}

int64_t BlockManager::pending_kv_changes() const {
  return impl_->pending_kv_changes();
}

absl::Status BlockManager::TakeHostCopies(std::vector<HostCopy>& out) {
  return impl_->pool().TakeHostCopies(out);
}

absl::Status BlockManager::CheckInvariants() const {
  if (groups_ != nullptr) return groups_->CheckInvariants();
  return impl_->CheckInvariants();
}

BlockManagerStats BlockManager::stats() const { return impl_->stats(); }

const BlockPool& BlockManager::pool() const { return impl_->pool(); }

const PagedKvConfig& BlockManager::config() const {
  return groups_ != nullptr ? groups_->config() : impl_->config();
}

const BlockManagerOptions& BlockManager::options() const {
  return impl_->options();
}

BlockManagerSnapshot BlockManager::Snapshot() const {
  if (groups_ != nullptr) return groups_->Snapshot();
  return impl_->Snapshot();
}

}  // namespace kvblock
