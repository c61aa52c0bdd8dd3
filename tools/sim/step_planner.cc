// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/step_planner.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/status_macros.h"
#include "sim/random.h"

namespace kvblock::sim {
namespace {

// The beam rule: at `position`, a request with `live` of `width` beams forks
// beam `fork` and drops beam `drop` (-1: none; never the same beam), keeping
// 1..width beams.
void DecideBeams(uint64_t id_hash, int64_t position, int32_t live,
                 int32_t width, int32_t& fork, int32_t& drop) {
  const uint64_t h = Mix(id_hash ^ Mix(static_cast<uint64_t>(position)));
  fork =
      live < width && (h & 1) == 0 ? static_cast<int32_t>((h >> 8) % live) : -1;
  drop = -1;
  if (live > 1 && (h >> 4) % 3 == 0) {
    drop = static_cast<int32_t>((h >> 16) % live);
    if (drop == fork) drop = (drop + 1) % live;
  }
}

// Of `drafts` drafts proposed after `position` tokens, how many the target
// model accepts: each with probability `acceptance`, decided by a hash of
// (request, position, seed); the first rejection ends the run.
int32_t AcceptedDrafts(uint64_t id_hash, uint64_t seed, int64_t position,
                       int32_t drafts, double acceptance) {
  int32_t accepted = 0;
  while (accepted < drafts) {
    const uint64_t h = Mix(
        id_hash ^ Mix(seed ^ Mix(static_cast<uint64_t>(position + accepted))));
    // The top 53 bits as a uniform double in [0, 1).
    if (static_cast<double>(h >> 11) * 0x1.0p-53 >= acceptance) break;
    ++accepted;
  }
  return accepted;
}

// The pages a prompt of `tokens` holds at once in the KV cache groups that
// keep every page (full attention; the run's one group without groups):
// what its sequence holds at the least, whatever the others release.
int64_t PromptPagesKept(const SchedulerConfig& config, int64_t tokens) {
  const std::vector<KvCacheGroupSpec>& groups = config.manager.kv_cache_groups;
  if (groups.empty()) return config.kv.PagesFor(tokens);
  int64_t pages = 0;
  for (const KvCacheGroupSpec& group : groups) {
    if (group.kind == AttentionKind::kFull) {
      pages += PagesForTokens(tokens, group.page_size);
    }
  }
  return pages;
}

// Why queued request `request` (at `waiting_index`) can never run here, if
// it cannot: its prompt needs more pages than the pool admits, or (without
// chunked prefill) it computes more tokens than a step may.
std::optional<PlannedRejection> RejectionOf(const SchedulerConfig& config,
                                            const Request& request,
                                            const AdmissionPlan& admission,
                                            size_t waiting_index) {
  const PagedKvConfig& kv = config.kv;
  const int32_t watermark = config.manager.watermark_pages;
  const int64_t prompt_pages =
      PromptPagesKept(config, static_cast<int64_t>(request.prompt.size()));
  if (prompt_pages > kv.num_pages - watermark) {
    return PlannedRejection{
        .waiting_index = waiting_index,
        .kind = RejectedRequest::Kind::kPoolTooSmall,
        .reason = absl::StrFormat(
            "its prompt needs %d pages, the pool admits %d (%d less a "
            "watermark of %d)",
            prompt_pages, kv.num_pages - watermark, kv.num_pages, watermark)};
  }
  if (!config.chunked_prefill &&
      admission.computed_tokens > config.max_tokens_per_step) {
    return PlannedRejection{
        .waiting_index = waiting_index,
        .kind = RejectedRequest::Kind::kOverTokenBudget,
        .reason = absl::StrFormat(
            "%d uncached prompt tokens exceed max_tokens_per_step %d (chunked "
            "prefill is off)",
            admission.computed_tokens, config.max_tokens_per_step)};
  }
  return std::nullopt;
}

}  // namespace

PlannedStep::PlannedStep(int32_t max_batch) {
  const size_t n = static_cast<size_t>(max_batch);
  running.reserve(n);
  admissions.reserve(n);
  finished.reserve(n);
  preempted.reserve(n);
  joins.reserve(n);
  fork_tokens.reserve(n);
  append_counts.reserve(n);
  append_tokens.reserve(n);
  draft_counts.reserve(n);
  prompt_chunks.reserve(n);
}

StepPlan PlannedStep::step_plan() const {
  return {.finished = finished,
          .preempted = preempted,
          .joins = joins,
          .append_counts = append_counts,
          .append_tokens = append_tokens,
          .prompt_chunks = prompt_chunks,
          .draft_counts = draft_counts};
}

StepPlanner::StepPlanner(const SchedulerConfig& config,
                         const BlockManager& manager, const BatchCommit& commit)
    : config_(config), kv_(config.kv), manager_(manager), commit_(commit) {
  stepping_.reserve(static_cast<size_t>(kv_.max_batch));
  page_counts_.reserve(static_cast<size_t>(kv_.max_batch));
}

int64_t StepPlanner::BatchAfterLeaving(const PlannedStep& plan) const {
  return commit_.batch() -
         static_cast<int64_t>(plan.finished.size() + plan.preempted.size());
}

absl::Status StepPlanner::Plan(const PlanInput& input, PlannedStep& plan) {
  plan.finished.assign(input.gave_way_finished.begin(),
                       input.gave_way_finished.end());
  plan.preempted.assign(input.gave_way_preempted.begin(),
                        input.gave_way_preempted.end());
  plan.running.assign(input.running.size(), RunningPlan{});
  plan.admissions.clear();
  plan.rejections.clear();
  plan.joins.clear();
  plan.fork_tokens.clear();
  plan.prompt_chunks.clear();
  plan.limit = StepLimit::kNone;
  plan.next_sequence_id = input.next_sequence_id;
  stepping_.clear();
  forks_ = 0;
  held_seats_ = 0;
  budget_ = config_.max_tokens_per_step;
  append_pages_ = 0;
  PlanRunning(input, plan);
  plan.next_sequence_id += forks_;  // the forks took the ids before.
  KVBLOCK_RETURN_IF_ERROR(PlanSlots(input, plan));
  return PlanAdmissions(input, plan);
}

void StepPlanner::PlanRunning(const PlanInput& input, PlannedStep& plan) {
  // Leaving sequences first, so forks know the room left in the batch.
  for (size_t i = 0; i < input.running.size(); ++i) {
    const RequestState& r = *input.running[i];
    RunningPlan& p = plan.running[i];
    p.finishing = r.generated == r.request->max_tokens;
    if (p.finishing) {
      for (const Sequence& s : r.sequences) plan.finished.push_back(s.id);
    } else if (r.request->beam > 1) {
      DecideBeams(r.id_hash, r.generated,
                  static_cast<int32_t>(r.sequences.size()), r.request->beam,
                  p.fork, p.drop);
      if (p.drop >= 0) plan.finished.push_back(r.sequences[p.drop].id);
    }
    // Seats for samples yet to fork, whether they fork this step or after
    // the prompt's last chunk: a beam's fork planned before them must not
    // take theirs.
    if (r.forks_pending) held_seats_ += r.request->n - 1;
  }
  const int64_t batch_after = BatchAfterLeaving(plan);
  for (size_t i = 0; i < input.running.size(); ++i) {
    const RequestState& r = *input.running[i];
    if (!plan.running[i].finishing && r.PromptLeft() == 0) {
      PlanDecode(r, static_cast<int32_t>(i), batch_after, plan);
    }
  }
  PlanBudget(input, plan);
}

void StepPlanner::PlanDecode(const RequestState& r, int32_t index,
                             int64_t batch_after, PlannedStep& plan) {
  const Request& request = *r.request;
  RunningPlan& p = plan.running[index];
  // The forks take ids from here; admissions take the ones after them.
  const SequenceId next_id = plan.next_sequence_id;
  if (r.forks_pending) {
    // The prompt is done: the other samples fork, each with its first token.
    p.samples_fork = true;
    p.fork_id = next_id + forks_;
    for (int32_t sample = 1; sample < request.n; ++sample) {
      plan.fork_tokens.push_back(GeneratedToken(request, sample, r.generated));
      plan.joins.push_back(
          {.id = p.fork_id + sample - 1,
           .fork_of = r.sequences[0].id,
           .tokens = absl::MakeConstSpan(&plan.fork_tokens.back(), 1),
           .extra = {}});
    }
    forks_ += request.n - 1;
    held_seats_ -= request.n - 1;  // the seats they held are now forks.
    budget_ -= request.n - 1;
    append_pages_ += request.n - 1;  // each fork's token: a page or a copy.
  }
  if (p.fork >= 0 && batch_after + forks_ + held_seats_ >= kv_.max_batch) {
    p.fork = -1;
  }
  p.accepted = AcceptedDrafts(r.id_hash, config_.spec_seed, r.generated,
                              r.drafts, config_.spec_acceptance);
  p.appends = static_cast<int32_t>(
      std::min<int64_t>(p.accepted + 1, request.max_tokens - r.generated));
  for (int32_t i = 0; i < static_cast<int32_t>(r.sequences.size()); ++i) {
    if (i == p.drop) continue;
    const Sequence& s = r.sequences[i];
    stepping_[s.id] = {.running_index = index, .sample = s.sample};
    --budget_;
  }
  if (p.fork >= 0) {
    p.fork_id = next_id + forks_;
    plan.fork_tokens.push_back(
        GeneratedToken(request, r.next_sample, r.generated));
    plan.joins.push_back(
        {.id = p.fork_id,
         .fork_of = r.sequences[p.fork].id,
         .tokens = absl::MakeConstSpan(&plan.fork_tokens.back(), 1),
         .extra = {}});
    ++forks_;
    --budget_;
    ++append_pages_;  // the fork's token: a new page or a copy.
  }
}

void StepPlanner::PlanBudget(const PlanInput& input, PlannedStep& plan) {
  for (size_t i = 0; i < input.running.size(); ++i) {
    const RequestState& r = *input.running[i];
    RunningPlan& p = plan.running[i];
    if (p.finishing) continue;
    const Request& request = *r.request;
    const int64_t left = r.PromptLeft();
    if (left > 0) {
      int64_t chunk = std::min(left, budget_);
      if (config_.chunk_tokens > 0) {
        chunk = std::min(chunk, config_.chunk_tokens);
      }
      if (chunk <= 0) continue;
      p.chunk = chunk;
      budget_ -= chunk;
      const SequenceId id = r.sequences[0].id;
      plan.prompt_chunks.push_back(
          {.id = id,
           .tokens = absl::MakeConstSpan(request.prompt)
                         .subspan(static_cast<size_t>(r.prompt_done),
                                  static_cast<size_t>(chunk)),
           .prompt_hashes = r.prompt_hashes});
      stepping_[id] = {.running_index = static_cast<int32_t>(i), .sample = 0};
      continue;
    }
    if (config_.spec_tokens == 0 || request.beam > 1 || p.samples_fork) {
      continue;
    }
    // Drafts the next step can verify: it appends at most the tokens left.
    const int64_t after = request.max_tokens - r.generated - p.appends;
    const int64_t live =
        static_cast<int64_t>(r.sequences.size()) - (p.drop >= 0 ? 1 : 0);
    const int64_t drafts =
        std::min({static_cast<int64_t>(config_.spec_tokens), after - 1,
                  budget_ / std::max<int64_t>(live, 1)});
    if (drafts <= 0) continue;
    p.new_drafts = static_cast<int32_t>(drafts);
    budget_ -= drafts * live;
  }
}

absl::Status StepPlanner::PlanSlots(const PlanInput& input, PlannedStep& plan) {
  plan.append_counts.clear();
  plan.append_tokens.clear();
  plan.draft_counts.clear();
  page_counts_.clear();
  const bool drafting = config_.spec_tokens > 0;
  for (const SequenceId id : commit_.slots()) {
    const auto it = stepping_.find(id);
    int32_t appends = 0, drafts = 0, chunk = 0;
    if (it != stepping_.end()) {
      const Stepping& stepping = it->second;
      const RequestState& r = *input.running[stepping.running_index];
      const RunningPlan& p = plan.running[stepping.running_index];
      if (p.chunk > 0) {
        chunk = static_cast<int32_t>(p.chunk);
      } else {
        appends = p.appends;
        drafts = p.new_drafts;
        for (int32_t j = 0; j < appends; ++j) {
          plan.append_tokens.push_back(
              GeneratedToken(*r.request, stepping.sample, r.generated + j));
        }
      }
    }
    plan.append_counts.push_back(appends);
    page_counts_.push_back(appends + chunk);
    if (drafting) plan.draft_counts.push_back(drafts);
  }
  // What the appends, chunks and drafts take from the pool, the manager's
  // own count (new pages, copies of shared partial pages, less the pages
  // reserved for the prompts).
  KVBLOCK_ASSIGN_OR_RETURN(
      const int64_t append_pages,
      commit_.AppendPages(page_counts_, plan.draft_counts));
  append_pages_ += append_pages;
  return absl::OkStatus();
}

absl::Status StepPlanner::PlanAdmissions(const PlanInput& input,
                                         PlannedStep& plan) {
  const std::deque<RequestState*>& waiting = *input.waiting;
  int64_t seats =
      kv_.max_batch - BatchAfterLeaving(plan) - forks_ - held_seats_;
  int64_t pages = manager_.NumAllocatable() - config_.manager.watermark_pages -
                  append_pages_;
  for (size_t i = 0;
       i < waiting.size() &&
       static_cast<int64_t>(plan.admissions.size()) < input.admit_limit;
       ++i) {
    const RequestState& r = *waiting[i];
    const Request& request = *r.request;
    if (request.n > seats) {
      plan.limit = StepLimit::kMaxBatch;
      break;
    }
    AdmitOptions admit;
    if (config_.chunked_prefill) {
      if (budget_ <= 0) {
        plan.limit = StepLimit::kTokenBudget;
        break;
      }
      admit.prefill_tokens = config_.chunk_tokens > 0
                                 ? std::min(budget_, config_.chunk_tokens)
                                 : budget_;
    }
    const HashExtraKeys extra{.cache_salt = request.cache_salt};
    KVBLOCK_ASSIGN_OR_RETURN(
        const AdmissionPlan admission,
        manager_.PlanAdmission(request.prompt, extra, r.prompt_hashes, admit));
    if (std::optional<PlannedRejection> rejection =
            RejectionOf(config_, request, admission, i)) {
      plan.rejections.push_back(*std::move(rejection));
      continue;
    }
    if (admission.computed_tokens > budget_) {
      plan.limit = StepLimit::kTokenBudget;
      break;
    }
    const int64_t taken = admission.pages_consumed() + admission.reserved_pages;
    if (taken > pages && manager_.num_sequences() == 0 &&
        plan.admissions.empty()) {
      // With no sequence in the pool every page is allocatable (a hit on an
      // unused page consumes one too): more than that, never.
      plan.rejections.push_back(
          {.waiting_index = i,
           .kind = RejectedRequest::Kind::kPoolTooSmall,
           .reason = absl::StrFormat(
               "its admission needs %d pages in its %d KV cache groups, the "
               "pool admits %d",
               taken, manager_.num_groups(), pages)});
      continue;
    }
    if (taken > pages) {
      plan.limit = StepLimit::kPages;
      break;
    }
    const SequenceId first_id = plan.next_sequence_id;
    const int64_t planned_prompt =
        admission.hit_tokens + admission.computed_tokens;
    plan.admissions.push_back(
        {.first_id = first_id, .planned_prompt = planned_prompt});
    plan.joins.push_back({.id = plan.next_sequence_id++,
                          .fork_of = kNoSequence,
                          .tokens = request.prompt,
                          .extra = extra,
                          .prompt_hashes = r.prompt_hashes,
                          .admit = admit});
    // A chunked prompt's samples fork once it is done; their seats are held.
    if (planned_prompt == static_cast<int64_t>(request.prompt.size())) {
      for (int32_t sample = 1; sample < request.n; ++sample) {
        plan.joins.push_back({.id = plan.next_sequence_id++,
                              .fork_of = first_id,
                              .tokens = {},
                              .extra = {}});
      }
    }
    seats -= request.n;
    budget_ -= admission.computed_tokens;
    pages -= taken;
  }
  return absl::OkStatus();
}

}  // namespace kvblock::sim
