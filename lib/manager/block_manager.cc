// Copyright 2026 The kvblock Authors.
//
// BlockManager: creation, transactions and their undo, admission, fork,
// removal and the observers. The append paths are in
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
#include "kvblock/status_macros.h"
#include "manager/admission_planner.h"
#include "manager/block_manager_transact.h"
#include "manager/step_journal.h"
#include "sequence/sequence_slab.h"

namespace kvblock {

using internal::JournalRecord;
using internal::SequenceCold;
using internal::SequenceHot;

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
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                           BlockPool::Create(config.num_pages));
  KVBLOCK_ASSIGN_OR_RETURN(
      BlockHasher hasher,
      BlockHasher::Create(options.hash_algorithm, config.page_size));
  // What the constructor reserves, checked before it tries: a config that
  // Validate() accepts may still need more memory than the machine has.
  const int64_t sequences = MaxSequences(config, options);
  const int64_t page_size = config.page_size;
  const int64_t width = config.max_pages_per_seq;
  internal::Reservation reservation("block manager");
  reservation.Add(sequences, sizeof(SequenceHot) + sizeof(SequenceCold));
  reservation.Add(sequences, width * int64_t{sizeof(PageId)});  // tables.
  reservation.Add(sequences, 2 * page_size * int64_t{sizeof(TokenId)});
  reservation.Add(sequences, 2 * int64_t{sizeof(JournalRecord)} +
                                 int64_t{sizeof(internal::InPlaceAppend)} +
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
                    internal::CacheEventLog::ReservedBytesPerChange(page_size));
  }
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  std::unique_ptr<BlockManager> manager;
  KVBLOCK_RETURN_IF_ERROR(reservation.Run([&] {
    manager.reset(
        new BlockManager(config, options, std::move(pool), std::move(hasher)));
  }));
  return manager;
}

int32_t BlockManager::MaxSequences(const PagedKvConfig& config,
                                   const BlockManagerOptions& options) {
  if (options.max_sequences > 0) return options.max_sequences;
  return static_cast<int32_t>(std::min<int64_t>(
      4 * int64_t{config.max_batch}, std::numeric_limits<int32_t>::max()));
}

BlockManager::BlockManager(const PagedKvConfig& config,
                           const BlockManagerOptions& options,
                           std::unique_ptr<BlockPool> pool, BlockHasher hasher)
    : config_(config),
      options_(options),
      pool_(std::move(pool)),
      hasher_(std::move(hasher)),
      planner_(std::make_unique<internal::AdmissionPlanner>(
          config, options.enable_prefix_caching, options.reserve_prompt_pages,
          hasher_)),
      slab_(std::make_unique<internal::SequenceSlab>(
          MaxSequences(config, options), config.max_pages_per_seq,
          config.page_size)),
      journal_(std::make_unique<internal::StepJournal>(
          MaxSequences(config, options), config.page_size,
          static_cast<size_t>(config.max_pages_per_seq) *
              static_cast<size_t>(config.max_batch))),
      page_scratch_(config.max_pages_per_seq),
      hash_scratch_(config.max_pages_per_seq),
      step_(std::make_unique<Transaction>()) {
  if (options_.enable_kv_events) {
    const auto changes = static_cast<size_t>(options_.reserved_kv_changes);
    const auto page_size = static_cast<size_t>(config.page_size);
    events_ = std::make_unique<internal::CacheEventLog>();
    events_->Reserve(changes, page_size);
    spare_events_ = std::make_unique<internal::CacheEventLog>();
    spare_events_->Reserve(changes, page_size);
    pool_->set_event_log(events_.get());
  }
}

BlockManager::~BlockManager() = default;

// Transactions ----------------------------------------------------------------

namespace {

// Undoes appends and copies on write to `table`, which held `num_pages`
// pages, the last one `last_page`: drops the pages added since, then puts
// the last page back if a copy replaced it.
void RestorePages(SequenceBlockTable& table, int32_t num_pages,
                  PageId last_page) {
  int32_t keep = num_pages;
  if (keep > 0 && table.Get(keep - 1) != last_page) --keep;
  table.ForgetFrom(keep);
  if (keep < num_pages) {
    (void)table.AdoptPages(absl::MakeConstSpan(&last_page, 1));
  }
}

}  // namespace

BlockManager::Transaction BlockManager::BeginTransaction() {
  return Transaction{pool_->BeginTransaction(), journal_->Begin(), stats_,
                     reserved_pages_};
}

void BlockManager::CommitTransaction(const Transaction& transaction) {
  // Only the innermost transaction is ever committed, so this cannot fail.
  (void)pool_->CommitTransaction(transaction.pool);
  if (journal_->Commit()) slab_->ReleaseRemoved();
}

void BlockManager::RollbackTransaction(const Transaction& transaction) {
  internal::SequenceSlab& slab = *slab_;
  const internal::StepJournal& journal = *journal_;
  const int32_t page_size = config_.page_size;
  journal_->Rollback(transaction.journal, [&](const JournalRecord& record) {
    switch (record.kind) {
      case JournalRecord::Kind::kCreated: {
        const JournalRecord::Created& r = record.created;
        if (r.parent >= 0) {
          slab.hot(r.parent).tail_maybe_shared = r.parent_tail_maybe_shared;
        }
        slab.UndoCreate(r.entry);
        return;
      }
      case JournalRecord::Kind::kRemoved: {
        const JournalRecord::Removed& r = record.removed;
        // The pool's rollback restores the references.
        (void)slab.hot(r.entry).table.AdoptPages(journal.pages(r));
        slab.UndoRemove(r.entry);
        return;
      }
      case JournalRecord::Kind::kAppended: {
        SequenceHot& hot = slab.hot(record.appended.entry);
        hot.num_tokens -= record.appended.count;
        hot.offset -= record.appended.count;
        return;
      }
      case JournalRecord::Kind::kAppendedRun: {
        const absl::Span<const internal::InPlaceAppend> run =
            journal.runs(record.appended_run);
        for (auto it = run.rbegin(); it != run.rend(); ++it) {
          SequenceHot& hot = slab.hot(it->entry);
          hot.num_tokens -= it->count;
          hot.offset -= it->count;
          hot.drafts = it->drafts;
        }
        return;
      }
      case JournalRecord::Kind::kFilled: {
        const JournalRecord::Filled& r = record.filled;
        SequenceHot& hot = slab.hot(r.entry);
        --hot.num_tokens;
        hot.offset = page_size - 1;
        slab.cold(r.entry).last_full_hash = journal.hash(r.hash_index);
        return;
      }
      case JournalRecord::Kind::kNewPage: {
        const JournalRecord::NewPage& r = record.new_page;
        SequenceHot& hot = slab.hot(r.entry);
        // The pool's rollback takes back the page.
        hot.table.ForgetFrom(hot.table.num_pages() - 1);
        --hot.num_tokens;
        hot.offset = 0;
        hot.tail_maybe_shared = r.tail_maybe_shared;
        if (r.tokens_offset >= 0) {
          std::copy_n(journal.tokens(r.tokens_offset), page_size,
                      slab.partial(r.entry));
        }
        return;
      }
      case JournalRecord::Kind::kDrafted: {
        const JournalRecord::Drafted& r = record.drafted;
        SequenceHot& hot = slab.hot(r.entry);
        // The released pages, last first, come back in table order.
        const absl::Span<const PageId> released = journal.pages(r);
        for (auto it = released.rbegin(); it != released.rend(); ++it) {
          (void)hot.table.AdoptPages(absl::MakeConstSpan(&*it, 1));
        }
        RestorePages(hot.table, r.num_pages, r.last_page);
        hot.drafts = r.drafts;
        hot.tail_maybe_shared = r.tail_maybe_shared;
        return;
      }
      case JournalRecord::Kind::kDraftStep: {
        const JournalRecord::DraftStep& r = record.draft_step;
        SequenceHot& hot = slab.hot(r.entry);
        hot.table.ForgetFrom(r.num_pages);  // the pool takes back a page.
        hot.num_tokens = r.num_tokens;
        hot.offset = static_cast<int32_t>(r.num_tokens % page_size);
        hot.drafts = r.drafts;
        if (r.hash_index >= 0) {
          slab.cold(r.entry).last_full_hash = journal.hash(r.hash_index);
          std::copy_n(journal.tokens(r.tokens_offset), hot.offset,
                      slab.partial(r.entry));
        }
        return;
      }
      case JournalRecord::Kind::kChanged: {
        const JournalRecord::Changed& r = record.changed;
        SequenceHot& hot = slab.hot(r.entry);
        RestorePages(hot.table, r.num_pages, r.last_page);
        hot.num_tokens = r.num_tokens;
        hot.offset = static_cast<int32_t>(r.num_tokens % page_size);
        hot.tail_maybe_shared = r.tail_maybe_shared;
        if (r.hash_index >= 0) {
          slab.cold(r.entry).last_full_hash = journal.hash(r.hash_index);
        }
        if (r.tokens_offset >= 0) {
          std::copy_n(journal.tokens(r.tokens_offset),
                      hot.offset == 0 ? page_size : hot.offset,
                      slab.partial(r.entry));
        }
        return;
      }
    }
  });
  stats_ = transaction.stats;
  reserved_pages_ = transaction.reserved_pages;
  (void)pool_->RollbackTransaction(transaction.pool);
}

absl::Status BlockManager::BeginStep() {
  if (in_step_) {
    return absl::FailedPreconditionError(
        "block manager: a step is already open");
  }
  *step_ = BeginTransaction();
  in_step_ = true;
  return absl::OkStatus();
}

absl::Status BlockManager::CommitStep() { return EndStep(/*commit=*/true); }

absl::Status BlockManager::RollbackStep() { return EndStep(/*commit=*/false); }

absl::Status BlockManager::EndStep(bool commit) {
  if (!in_step_) {
    return absl::FailedPreconditionError("block manager: no step is open");
  }
  if (commit) {
    CommitTransaction(*step_);
  } else {
    RollbackTransaction(*step_);
  }
  in_step_ = false;
  return absl::OkStatus();
}

bool BlockManager::in_step() const { return in_step_; }

// Admission -------------------------------------------------------------------

absl::StatusOr<int64_t> BlockManager::HashPrompt(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<BlockHash> out) const {
  return HashChain(hasher_, prompt, extra, out);
}

absl::StatusOr<AdmissionPlan> BlockManager::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes,
    const AdmitOptions& admit) const {
  absl::Span<const BlockHash> hashes;
  return planner_->Plan(*pool_, prompt, extra, prompt_hashes, admit, hashes);
}

bool BlockManager::CanAdmit(absl::Span<const TokenId> prompt,
                            const HashExtraKeys& extra,
                            absl::Span<const BlockHash> prompt_hashes,
                            const AdmitOptions& admit) const {
  const absl::StatusOr<AdmissionPlan> plan =
      PlanAdmission(prompt, extra, prompt_hashes, admit);
  return plan.ok() && plan->pages_consumed() + plan->reserved_pages <=
                          NumAllocatable() - options_.watermark_pages;
}

absl::Status BlockManager::CheckNewId(SequenceId id,
                                      absl::string_view what) const {
  if (id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: ", what, " id ", id,
        " is negative (ids are non-negative; kNoSequence = -1 names none)"));
  }
  if (slab_->Find(id) >= 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: ", what, " ", id, " is already live"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdmissionPlan> BlockManager::Admit(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  KVBLOCK_RETURN_IF_ERROR(CheckNewId(id, "sequence"));
  absl::Span<const BlockHash> hashes;
  KVBLOCK_ASSIGN_OR_RETURN(
      const AdmissionPlan plan,
      planner_->Plan(*pool_, prompt, extra, prompt_hashes, admit, hashes));
  // Pages get filed under these hashes: check that the chain starts from
  // this prompt and these extra keys (one page hash), so that a mismatched
  // salt cannot leak pages into another tenant's chains.
  if (!prompt_hashes.empty() && options_.enable_prefix_caching &&
      planner_->FirstPageHash(prompt.first(config_.page_size), extra) !=
          hashes[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: prompt_hashes of sequence ", id,
                     " do not start from its prompt and extra keys"));
  }
  const int64_t needed = int64_t{plan.pages_consumed()} + plan.reserved_pages;
  if (needed > NumAllocatable() - options_.watermark_pages) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", id, " needs ", plan.pages_consumed(),
        " pages", (plan.reserved_pages > 0 ? " and " : ""),
        (plan.reserved_pages > 0
             ? absl::StrCat(plan.reserved_pages, " reserved for its prompt")
             : ""),
        ", ", NumAllocatable(), " are allocatable and ",
        options_.watermark_pages, " are kept as watermark"));
  }
  // The tokens the admission schedules: the hits, then what this step
  // computes.
  const int64_t end = plan.hit_tokens + plan.computed_tokens;
  const int32_t full_pages = static_cast<int32_t>(end / config_.page_size);
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    const int32_t entry = slab_->Create(id);
    journal_->Created(entry, -1, false);
    SequenceHot& hot = slab_->hot(entry);
    SequenceCold& cold = slab_->cold(entry);
    hot.num_tokens = end;
    hot.offset = static_cast<int32_t>(end % config_.page_size);
    cold.cache_salt.assign(extra.cache_salt.data(), extra.cache_salt.size());
    cold.adapter_id = extra.adapter_id;
    hot.prompt_end = static_cast<int64_t>(prompt.size());
    cold.reserves = plan.reserved_pages > 0;
    reserved_pages_ += plan.reserved_pages;
    SequenceBlockTable& table = hot.table;
    if (plan.hit_pages > 0) {
      // The pages the plan found: no second lookup.
      const absl::Span<const PageId> hits = planner_->hits(plan.hit_pages);
      KVBLOCK_RETURN_IF_ERROR(pool_->AcquireCached(hits));
      KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(hits));
    }
    const absl::Span<PageId> fresh =
        absl::MakeSpan(page_scratch_).first(plan.new_pages);
    KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
    KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(fresh));
    if (options_.enable_prefix_caching) {
      const size_t first = static_cast<size_t>(plan.hit_pages);
      KVBLOCK_RETURN_IF_ERROR(RegisterPages(
          entry, plan.hit_pages,
          first > 0 ? hashes[first - 1] : hasher_.RootHash(extra),
          hashes.subspan(first, full_pages - first),
          prompt.subspan(first * config_.page_size,
                         (full_pages - first) * config_.page_size)));
      cold.last_full_hash =
          full_pages > 0 ? hashes[full_pages - 1] : hasher_.RootHash(extra);
    }
    const auto tail = prompt.subspan(
        static_cast<size_t>(full_pages) * config_.page_size, hot.offset);
    std::copy(tail.begin(), tail.end(), slab_->partial(entry));
    ++stats_.admitted;
    stats_.prompt_tokens += hot.prompt_end;
    stats_.prefix_hit_tokens += plan.hit_tokens;
    return absl::OkStatus();
  }));
  return plan;
}

// Fork and removal ------------------------------------------------------------

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  if (slab_->Find(parent) < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: fork parent ", parent, " is not live"));
  }
  KVBLOCK_RETURN_IF_ERROR(CheckNewId(child, "fork child"));
  {
    const int32_t source = slab_->Find(parent);
    const int64_t prompt_left =
        slab_->hot(source).prompt_end - slab_->hot(source).num_tokens;
    if (prompt_left > 0 || slab_->hot(source).drafts > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block manager: fork parent ", parent, " still has ",
          prompt_left > 0
              ? absl::StrCat(prompt_left, " prompt tokens to compute")
              : absl::StrCat(slab_->hot(source).drafts, " draft slots"),
          ": fork it after its prompt, without drafts"));
    }
  }
  return Transact([&]() -> absl::Status {
    const int32_t entry = slab_->Create(child);
    // After Create, which may grow the slab.
    const int32_t source = slab_->Find(parent);
    SequenceHot& from = slab_->hot(source);
    SequenceHot& to = slab_->hot(entry);
    journal_->Created(entry, source, from.tail_maybe_shared);
    KVBLOCK_RETURN_IF_ERROR(from.table.ForkInto(to.table, *pool_));
    to.num_tokens = from.num_tokens;
    to.offset = from.offset;
    // Both now hold the partial page.
    from.tail_maybe_shared = true;
    to.tail_maybe_shared = true;
    std::copy_n(slab_->partial(source), config_.page_size,
                slab_->partial(entry));
    SequenceCold& cold = slab_->cold(entry);
    cold.last_full_hash = slab_->cold(source).last_full_hash;
    cold.cache_salt = slab_->cold(source).cache_salt;
    cold.adapter_id = slab_->cold(source).adapter_id;
    to.prompt_end = from.prompt_end;
    ++stats_.forks;
    return absl::OkStatus();
  });
}

absl::Status BlockManager::CheckNotRunByCommit(int32_t entry,
                                               SequenceId id) const {
  if (!slab_->hot(entry).run_by_commit || commit_applying_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "block manager: sequence ", id,
      " runs in a BatchCommit; it changes only through BatchCommit::Commit"));
}

void BlockManager::SetRunByCommit(SequenceHandle handle, bool on) {
  slab_->hot(handle.index).run_by_commit = on;
}

absl::Status BlockManager::Remove(SequenceId id, bool preempted) {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  KVBLOCK_RETURN_IF_ERROR(CheckNotRunByCommit(entry, id));
  return Transact([&]() -> absl::Status {
    reserved_pages_ -= ReservationOf(entry);
    SequenceBlockTable& table = slab_->hot(entry).table;
    // The pages, kept before the release empties the table, are journaled
    // once it succeeded.
    const absl::Span<PageId> pages =
        absl::MakeSpan(page_scratch_).first(table.num_pages());
    std::copy(table.entries().begin(), table.entries().begin() + pages.size(),
              pages.begin());
    KVBLOCK_RETURN_IF_ERROR(table.ReleaseAll(*pool_));
    journal_->Removed(entry, pages);
    slab_->Remove(entry);
    ++(preempted ? stats_.preemptions : stats_.freed);
    return absl::OkStatus();
  });
}

absl::Status BlockManager::Free(SequenceId id) { return Remove(id, false); }

absl::Status BlockManager::Preempt(SequenceId id) { return Remove(id, true); }

absl::Status BlockManager::ResetPrefixCache() {
  return pool_->ResetPrefixCache();
}

absl::Status BlockManager::CheckKvEventsTakeable() const {
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

absl::Status BlockManager::TakeKvEvents(std::vector<KvCacheEvent>& out) {
  KVBLOCK_RETURN_IF_ERROR(CheckKvEventsTakeable());
  // Built here; the log keeps its buffers.
  events_->AppendEventsTo(config_.page_size, out);
  events_->Clear();
  return absl::OkStatus();
}

absl::Status BlockManager::TakeKvEvents(KvEventBatch& batch) {
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
  batch.page_size_ = config_.page_size;
  return absl::OkStatus();
}

// Observers -------------------------------------------------------------------

int64_t BlockManager::pending_kv_changes() const {
  return events_ == nullptr ? 0 : events_->num_records();
}

bool BlockManager::Contains(SequenceId id) const {
  return slab_->Find(id) >= 0;
}

int32_t BlockManager::num_sequences() const { return slab_->num_live(); }

absl::StatusOr<absl::Span<const PageId>> BlockManager::Pages(
    SequenceId id) const {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  const SequenceBlockTable& table = slab_->hot(entry).table;
  return table.entries().first(table.num_pages());
}

absl::StatusOr<absl::Span<const PageId>> BlockManager::PagesAt(
    SequenceHandle handle) const {
  if (!slab_->IsLive(handle)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: handle (", handle.index, ", generation ",
                     handle.generation, ") is not live"));
  }
  const SequenceBlockTable& table = slab_->hot(handle.index).table;
  return table.entries().first(table.num_pages());
}

absl::StatusOr<int64_t> BlockManager::PagesForAppend(SequenceHandle handle,
                                                     int64_t count,
                                                     int32_t drafts) const {
  if (!slab_->IsLive(handle) || count < 0 || drafts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: pages for appending ", count,
                     " tokens and ", drafts, " drafts to handle (",
                     handle.index, ", generation ", handle.generation, ")"));
  }
  const SequenceHot& hot = slab_->hot(handle.index);
  if (count == 0 && drafts == hot.drafts) return 0;
  const int64_t page_size = config_.page_size;
  const int64_t pages =
      (hot.num_tokens + count + drafts + page_size - 1) / page_size;
  // Only a sequence without drafts shares its partial (last) page.
  const bool copy =
      hot.offset != 0 && hot.tail_maybe_shared &&
      pool_->RefCount(*hot.table.Get(hot.table.num_pages() - 1)) > 1;
  const int64_t more = std::max<int64_t>(0, pages - hot.table.num_pages());
  return std::max<int64_t>(0, more - ReservationOf(handle.index)) +
         (copy ? 1 : 0);
}

int32_t BlockManager::NumAllocatable() const {
  return pool_->NumFree() - reserved_pages_;
}

int64_t BlockManager::AllocatableFor(int32_t entry) const {
  if (reserved_pages_ == 0) return pool_->NumFree();
  return int64_t{pool_->NumFree()} - reserved_pages_ + ReservationOf(entry);
}

int32_t BlockManager::ReservationOf(int32_t entry) const {
  if (!slab_->cold(entry).reserves) return 0;
  const SequenceHot& hot = slab_->hot(entry);
  const int64_t page_size = config_.page_size;
  const int64_t prompt_pages = (hot.prompt_end + page_size - 1) / page_size;
  return static_cast<int32_t>(
      std::max<int64_t>(0, prompt_pages - hot.table.num_pages()));
}

void BlockManager::DrawReservation(int32_t entry, int32_t pages) {
  if (reserved_pages_ == 0 || pages == 0) return;
  if (!slab_->cold(entry).reserves) return;
  const SequenceHot& hot = slab_->hot(entry);
  const int64_t page_size = config_.page_size;
  const int64_t prompt_pages = (hot.prompt_end + page_size - 1) / page_size;
  const int64_t after = hot.table.num_pages();
  const int64_t drawn = std::max<int64_t>(0, prompt_pages - (after - pages)) -
                        std::max<int64_t>(0, prompt_pages - after);
  reserved_pages_ -= static_cast<int32_t>(drawn);
}

absl::StatusOr<int64_t> BlockManager::NumTokens(SequenceId id) const {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return slab_->hot(entry).num_tokens;
}

absl::StatusOr<int64_t> BlockManager::PromptTokensLeft(SequenceId id) const {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return std::max<int64_t>(
      0, slab_->hot(entry).prompt_end - slab_->hot(entry).num_tokens);
}

absl::StatusOr<int32_t> BlockManager::NumDrafts(SequenceId id) const {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return slab_->hot(entry).drafts;
}

absl::StatusOr<SequenceHandle> BlockManager::HandleOf(SequenceId id) const {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return slab_->HandleAt(entry);
}

int32_t BlockManager::handle_limit() const { return slab_->limit(); }

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats stats = stats_;
  const BlockPoolStats& pool = pool_->stats();
  stats.cow_copies = pool.cow_copies;
  stats.evictions = pool.evictions;
  stats.pages_in_use = pool_->NumUsed();
  stats.peak_pages_in_use = pool.peak_used;
  return stats;
}

absl::Status BlockManager::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(pool_->CheckInvariants());
  std::vector<int32_t> references(config_.num_pages, 0);
  int64_t reserved = 0;
  for (const auto& [id, entry] : slab_->live()) {
    const SequenceHot& hot = slab_->hot(entry);
    const SequenceBlockTable& table = hot.table;
    if (slab_->cold(entry).id != id || !hot.live) {
      return absl::InternalError(
          absl::StrCat("block manager: entry ", entry, " holds sequence ",
                       slab_->cold(entry).id, (hot.live ? "" : " (not live)"),
                       ", indexed as ", id));
    }
    if (hot.offset != hot.num_tokens % config_.page_size) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id, " has offset ",
                       hot.offset, " with ", hot.num_tokens, " tokens"));
    }
    const int32_t partial_page =
        static_cast<int32_t>(hot.num_tokens / config_.page_size);
    if (!hot.tail_maybe_shared && hot.offset != 0 &&
        pool_->RefCount(*table.Get(partial_page)) != 1) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id,
                       "'s partial page is shared but not flagged"));
    }
    if (hot.drafts < 0 ||
        (hot.drafts > 0 &&
         (hot.tail_maybe_shared || hot.num_tokens < hot.prompt_end))) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " holds ", hot.drafts,
          " drafts with ", hot.prompt_end - hot.num_tokens,
          " prompt tokens left", (hot.tail_maybe_shared ? ", shared" : "")));
    }
    const int64_t pages =
        (hot.num_tokens + hot.drafts + config_.page_size - 1) /
        config_.page_size;
    if (table.num_pages() != pages) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " holds ", hot.num_tokens,
          " tokens and ", hot.drafts, " drafts in ", table.num_pages(),
          " pages, expected ", pages));
    }
    reserved += ReservationOf(entry);
    for (const PageId page : table.entries().first(pages)) ++references[page];
  }
  for (PageId page = 0; page < config_.num_pages; ++page) {
    if (pool_->RefCount(page) != references[page]) {
      return absl::InternalError(absl::StrCat(
          "block manager: page ", page, " has refcount ", pool_->RefCount(page),
          " but ", references[page], " sequence references"));
    }
  }
  if (reserved != reserved_pages_ || reserved_pages_ > pool_->NumFree()) {
    return absl::InternalError(absl::StrCat("block manager: ", reserved_pages_,
                                            " pages reserved, the sequences' "
                                            "reservations add up to ",
                                            reserved, ", ", pool_->NumFree(),
                                            " are allocatable"));
  }
  if (journal_->depth() == 0 && !journal_->empty()) {
    return absl::InternalError("block manager: journal outside a transaction");
  }
  return absl::OkStatus();
}

BlockManagerSnapshot BlockManager::Snapshot() const {
  BlockManagerSnapshot snapshot;
  snapshot.pool = pool_->Snapshot();
  for (const auto& [id, entry] : slab_->live()) {
    const SequenceHot& hot = slab_->hot(entry);
    const SequenceCold& cold = slab_->cold(entry);
    const auto pages = hot.table.entries().first(hot.table.num_pages());
    const TokenId* const partial = slab_->partial(entry);
    snapshot.sequences.push_back(BlockManagerSnapshot::SequenceState{
        .id = id,
        .pages = {pages.begin(), pages.end()},
        .num_tokens = hot.num_tokens,
        .last_full_hash = cold.last_full_hash,
        .partial_tokens = {partial, partial + hot.offset},
        .cache_salt = cold.cache_salt,
        .adapter_id = cold.adapter_id,
        .prompt_tokens = hot.prompt_end,
        .drafts = hot.drafts});
  }
  std::sort(snapshot.sequences.begin(), snapshot.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snapshot.stats = stats();
  return snapshot;
}

}  // namespace kvblock
