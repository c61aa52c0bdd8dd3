// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/step_executor.h"

#include <algorithm>
#include <cstddef>
#include <limits>

#include "absl/strings/str_format.h"
#include "kvblock/kernels.h"
#include "kvblock/status_macros.h"

namespace kvblock::sim {

StepExecutor::StepExecutor(SchedulerState& state, StepPlanner& planner,
                           RequestQueue& requests, RunMetrics& metrics)
    : state_(state),
      planner_(planner),
      requests_(requests),
      metrics_(metrics),
      plan_(state.config.kv.max_batch) {
  gave_way_finished_.reserve(static_cast<size_t>(state.config.kv.max_batch));
  gave_way_preempted_.reserve(static_cast<size_t>(state.config.kv.max_batch));
}

absl::StatusOr<std::optional<StepResult>> StepExecutor::Commit(int64_t clock) {
  gave_way_finished_.clear();
  gave_way_preempted_.clear();
  preemptions_ = 0;
  pages_ran_out_ = false;
  int64_t admit_limit = std::numeric_limits<int64_t>::max();
  for (;;) {
    KVBLOCK_RETURN_IF_ERROR(
        planner_.Plan({.running = requests_.running(),
                       .waiting = &requests_.waiting(),
                       .gave_way_finished = gave_way_finished_,
                       .gave_way_preempted = gave_way_preempted_,
                       .next_sequence_id = requests_.next_sequence_id(),
                       .admit_limit = admit_limit},
                      plan_));
    requests_.RejectPlanned(plan_);
    if (plan_.empty()) return std::nullopt;
    absl::StatusOr<StepResult> step = state_.commit->Commit(plan_.step_plan());
    if (step.ok()) return *step;
    if (step.status().code() != absl::StatusCode::kResourceExhausted) {
      return absl::InternalError(absl::StrFormat("step %d: commit: %s", clock,
                                                 step.status().ToString()));
    }
    pages_ran_out_ = true;
    const int64_t admitted = static_cast<int64_t>(plan_.admissions.size());
    if (admitted > 0) {
      admit_limit = admitted - 1;  // the latest admission waits.
    } else {
      KVBLOCK_RETURN_IF_ERROR(GiveWay(clock));
      admit_limit = 0;
    }
  }
}

absl::Status StepExecutor::GiveWay(int64_t clock) {
  if (requests_.running().empty()) {
    return absl::InternalError(absl::StrFormat(
        "step %d: out of pages with no request left to preempt", clock));
  }
  RequestState& victim = requests_.PopLatestRunning();
  const bool alone = requests_.running().empty();
  for (const Sequence& s : victim.sequences) {
    (alone ? gave_way_finished_ : gave_way_preempted_).push_back(s.id);
  }
  const int64_t sequences = static_cast<int64_t>(victim.sequences.size());
  victim.sequences.clear();
  if (alone) {
    requests_.Reject(
        victim, RejectedRequest::Kind::kRanOutAlone,
        absl::StrFormat("ran out of pages running alone (pool of %d pages)",
                        state_.config.kv.num_pages));
    return absl::OkStatus();
  }
  metrics_.AddRecomputedTokens(victim.generated * sequences);
  victim.Restart();
  requests_.Requeue(victim);
  ++preemptions_;
  return absl::OkStatus();
}

absl::Status StepExecutor::RunDevice(absl::Span<const PageCopy> copies,
                                     absl::Span<const HostCopy> host_copies,
                                     int64_t clock) {
  HostClock& host_clock = metrics_.host_clock();
  KVBLOCK_RETURN_IF_ERROR(state_.table->Upload(nullptr).status());
  host_clock.Lap(&HostPhases::upload_ns);
  if (!host_copies.empty()) {
    KVBLOCK_RETURN_IF_ERROR(RunHostCopies(host_copies, clock));
    host_clock.Lap(&HostPhases::host_copies_ns);
  }
  if (copies.empty()) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(RunCopies(copies, clock));
  host_clock.Lap(&HostPhases::copy_on_write_ns);
  return absl::OkStatus();
}

absl::Status StepExecutor::RunCopies(absl::Span<const PageCopy> copies,
                                     int64_t clock) {
  const PagedKvConfig& kv = state_.config.kv;
  // One copy a row at most: every group's rows.
  const int32_t capacity = state_.table->max_batch();
  if (copies.size() > static_cast<size_t>(capacity)) {
    return absl::InternalError(
        absl::StrFormat("step %d: %d copies exceed the %d the copy list holds",
                        clock, copies.size(), capacity));
  }
  Device& device = state_.device;
  // The previous step's list may still be in flight from the staging.
  KVBLOCK_RETURN_IF_ERROR(device.WaitEvent(state_.copies_done));
  auto* staging = static_cast<PageId*>(state_.copy_staging.data());
  for (size_t i = 0; i < copies.size(); ++i) {
    staging[2 * i] = copies[i].source;
    staging[2 * i + 1] = copies[i].destination;
  }
  KVBLOCK_RETURN_IF_ERROR(
      device.CopyToDevice(staging, state_.copy_list.data(),
                          copies.size() * 2 * sizeof(PageId), nullptr));
  KVBLOCK_RETURN_IF_ERROR(
      CopyPages(device, KvPool{.config = kv, .data = state_.kv_pool.data()},
                static_cast<const PageId*>(state_.copy_list.data()),
                static_cast<int64_t>(copies.size()), nullptr));
  return device.RecordEvent(state_.copies_done, nullptr);
}

absl::Status StepExecutor::RunHostCopies(absl::Span<const HostCopy> copies,
                                         int64_t clock) {
  if (copies.size() > state_.host_copy_capacity) {
    return absl::InternalError(absl::StrFormat(
        "step %d: %d host copies exceed the %d the host copy list holds", clock,
        copies.size(), state_.host_copy_capacity));
  }
  Device& device = state_.device;
  // The previous step's list may still be read from the staging.
  KVBLOCK_RETURN_IF_ERROR(device.WaitEvent(state_.host_copies_done));
  auto* staging = static_cast<HostCopy*>(state_.host_copy_staging.data());
  std::copy(copies.begin(), copies.end(), staging);
  const PagedKvConfig& kv = state_.config.kv;
  KVBLOCK_RETURN_IF_ERROR(kvblock::RunHostCopies(
      device, KvPool{.config = kv, .data = state_.kv_pool.data()},
      HostKvPool{.data = state_.host_kv.data(),
                 .num_pages = state_.config.manager.host_pages},
      staging, static_cast<int64_t>(copies.size()), nullptr));
  return device.RecordEvent(state_.host_copies_done, nullptr);
}

}  // namespace kvblock::sim
