// Copyright 2026 The kvblock Authors.
//
// BlockManager's append paths. Every append first asks one question, inline:
// do the tokens stay in a partial page this sequence holds alone, without
// filling it (StaysInPartialPage)? Then they are written in place with an
// 8-byte undo note: Append's one sequence (AppendInPlace), or AppendMany's
// run of decoding sequences (AppendDecodeRun). Everything else takes the one
// slow path, AppendSlow: a token that fills the partial page or starts a new
// one (the decode cases, with short records), or the general case (several
// tokens, a shared partial page to copy, the errors).
#include <algorithm>
#include <cstdint>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "block_manager_transact.h"
#include "kvblock/block_manager.h"
#include "kvblock/status_macros.h"
#include "sequence_slab.h"
#include "step_journal.h"

namespace kvblock {
namespace {

using internal::InPlaceAppend;
using internal::SequenceHot;

// True when `count` tokens, 0 < count < page_size, go into the partial page
// of `hot`, held by it alone, without filling it: no page fills, is
// allocated or is copied.
inline bool StaysInPartialPage(const SequenceHot& hot, int32_t count,
                               int32_t page_size) {
  return hot.offset != 0 && !hot.tail_maybe_shared &&
         hot.offset + count < page_size;
}

}  // namespace

inline bool BlockManager::AppendInPlace(int32_t entry,
                                        absl::Span<const TokenId> tokens) {
  if (tokens.empty()) return true;
  if (tokens.size() >= static_cast<size_t>(config_.page_size)) return false;
  const int32_t count = static_cast<int32_t>(tokens.size());
  SequenceHot& hot = slab_->hot(entry);
  if (!StaysInPartialPage(hot, count, config_.page_size)) return false;
  TokenId* const partial = slab_->partial(entry) + hot.offset;
  if (count == 1) {
    *partial = tokens[0];  // decode: no call into memmove for one token.
  } else {
    std::copy(tokens.begin(), tokens.end(), partial);
  }
  journal_->Appended(entry, count);
  hot.num_tokens += count;
  hot.offset += count;
  stats_.appended_tokens += count;
  return true;
}

absl::StatusOr<AppendResult> BlockManager::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  const int32_t entry = slab_->Find(id);
  if (entry < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: sequence ", id, " is not live"));
  }
  AppendResult result;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    if (AppendInPlace(entry, tokens)) return absl::OkStatus();
    return AppendSlow(entry, tokens, result);
  }));
  return result;
}

size_t BlockManager::AppendDecodeRun(absl::Span<const SequenceHandle> handles,
                                     absl::Span<const int32_t> counts,
                                     absl::Span<const TokenId> tokens, size_t i,
                                     size_t& next, InPlaceAppend*& notes) {
  const SequenceHandle* const handle_of = handles.data();
  const int32_t* const count_of = counts.data();
  const TokenId* const token_of = tokens.data();
  SequenceHot* const slab = slab_->hot_data();
  const size_t slab_size = static_cast<size_t>(slab_->limit());
  TokenId* const partial_tokens = slab_->partial_data();
  const int32_t page_size = config_.page_size;
  InPlaceAppend* note = notes;
  size_t token = next;
  for (; i < handles.size(); ++i) {
    const SequenceHandle handle = handle_of[i];
    if (count_of[i] != 1 || token == tokens.size() ||
        static_cast<size_t>(handle.index) >= slab_size) {
      break;
    }
    SequenceHot& hot = slab[handle.index];
    if (!hot.live || hot.generation != handle.generation ||
        !StaysInPartialPage(hot, 1, page_size)) {
      break;
    }
    // Read once: the token store below may alias it.
    const int32_t offset = hot.offset;
    partial_tokens[static_cast<size_t>(handle.index) * page_size + offset] =
        token_of[token++];
    *note++ = {handle.index, 1};
    ++hot.num_tokens;
    hot.offset = offset + 1;
  }
  stats_.appended_tokens += static_cast<int64_t>(token - next);
  next = token;
  notes = note;
  return i;
}

absl::Status BlockManager::AppendMany(absl::Span<const SequenceHandle> handles,
                                      absl::Span<const int32_t> counts,
                                      absl::Span<const TokenId> tokens,
                                      AppendManyResult& result) {
  result.changed.clear();
  result.pages.clear();
  result.first_changed_page.clear();
  result.copies.clear();
  result.new_pages = 0;
  if (handles.size() != counts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: append many got ", handles.size(),
                     " handles and ", counts.size(), " counts"));
  }
  const absl::Status status = Transact([&]() -> absl::Status {
    // Room for a decode note per entry, made once (within the journal's
    // reserve: no allocation in steady state).
    InPlaceAppend* notes = journal_->RunSpace(handles.size());
    absl::Cleanup end_runs = [&] { journal_->EndRuns(notes); };
    size_t next = 0;
    for (size_t i = 0; i < handles.size(); ++i) {
      InPlaceAppend* const run = notes;
      i = AppendDecodeRun(handles, counts, tokens, i, next, notes);
      journal_->Run(run, notes);
      if (i == handles.size()) break;
      const int32_t count = counts[i];
      if (count < 0 || static_cast<size_t>(count) > tokens.size() - next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block manager: append many counts[", i, "] is ", count, " with ",
            tokens.size() - next, " tokens left"));
      }
      if (handles[i] == SequenceHandle{} && count == 0) continue;  // a gap.
      if (!slab_->IsLive(handles[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block manager: append many handles[", i, "] = (", handles[i].index,
            ", generation ", handles[i].generation, ") is not live"));
      }
      const int32_t entry = handles[i].index;
      const absl::Span<const TokenId> entry_tokens =
          tokens.subspan(next, count);
      next += count;
      if (AppendInPlace(entry, entry_tokens)) continue;
      const int32_t pages_before = slab_->hot(entry).table.num_pages();
      AppendResult one;
      KVBLOCK_RETURN_IF_ERROR(AppendSlow(entry, entry_tokens, one));
      if (one.new_pages == 0 && !one.copy.has_value()) continue;
      result.changed.push_back(static_cast<int32_t>(i));
      const SequenceBlockTable& table = slab_->hot(entry).table;
      result.pages.push_back(table.entries().first(table.num_pages()));
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
  });
  if (!status.ok()) {
    result.changed.clear();
    result.pages.clear();
    result.first_changed_page.clear();
    result.copies.clear();
    result.new_pages = 0;
  }
  return status;
}

absl::Status BlockManager::AppendSlow(int32_t entry,
                                      absl::Span<const TokenId> tokens,
                                      AppendResult& result) {
  const int32_t page_size = config_.page_size;
  SequenceHot& hot = slab_->hot(entry);
  internal::SequenceCold& cold = slab_->cold(entry);
  SequenceBlockTable& table = hot.table;
  TokenId* const partial = slab_->partial(entry);

  // Decode, one token: it fills the partial page held here alone, or
  // starts a page. (With one-token pages every page fills at once: the
  // general case.)
  if (tokens.size() == 1 && page_size > 1) {
    if (hot.offset == page_size - 1 && !hot.tail_maybe_shared) {
      partial[page_size - 1] = tokens[0];  // past the page until it counts.
      const BlockHash chain_before = cold.last_full_hash;
      if (options_.enable_prefix_caching) {
        KVBLOCK_RETURN_IF_ERROR(RegisterFullPage(entry));
      }
      journal_->Filled(entry, chain_before);
      ++hot.num_tokens;
      hot.offset = 0;
      hot.filled_in_transaction = journal_->serial();
      ++stats_.appended_tokens;
      return absl::OkStatus();
    }
    if (hot.offset == 0 && table.num_pages() < config_.max_pages_per_seq) {
      if (pool_->NumFree() == 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("block manager: sequence ", cold.id,
                         " needs 1 page, 0 are allocatable"));
      }
      KVBLOCK_ASSIGN_OR_RETURN(const PageId page, pool_->Allocate());
      // Cannot fail: the capacity was checked above.
      KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(absl::MakeConstSpan(&page, 1)));
      // The last full page's tokens: a rollback that also undoes its fill
      // needs them back. Decode fills a page and starts the next one in two
      // steps, two transactions, so this is rare.
      const bool filled_here = hot.filled_in_transaction == journal_->serial();
      journal_->NewPage(entry, hot.tail_maybe_shared,
                        filled_here ? absl::MakeConstSpan(partial, page_size)
                                    : absl::Span<const TokenId>());
      partial[0] = tokens[0];
      ++hot.num_tokens;
      hot.offset = 1;
      hot.tail_maybe_shared = false;
      ++stats_.appended_tokens;
      result.new_pages = 1;
      return absl::OkStatus();
    }
  }

  // The general case: any number of tokens, across pages, copying a shared
  // partial page first.
  const int64_t count = static_cast<int64_t>(tokens.size());
  const int64_t new_tokens = hot.num_tokens + count;
  const int32_t old_pages = table.num_pages();
  const int64_t pages = (new_tokens + page_size - 1) / page_size;
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: sequence ", cold.id, " would hold ", new_tokens,
        " tokens in ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  const PageId last_page = old_pages > 0 ? *table.Get(old_pages - 1) : kNoPage;
  const bool copy = hot.offset != 0 && hot.tail_maybe_shared &&
                    pool_->RefCount(last_page) > 1;
  const int64_t needed = pages - old_pages + (copy ? 1 : 0);
  if (needed > pool_->NumFree()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block manager: sequence ", cold.id, " needs ", needed,
                     " pages, ", pool_->NumFree(), " are allocatable"));
  }
  int32_t offset = hot.offset;
  // The partial tokens are overwritten only when a page fills; at offset 0
  // they are the last full page's, which an undone fill of this transaction
  // needs back.
  const bool save_tokens = offset == 0 || offset + count >= page_size;
  journal_->Changed(entry, hot.tail_maybe_shared, hot.num_tokens, old_pages,
                    last_page, cold.last_full_hash,
                    save_tokens ? absl::MakeConstSpan(
                                      partial, offset == 0 ? page_size : offset)
                                : absl::Span<const TokenId>());
  if (copy) {
    KVBLOCK_ASSIGN_OR_RETURN(const CopyOnWrite cow,
                             table.EnsureWritable(old_pages - 1, *pool_));
    result.copy = PageCopy{cow.source, cow.page};
  }
  // From here on the last page is fresh, copied or held here alone.
  hot.tail_maybe_shared = false;
  for (const TokenId token : tokens) {
    if (offset == 0) {
      KVBLOCK_ASSIGN_OR_RETURN(const PageId page, pool_->Allocate());
      KVBLOCK_RETURN_IF_ERROR(table.AdoptPages(absl::MakeConstSpan(&page, 1)));
      ++result.new_pages;
    }
    partial[offset] = token;
    ++hot.num_tokens;
    if (++offset < page_size) continue;
    offset = 0;
    if (options_.enable_prefix_caching) {
      KVBLOCK_RETURN_IF_ERROR(RegisterFullPage(entry));
    }
  }
  hot.offset = offset;
  stats_.appended_tokens += count;
  return absl::OkStatus();
}

absl::Status BlockManager::RegisterFullPage(int32_t entry) {
  const SequenceBlockTable& table = slab_->hot(entry).table;
  internal::SequenceCold& cold = slab_->cold(entry);
  const BlockHash hash = hasher_.HashPage(
      cold.last_full_hash,
      absl::MakeConstSpan(slab_->partial(entry), config_.page_size));
  KVBLOCK_RETURN_IF_ERROR(
      pool_->RegisterCached(table.entries()[table.num_pages() - 1], hash)
          .status());
  cold.last_full_hash = hash;
  return absl::OkStatus();
}

}  // namespace kvblock
