// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManager's append: one guarded decode fast path and one general path,
// each a Sequence change that keeps its invariant.
//   decode    fewer than a page of tokens, past the prompt, that write only
//             a partial page held here alone and take at most one new page
//             (AppendDecodeStep; its guard is StaysInPlace, then the checks
//             at the top of StepPastEdge). In place, when no page fills or is
//             added, it writes a 12-byte undo note: for Append's one sequence,
//             or for AppendMany's run of them in one loop (AppendDecodeRun),
//             the decode step's common case. Past a page edge (StepPastEdge) it
//             writes one short record: a token that fills or starts a page,
//             a speculative step that crosses one;
//   general   everything else (AppendGeneral): many tokens, a shared partial
//             page to copy, prompt chunks, and every error. Drafts alone
//             change through SetDraftsAt.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "cache/cache_event_log.h"
#include "kvblock/status_macros.h"
#include "manager/block_manager_impl.h"
#include "manager/group_coordinator.h"
#include "manager/step_journal.h"
#include "sequence/sequence_slab.h"

namespace kvblock::internal {
namespace {

// The decode fast path's in-place case: `count` tokens, 0 < count <
// page_size, go into the partial page of `seq`, held by it alone, without
// filling it, and then `drafts` drafts end on the pages it holds: no page is
// allocated, released, copied or filled. `drafts` < 0: plain decode, which
// holds no drafts before or after.
inline bool StaysInPlace(const Sequence& seq, int32_t count, int32_t drafts,
                         int32_t page_size) {
  if (seq.offset() == 0 || seq.tail_maybe_shared() || !seq.prompt_done() ||
      seq.offset() + count >= page_size) {
    return false;
  }
  if (drafts < 0) return seq.drafts() == 0;
  // The pages held are those of num_tokens + drafts (an invariant): no
  // need to read the table's line of the entry.
  return PagesForTokens(seq.num_tokens() + count + drafts, page_size) ==
         PagesForTokens(seq.num_tokens() + seq.drafts(), page_size);
}

// FailedPrecondition when `seq` still has prompt tokens to compute: its next
// tokens are those, through AppendPrompt.
inline absl::Status CheckPromptDone(const Sequence& seq, SequenceId id) {
  if (ABSL_PREDICT_TRUE(seq.prompt_done())) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("block manager: sequence ", id, " has ", seq.prompt_left(),
                   " prompt tokens left: append them with AppendPrompt first"));
}

}  // namespace

absl::StatusOr<AppendResult> BlockManagerImpl::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, EntryToChange(id));
  AppendResult result;
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    bool taken = false;
    KVBLOCK_RETURN_IF_ERROR(AppendDecodeStep(entry, tokens, -1, result, taken));
    if (!taken) {
      KVBLOCK_RETURN_IF_ERROR(CheckPromptDone(slab_.sequence(entry), id));
      KVBLOCK_RETURN_IF_ERROR(AppendGeneral(entry, tokens, result, {}, -1));
    }
    stats_.appended_tokens += static_cast<int64_t>(tokens.size());
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<AppendResult> BlockManagerImpl::AppendPrompt(
    SequenceId id, absl::Span<const TokenId> tokens,
    absl::Span<const BlockHash> prompt_hashes) {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, EntryToChange(id));
  const Sequence& seq = slab_.sequence(entry);
  const internal::SequenceCold& cold = slab_.cold(entry);
  const int64_t left =
      std::max<int64_t>(0, seq.prompt_end() - seq.num_tokens());
  if (tokens.empty() || static_cast<int64_t>(tokens.size()) > left) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: a prompt chunk of ", tokens.size(),
                     " tokens for sequence ", id, ", which has ", left,
                     " prompt tokens left"));
  }
  if (!options_.enable_prefix_caching) prompt_hashes = {};
  if (!prompt_hashes.empty()) {
    const int64_t full_pages = seq.prompt_end() / config_.page_size;
    const int64_t page = seq.num_tokens() / config_.page_size;
    if (static_cast<int64_t>(prompt_hashes.size()) != full_pages ||
        (page > 0 && prompt_hashes[page - 1] != cold.last_full_hash)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block manager: the ", prompt_hashes.size(),
                       " prompt hashes of a chunk of sequence ", id,
                       " are not its prompt's (", full_pages,
                       " full pages, continuing its chain)"));
    }
  }
  AppendResult result;
  // Prompt tokens never take the decode fast path.
  KVBLOCK_RETURN_IF_ERROR(Transact([&]() -> absl::Status {
    KVBLOCK_RETURN_IF_ERROR(
        AppendGeneral(entry, tokens, result, prompt_hashes, -1));
    ++stats_.prompt_chunks;
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<AppendResult> BlockManagerImpl::SetDrafts(SequenceId id,
                                                         int32_t count) {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, EntryToChange(id));
  AppendResult result;
  KVBLOCK_RETURN_IF_ERROR(
      Transact([&] { return SetDraftsAt(entry, count, result); }));
  return result;
}

absl::Status BlockManagerImpl::CheckDrafts(const Sequence& seq, SequenceId id,
                                           int32_t count) const {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: sequence ", id, " given ", count, " drafts"));
  }
  if (count == seq.drafts()) return absl::OkStatus();
  if (count > 0 && !seq.prompt_done()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block manager: sequence ", id, " given ", count, " drafts with ",
        seq.prompt_left(), " prompt tokens left"));
  }
  const int64_t pages = config_.PagesFor(seq.num_tokens() + count);
  if (pages > config_.max_pages_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        "block manager: sequence ", id, " would hold ", seq.num_tokens(),
        " tokens and ", count, " drafts in ", pages,
        " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
  }
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::SetDraftsAt(int32_t entry, int32_t count,
                                           AppendResult& result) {
  Sequence& seq = slab_.sequence(entry);
  const internal::SequenceCold& cold = slab_.cold(entry);
  KVBLOCK_RETURN_IF_ERROR(CheckDrafts(seq, cold.id, count));
  if (count == seq.drafts()) return absl::OkStatus();
  const int64_t pages = config_.PagesFor(seq.num_tokens() + count);
  const int32_t old_pages = seq.num_pages();
  const PageId last_page = seq.last_page();
  // Drafts write KV into the partial page: a shared one is copied first.
  // (With drafts held it is never shared: no fork, copied when they came.)
  const bool copy = count > 0 && seq.drafts() == 0 && seq.TailNeedsCopy(*pool_);
  const int64_t needed =
      std::max<int64_t>(0, pages - old_pages) + (copy ? 1 : 0);
  if (needed > AllocatableFor(entry)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block manager: sequence ", cold.id, " needs ", needed, " pages for ",
        count, " drafts, ", AllocatableFor(entry), " are allocatable"));
  }
  // The pages wholly past the new end, last first.
  const absl::Span<PageId> released =
      absl::MakeSpan(page_scratch_)
          .first(static_cast<size_t>(std::max<int64_t>(0, old_pages - pages)));
  for (size_t i = 0; i < released.size(); ++i) {
    released[i] = seq.pages()[old_pages - 1 - i];
  }
  journal_.Drafted(entry, seq.drafts(), old_pages, last_page,
                   seq.tail_maybe_shared(), released);
  if (!released.empty()) {
    seq.ShrinkDrafts(count);
    for (const PageId page : released) {
      KVBLOCK_RETURN_IF_ERROR(pool_->Release(page));
    }
    result.released_pages += static_cast<int32_t>(released.size());
  }
  if (copy) {
    KVBLOCK_ASSIGN_OR_RETURN(const CopyOnWrite cow, seq.CopyTail(*pool_));
    result.copy = PageCopy{cow.source, cow.page};
  }
  if (count > 0) seq.OwnTail();
  if (released.empty()) {
    const absl::Span<PageId> fresh =
        absl::MakeSpan(page_scratch_)
            .first(
                static_cast<size_t>(std::max<int64_t>(0, pages - old_pages)));
    KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
    KVBLOCK_RETURN_IF_ERROR(seq.Grow(fresh, seq.num_tokens(), count));
    result.new_pages += static_cast<int32_t>(fresh.size());
  }
  stats_.draft_slots += count;
  return absl::OkStatus();
}

namespace {

// AppendDecodeRun's loop, one instantiation for plain decode (one token a
// sequence) and one for speculative steps (several tokens, the new drafts in
// `draft_of`), each taking the sequences that StaysInPlace. Returns the index
// of the first sequence it did not take; advances `token` and `note`.
template <bool kDrafting>
size_t DecodeRun(absl::Span<const SequenceHandle> handles,
                 const int32_t* count_of, absl::Span<const TokenId> tokens,
                 const int32_t* draft_of, size_t i, size_t& next,
                 InPlaceAppend*& notes, Sequence* slab, size_t slab_size,
                 TokenId* partial_tokens, int32_t page_size,
                 int64_t& draft_slots) {
  const TokenId* const token_of = tokens.data();
  // Locals, not the references, in the loop: no store may alias them.
  size_t token = next;
  InPlaceAppend* note = notes;
  int64_t slots = 0;
  for (; i < handles.size(); ++i) {
    const SequenceHandle handle = handles[i];
    const int32_t count = kDrafting ? count_of[i] : 1;
    if (static_cast<size_t>(handle.index) >= slab_size) break;
    if constexpr (kDrafting) {
      // Negative drafts are refused by SetDraftsAt, past the run.
      if (count < 1 || count >= page_size || draft_of[i] < 0 ||
          static_cast<size_t>(count) > tokens.size() - token) {
        break;
      }
    } else if (count_of[i] != 1 || token == tokens.size()) {
      break;
    }
    Sequence& seq = slab[handle.index];
    if (!seq.live() || seq.generation() != handle.generation) break;
    if (!StaysInPlace(seq, count, kDrafting ? draft_of[i] : -1, page_size)) {
      break;
    }
    TokenId* const partial = partial_tokens +
                             static_cast<size_t>(handle.index) * page_size +
                             seq.offset();
    if constexpr (kDrafting) {
      std::copy_n(token_of + token, count, partial);
    } else {
      *partial = token_of[token];  // no call into memmove for one token.
    }
    token += static_cast<size_t>(count);
    *note++ = {handle.index, count, seq.drafts()};
    if constexpr (kDrafting) {
      // Counted as the append and SetDraftsAt would count them.
      const int32_t drafts = draft_of[i];
      if (drafts != std::max(0, seq.drafts() - count)) slots += drafts;
      seq.AppendInPlace(count, drafts);
    } else {
      seq.AppendInPlace(1);
    }
  }
  next = token;
  notes = note;
  draft_slots += slots;
  return i;
}

}  // namespace

size_t BlockManagerImpl::AppendDecodeRun(
    absl::Span<const SequenceHandle> handles, absl::Span<const int32_t> counts,
    absl::Span<const TokenId> tokens, absl::Span<const int32_t> draft_counts,
    size_t i, size_t& next, InPlaceAppend*& notes) {
  size_t token = next;
  int64_t draft_slots = 0;
  Sequence* const slab = slab_.sequence_data();
  const size_t slab_size = static_cast<size_t>(slab_.limit());
  TokenId* const partial = slab_.partial_data();
  const int32_t page_size = config_.page_size;
  i = draft_counts.empty()
          ? DecodeRun<false>(handles, counts.data(), tokens, nullptr, i, token,
                             notes, slab, slab_size, partial, page_size,
                             draft_slots)
          : DecodeRun<true>(handles, counts.data(), tokens, draft_counts.data(),
                            i, token, notes, slab, slab_size, partial,
                            page_size, draft_slots);
  stats_.draft_slots += draft_slots;
  stats_.appended_tokens += static_cast<int64_t>(token - next);
  next = token;
  return i;
}

absl::Status BlockManagerImpl::AppendMany(
    absl::Span<const SequenceHandle> handles, absl::Span<const int32_t> counts,
    absl::Span<const TokenId> tokens, AppendManyResult& result,
    absl::Span<const int32_t> draft_counts) {
  result.Clear();
  KVBLOCK_RETURN_IF_ERROR(CheckAppendMany(handles, counts, draft_counts));
  const bool drafting = !draft_counts.empty();
  const absl::Status status = Transact([&]() -> absl::Status {
    // Room for a decode note per entry, made once (within the journal's
    // reserve: no allocation in steady state).
    InPlaceAppend* notes = journal_.RunSpace(handles.size());
    absl::Cleanup end_runs = [&] { journal_.EndRuns(notes); };
    size_t next = 0;
    for (size_t i = 0; i < handles.size(); ++i) {
      InPlaceAppend* const run = notes;
      i = AppendDecodeRun(handles, counts, tokens, draft_counts, i, next,
                          notes);
      journal_.Run(run, notes);
      if (i == handles.size()) break;
      const int32_t count = counts[i];
      if (count < 0 || static_cast<size_t>(count) > tokens.size() - next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block manager: append many counts[", i, "] is ", count, " with ",
            tokens.size() - next, " tokens left"));
      }
      if (handles[i] == SequenceHandle{} && count == 0 &&
          (!drafting || draft_counts[i] == 0)) {
        continue;  // a gap.
      }
      if (!slab_.IsLive(handles[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block manager: append many handles[", i, "] = (", handles[i].index,
            ", generation ", handles[i].generation, ") is not live"));
      }
      const int32_t entry = handles[i].index;
      const absl::Span<const TokenId> entry_tokens =
          tokens.subspan(next, count);
      next += count;
      stats_.appended_tokens += count;
      KVBLOCK_RETURN_IF_ERROR(AppendEntry(i, entry, entry_tokens,
                                          drafting ? &draft_counts[i] : nullptr,
                                          result));
    }
    if (next != tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block manager: append many counts add up to ", next,
                       " tokens, got ", tokens.size()));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) result.Clear();
  return status;
}

absl::Status BlockManagerImpl::CheckAppendMany(
    absl::Span<const SequenceHandle> handles, absl::Span<const int32_t> counts,
    absl::Span<const int32_t> draft_counts) const {
  if (handles.size() != counts.size() ||
      (!draft_counts.empty() && draft_counts.size() != handles.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: append many got ", handles.size(), " handles, ",
        counts.size(), " counts and ", draft_counts.size(), " draft counts"));
  }
  if (commit_applying_) return absl::OkStatus();  // its Validate stands for it.
  for (const SequenceHandle& handle : handles) {
    if (!slab_.IsLive(handle)) continue;  // refused in the append, in order.
    KVBLOCK_RETURN_IF_ERROR(
        CheckNotRunByCommit(handle.index, slab_.cold(handle.index).id));
  }
  return absl::OkStatus();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status BlockManagerImpl::AppendEntry(
    size_t i, int32_t entry, absl::Span<const TokenId> tokens,
    const int32_t* drafts, AppendManyResult& result) {
  const Sequence& seq = slab_.sequence(entry);
  const int32_t pages_before = seq.num_pages();
  AppendResult one;
  // With drafts whose end does not fall back (the common speculative
  // step), the append sets them too.
  bool drafts_set = false;
  if (!tokens.empty()) {
    drafts_set =
        drafts != nullptr && *drafts >= 0 &&
        seq.num_tokens() + static_cast<int64_t>(tokens.size()) + *drafts >
            int64_t{pages_before - 1} * config_.page_size;
    const int32_t drafts_after = drafts_set ? *drafts : -1;
    bool taken = false;
    KVBLOCK_RETURN_IF_ERROR(
        AppendDecodeStep(entry, tokens, drafts_after, one, taken));
    if (!taken) {
      KVBLOCK_RETURN_IF_ERROR(CheckPromptDone(seq, slab_.cold(entry).id));
      KVBLOCK_RETURN_IF_ERROR(
          AppendGeneral(entry, tokens, one, {}, drafts_after));
    }
  }
  // A copy on write replaces the last page held before.
  int32_t first_changed = pages_before - (one.copy.has_value() ? 1 : 0);
  if (drafts != nullptr && !drafts_set) {
    const int32_t pages_between = seq.num_pages();
    AppendResult drafted;
    KVBLOCK_RETURN_IF_ERROR(SetDraftsAt(entry, *drafts, drafted));
    first_changed = std::min(
        {first_changed, pages_between - (drafted.copy.has_value() ? 1 : 0),
         seq.num_pages()});
    if (drafted.copy.has_value()) {
      one.copy = drafted.copy;
      ++result.draft_copies;
    }
    one.new_pages += drafted.new_pages;
    one.released_pages = drafted.released_pages;
  }
  if (one.new_pages == 0 && !one.copy.has_value() && one.released_pages == 0) {
    return absl::OkStatus();
  }
  result.changed.push_back(static_cast<int32_t>(i));
  result.pages.push_back(seq.pages());
  result.first_changed_page.push_back(first_changed);
  if (one.copy.has_value()) result.copies.push_back(*one.copy);
  result.new_pages += one.new_pages;
  return absl::OkStatus();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status
BlockManagerImpl::AppendDecodeStep(int32_t entry,
                                   absl::Span<const TokenId> tokens,
                                   int32_t drafts_after, AppendResult& result,
                                   bool& taken) {
  const int32_t page_size = config_.page_size;
  taken = tokens.empty() && drafts_after < 0;  // nothing to do.
  if (tokens.empty() || tokens.size() >= static_cast<size_t>(page_size)) {
    return absl::OkStatus();
  }
  Sequence& seq = slab_.sequence(entry);
  const int32_t count = static_cast<int32_t>(tokens.size());
  if (!StaysInPlace(seq, count, drafts_after, page_size)) {
    return StepPastEdge(entry, tokens, drafts_after, result, taken);
  }
  TokenId* const partial = slab_.partial(entry) + seq.offset();
  if (count == 1) {
    *partial = tokens[0];  // decode: no call into memmove for one token.
  } else {
    std::copy(tokens.begin(), tokens.end(), partial);
  }
  journal_.Appended(entry, count, seq.drafts());
  if (drafts_after < 0) {
    seq.AppendInPlace(count);
  } else {
    // Counted as SetDraftsAt would count them.
    if (drafts_after != std::max(0, seq.drafts() - count)) {
      stats_.draft_slots += drafts_after;
    }
    seq.AppendInPlace(count, drafts_after);
  }
  taken = true;
  return absl::OkStatus();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status BlockManagerImpl::StepPastEdge(
    int32_t entry, absl::Span<const TokenId> tokens, int32_t drafts_after,
    AppendResult& result, bool& taken) {
  const int32_t page_size = config_.page_size;
  Sequence& seq = slab_.sequence(entry);
  const int32_t count = static_cast<int32_t>(tokens.size());
  const int32_t offset = seq.offset();
  const int32_t left_drafts = std::max(0, seq.drafts() - count);
  const int32_t drafts = drafts_after >= 0 ? drafts_after : left_drafts;
  const int32_t held = seq.num_pages();
  const int64_t pages = config_.PagesFor(seq.num_tokens() + count + drafts);
  // The partial page is written (unless it is empty), so held here alone.
  if (!seq.prompt_done() || (offset != 0 && seq.tail_maybe_shared()) ||
      pages < held || pages > held + 1 || pages > config_.max_pages_per_seq) {
    return absl::OkStatus();
  }
  const bool adds = pages > held;
  if (adds && AllocatableFor(entry) < 1) return absl::OkStatus();
  // count < page_size: at most one page fills, the partial one.
  const bool fills = offset + count >= page_size;
  const int32_t into_partial = fills ? page_size - offset : count;
  const int32_t past = count - into_partial;
  SequenceCold& cold = slab_.cold(entry);
  TokenId* const partial = slab_.partial(entry);
  // Saved: the partial tokens that tokens past a filled page overwrite; at
  // offset 0 the last full page's, which an undone fill of this transaction
  // needs back.
  const bool refill =
      offset == 0 && seq.filled_in_transaction() == journal_.serial();
  journal_.EdgeStep(entry, seq.num_tokens(), held, seq.drafts(),
                    seq.tail_maybe_shared(),
                    fills ? &cold.last_full_hash : nullptr,
                    absl::MakeConstSpan(partial, refill              ? page_size
                                                 : fills && past > 0 ? offset
                                                                     : 0));
  taken = true;
  // Counted as SetDraftsAt would count them.
  if (drafts != left_drafts) stats_.draft_slots += drafts;
  const int32_t filled_page =
      static_cast<int32_t>(seq.num_tokens() / page_size);
  PageId page = kNoPage;
  if (adds) {
    KVBLOCK_ASSIGN_OR_RETURN(page, pool_->Allocate());
  }
  // Cannot fail: pages <= max_pages_per_seq. With the prompt done no
  // reservation is left to draw from.
  KVBLOCK_RETURN_IF_ERROR(seq.Grow(absl::MakeConstSpan(&page, adds ? 1 : 0),
                                   seq.num_tokens() + count, drafts,
                                   fills ? journal_.serial() : 0));
  // The new partial page is fresh, a draft page, or the one held alone.
  seq.OwnTail();
  if (count == 1) {
    partial[offset] = tokens[0];  // decode: no call into memmove.
  } else {
    std::copy_n(tokens.begin(), into_partial, partial + offset);
  }
  if (fills) {
    if (options_.enable_prefix_caching) {
      KVBLOCK_RETURN_IF_ERROR(
          RegisterFullPage(entry, filled_page, nullptr,
                           absl::MakeConstSpan(partial, page_size)));
    }
    if (past > 0) std::copy_n(tokens.begin() + into_partial, past, partial);
  }
  result.new_pages += adds ? 1 : 0;
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::CheckGrowth(int32_t entry, int64_t new_tokens,
                                           int64_t drafts, bool copy) const {
  const SequenceCold& cold = slab_.cold(entry);
  const int64_t old_pages = slab_.sequence(entry).num_pages();
  const int64_t allocatable = AllocatableFor(entry);
  // The tokens' pages, then with the new drafts (as SetDraftsAt would check
  // them after the append).
  const int64_t held[] = {0, drafts};
  for (const int64_t slots : absl::MakeConstSpan(held, drafts > 0 ? 2 : 1)) {
    const int64_t end = config_.PagesFor(new_tokens + slots);
    if (end > config_.max_pages_per_seq) {
      return absl::OutOfRangeError(absl::StrCat(
          "block manager: sequence ", cold.id, " would hold ", new_tokens,
          " tokens and ", slots, " drafts in ", end,
          " pages, more than max_pages_per_seq = ", config_.max_pages_per_seq));
    }
    const int64_t needed =
        std::max<int64_t>(0, end - old_pages) + (copy ? 1 : 0);
    if (needed > allocatable) {
      return absl::ResourceExhaustedError(
          absl::StrCat("block manager: sequence ", cold.id, " needs ", needed,
                       " pages for its tokens and ", slots, " drafts, ",
                       allocatable, " are allocatable"));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::AppendGeneral(
    int32_t entry, absl::Span<const TokenId> tokens, AppendResult& result,
    absl::Span<const BlockHash> prompt_hashes, int32_t drafts_after) {
  const int32_t page_size = config_.page_size;
  Sequence& seq = slab_.sequence(entry);
  internal::SequenceCold& cold = slab_.cold(entry);
  TokenId* const partial = slab_.partial(entry);
  const int64_t count = static_cast<int64_t>(tokens.size());
  const int64_t old_tokens = seq.num_tokens();
  const int32_t old_pages = seq.num_pages();
  const PageId last_page = seq.last_page();
  // The tokens take the draft slots first.
  const int64_t left_drafts =
      std::max<int64_t>(0, int64_t{seq.drafts()} - count);
  const int64_t new_drafts = drafts_after >= 0 ? drafts_after : left_drafts;
  // With drafts the partial page is held here alone: never copied.
  const bool copy = seq.TailNeedsCopy(*pool_);
  KVBLOCK_RETURN_IF_ERROR(
      CheckGrowth(entry, old_tokens + count, std::max(0, drafts_after), copy));
  if (seq.drafts() > 0 || new_drafts > 0) {
    journal_.Drafted(entry, seq.drafts(), old_pages, last_page,
                     seq.tail_maybe_shared(), {});
    // As SetDraftsAt counts a change of drafts.
    if (drafts_after >= 0 && new_drafts != left_drafts) {
      stats_.draft_slots += new_drafts;
    }
  }
  const int32_t offset = seq.offset();
  // The partial tokens are overwritten only when a page fills; at offset 0
  // they are the last full page's, which an undone fill of this transaction
  // needs back.
  const bool fills = offset + count >= page_size;
  const bool save_tokens = offset == 0 || fills;
  journal_.Changed(entry, seq.tail_maybe_shared(), old_tokens, old_pages,
                   last_page, fills ? &cold.last_full_hash : nullptr,
                   save_tokens ? absl::MakeConstSpan(
                                     partial, offset == 0 ? page_size : offset)
                               : absl::Span<const TokenId>());
  if (copy) {
    KVBLOCK_ASSIGN_OR_RETURN(const CopyOnWrite cow, seq.CopyTail(*pool_));
    result.copy = PageCopy{cow.source, cow.page};
  }
  // From here on the last page is fresh, copied or held here alone.
  seq.OwnTail();
  // Every new page at once, before any fills (a long prompt chunk spans
  // many). The capacity was checked above.
  const absl::Span<PageId> fresh =
      absl::MakeSpan(page_scratch_)
          .first(static_cast<size_t>(std::max<int64_t>(
              0,
              config_.PagesFor(old_tokens + count + new_drafts) - old_pages)));
  KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
  KVBLOCK_RETURN_IF_ERROR(
      seq.Grow(fresh, old_tokens + count, static_cast<int32_t>(new_drafts)));
  result.new_pages += static_cast<int32_t>(fresh.size());
  DrawReservation(entry, static_cast<int32_t>(fresh.size()));
  return WriteTokens(entry, old_tokens, tokens, prompt_hashes);
}

absl::Status BlockManagerImpl::WriteTokens(
    int32_t entry, int64_t old_tokens, absl::Span<const TokenId> tokens,
    absl::Span<const BlockHash> prompt_hashes) {
  const size_t page_size = static_cast<size_t>(config_.page_size);
  internal::SequenceCold& cold = slab_.cold(entry);
  TokenId* const partial = slab_.partial(entry);
  int64_t written = old_tokens;  // the tokens in place so far.
  size_t offset = static_cast<size_t>(old_tokens % config_.page_size);
  // The partial page first (its tokens are in `partial`), then whole pages
  // straight from `tokens` (a long prompt chunk spans many), then the tail.
  // Each page that fills is registered.
  absl::Span<const TokenId> rest = tokens;
  absl::Span<const TokenId> page_tokens;  // of the last page filled.
  while (!rest.empty()) {
    const int64_t next_page = written / config_.page_size;
    // Whole pages in one run, registered as an admission registers them;
    // page 0 of given hashes goes alone (hashed, it checks that they are
    // this prompt's).
    if (offset == 0 && rest.size() >= page_size &&
        (next_page > 0 || prompt_hashes.empty())) {
      const size_t pages = rest.size() / page_size;
      const absl::Span<const TokenId> run = rest.first(pages * page_size);
      if (options_.enable_prefix_caching) {
        const absl::Span<const BlockHash> hashes =
            prompt_hashes.empty()
                ? HashPages(cold.last_full_hash, run)
                : prompt_hashes.subspan(static_cast<size_t>(next_page), pages);
        KVBLOCK_RETURN_IF_ERROR(
            RegisterPages(entry, static_cast<int32_t>(next_page),
                          cold.last_full_hash, hashes, run));
        cold.last_full_hash = hashes.back();
      }
      page_tokens = run.last(page_size);
      rest.remove_prefix(run.size());
      written += static_cast<int64_t>(run.size());
      continue;
    }
    if (offset == 0 && rest.size() >= page_size) {
      page_tokens = rest.first(page_size);
      rest.remove_prefix(page_size);
      written += static_cast<int64_t>(page_size);
    } else {
      const size_t take = std::min(rest.size(), page_size - offset);
      std::copy_n(rest.begin(), take, partial + offset);
      rest.remove_prefix(take);
      written += static_cast<int64_t>(take);
      offset += take;
      if (offset < page_size) break;
      offset = 0;
      page_tokens = absl::MakeConstSpan(partial, page_size);
    }
    if (options_.enable_prefix_caching) {
      KVBLOCK_RETURN_IF_ERROR(RegisterChunkPage(
          entry, static_cast<int32_t>(written / config_.page_size) - 1,
          prompt_hashes, page_tokens));
    }
  }
  // At offset 0 `partial` holds the last full page's tokens (an undone fill
  // of this transaction needs them back).
  if (offset == 0 && !page_tokens.empty() && page_tokens.data() != partial) {
    std::copy(page_tokens.begin(), page_tokens.end(), partial);
  }
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::RegisterChunkPage(
    int32_t entry, int32_t page, absl::Span<const BlockHash> prompt_hashes,
    absl::Span<const TokenId> page_tokens) {
  // Page 0 is hashed: it checks that the hashes are this prompt's.
  const BlockHash* given =
      page > 0 && !prompt_hashes.empty() ? &prompt_hashes[page] : nullptr;
  KVBLOCK_RETURN_IF_ERROR(RegisterFullPage(entry, page, given, page_tokens));
  const SequenceCold& cold = slab_.cold(entry);
  if (page == 0 && !prompt_hashes.empty() &&
      cold.last_full_hash != prompt_hashes[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("block manager: the prompt hashes of a chunk of sequence ",
                     cold.id, " do not start from its prompt and extra keys"));
  }
  return absl::OkStatus();
}

absl::Span<const BlockHash> BlockManagerImpl::HashPages(
    BlockHash parent, absl::Span<const TokenId> tokens) {
  const size_t page_size = static_cast<size_t>(config_.page_size);
  const absl::Span<BlockHash> hashes =
      absl::MakeSpan(hash_scratch_).first(tokens.size() / page_size);
  for (size_t i = 0; i < hashes.size(); ++i) {
    parent = HashPage(parent, tokens.subspan(i * page_size, page_size));
    hashes[i] = parent;
  }
  return hashes;
}

bool BlockManagerImpl::ParentCached(PageId parent_page,
                                    const BlockHash& parent) const {
  // A window group's parent may be skipped: it caches every page it can use.
  if (skips_pages()) return true;
  BlockHash salted;
  const BlockHash& key = Key(parent, salted);
  const std::optional<BlockHash> held = pool_->CachedHash(parent_page);
  return (held && *held == key) || pool_->Lookup(key).has_value();
}

absl::Status BlockManagerImpl::NotLiveHandleError(SequenceHandle handle) {
  return absl::InvalidArgumentError(
      absl::StrCat("block manager: handle (", handle.index, ", generation ",
                   handle.generation, ") is not live"));
}

absl::StatusOr<int32_t> BlockManagerImpl::ReleaseSkippedPages(int32_t entry) {
  Sequence& seq = slab_.sequence(entry);
  const int64_t skipped = NumSkippedPages(scope_.spec, seq.num_tokens());
  const int64_t due_before = seq.skip_due_at();
  const int64_t due = NextSkipTokens(scope_.spec, skipped);
  const absl::Span<const PageId> entries = seq.table().entries();
  const int32_t end = static_cast<int32_t>(skipped);  // <= its pages.
  int32_t first = end;
  while (first > 0 && entries[first - 1] != scope_.null_page) --first;
  if (first == end) {
    // Nothing new to release: skip_due_at follows from the pages skipped,
    // which stay (a rollback leaves it right).
    seq.set_skip_due_at(due);
    return -1;
  }
  const absl::Span<PageId> released =
      absl::MakeSpan(page_scratch_).first(end - first);
  std::copy(entries.begin() + first, entries.begin() + end, released.begin());
  for (int32_t page = end - 1; page >= first; --page) {
    KVBLOCK_RETURN_IF_ERROR(pool_->Retain(scope_.null_page));
    KVBLOCK_RETURN_IF_ERROR(pool_->Release(released[page - first]));
  }
  seq.SkipPages(first, end - first, scope_.null_page);
  seq.set_skip_due_at(due);
  journal_.Skipped(entry, first, released, due_before);
  return first;
}

absl::Status BlockManagerImpl::RegisterPages(int32_t entry, int32_t first,
                                             const BlockHash& parent,
                                             absl::Span<const BlockHash> hashes,
                                             absl::Span<const TokenId> tokens) {
  const absl::Span<const PageId> entries =
      slab_.sequence(entry).table().entries();
  if (first > 0 && !ParentCached(entries[first - 1], parent)) {
    return absl::OkStatus();
  }
  const absl::Span<const PageId> pages = entries.subspan(first, hashes.size());
  BlockHash salted;
  if (events_ != nullptr) {
    const internal::SequenceCold& cold = slab_.cold(entry);
    events_->BeginRun(first, parent, hashes, tokens, cold.cache_salt,
                      cold.adapter_id, scope_.index);
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (skips_pages() &&
        !CachesFullPage(scope_.spec, first + static_cast<int64_t>(i),
                        scope_.alignment_tokens)) {
      if (events_ != nullptr) events_->SkipInRun();
      continue;
    }
    KVBLOCK_RETURN_IF_ERROR(
        pool_->RegisterCached(pages[i], Key(hashes[i], salted), scope_.index)
            .status());
  }
  if (events_ != nullptr) events_->EndRun();
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::RegisterFullPage(
    int32_t entry, int32_t page, const BlockHash* hash,
    absl::Span<const TokenId> page_tokens) {
  const SequenceBlockTable& table = slab_.sequence(entry).table();
  internal::SequenceCold& cold = slab_.cold(entry);
  const BlockHash full =
      hash != nullptr ? *hash : HashPage(cold.last_full_hash, page_tokens);
  if ((page > 0 &&
       !ParentCached(table.entries()[page - 1], cold.last_full_hash)) ||
      (skips_pages() &&
       !CachesFullPage(scope_.spec, page, scope_.alignment_tokens))) {
    cold.last_full_hash = full;
    return absl::OkStatus();
  }
  BlockHash salted;
  if (events_ != nullptr) {
    events_->BeginRun(page, cold.last_full_hash, absl::MakeConstSpan(&full, 1),
                      page_tokens, cold.cache_salt, cold.adapter_id,
                      scope_.index);
  }
  KVBLOCK_RETURN_IF_ERROR(pool_
                              ->RegisterCached(table.entries()[page],
                                               Key(full, salted), scope_.index)
                              .status());
  if (events_ != nullptr) events_->EndRun();
  cold.last_full_hash = full;
  return absl::OkStatus();
}

}  // namespace kvblock::internal

namespace kvblock {

// The public calls, beside their implementations so that each inlines into
// its forwarder.

absl::StatusOr<AppendResult> BlockManager::Append(
    SequenceId id, absl::Span<const TokenId> tokens) {
  if (ABSL_PREDICT_FALSE(groups_ != nullptr))
    return groups_->Append(id, tokens);
  return impl_->Append(id, tokens);
}

absl::StatusOr<AppendResult> BlockManager::AppendPrompt(
    SequenceId id, absl::Span<const TokenId> tokens,
    absl::Span<const BlockHash> prompt_hashes) {
  if (groups_ != nullptr) {
    return groups_->AppendPrompt(id, tokens, prompt_hashes);
  }
  return impl_->AppendPrompt(id, tokens, prompt_hashes);
}

absl::StatusOr<AppendResult> BlockManager::SetDrafts(SequenceId id,
                                                     int32_t count) {
  if (groups_ != nullptr) return groups_->SetDrafts(id, count);
  return impl_->SetDrafts(id, count);
}

}  // namespace kvblock
