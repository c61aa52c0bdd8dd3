// Copyright 2026 The kvblock Authors.
#include "kvblock/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "status_macros.h"

namespace kvblock {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

BlockManager::Sequence::Sequence(int32_t max_pages_per_seq, int32_t page_size)
    : table(max_pages_per_seq), partial(page_size) {}

absl::StatusOr<std::unique_ptr<BlockManager>> BlockManager::Create(
    const PagedKvConfig& config, const BlockManagerOptions& options) {
  KVBLOCK_RETURN_IF_ERROR(config.Validate());
  if (options.watermark_pages < 0 || options.watermark_pages > config.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: watermark_pages must be in [0, num_pages = ",
        config.num_pages, "], got ", options.watermark_pages));
  }
  if (options.max_sequences < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: max_sequences must not be negative, got ",
                     options.max_sequences));
  }
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                           BlockPool::Create(config.num_pages));
  KVBLOCK_ASSIGN_OR_RETURN(BlockHasher hasher,
                           BlockHasher::Create(options.hash_algorithm));
  return std::unique_ptr<BlockManager>(
      new BlockManager(config, options, std::move(pool), std::move(hasher)));
}

BlockManager::BlockManager(const PagedKvConfig& config,
                           const BlockManagerOptions& options,
                           std::unique_ptr<BlockPool> pool, BlockHasher hasher)
    : config_(config),
      options_(options),
      pool_(std::move(pool)),
      hasher_(std::move(hasher)),
      chain_(config.max_pages_per_seq),
      page_scratch_(config.max_pages_per_seq) {
  const int32_t max_sequences = options.max_sequences > 0
                                    ? options.max_sequences
                                    : 4 * config.max_batch;
  free_slots_.reserve(max_sequences);
  pending_free_.reserve(max_sequences);
  slot_of_.reserve(max_sequences);
  for (int32_t slot = 0; slot < max_sequences; ++slot) {
    sequences_.emplace_back(config.max_pages_per_seq, config.page_size);
  }
  // LIFO: slot 0 is handed out first.
  for (int32_t slot = max_sequences - 1; slot >= 0; --slot) {
    free_slots_.push_back(slot);
  }
  // A step journals about one record per running sequence.
  journal_.reserve(2 * static_cast<size_t>(max_sequences));
  token_arena_.reserve(static_cast<size_t>(max_sequences) * config.page_size);
  page_arena_.reserve(static_cast<size_t>(config.max_pages_per_seq) *
                      config.max_batch);
}

// Transactions ----------------------------------------------------------------

BlockManager::Transaction BlockManager::BeginTransaction() {
  ++depth_;
  return Transaction{pool_->BeginTransaction(), journal_.size(),
                     token_arena_.size(), page_arena_.size(), stats_};
}

void BlockManager::CommitTransaction(const Transaction& transaction) {
  // Only the innermost transaction is ever committed, so this cannot fail.
  (void)pool_->CommitTransaction(transaction.pool_savepoint);
  if (--depth_ > 0) return;
  journal_.clear();
  token_arena_.clear();
  page_arena_.clear();
  for (int32_t slot : pending_free_) free_slots_.push_back(slot);
  pending_free_.clear();
}

void BlockManager::RollbackTransaction(const Transaction& transaction) {
  while (journal_.size() > transaction.journal_size) {
    Undo(journal_.back());
    journal_.pop_back();
  }
  token_arena_.resize(transaction.token_arena_size);
  page_arena_.resize(transaction.page_arena_size);
  stats_ = transaction.stats;
  (void)pool_->RollbackTransaction(transaction.pool_savepoint);
  --depth_;
}

template <typename Change>
absl::Status BlockManager::Transact(Change&& change) {
  const Transaction transaction = BeginTransaction();
  absl::Status status = change();
  if (status.ok()) {
    CommitTransaction(transaction);
  } else {
    RollbackTransaction(transaction);
  }
  return status;
}

void BlockManager::Undo(const UndoRecord& record) {
  Sequence& sequence = sequences_[record.slot];
  switch (record.op) {
    case UndoRecord::Op::kCreated:
      // The pool's rollback takes back the references the table held.
      sequence.table.ForgetFrom(0);
      slot_of_.erase(sequence.id);
      sequence.id = kNoSequence;
      free_slots_.push_back(record.slot);
      return;
    case UndoRecord::Op::kRemoved:
      (void)sequence.table.AdoptPages(absl::MakeConstSpan(
          page_arena_.data() + record.arena_offset, record.count));
      slot_of_[sequence.id] = record.slot;
      pending_free_.pop_back();
      return;
    case UndoRecord::Op::kChanged: {
      SequenceBlockTable& table = sequence.table;
      // Pages appended since, then the last page if a copy replaced it.
      int32_t keep = record.num_pages;
      if (keep > 0 && table.Get(keep - 1) != record.last_page) --keep;
      table.ForgetFrom(keep);
      if (keep < record.num_pages) {
        (void)table.AdoptPages(absl::MakeConstSpan(&record.last_page, 1));
      }
      sequence.num_tokens = record.num_tokens;
      sequence.last_full_hash = record.last_full_hash;
      std::copy_n(token_arena_.begin() + record.arena_offset, record.count,
                  sequence.partial.begin());
      return;
    }
  }
}

absl::Status BlockManager::BeginStep() {
  if (step_.has_value()) {
    return absl::FailedPreconditionError("block manager: a step is already open");
  }
  step_ = BeginTransaction();
  return absl::OkStatus();
}

absl::Status BlockManager::CommitStep() {
  if (!step_.has_value()) {
    return absl::FailedPreconditionError("block manager: no step is open");
  }
  CommitTransaction(*step_);
  step_.reset();
  return absl::OkStatus();
}

absl::Status BlockManager::RollbackStep() {
  if (!step_.has_value()) {
    return absl::FailedPreconditionError("block manager: no step is open");
  }
  RollbackTransaction(*step_);
  step_.reset();
  return absl::OkStatus();
}

bool BlockManager::in_step() const { return step_.has_value(); }

// Sequences -------------------------------------------------------------------

BlockManager::Sequence* BlockManager::Find(SequenceId id) {
  auto it = slot_of_.find(id);
  return it == slot_of_.end() ? nullptr : &sequences_[it->second];
}

const BlockManager::Sequence* BlockManager::Find(SequenceId id) const {
  auto it = slot_of_.find(id);
  return it == slot_of_.end() ? nullptr : &sequences_[it->second];
}

int32_t BlockManager::CreateSequence(SequenceId id) {
  int32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<int32_t>(sequences_.size());
    sequences_.emplace_back(config_.max_pages_per_seq, config_.page_size);
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  Sequence& sequence = sequences_[slot];
  sequence.id = id;
  sequence.num_tokens = 0;
  sequence.last_full_hash = kRootBlockHash;
  sequence.cache_salt.clear();
  sequence.adapter_id = 0;
  slot_of_.emplace(id, slot);
  journal_.push_back({.op = UndoRecord::Op::kCreated, .slot = slot});
  return slot;
}

absl::StatusOr<AdmissionPlan> BlockManager::Plan(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra) const {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("block manager: the prompt is empty");
  }
  const int64_t pages = CeilDiv(static_cast<int64_t>(prompt.size()),
                                config_.page_size);
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: a prompt of ", prompt.size(), " tokens needs ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  AdmissionPlan plan;
  if (options_.enable_prefix_caching) {
    KVBLOCK_ASSIGN_OR_RETURN(
        const int64_t full_pages,
        HashChain(hasher_, prompt, config_.page_size, extra,
                  absl::MakeSpan(chain_)));
    // vLLM's rule: at least one prompt token is computed, so a fully cached
    // prompt recomputes its last page.
    const int64_t max_hits =
        std::min<int64_t>(full_pages, (static_cast<int64_t>(prompt.size()) - 1) /
                                          config_.page_size);
    for (int64_t i = 0; i < max_hits; ++i) {
      std::optional<PageId> page = pool_->Lookup(chain_[i]);
      if (!page.has_value()) break;
      ++plan.hit_pages;
      if (pool_->RefCount(*page) == 0) ++plan.revived_pages;
    }
  }
  plan.hit_tokens = int64_t{plan.hit_pages} * config_.page_size;
  plan.new_pages = static_cast<int32_t>(pages) - plan.hit_pages;
  return plan;
}

absl::StatusOr<AdmissionPlan> BlockManager::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra) const {
  return Plan(prompt, extra);
}

bool BlockManager::CanAdmit(absl::Span<const TokenId> prompt,
                            const HashExtraKeys& extra) const {
  absl::StatusOr<AdmissionPlan> plan = Plan(prompt, extra);
  return plan.ok() && plan->pages_consumed() <=
                          pool_->NumFree() - options_.watermark_pages;
}

absl::StatusOr<AdmissionPlan> BlockManager::Admit(
    SequenceId id, absl::Span<const TokenId> prompt,
    const HashExtraKeys& extra) {
  if (Find(id) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: sequence ", id, " is already live"));
  }
  KVBLOCK_ASSIGN_OR_RETURN(const AdmissionPlan plan, Plan(prompt, extra));
  if (plan.pages_consumed() > pool_->NumFree() - options_.watermark_pages) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", id, " needs ", plan.pages_consumed(),
        " pages, ", pool_->NumFree(), " are allocatable and ",
        options_.watermark_pages, " are kept as watermark"));
  }
  const int32_t full_pages =
      static_cast<int32_t>(prompt.size()) / config_.page_size;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    Sequence& sequence = sequences_[CreateSequence(id)];
    sequence.num_tokens = static_cast<int64_t>(prompt.size());
    sequence.cache_salt.assign(extra.cache_salt.data(), extra.cache_salt.size());
    sequence.adapter_id = extra.adapter_id;
    SequenceBlockTable& table = sequence.table;
    if (plan.hit_pages > 0) {
      KVBLOCK_ASSIGN_OR_RETURN(
          const int32_t hits,
          pool_->AcquireCachedPrefix(
              absl::MakeConstSpan(chain_).first(plan.hit_pages),
              absl::MakeSpan(page_scratch_)));
      if (hits != plan.hit_pages) {
        return absl::InternalError(absl::StrCat(
            "block manager: planned ", plan.hit_pages, " prefix hits, got ",
            hits));
      }
      KVBLOCK_RETURN_IF_ERROR(
          table.AdoptPages(absl::MakeConstSpan(page_scratch_).first(hits)));
    }
    absl::Span<PageId> fresh = absl::MakeSpan(page_scratch_).first(plan.new_pages);
    KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
    KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(fresh));
    if (options_.enable_prefix_caching) {
      for (int32_t i = plan.hit_pages; i < full_pages; ++i) {
        KVBLOCK_RETURN_IF_ERROR(
            pool_->RegisterCached(*table.Get(i), chain_[i]).status());
      }
      if (full_pages > 0) sequence.last_full_hash = chain_[full_pages - 1];
    }
    const auto tail = prompt.subspan(static_cast<size_t>(full_pages) *
                                     config_.page_size);
    std::copy(tail.begin(), tail.end(), sequence.partial.begin());
    ++stats_.admitted;
    stats_.prompt_tokens += sequence.num_tokens;
    stats_.prefix_hit_tokens += plan.hit_tokens;
    return absl::OkStatus();
  }));
  return plan;
}

absl::StatusOr<AppendResult> BlockManager::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  Sequence* sequence = Find(id);
  if (sequence == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  AppendResult result;
  if (tokens.empty()) return result;
  const int32_t page_size = config_.page_size;
  const int64_t old_tokens = sequence->num_tokens;
  const int64_t new_tokens = old_tokens + static_cast<int64_t>(tokens.size());
  const int32_t old_pages = sequence->table.num_pages();
  const int64_t pages = CeilDiv(new_tokens, page_size);
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: sequence ", id, " would hold ", new_tokens,
        " tokens in ", pages, " pages, more than max_pages_per_seq = ",
        config_.max_pages_per_seq));
  }
  const int32_t partial = static_cast<int32_t>(old_tokens % page_size);
  const bool copy =
      partial != 0 && pool_->RefCount(*sequence->table.Get(old_pages - 1)) > 1;
  const int64_t needed = pages - old_pages + (copy ? 1 : 0);
  if (needed > pool_->NumFree()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", id, " needs ", needed, " pages, ",
        pool_->NumFree(), " are allocatable"));
  }
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    return AppendTokens(*sequence, tokens, result);
  }));
  return result;
}

absl::Status BlockManager::AppendTokens(Sequence& sequence,
                                        absl::Span<const TokenId> tokens,
                                        AppendResult& result) {
  const int32_t page_size = config_.page_size;
  SequenceBlockTable& table = sequence.table;
  int32_t offset = static_cast<int32_t>(sequence.num_tokens % page_size);
  UndoRecord record{.op = UndoRecord::Op::kChanged,
                    .slot = slot_of_.find(sequence.id)->second,
                    .num_tokens = sequence.num_tokens,
                    .num_pages = table.num_pages(),
                    .last_page = table.num_pages() > 0
                                     ? *table.Get(table.num_pages() - 1)
                                     : kNoPage,
                    .last_full_hash = sequence.last_full_hash};
  // The live partial tokens are overwritten only when a page fills.
  if (offset + static_cast<int64_t>(tokens.size()) >= page_size) {
    record.arena_offset = static_cast<int32_t>(token_arena_.size());
    record.count = offset;
    token_arena_.insert(token_arena_.end(), sequence.partial.begin(),
                        sequence.partial.begin() + offset);
  }
  journal_.push_back(record);

  if (offset != 0 && pool_->RefCount(*table.Get(table.num_pages() - 1)) > 1) {
    KVBLOCK_ASSIGN_OR_RETURN(
        const CopyOnWrite cow,
        table.EnsureWritable(table.num_pages() - 1, *pool_));
    result.copy = PageCopy{cow.source, cow.page};
  }
  for (const TokenId token : tokens) {
    if (offset == 0) {
      KVBLOCK_RETURN_IF_ERROR(
          table.EnsureWritable(table.num_pages(), *pool_).status());
      ++result.new_pages;
    }
    sequence.partial[offset] = token;
    ++sequence.num_tokens;
    if (++offset < page_size) continue;
    offset = 0;
    if (!options_.enable_prefix_caching) continue;
    const BlockHash hash = hasher_.HashPage(
        sequence.last_full_hash, sequence.partial,
        HashExtraKeys{sequence.cache_salt, sequence.adapter_id});
    KVBLOCK_RETURN_IF_ERROR(
        pool_->RegisterCached(*table.Get(table.num_pages() - 1), hash).status());
    sequence.last_full_hash = hash;
  }
  stats_.appended_tokens += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  const Sequence* source = Find(parent);
  if (source == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("block manager: fork parent ", parent, " is not live"));
  }
  if (Find(child) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: fork child ", child, " is already live"));
  }
  return Transact([&]() -> absl::Status {
    const int32_t slot = CreateSequence(child);
    // CreateSequence may grow the slab; deque keeps `source` valid.
    Sequence& target = sequences_[slot];
    KVBLOCK_RETURN_IF_ERROR(source->table.ForkInto(target.table, *pool_));
    target.num_tokens = source->num_tokens;
    target.last_full_hash = source->last_full_hash;
    std::copy(source->partial.begin(), source->partial.end(),
              target.partial.begin());
    target.cache_salt = source->cache_salt;
    target.adapter_id = source->adapter_id;
    ++stats_.forks;
    return absl::OkStatus();
  });
}

absl::Status BlockManager::Remove(SequenceId id, bool preempted) {
  auto it = slot_of_.find(id);
  if (it == slot_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  const int32_t slot = it->second;
  return Transact([&]() -> absl::Status {
    SequenceBlockTable& table = sequences_[slot].table;
    UndoRecord record{.op = UndoRecord::Op::kRemoved,
                      .slot = slot,
                      .arena_offset = static_cast<int32_t>(page_arena_.size()),
                      .count = table.num_pages()};
    const auto pages = table.entries().first(table.num_pages());
    page_arena_.insert(page_arena_.end(), pages.begin(), pages.end());
    KVBLOCK_RETURN_IF_ERROR(table.ReleaseAll(*pool_));
    journal_.push_back(record);
    slot_of_.erase(id);
    pending_free_.push_back(slot);
    ++(preempted ? stats_.preemptions : stats_.freed);
    return absl::OkStatus();
  });
}

absl::Status BlockManager::Free(SequenceId id) { return Remove(id, false); }

absl::Status BlockManager::Preempt(SequenceId id) { return Remove(id, true); }

bool BlockManager::Contains(SequenceId id) const { return Find(id) != nullptr; }

int32_t BlockManager::num_sequences() const {
  return static_cast<int32_t>(slot_of_.size());
}

absl::StatusOr<absl::Span<const PageId>> BlockManager::Pages(
    SequenceId id) const {
  const Sequence* sequence = Find(id);
  if (sequence == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return sequence->table.entries().first(sequence->table.num_pages());
}

absl::StatusOr<int64_t> BlockManager::NumTokens(SequenceId id) const {
  const Sequence* sequence = Find(id);
  if (sequence == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return sequence->num_tokens;
}

absl::Status BlockManager::ResetPrefixCache() {
  return pool_->ResetPrefixCache();
}

// Observers -------------------------------------------------------------------

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
  for (const auto& [id, slot] : slot_of_) {
    const Sequence& sequence = sequences_[slot];
    if (sequence.id != id) {
      return absl::InternalError(absl::StrCat(
          "block manager: slot ", slot, " holds sequence ", sequence.id,
          ", indexed as ", id));
    }
    const int64_t pages = CeilDiv(sequence.num_tokens, config_.page_size);
    if (sequence.table.num_pages() != pages) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " holds ", sequence.num_tokens,
          " tokens in ", sequence.table.num_pages(), " pages, expected ",
          pages));
    }
    for (const PageId page : sequence.table.entries().first(pages)) {
      ++references[page];
    }
  }
  for (PageId page = 0; page < config_.num_pages; ++page) {
    if (pool_->RefCount(page) != references[page]) {
      return absl::InternalError(absl::StrCat(
          "block manager: page ", page, " has refcount ",
          pool_->RefCount(page), " but ", references[page],
          " sequence references"));
    }
  }
  if (depth_ == 0 && !journal_.empty()) {
    return absl::InternalError("block manager: journal outside a transaction");
  }
  return absl::OkStatus();
}

BlockManagerSnapshot BlockManager::Snapshot() const {
  BlockManagerSnapshot snapshot;
  snapshot.pool = pool_->Snapshot();
  for (const auto& [id, slot] : slot_of_) {
    const Sequence& sequence = sequences_[slot];
    const auto pages = sequence.table.entries().first(sequence.table.num_pages());
    const auto partial = static_cast<size_t>(sequence.num_tokens % config_.page_size);
    snapshot.sequences.push_back(BlockManagerSnapshot::SequenceState{
        .id = id,
        .pages = {pages.begin(), pages.end()},
        .num_tokens = sequence.num_tokens,
        .last_full_hash = sequence.last_full_hash,
        .partial_tokens = {sequence.partial.begin(),
                           sequence.partial.begin() + partial},
        .cache_salt = sequence.cache_salt,
        .adapter_id = sequence.adapter_id});
  }
  std::sort(snapshot.sequences.begin(), snapshot.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snapshot.stats = stats();
  return snapshot;
}

}  // namespace kvblock
