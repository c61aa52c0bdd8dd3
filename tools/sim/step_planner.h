// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// StepPlanner: plans one step of kvblock-sim's serving loop (scheduler.h,
// steps 2 and 3), as vLLM v1's Scheduler.schedule() builds a fresh
// SchedulerOutput: from the running requests and the waiting queue, which it
// only reads, and the library's read-only queries (BlockManager::
// PlanAdmission and NumAllocatable, BatchCommit::AppendPages), it rebuilds a
// PlannedStep: the StepPlan to commit and what each request does in the
// step. It changes neither the library nor the requests; applying the plan
// is the caller's (StepExecutor commits it, RequestQueue::ApplyStep updates
// the requests), so a step that does not fit the pool is planned again with
// fewer admissions.
//
// Complexity: O(running sequences + queued requests looked at) plus the
// library's queries. A PlannedStep's buffers are reserved for max_batch and
// reused from step to step: steady-state planning allocates no memory but a
// rejected request's reason.
// Thread safety: thread-compatible; one thread owns a planner.
#ifndef KVBLOCK_TOOLS_SIM_STEP_PLANNER_H_
#define KVBLOCK_TOOLS_SIM_STEP_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "sim/request_state.h"
#include "sim/scheduler.h"

namespace kvblock::sim {

// What a running request does in a planned step.
struct RunningPlan {
  // It has generated max_tokens: every sequence leaves.
  bool finishing = false;
  int32_t drop = -1;  // the index of the beam it drops (-1: none).
  int32_t fork = -1;  // the index of the beam it forks (-1: none).
  // Its prompt is done: the other samples fork now, each with its first
  // token.
  bool samples_fork = false;
  // The id of the forked beam, or of the first sample forked now.
  SequenceId fork_id = 0;
  int64_t chunk = 0;       // the prompt tokens it computes (chunked prefill).
  int32_t accepted = 0;    // of the drafts it held, those accepted.
  int32_t appends = 0;     // tokens each sequence appends.
  int32_t new_drafts = 0;  // draft slots each sequence then holds.
};

// A request the plan admits from the queue head.
struct PlannedAdmission {
  SequenceId first_id = 0;     // sample i gets first_id + i.
  int64_t planned_prompt = 0;  // its prompt tokens done after the step.
};

// A queued request the planner found can never run.
struct PlannedRejection {
  size_t waiting_index = 0;  // in the queue the plan was made from.
  RejectedRequest::Kind kind = RejectedRequest::Kind::kPoolTooSmall;
  std::string reason;
};

// One planned step. step_plan() views the buffers below; a PlannedStep is
// not copied, so that the joins' views into fork_tokens stay valid.
struct PlannedStep {
  explicit PlannedStep(int32_t max_batch);
  PlannedStep(const PlannedStep&) = delete;
  PlannedStep& operator=(const PlannedStep&) = delete;

  // What BatchCommit::Commit takes.
  StepPlan step_plan() const;
  // Nothing to commit: nothing runs, joins or leaves.
  bool empty() const {
    return running.empty() && joins.empty() && finished.empty();
  }

  // By index of the running requests planned from.
  std::vector<RunningPlan> running;
  // The requests at the queue head it admits, once the rejected ones are
  // taken out of the queue, in order.
  std::vector<PlannedAdmission> admissions;
  std::vector<PlannedRejection> rejections;  // in queue order.
  StepLimit limit = StepLimit::kNone;        // what stopped the admissions.
  // The next sequence id after the step's forks and admissions.
  SequenceId next_sequence_id = 0;

  // The StepPlan's contents.
  std::vector<SequenceId> finished;
  std::vector<SequenceId> preempted;
  std::vector<JoinRequest> joins;
  std::vector<TokenId> fork_tokens;  // reserved: joins view into it.
  std::vector<int32_t> append_counts;
  std::vector<TokenId> append_tokens;
  std::vector<int32_t> draft_counts;  // per slot; empty without drafts.
  std::vector<PromptChunk> prompt_chunks;
};

// What a plan is made from.
struct PlanInput {
  absl::Span<RequestState* const> running = {};        // in admission order.
  const std::deque<RequestState*>* waiting = nullptr;  // FCFS.
  // The sequences of this step's requests that gave way while it was
  // committed (StepExecutor): they leave in every plan after that.
  absl::Span<const SequenceId> gave_way_finished = {};
  absl::Span<const SequenceId> gave_way_preempted = {};
  SequenceId next_sequence_id = 0;  // the first id the step's joins take.
  // The most requests it admits.
  int64_t admit_limit = std::numeric_limits<int64_t>::max();
};

class StepPlanner {
 public:
  // All must outlive the planner.
  StepPlanner(const SchedulerConfig& config, const BlockManager& manager,
              const BatchCommit& commit);

  // Rebuilds `plan` from `input` alone (nothing of an earlier plan is kept
  // but its buffers' capacity). Errors are the library queries' (the
  // requests' prompt hashes, the running slots): the scheduler does not
  // plan for them.
  absl::Status Plan(const PlanInput& input, PlannedStep& plan);

 private:
  // The leaving, appending, drafting, prefilling and forking sequences of
  // the running requests.
  void PlanRunning(const PlanInput& input, PlannedStep& plan);
  // The decode of running request `index` (its prompt done): the tokens it
  // appends, its drafts, the beam or sample forks.
  void PlanDecode(const RequestState& r, int32_t index, int64_t batch_after,
                  PlannedStep& plan);
  // Gives decoding requests their drafts and prefilling ones their chunks
  // from the token budget left after one token per decoding sequence.
  void PlanBudget(const PlanInput& input, PlannedStep& plan);
  // The appends, drafts and chunks by slot, and the pages they may take.
  absl::Status PlanSlots(const PlanInput& input, PlannedStep& plan);
  // Admissions from the queue head; rejects the requests that never fit.
  absl::Status PlanAdmissions(const PlanInput& input, PlannedStep& plan);
  // Running sequences once the planned ones have left.
  int64_t BatchAfterLeaving(const PlannedStep& plan) const;

  const SchedulerConfig& config_;
  const PagedKvConfig& kv_;
  const BlockManager& manager_;
  const BatchCommit& commit_;

  // Scratch of the plan being made, reset by Plan.
  // The running sequences that append or take a prompt chunk.
  struct Stepping {
    int32_t running_index = 0;
    int32_t sample = 0;
  };
  absl::flat_hash_map<SequenceId, Stepping> stepping_;
  std::vector<int32_t> page_counts_;  // per slot: appends and chunks.
  int32_t forks_ = 0;
  int32_t held_seats_ = 0;    // for samples forking once their prompt is done.
  int64_t budget_ = 0;        // tokens the step has left to compute.
  int64_t append_pages_ = 0;  // pages the step's appends may allocate.
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_STEP_PLANNER_H_
