// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManagerImpl's sequence lifecycle: admission (planned first), fork and
// removal (Free, Preempt).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "cache/cache_event_log.h"
#include "kvblock/status_macros.h"
#include "manager/block_manager_impl.h"

namespace kvblock::internal {

// Admission -------------------------------------------------------------------

absl::StatusOr<int64_t> BlockManagerImpl::HashPrompt(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<BlockHash> out) const {
  return HashChain(hasher_, prompt, extra, out);
}

absl::StatusOr<AdmissionPlan> BlockManagerImpl::PlanAdmission(
    absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes,
    const AdmitOptions& admit) const {
  absl::Span<const BlockHash> hashes;
  return planner_.Plan(*pool_, prompt, extra, prompt_hashes, admit, hashes);
}

bool BlockManagerImpl::CanAdmit(absl::Span<const TokenId> prompt,
                                const HashExtraKeys& extra,
                                absl::Span<const BlockHash> prompt_hashes,
                                const AdmitOptions& admit) const {
  const absl::StatusOr<AdmissionPlan> plan =
      PlanAdmission(prompt, extra, prompt_hashes, admit);
  return plan.ok() && plan->pages_consumed() + plan->reserved_pages <=
                          NumAllocatable() - options_.watermark_pages;
}

absl::Status BlockManagerImpl::CheckNewId(SequenceId id,
                                          absl::string_view what) const {
  if (id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block manager: ", what, " id ", id,
        " is negative (ids are non-negative; kNoSequence = -1 names none)"));
  }
  if (slab_.Find(id) >= 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("block manager: ", what, " ", id, " is already live"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdmissionPlan> BlockManagerImpl::Admit(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    absl::Span<const BlockHash> prompt_hashes, const AdmitOptions& admit) {
  KVBLOCK_RETURN_IF_ERROR(CheckNewId(id, "sequence"));
  absl::Span<const BlockHash> hashes;
  KVBLOCK_ASSIGN_OR_RETURN(
      const AdmissionPlan plan,
      planner_.Plan(*pool_, prompt, extra, prompt_hashes, admit, hashes));
  // Pages get filed under these hashes: check that the chain starts from
  // this prompt and these extra keys (one page hash), so that a mismatched
  // salt cannot leak pages into another tenant's chains.
  if (!prompt_hashes.empty() && options_.enable_prefix_caching &&
      planner_.FirstPageHash(prompt.first(config_.page_size), extra) !=
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
  KVBLOCK_RETURN_IF_ERROR(AdmitPlanned(id, prompt, extra, plan, hashes));
  return plan;
}

absl::Status BlockManagerImpl::AdmitPlanned(
    SequenceId id, absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
    const AdmissionPlan& plan, absl::Span<const BlockHash> hashes) {
  // The tokens the admission schedules: the hits, then what this step
  // computes.
  const int64_t end = plan.hit_tokens + plan.computed_tokens;
  const int32_t full_pages = static_cast<int32_t>(end / config_.page_size);
  return Transact([&]() -> absl::Status {
    const int32_t entry = slab_.Create(id);
    journal_.Created(entry, -1, false);
    Sequence& seq = slab_.sequence(entry);
    SequenceCold& cold = slab_.cold(entry);
    cold.cache_salt.assign(extra.cache_salt.data(), extra.cache_salt.size());
    cold.adapter_id = extra.adapter_id;
    seq.StartPrompt(static_cast<int64_t>(prompt.size()));
    cold.reserves = plan.reserved_pages > 0;
    reserved_pages_ += plan.reserved_pages;
    if (plan.host_hit_pages > 0) {
      KVBLOCK_RETURN_IF_ERROR(TakeHits(entry, prompt, extra, plan, hashes));
    } else if (plan.hit_pages > 0) {
      // The pages the plan found: no second lookup.
      const absl::Span<const PageId> hits = planner_.hits(plan.hit_pages);
      if (skips_pages()) {
        // A window group's hit starts with null pages.
        for (const PageId page : hits) {
          KVBLOCK_RETURN_IF_ERROR(
              page == scope_.null_page
                  ? pool_->Retain(page)
                  : pool_->AcquireCached(absl::MakeConstSpan(&page, 1)));
        }
      } else {
        KVBLOCK_RETURN_IF_ERROR(pool_->AcquireCached(hits));
      }
      KVBLOCK_RETURN_IF_ERROR(seq.Grow(hits, plan.hit_tokens, 0));
    }
    const absl::Span<PageId> fresh =
        absl::MakeSpan(page_scratch_).first(plan.new_pages);
    KVBLOCK_RETURN_IF_ERROR(pool_->AllocateN(fresh));
    KVBLOCK_RETURN_IF_ERROR(seq.Grow(fresh, end, 0));
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
        static_cast<size_t>(full_pages) * config_.page_size, seq.offset());
    std::copy(tail.begin(), tail.end(), slab_.partial(entry));
    ++stats_.admitted;
    stats_.prompt_tokens += seq.prompt_end();
    stats_.prefix_hit_tokens += plan.hit_tokens;
    stats_.host_hit_tokens += int64_t{plan.host_hit_pages} * config_.page_size;
    return absl::OkStatus();
  });
}

absl::Status BlockManagerImpl::TakeHits(int32_t entry,
                                        absl::Span<const TokenId> prompt,
                                        const HashExtraKeys& extra,
                                        const AdmissionPlan& plan,
                                        absl::Span<const BlockHash> hashes) {
  const absl::Span<const PageId> hits = planner_.hits(plan.hit_pages);
  const absl::Span<PageId> pages =
      absl::MakeSpan(page_scratch_).first(plan.hit_pages);
  std::copy(hits.begin(), hits.end(), pages.begin());
  // The device's hits first, so that the loads' allocations evict none;
  // and every host hit used by the batch, so that the stores those
  // allocations make drop none of them either.
  const absl::Span<BlockHash> host_keys =
      absl::MakeSpan(hash_scratch_).first(plan.host_hit_pages);
  size_t next_key = 0;
  for (int32_t i = 0; i < plan.hit_pages; ++i) {
    if (hits[i] == kNoPage) {
      host_keys[next_key++] = hashes[i];
      continue;
    }
    KVBLOCK_RETURN_IF_ERROR(
        pool_->AcquireCached(absl::MakeConstSpan(&hits[i], 1)));
  }
  KVBLOCK_RETURN_IF_ERROR(pool_->UseHostPages(host_keys));
  const SequenceCold& cold = slab_.cold(entry);
  const int64_t page_size = config_.page_size;
  for (int32_t i = 0; i < plan.hit_pages; ++i) {
    if (hits[i] != kNoPage) continue;
    // A page of one registration run, so that its KV cache event names its
    // chain and tokens as a computed page's would.
    if (events_ != nullptr) {
      events_->BeginRun(i, i > 0 ? hashes[i - 1] : hasher_.RootHash(extra),
                        hashes.subspan(i, 1),
                        prompt.subspan(i * page_size, page_size),
                        cold.cache_salt, cold.adapter_id, scope_.index);
    }
    KVBLOCK_ASSIGN_OR_RETURN(pages[i],
                             pool_->LoadFromHost(hashes[i], scope_.index));
    if (events_ != nullptr) events_->EndRun();
  }
  return slab_.sequence(entry).Grow(pages, plan.hit_tokens, 0);
}

// Fork and removal ------------------------------------------------------------

absl::Status BlockManagerImpl::Fork(SequenceId parent, SequenceId child) {
  if (slab_.Find(parent) < 0) {
    return absl::NotFoundError(
        absl::StrCat("block manager: fork parent ", parent, " is not live"));
  }
  KVBLOCK_RETURN_IF_ERROR(CheckNewId(child, "fork child"));
  {
    const int32_t source = slab_.Find(parent);
    const int64_t prompt_left = slab_.sequence(source).prompt_left();
    if (prompt_left > 0 || slab_.sequence(source).drafts() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block manager: fork parent ", parent, " still has ",
          prompt_left > 0
              ? absl::StrCat(prompt_left, " prompt tokens to compute")
              : absl::StrCat(slab_.sequence(source).drafts(), " draft slots"),
          ": fork it after its prompt, without drafts"));
    }
  }
  return Transact([&]() -> absl::Status {
    const int32_t entry = slab_.Create(child);
    // After Create, which may grow the slab.
    const int32_t source = slab_.Find(parent);
    Sequence& from = slab_.sequence(source);
    Sequence& to = slab_.sequence(entry);
    journal_.Created(entry, source, from.tail_maybe_shared());
    KVBLOCK_RETURN_IF_ERROR(to.ForkFrom(from, *pool_));
    std::copy_n(slab_.partial(source), config_.page_size, slab_.partial(entry));
    SequenceCold& cold = slab_.cold(entry);
    cold.last_full_hash = slab_.cold(source).last_full_hash;
    cold.cache_salt = slab_.cold(source).cache_salt;
    cold.adapter_id = slab_.cold(source).adapter_id;
    ++stats_.forks;
    return absl::OkStatus();
  });
}

absl::Status BlockManagerImpl::CheckNotRunByCommit(int32_t entry,
                                                   SequenceId id) const {
  if (!slab_.sequence(entry).run_by_commit() || commit_applying_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "block manager: sequence ", id,
      " runs in a BatchCommit; it changes only through BatchCommit::Commit"));
}

absl::Status BlockManagerImpl::Remove(SequenceId id, bool preempted) {
  KVBLOCK_ASSIGN_OR_RETURN(const int32_t entry, EntryToChange(id));
  return Transact([&]() -> absl::Status {
    reserved_pages_ -= ReservationOf(entry);
    Sequence& seq = slab_.sequence(entry);
    // The pages, kept before the release empties the table, are journaled
    // once it succeeded.
    const absl::Span<PageId> pages =
        absl::MakeSpan(page_scratch_).first(seq.num_pages());
    std::copy(seq.pages().begin(), seq.pages().end(), pages.begin());
    KVBLOCK_RETURN_IF_ERROR(seq.ReleasePages(*pool_));
    journal_.Removed(entry, pages);
    slab_.Remove(entry);
    ++(preempted ? stats_.preemptions : stats_.freed);
    return absl::OkStatus();
  });
}

}  // namespace kvblock::internal
