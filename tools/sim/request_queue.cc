// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/request_queue.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvblock/status_macros.h"
#include "sim/random.h"

namespace kvblock::sim {

RequestQueue::RequestQueue(absl::Span<const Request> requests,
                           int32_t max_batch, RunMetrics& metrics)
    : metrics_(metrics) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].arrival < requests[b].arrival;
  });
  for (const size_t i : order) {
    requests_.push_back(
        {.request = &requests[i], .id_hash = HashId(requests[i].id)});
  }
  running_.reserve(static_cast<size_t>(max_batch));
  still_running_.reserve(static_cast<size_t>(max_batch));
}

RequestState* RequestQueue::NextArrival(int64_t clock) {
  if (next_arrival_ == requests_.size() ||
      requests_[next_arrival_].request->arrival > clock) {
    return nullptr;
  }
  return &requests_[next_arrival_++];
}

std::optional<int64_t> RequestQueue::next_arrival_step() const {
  if (next_arrival_ == requests_.size()) return std::nullopt;
  return requests_[next_arrival_].request->arrival;
}

absl::StatusOr<std::optional<int64_t>> RequestQueue::ReadFeed(RequestFeed& feed,
                                                              int64_t clock) {
  const FeedReport report{.clock = clock,
                          .kv_event_batches = metrics_.kv_event_batches(),
                          .running = static_cast<int64_t>(running_.size()),
                          .waiting = static_cast<int64_t>(waiting_.size()),
                          .completed = metrics_.completed(),
                          .rejected = metrics_.rejected(),
                          .finished_ids = finished_ids_};
  const size_t known = fed_.size();
  KVBLOCK_ASSIGN_OR_RETURN(const std::optional<int64_t> horizon,
                           feed.Next(report, fed_));
  finished_ids_.clear();
  if (horizon.has_value() && *horizon <= clock) {
    return absl::InternalError(absl::StrFormat(
        "feed: horizon %d does not pass step %d", *horizon, clock));
  }
  int64_t earliest = clock;
  for (size_t i = known; i < fed_.size(); ++i) {
    Request& request = fed_[i];
    if (request.arrival < earliest ||
        (horizon.has_value() && request.arrival >= *horizon)) {
      return absl::InternalError(absl::StrFormat(
          "feed: request '%s' arrives at step %d, outside [%d, %s)", request.id,
          request.arrival, earliest,
          horizon.has_value() ? absl::StrCat(*horizon) : "end"));
    }
    earliest = request.arrival;
    requests_.push_back({.request = &request,
                         .owned = &request,
                         .id_hash = HashId(request.id)});
  }
  metrics_.AddRequests(static_cast<int64_t>(fed_.size() - known));
  return horizon;
}

void RequestQueue::RejectPlanned(const PlannedStep& plan) {
  for (const PlannedRejection& rejection : plan.rejections) {
    Reject(*waiting_[rejection.waiting_index], rejection.kind,
           rejection.reason);
  }
  // Last first, so that the indices before stay put.
  for (auto it = plan.rejections.rbegin(); it != plan.rejections.rend(); ++it) {
    waiting_.erase(waiting_.begin() +
                   static_cast<std::ptrdiff_t>(it->waiting_index));
  }
}

absl::Status RequestQueue::ApplyStep(const PlannedStep& plan, int64_t clock,
                                     const BlockManager& manager) {
  still_running_.clear();
  ApplyRunning(plan, clock);
  KVBLOCK_RETURN_IF_ERROR(ApplyAdmissions(plan, clock, manager));
  next_sequence_id_ = plan.next_sequence_id;
  running_.swap(still_running_);
  return absl::OkStatus();
}

void RequestQueue::ApplyRunning(const PlannedStep& plan, int64_t clock) {
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState& r = *running_[i];
    const RunningPlan& p = plan.running[i];
    const Request& request = *r.request;
    if (p.finishing) {
      r.sequences.clear();
      metrics_.Complete(r);
      Done(r);
      continue;
    }
    still_running_.push_back(&r);
    if (p.chunk > 0) {
      r.prompt_done += p.chunk;
      ++r.prompt_steps;
      if (r.PromptLeft() == 0 && r.first_token < 0) r.first_token = clock;
      continue;
    }
    if (r.PromptLeft() > 0) continue;  // no budget for its chunk this step.
    if (p.samples_fork) {
      for (int32_t sample = 1; sample < request.n; ++sample) {
        r.sequences.push_back({.id = p.fork_id + sample - 1, .sample = sample});
      }
      r.next_sample = request.n;
      r.forks_pending = false;
    }
    if (p.fork >= 0) {
      r.sequences.push_back({.id = p.fork_id, .sample = r.next_sample++});
    }
    if (p.drop >= 0) r.sequences.erase(r.sequences.begin() + p.drop);
    const int64_t live = static_cast<int64_t>(r.sequences.size());
    metrics_.AddDrafts(int64_t{p.accepted} * live,
                       int64_t{p.new_drafts} * live);
    r.generated += p.appends;
    r.drafts = p.new_drafts;
  }
}

absl::Status RequestQueue::ApplyAdmissions(const PlannedStep& plan,
                                           int64_t clock,
                                           const BlockManager& manager) {
  for (const PlannedAdmission& admission : plan.admissions) {
    RequestState& r = *waiting_.front();
    waiting_.pop_front();
    if (r.first_admitted < 0) r.first_admitted = clock;
    const Request& request = *r.request;
    // The manager's count: a prompt may hit pages that a join before it in
    // this step registered, which planning did not see.
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    KVBLOCK_ASSIGN_OR_RETURN(const int64_t left,
                             manager.PromptTokensLeft(admission.first_id));
    r.prompt_done = prompt - left;
    r.prompt_steps = 1;
    if (r.PromptLeft() == 0 && r.first_token < 0) r.first_token = clock;
    // Samples join with a prompt planned whole, else fork once it is done.
    const bool whole = admission.planned_prompt == prompt;
    r.forks_pending = !whole && request.n > 1;
    const int32_t samples = whole ? request.n : 1;
    for (int32_t sample = 0; sample < samples; ++sample) {
      r.sequences.push_back(
          {.id = admission.first_id + sample, .sample = sample});
    }
    r.next_sample = samples;
    still_running_.push_back(&r);
  }
  return absl::OkStatus();
}

RequestState& RequestQueue::PopLatestRunning() {
  RequestState& latest = *running_.back();
  running_.pop_back();
  return latest;
}

void RequestQueue::Reject(RequestState& request, RejectedRequest::Kind kind,
                          std::string reason) {
  metrics_.Reject(*request.request, kind, std::move(reason));
  Done(request);
}

void RequestQueue::Done(RequestState& request) {
  request.done = true;
  done_.push_back(&request);
}

void RequestQueue::ReleaseDone() {
  for (RequestState* r : done_) {
    r->sequences = {};
    r->prompt_hashes = {};
    if (r->owned != nullptr) {
      finished_ids_.push_back(std::move(r->owned->id));
      r->owned->prompt = {};
      r->owned->output = {};
      r->owned->cache_salt = {};
    }
  }
  done_.clear();
  while (next_arrival_ > 0 && requests_.front().done) {
    if (requests_.front().owned != nullptr) fed_.pop_front();
    requests_.pop_front();
    --next_arrival_;
  }
}

int32_t RequestQueue::DraftOnlyPages(int32_t page_size) const {
  int64_t pages = 0;
  for (const RequestState* r : running_) pages += r->DraftOnlyPages(page_size);
  return static_cast<int32_t>(pages);
}

}  // namespace kvblock::sim
