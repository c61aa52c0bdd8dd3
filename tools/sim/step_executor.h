// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// StepExecutor: runs a step of kvblock-sim's serving loop through the
// library (scheduler.h, steps 4 and 5). Commit has the StepPlanner plan the
// step and commits the plan through BatchCommit as one transaction; when the
// pool runs out (ResourceExhausted, everything rolled back) the most
// recently admitted request gives way and the step is planned and committed
// again: first this step's admissions, latest first (they stay queued), then
// running requests, preempted and re-queued, or rejected when one ran alone.
// RunDevice then uploads the page table, runs the step's host-tier copies
// (RunHostCopies between the KV pool and the pinned host pages) and its
// copy-on-write copies through the copy kernel on the KV pool.
//
// Host time: the executor times none of the library calls it makes. The
// commits (and their plans) are part of the step's planning phase, which
// BatchCommit's own phase times are taken out of (RunMetrics); RunDevice
// ends the upload phase and the copy-on-write phase on the run's HostClock.
//
// Complexity: each commit is the library's; a step that does not fit the
// pool is planned and committed again once per request that gives way.
// Thread safety: thread-compatible; the scheduler's thread owns it.
#ifndef KVBLOCK_TOOLS_SIM_STEP_EXECUTOR_H_
#define KVBLOCK_TOOLS_SIM_STEP_EXECUTOR_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/batch_commit.h"
#include "sim/request_queue.h"
#include "sim/run_metrics.h"
#include "sim/scheduler.h"
#include "sim/scheduler_state.h"
#include "sim/step_planner.h"

namespace kvblock::sim {

class StepExecutor {
 public:
  // All must outlive the executor.
  StepExecutor(SchedulerState& state, StepPlanner& planner,
               RequestQueue& requests, RunMetrics& metrics);

  // Plans and commits step `clock`, letting requests give way until it fits
  // the pool; the planner's rejections leave the queue on the way. nullopt
  // when there is nothing to commit. Internal for any other commit error
  // (the message names the step), or when the pool runs out with nothing
  // left to give way; the planner's errors.
  absl::StatusOr<std::optional<StepResult>> Commit(int64_t clock);
  // The plan Commit committed last.
  const PlannedStep& plan() const { return plan_; }
  // Of the step Commit committed last: requests preempted to make it fit,
  // and whether a commit of it ran out of pages.
  int32_t preemptions() const { return preemptions_; }
  bool pages_ran_out() const { return pages_ran_out_; }

  // Uploads the page table and runs committed step `clock`'s `host_copies`
  // (the host tier's, stores then loads) and `copies` (copy-on-write),
  // ending the upload, host-copy and copy-on-write phases on the run's
  // HostClock. Internal for more copies than a list holds; the device's
  // errors.
  absl::Status RunDevice(absl::Span<const PageCopy> copies,
                         absl::Span<const HostCopy> host_copies, int64_t clock);

 private:
  // The latest admitted running request gives way after the pool ran out:
  // preempted and re-queued, or rejected when it ran alone.
  absl::Status GiveWay(int64_t clock);
  // Stages `copies` and runs the copy kernel over them.
  absl::Status RunCopies(absl::Span<const PageCopy> copies, int64_t clock);
  // Stages `copies` and runs them between the pool and the host tier.
  absl::Status RunHostCopies(absl::Span<const HostCopy> copies, int64_t clock);

  SchedulerState& state_;
  StepPlanner& planner_;
  RequestQueue& requests_;
  RunMetrics& metrics_;
  PlannedStep plan_;
  // The sequences of the requests that gave way in this step: they leave in
  // every plan of it after that.
  std::vector<SequenceId> gave_way_finished_;
  std::vector<SequenceId> gave_way_preempted_;
  int32_t preemptions_ = 0;
  bool pages_ran_out_ = false;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_STEP_EXECUTOR_H_
