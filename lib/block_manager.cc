// Copyright 2026 The kvblock Authors.
#include "kvblock/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "reservation.h"
#include "status_macros.h"

namespace kvblock {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

BlockManager::Sequence::Sequence(int32_t max_pages_per_seq)
    : table(max_pages_per_seq) {}

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
  reservation.Add(sequences, sizeof(Sequence));
  reservation.Add(sequences, width * int64_t{sizeof(PageId)});  // tables.
  reservation.Add(sequences, 2 * page_size * int64_t{sizeof(TokenId)});
  reservation.Add(sequences, 2 * int64_t{sizeof(UndoRecord)} +
                                 int64_t{sizeof(InPlaceAppend)} +
                                 int64_t{sizeof(BlockHash)} +
                                 2 * int64_t{sizeof(int32_t)});
  reservation.Add(sequences,
                  2 * int64_t{sizeof(std::pair<SequenceId, int32_t>)});
  reservation.Add(width,
                  int64_t{sizeof(BlockHash)} + 2 * int64_t{sizeof(PageId)});
  reservation.Add(width, int64_t{config.max_batch} * int64_t{sizeof(PageId)});
  reservation.Add(page_size, sizeof(TokenId));
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
      chain_(config.max_pages_per_seq),
      hit_pages_(config.max_pages_per_seq),
      page_scratch_(config.max_pages_per_seq) {
  const int32_t max_sequences = MaxSequences(config, options);
  first_page_.tokens.reserve(config.page_size);
  free_handles_.reserve(max_sequences);
  pending_free_.reserve(max_sequences);
  handle_of_.reserve(max_sequences);
  sequences_.reserve(max_sequences);
  for (int32_t handle = 0; handle < max_sequences; ++handle) {
    sequences_.emplace_back(config.max_pages_per_seq);
  }
  partial_tokens_.resize(static_cast<size_t>(max_sequences) * config.page_size);
  // LIFO: handle 0 is handed out first.
  for (int32_t handle = max_sequences - 1; handle >= 0; --handle) {
    free_handles_.push_back(handle);
  }
  // A step journals about one record per running sequence.
  journal_.reserve(2 * static_cast<size_t>(max_sequences));
  in_place_.reserve(max_sequences);
  token_arena_.reserve(static_cast<size_t>(max_sequences) * config.page_size);
  page_arena_.reserve(static_cast<size_t>(config.max_pages_per_seq) *
                      static_cast<size_t>(config.max_batch));
  hash_arena_.reserve(max_sequences);
}

// Transactions ----------------------------------------------------------------

BlockManager::Transaction BlockManager::BeginTransaction() {
  if (depth_++ == 0) ++transaction_serial_;
  return Transaction{pool_->BeginTransaction(),
                     journal_.size(),
                     in_place_.size(),
                     token_arena_.size(),
                     page_arena_.size(),
                     hash_arena_.size(),
                     stats_};
}

void BlockManager::CommitTransaction(const Transaction& transaction) {
  // Only the innermost transaction is ever committed, so this cannot fail.
  (void)pool_->CommitTransaction(transaction.pool_savepoint);
  if (--depth_ > 0) return;
  journal_.clear();
  in_place_.clear();
  token_arena_.clear();
  page_arena_.clear();
  hash_arena_.clear();
  for (int32_t handle : pending_free_) free_handles_.push_back(handle);
  pending_free_.clear();
}

void BlockManager::RollbackTransaction(const Transaction& transaction) {
  while (journal_.size() > transaction.journal_size) {
    Undo(journal_.back());
    journal_.pop_back();
  }
  in_place_.resize(transaction.in_place_size);
  token_arena_.resize(transaction.token_arena_size);
  page_arena_.resize(transaction.page_arena_size);
  hash_arena_.resize(transaction.hash_arena_size);
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
  Sequence& sequence = sequences_[record.handle];
  switch (record.op) {
    case UndoRecord::Op::kCreated:
      // The pool's rollback takes back the references the table held.
      sequence.table.ForgetFrom(0);
      handle_of_.erase(sequence.id);
      sequence.id = kNoSequence;
      sequence.live = false;
      free_handles_.push_back(record.handle);
      return;
    case UndoRecord::Op::kRemoved:
      (void)sequence.table.AdoptPages(absl::MakeConstSpan(
          page_arena_.data() + record.arena_offset, record.count));
      handle_of_[sequence.id] = record.handle;
      sequence.live = true;
      pending_free_.pop_back();
      return;
    case UndoRecord::Op::kAppended:
      sequence.num_tokens -= record.count;
      sequence.offset -= record.count;
      return;
    case UndoRecord::Op::kAppendedRun:
      for (int32_t k = record.count - 1; k >= 0; --k) {
        const InPlaceAppend& append = in_place_[record.arena_offset + k];
        Sequence& appended = sequences_[append.handle];
        appended.num_tokens -= append.count;
        appended.offset -= append.count;
      }
      return;
    case UndoRecord::Op::kFilled:
      --sequence.num_tokens;
      sequence.offset = config_.page_size - 1;
      if (options_.enable_prefix_caching) {
        sequence.last_full_hash = hash_arena_[record.hash_index];
      }
      return;
    case UndoRecord::Op::kNewPage:
      // The pool's rollback takes back the page.
      sequence.table.ForgetFrom(sequence.table.num_pages() - 1);
      --sequence.num_tokens;
      sequence.offset = 0;
      sequence.tail_maybe_shared = record.tail_maybe_shared;
      if (record.arena_offset >= 0) {
        std::copy_n(token_arena_.begin() + record.arena_offset,
                    config_.page_size, PartialTokens(record.handle));
      }
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
      sequence.offset =
          static_cast<int32_t>(record.num_tokens % config_.page_size);
      sequence.tail_maybe_shared = record.tail_maybe_shared;
      sequence.last_full_hash = hash_arena_[record.hash_index];
      std::copy_n(token_arena_.begin() + record.arena_offset, record.count,
                  PartialTokens(record.handle));
      return;
    }
  }
}

absl::Status BlockManager::BeginStep() {
  if (step_.has_value()) {
    return absl::FailedPreconditionError(
        "block manager: a step is already open");
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
  auto it = handle_of_.find(id);
  return it == handle_of_.end() ? nullptr : &sequences_[it->second];
}

const BlockManager::Sequence* BlockManager::Find(SequenceId id) const {
  auto it = handle_of_.find(id);
  return it == handle_of_.end() ? nullptr : &sequences_[it->second];
}

int32_t BlockManager::CreateSequence(SequenceId id) {
  int32_t handle;
  if (free_handles_.empty()) {
    handle = static_cast<int32_t>(sequences_.size());
    sequences_.emplace_back(config_.max_pages_per_seq);
    partial_tokens_.resize(partial_tokens_.size() + config_.page_size);
  } else {
    handle = free_handles_.back();
    free_handles_.pop_back();
  }
  Sequence& sequence = sequences_[handle];
  sequence.id = id;
  sequence.live = true;
  ++sequence.generation;
  sequence.num_tokens = 0;
  sequence.offset = 0;
  sequence.tail_maybe_shared = false;
  sequence.last_full_hash = BlockHash{};
  sequence.cache_salt.clear();
  sequence.adapter_id = 0;
  handle_of_.emplace(id, handle);
  UndoRecord& record = journal_.emplace_back();
  record.op = UndoRecord::Op::kCreated;
  record.handle = handle;
  return handle;
}

absl::StatusOr<AdmissionPlan> BlockManager::Plan(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes,
    absl::Span<const BlockHash>& hashes) const {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("block manager: the prompt is empty");
  }
  const int64_t pages =
      CeilDiv(static_cast<int64_t>(prompt.size()), config_.page_size);
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: a prompt of ", prompt.size(), " tokens needs ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  AdmissionPlan plan;
  if (options_.enable_prefix_caching) {
    const int64_t full_pages =
        static_cast<int64_t>(prompt.size()) / config_.page_size;
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
    const int64_t max_hits = std::min<int64_t>(
        full_pages,
        (static_cast<int64_t>(prompt.size()) - 1) / config_.page_size);
    for (int64_t i = 0; i < max_hits; ++i) {
      std::optional<PageId> page = pool_->Lookup(hashes[i]);
      if (!page.has_value()) break;
      hit_pages_[plan.hit_pages++] = *page;
      if (pool_->RefCount(*page) == 0) ++plan.revived_pages;
    }
  }
  plan.hit_tokens = int64_t{plan.hit_pages} * config_.page_size;
  plan.new_pages = static_cast<int32_t>(pages) - plan.hit_pages;
  return plan;
}

BlockHash BlockManager::FirstPageHash(absl::Span<const TokenId> first_page,
                                      const HashExtraKeys& extra) {
  const BlockHash root = hasher_.RootHash(extra);
  if (root != first_page_.root ||
      !std::equal(first_page.begin(), first_page.end(),
                  first_page_.tokens.begin(), first_page_.tokens.end())) {
    first_page_.tokens.assign(first_page.begin(), first_page.end());
    first_page_.root = root;
    first_page_.hash = hasher_.HashPage(root, first_page);
  }
  return first_page_.hash;
}

absl::StatusOr<int64_t> BlockManager::HashPrompt(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<BlockHash> out) const {
  return HashChain(hasher_, prompt, extra, out);
}

absl::StatusOr<AdmissionPlan> BlockManager::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes) const {
  absl::Span<const BlockHash> hashes;
  return Plan(prompt, extra, prompt_hashes, hashes);
}

bool BlockManager::CanAdmit(absl::Span<const TokenId> prompt,
                            const HashExtraKeys& extra,
                            absl::Span<const BlockHash> prompt_hashes) const {
  absl::Span<const BlockHash> hashes;
  absl::StatusOr<AdmissionPlan> plan =
      Plan(prompt, extra, prompt_hashes, hashes);
  return plan.ok() &&
         plan->pages_consumed() <= pool_->NumFree() - options_.watermark_pages;
}

absl::StatusOr<AdmissionPlan> BlockManager::Admit(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes) {
  if (id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: sequence id ", id,
        " is negative (ids are non-negative; kNoSequence = -1 names none)"));
  }
  if (Find(id) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: sequence ", id, " is already live"));
  }
  absl::Span<const BlockHash> hashes;
  KVBLOCK_ASSIGN_OR_RETURN(const AdmissionPlan plan,
                           Plan(prompt, extra, prompt_hashes, hashes));
  // Pages get filed under these hashes: check that the chain starts from
  // this prompt and these extra keys (one page hash), so that a mismatched
  // salt cannot leak pages into another tenant's chains.
  if (!prompt_hashes.empty() && options_.enable_prefix_caching &&
      FirstPageHash(prompt.first(config_.page_size), extra) != hashes[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: prompt_hashes of sequence ", id,
                     " do not start from its prompt and extra keys"));
  }
  if (plan.pages_consumed() > pool_->NumFree() - options_.watermark_pages) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", id, " needs ", plan.pages_consumed(),
        " pages, ", pool_->NumFree(), " are allocatable and ",
        options_.watermark_pages, " are kept as watermark"));
  }
  const int32_t full_pages =
      static_cast<int32_t>(prompt.size()) / config_.page_size;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    const int32_t handle = CreateSequence(id);
    Sequence& sequence = sequences_[handle];
    sequence.num_tokens = static_cast<int64_t>(prompt.size());
    sequence.offset = static_cast<int32_t>(prompt.size() % config_.page_size);
    sequence.cache_salt.assign(extra.cache_salt.data(),
                               extra.cache_salt.size());
    sequence.adapter_id = extra.adapter_id;
    SequenceBlockTable& table = sequence.table;
    if (plan.hit_pages > 0) {
      // The pages Plan found: no second lookup.
      const absl::Span<const PageId> hits =
          absl::MakeConstSpan(hit_pages_).first(plan.hit_pages);
      KVBLOCK_RETURN_IF_ERROR(pool_->AcquireCached(hits));
      KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(hits));
    }
    absl::Span<PageId> fresh =
        absl::MakeSpan(page_scratch_).first(plan.new_pages);
    KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
    KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(fresh));
    if (options_.enable_prefix_caching) {
      for (int32_t i = plan.hit_pages; i < full_pages; ++i) {
        KVBLOCK_RETURN_IF_ERROR(
            pool_->RegisterCached(*table.Get(i), hashes[i]).status());
      }
      sequence.last_full_hash =
          full_pages > 0 ? hashes[full_pages - 1] : hasher_.RootHash(extra);
    }
    const auto tail =
        prompt.subspan(static_cast<size_t>(full_pages) * config_.page_size);
    std::copy(tail.begin(), tail.end(), PartialTokens(handle));
    ++stats_.admitted;
    stats_.prompt_tokens += sequence.num_tokens;
    stats_.prefix_hit_tokens += plan.hit_tokens;
    return absl::OkStatus();
  }));
  return plan;
}

inline bool BlockManager::AppendToPartialPage(
    int32_t handle, Sequence& sequence, absl::Span<const TokenId> tokens) {
  const int64_t count = static_cast<int64_t>(tokens.size());
  if (count == 0) return true;
  if (sequence.offset == 0 || sequence.offset + count >= config_.page_size ||
      sequence.tail_maybe_shared) {
    return false;
  }
  TokenId* const partial = PartialTokens(handle) + sequence.offset;
  if (count == 1) {
    *partial = tokens[0];  // decode: no call into memmove for one token.
  } else {
    std::copy(tokens.begin(), tokens.end(), partial);
  }
  // Written in place, like every hot record: one built on the stack and
  // copied out stalls on store forwarding.
  UndoRecord& record = journal_.emplace_back();
  record.op = UndoRecord::Op::kAppended;
  record.handle = handle;
  record.count = static_cast<int32_t>(count);
  sequence.num_tokens += count;
  sequence.offset += static_cast<int32_t>(count);
  stats_.appended_tokens += count;
  return true;
}

absl::StatusOr<AppendResult> BlockManager::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  auto it = handle_of_.find(id);
  if (it == handle_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  AppendResult result;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    const int32_t handle = it->second;
    Sequence& sequence = sequences_[handle];
    if (AppendToPartialPage(handle, sequence, tokens)) return absl::OkStatus();
    return AppendAtPageBoundary(handle, sequence, tokens, result);
  }));
  return result;
}

size_t BlockManager::AppendDecodeRun(absl::Span<const SequenceHandle> handles,
                                     absl::Span<const int32_t> counts,
                                     absl::Span<const TokenId> tokens, size_t i,
                                     size_t& next, InPlaceAppend*& out) {
  const SequenceHandle* const handle_of = handles.data();
  const int32_t* const count_of = counts.data();
  const TokenId* const token_of = tokens.data();
  Sequence* const slab = sequences_.data();
  const size_t slab_size = sequences_.size();
  TokenId* const partial_tokens = partial_tokens_.data();
  const int32_t page_size = config_.page_size;
  size_t token = next;
  InPlaceAppend* entry = out;
  for (; i < handles.size(); ++i) {
    const SequenceHandle handle = handle_of[i];
    if (count_of[i] != 1 || token == tokens.size() ||
        static_cast<size_t>(handle.index) >= slab_size) {
      break;
    }
    Sequence& sequence = slab[handle.index];
    const int32_t offset = sequence.offset;
    if (!sequence.live || sequence.generation != handle.generation ||
        sequence.tail_maybe_shared || offset == 0 || offset + 1 == page_size) {
      break;
    }
    partial_tokens[static_cast<size_t>(handle.index) * page_size + offset] =
        token_of[token++];
    *entry++ = {handle.index, 1};
    ++sequence.num_tokens;
    sequence.offset = offset + 1;
  }
  stats_.appended_tokens += static_cast<int64_t>(token - next);
  next = token;
  out = entry;
  return i;
}

absl::Status BlockManager::AppendMany(absl::Span<const SequenceHandle> handles,
                                      absl::Span<const int32_t> counts,
                                      absl::Span<const TokenId> tokens,
                                      AppendManyResult& result) {
  result.changed.clear();
  result.first_changed_page.clear();
  result.copies.clear();
  result.new_pages = 0;
  if (handles.size() != counts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: append many got ", handles.size(),
                     " handles and ", counts.size(), " counts"));
  }
  absl::Status status = Transact([&]() -> absl::Status {
    // Decode runs note their appends in in_place_, room for every entry
    // made up front (within its reserve: no allocation in steady state);
    // each run is journaled as one kAppendedRun record before the next
    // entry of another kind, so the journal keeps the order of the changes.
    const size_t base = in_place_.size();
    in_place_.resize(base + handles.size());
    InPlaceAppend* const arena = in_place_.data();
    InPlaceAppend* out = arena + base;
    InPlaceAppend* run = out;
    const auto journal_run = [&] {
      if (out == run) return;
      UndoRecord& record = journal_.emplace_back();
      record.op = UndoRecord::Op::kAppendedRun;
      record.arena_offset = static_cast<int32_t>(run - arena);
      record.count = static_cast<int32_t>(out - run);
      run = out;
    };
    const absl::Status appended = [&]() -> absl::Status {
      size_t next = 0;
      for (size_t i = 0; i < handles.size(); ++i) {
        i = AppendDecodeRun(handles, counts, tokens, i, next, out);
        journal_run();
        if (i == handles.size()) break;
        const int32_t count = counts[i];
        if (count < 0 || static_cast<size_t>(count) > tokens.size() - next) {
          return absl::InvalidArgumentError(absl::StrCat(
              "block manager: append many counts[", i, "] is ", count, " with ",
              tokens.size() - next, " tokens left"));
        }
        if (handles[i] == SequenceHandle{} && count == 0) continue;  // a gap.
        if (!IsLive(handles[i])) {
          return absl::InvalidArgumentError(
              absl::StrCat("block manager: append many handles[", i, "] = (",
                           handles[i].index, ", generation ",
                           handles[i].generation, ") is not live"));
        }
        const int32_t handle = handles[i].index;
        Sequence& sequence = sequences_[handle];
        const absl::Span<const TokenId> entry = tokens.subspan(next, count);
        next += count;
        if (AppendToPartialPage(handle, sequence, entry)) continue;
        const int32_t pages_before = sequence.table.num_pages();
        AppendResult one;
        KVBLOCK_RETURN_IF_ERROR(
            AppendAtPageBoundary(handle, sequence, entry, one));
        if (one.new_pages == 0 && !one.copy.has_value()) continue;
        result.changed.push_back(static_cast<int32_t>(i));
        // A copy on write replaces the last page held before.
        result.first_changed_page.push_back(pages_before -
                                            (one.copy.has_value() ? 1 : 0));
        if (one.copy.has_value()) result.copies.push_back(*one.copy);
        result.new_pages += one.new_pages;
      }
      if (next != tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("block manager: append many counts add up to ", next,
                         " tokens, got ", tokens.size()));
      }
      return absl::OkStatus();
    }();
    in_place_.resize(static_cast<size_t>(out - arena));
    return appended;
  });
  if (!status.ok()) {
    result.changed.clear();
    result.first_changed_page.clear();
    result.copies.clear();
    result.new_pages = 0;
  }
  return status;
}

absl::Status BlockManager::AppendAtPageBoundary(
    int32_t handle, Sequence& sequence, absl::Span<const TokenId> tokens,
    AppendResult& result) {
  // With one-token pages every page is full at once: the general path.
  if (tokens.size() == 1 && config_.page_size > 1) {
    if (sequence.offset == config_.page_size - 1 &&
        !sequence.tail_maybe_shared) {
      return FillPage(handle, sequence, tokens[0]);
    }
    if (sequence.offset == 0 &&
        sequence.table.num_pages() < config_.max_pages_per_seq) {
      KVBLOCK_RETURN_IF_ERROR(StartPage(handle, sequence, tokens[0]));
      result.new_pages = 1;
      return absl::OkStatus();
    }
  }
  return AppendAcrossPages(handle, sequence, tokens, result);
}

absl::Status BlockManager::FillPage(int32_t handle, Sequence& sequence,
                                    TokenId token) {
  const int32_t page_size = config_.page_size;
  TokenId* const partial = PartialTokens(handle);
  partial[page_size - 1] = token;  // past the partial page until it counts.
  const int32_t hash_index = static_cast<int32_t>(hash_arena_.size());
  if (options_.enable_prefix_caching) {
    // The caller's rollback drops this entry if the registration fails.
    hash_arena_.push_back(sequence.last_full_hash);
    KVBLOCK_RETURN_IF_ERROR(RegisterFullPage(handle, sequence));
  }
  UndoRecord& record = journal_.emplace_back();
  record.op = UndoRecord::Op::kFilled;
  record.handle = handle;
  record.hash_index = hash_index;
  ++sequence.num_tokens;
  sequence.offset = 0;
  sequence.filled_in_transaction = transaction_serial_;
  ++stats_.appended_tokens;
  return absl::OkStatus();
}

absl::Status BlockManager::RegisterFullPage(int32_t handle,
                                            Sequence& sequence) {
  const SequenceBlockTable& table = sequence.table;
  const BlockHash hash = hasher_.HashPage(
      sequence.last_full_hash,
      absl::MakeConstSpan(PartialTokens(handle), config_.page_size));
  KVBLOCK_RETURN_IF_ERROR(
      pool_->RegisterCached(table.entries()[table.num_pages() - 1], hash)
          .status());
  sequence.last_full_hash = hash;
  return absl::OkStatus();
}

absl::Status BlockManager::StartPage(int32_t handle, Sequence& sequence,
                                     TokenId token) {
  if (pool_->NumFree() == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block manager: sequence ", sequence.id,
                     " needs 1 page, 0 are allocatable"));
  }
  KVBLOCK_ASSIGN_OR_RETURN(const PageId page, pool_->Allocate());
  // Cannot fail: the caller checked the table's capacity.
  KVBLOCK_RETURN_IF_ERROR(
      sequence.table.AdoptPages(absl::MakeConstSpan(&page, 1)));
  TokenId* const partial = PartialTokens(handle);
  UndoRecord& record = journal_.emplace_back();
  record.op = UndoRecord::Op::kNewPage;
  record.tail_maybe_shared = sequence.tail_maybe_shared;
  record.handle = handle;
  record.arena_offset = -1;
  // The tokens of the last full page: a rollback that also undoes its fill
  // needs them back. Decode fills a page and starts the next one in two
  // steps, two transactions, so this is rare.
  if (sequence.filled_in_transaction == transaction_serial_) {
    record.arena_offset = static_cast<int32_t>(token_arena_.size());
    token_arena_.insert(token_arena_.end(), partial,
                        partial + config_.page_size);
  }
  partial[0] = token;
  ++sequence.num_tokens;
  sequence.offset = 1;
  sequence.tail_maybe_shared = false;
  ++stats_.appended_tokens;
  return absl::OkStatus();
}

absl::Status BlockManager::AppendAcrossPages(int32_t handle, Sequence& sequence,
                                             absl::Span<const TokenId> tokens,
                                             AppendResult& result) {
  const int32_t page_size = config_.page_size;
  const int64_t count = static_cast<int64_t>(tokens.size());
  TokenId* const partial = PartialTokens(handle);
  SequenceBlockTable& table = sequence.table;
  const int64_t new_tokens = sequence.num_tokens + count;
  const int32_t old_pages = table.num_pages();
  const int64_t pages = CeilDiv(new_tokens, page_size);
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: sequence ", sequence.id, " would hold ", new_tokens,
        " tokens in ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  const PageId last_page = old_pages > 0 ? *table.Get(old_pages - 1) : kNoPage;
  const bool copy = sequence.offset != 0 && sequence.tail_maybe_shared &&
                    pool_->RefCount(last_page) > 1;
  const int64_t needed = pages - old_pages + (copy ? 1 : 0);
  if (needed > pool_->NumFree()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block manager: sequence ", sequence.id, " needs ", needed,
                     " pages, ", pool_->NumFree(), " are allocatable"));
  }

  int32_t offset = sequence.offset;
  UndoRecord record{.op = UndoRecord::Op::kChanged,
                    .tail_maybe_shared = sequence.tail_maybe_shared,
                    .handle = handle,
                    .num_tokens = sequence.num_tokens,
                    .num_pages = old_pages,
                    .last_page = last_page,
                    .hash_index = static_cast<int32_t>(hash_arena_.size())};
  hash_arena_.push_back(sequence.last_full_hash);
  // The live partial tokens are overwritten only when a page fills; at
  // offset 0 the tokens are those of the last full page, which an undone
  // FillPage of this transaction needs back.
  if (offset == 0 || offset + count >= page_size) {
    record.arena_offset = static_cast<int32_t>(token_arena_.size());
    record.count = offset == 0 ? page_size : offset;
    token_arena_.insert(token_arena_.end(), partial, partial + record.count);
  }
  journal_.push_back(record);

  if (copy) {
    KVBLOCK_ASSIGN_OR_RETURN(const CopyOnWrite cow,
                             table.EnsureWritable(old_pages - 1, *pool_));
    result.copy = PageCopy{cow.source, cow.page};
  }
  // From here on the last page is fresh, copied or held here alone.
  sequence.tail_maybe_shared = false;
  for (const TokenId token : tokens) {
    if (offset == 0) {
      KVBLOCK_ASSIGN_OR_RETURN(const PageId page, pool_->Allocate());
      KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(absl::MakeConstSpan(&page, 1)));
      ++result.new_pages;
    }
    partial[offset] = token;
    ++sequence.num_tokens;
    if (++offset < page_size) continue;
    offset = 0;
    if (!options_.enable_prefix_caching) continue;
    KVBLOCK_RETURN_IF_ERROR(RegisterFullPage(handle, sequence));
  }
  sequence.offset = offset;
  stats_.appended_tokens += count;
  return absl::OkStatus();
}

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  if (Find(parent) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("block manager: fork parent ", parent, " is not live"));
  }
  if (child < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: fork child id ", child,
        " is negative (ids are non-negative; kNoSequence = -1 names none)"));
  }
  if (Find(child) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: fork child ", child, " is already live"));
  }
  return Transact([&]() -> absl::Status {
    const int32_t handle = CreateSequence(child);
    // After CreateSequence, which may grow the slab.
    Sequence* const source = Find(parent);
    Sequence& target = sequences_[handle];
    KVBLOCK_RETURN_IF_ERROR(source->table.ForkInto(target.table, *pool_));
    target.num_tokens = source->num_tokens;
    target.offset = source->offset;
    // Both now hold the partial page. The parent's flag is not journaled:
    // a stale `true` only sends its next append down the slow path once.
    source->tail_maybe_shared = true;
    target.tail_maybe_shared = true;
    target.last_full_hash = source->last_full_hash;
    std::copy_n(PartialTokens(handle_of_.at(parent)), config_.page_size,
                PartialTokens(handle));
    target.cache_salt = source->cache_salt;
    target.adapter_id = source->adapter_id;
    ++stats_.forks;
    return absl::OkStatus();
  });
}

absl::Status BlockManager::Remove(SequenceId id, bool preempted) {
  auto it = handle_of_.find(id);
  if (it == handle_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  const int32_t handle = it->second;
  return Transact([&]() -> absl::Status {
    Sequence& sequence = sequences_[handle];
    SequenceBlockTable& table = sequence.table;
    const int32_t arena_offset = static_cast<int32_t>(page_arena_.size());
    const int32_t count = table.num_pages();
    const auto pages = table.entries().first(count);
    page_arena_.insert(page_arena_.end(), pages.begin(), pages.end());
    KVBLOCK_RETURN_IF_ERROR(table.ReleaseAll(*pool_));
    UndoRecord& record = journal_.emplace_back();
    record.op = UndoRecord::Op::kRemoved;
    record.handle = handle;
    record.arena_offset = arena_offset;
    record.count = count;
    handle_of_.erase(it);  // found above: no second probe.
    sequence.live = false;
    pending_free_.push_back(handle);
    ++(preempted ? stats_.preemptions : stats_.freed);
    return absl::OkStatus();
  });
}

absl::Status BlockManager::Free(SequenceId id) { return Remove(id, false); }

absl::Status BlockManager::Preempt(SequenceId id) { return Remove(id, true); }

bool BlockManager::Contains(SequenceId id) const { return Find(id) != nullptr; }

int32_t BlockManager::num_sequences() const {
  return static_cast<int32_t>(handle_of_.size());
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

absl::StatusOr<SequenceHandle> BlockManager::HandleOf(SequenceId id) const {
  auto it = handle_of_.find(id);
  if (it == handle_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  return SequenceHandle{it->second, sequences_[it->second].generation};
}

int32_t BlockManager::handle_limit() const {
  return static_cast<int32_t>(sequences_.size());
}

absl::Status BlockManager::NotLiveError(SequenceHandle handle) const {
  return absl::InvalidArgumentError(
      absl::StrCat("block manager: handle (", handle.index, ", generation ",
                   handle.generation, ") is not live"));
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
  for (const auto& [id, handle] : handle_of_) {
    const Sequence& sequence = sequences_[handle];
    if (sequence.id != id || !sequence.live) {
      return absl::InternalError(absl::StrCat(
          "block manager: handle ", handle, " holds sequence ", sequence.id,
          (sequence.live ? "" : " (not live)"), ", indexed as ", id));
    }
    if (sequence.offset != sequence.num_tokens % config_.page_size) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " has offset ", sequence.offset,
          " with ", sequence.num_tokens, " tokens"));
    }
    if (!sequence.tail_maybe_shared && sequence.offset != 0 &&
        pool_->RefCount(*sequence.table.Get(sequence.table.num_pages() - 1)) !=
            1) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id,
                       "'s partial page is shared but not flagged"));
    }
    const int64_t pages = CeilDiv(sequence.num_tokens, config_.page_size);
    if (sequence.table.num_pages() != pages) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id, " holds ",
                       sequence.num_tokens, " tokens in ",
                       sequence.table.num_pages(), " pages, expected ", pages));
    }
    for (const PageId page : sequence.table.entries().first(pages)) {
      ++references[page];
    }
  }
  for (PageId page = 0; page < config_.num_pages; ++page) {
    if (pool_->RefCount(page) != references[page]) {
      return absl::InternalError(absl::StrCat(
          "block manager: page ", page, " has refcount ", pool_->RefCount(page),
          " but ", references[page], " sequence references"));
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
  for (const auto& [id, handle] : handle_of_) {
    const Sequence& sequence = sequences_[handle];
    const auto pages =
        sequence.table.entries().first(sequence.table.num_pages());
    const TokenId* const partial =
        partial_tokens_.data() +
        static_cast<size_t>(handle) * config_.page_size;
    snapshot.sequences.push_back(BlockManagerSnapshot::SequenceState{
        .id = id,
        .pages = {pages.begin(), pages.end()},
        .num_tokens = sequence.num_tokens,
        .last_full_hash = sequence.last_full_hash,
        .partial_tokens = {partial, partial + sequence.offset},
        .cache_salt = sequence.cache_salt,
        .adapter_id = sequence.adapter_id});
  }
  std::sort(snapshot.sequences.begin(), snapshot.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snapshot.stats = stats();
  return snapshot;
}

}  // namespace kvblock
