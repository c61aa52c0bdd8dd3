// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// RunMetrics: the report of a kvblock-sim run (SimResult) built as the run
// goes, as vLLM's SchedulerStats are fed from each step's output: every
// committed step's StepResult with the manager's stats before and after it,
// every request that completes or is rejected, the drafts verified and the
// KV event batches handed over; Finish adds the library's totals
// (BlockManagerStats, BatchCommit's phase times, the page table's uploads).
//
// HostClock: the host time of the steps, read at the boundaries of their
// phases and nowhere else, so that no library call inside a phase is timed
// on its own. A step is one stretch of time from its start to the end of
// its device work, cut into phases; BatchCommit times the parts of its
// Commit itself (CommitPhaseTimes), and Finish takes that time out of the
// phase it ran in (planning), where the give-way retries commit.
//
// Complexity: O(1) per step and per request (StepHistogram::Add), plus a
// record per step with SchedulerConfig::keep_timeline; Finish is O(cached
// pages) with KV events on.
// Thread safety: thread-compatible; the scheduler's thread owns both.
#ifndef KVBLOCK_TOOLS_SIM_RUN_METRICS_H_
#define KVBLOCK_TOOLS_SIM_RUN_METRICS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/kv_events.h"
#include "sim/request_state.h"
#include "sim/scheduler.h"
#include "sim/scheduler_state.h"
#include "sim/step_histogram.h"

namespace kvblock::sim {

class HostClock {
 public:
  // A phase begins now: the first of a step, or one outside the steps.
  void Start() { last_ = std::chrono::steady_clock::now(); }
  // The phase begun at the last Start or Lap ends now, its time added to
  // `phase`; the next phase begins.
  void Lap(int64_t HostPhases::*phase);
  const HostPhases& phases() const { return phases_; }

 private:
  std::chrono::steady_clock::time_point last_ =
      std::chrono::steady_clock::now();
  HostPhases phases_;
};

// What the scheduler did in a committed step, beside its StepResult.
struct StepSummary {
  int64_t step = 0;  // the scheduler clock.
  int32_t preemptions = 0;
  int32_t waiting = 0;  // requests queued after it.
  StepLimit limit = StepLimit::kNone;
  // Pages that hold nothing but draft slots after it (0 without drafts).
  int32_t draft_only_pages = 0;
};

class RunMetrics {
 public:
  // For a run of `config` over `requests` requests (more may be fed).
  RunMetrics(const SchedulerConfig& config, int64_t requests);

  void AddRequests(int64_t count) { result_.requests += count; }
  // `request` ran to max_tokens.
  void Complete(const RequestState& request);
  // `request` can never run, for `reason`.
  void Reject(const Request& request, RejectedRequest::Kind kind,
              std::string reason);
  // Tokens a preemption threw away, to be generated again.
  void AddRecomputedTokens(int64_t tokens) {
    result_.recomputed_tokens += tokens;
  }
  // Drafts verified and proposed in a step, over a request's sequences.
  void AddDrafts(int64_t accepted, int64_t proposed) {
    result_.drafts_accepted += accepted;
    result_.drafts_proposed += proposed;
  }
  // A batch handed to the KV event sink.
  void AddKvEventBatch(const KvEventBatch& batch);
  // A committed step: its result, the manager's stats before and after it
  // (its planning and commit), and what the scheduler did in it.
  void AddStep(const StepResult& step, const BlockManagerStats& before,
               const BlockManagerStats& after, const StepSummary& summary);

  // With KV cache groups, after AddStep: when the pages in use reach a new
  // peak, each group's share of them (SimResult::pages_by_group).
  absl::Status NoteGroupPages(const SchedulerState& state);

  HostClock& host_clock() { return host_clock_; }
  int64_t requests() const { return result_.requests; }
  int64_t steps() const { return result_.steps; }
  int64_t completed() const { return result_.completed; }
  int64_t rejected() const { return result_.num_rejected(); }
  int64_t kv_event_batches() const { return result_.kv_events.batches; }

  // The report, with the totals of `state`'s library objects after the run
  // and the run's wall time and scheduler-thread CPU time. Call once.
  SimResult Finish(const SchedulerState& state, double wall_seconds,
                   int64_t scheduler_thread_ns);

 private:
  // The host time by phase, BatchCommit's parts split out of planning.
  void FinishHostTime(const CommitPhaseTimes& commit);
  // The prefix cache at the end, for a subscriber that rebuilt it.
  void FinishKvEvents(const BlockManager& manager);
  // The steps' uploads: the page table's, less the one at start-up.
  void FinishUploads(const SchedulerState& state);
  // The modelled time of `copies` host-tier copies (the config's bandwidth).
  int64_t HostCopyNanos(int64_t copies) const;

  // The highest pages in use NoteGroupPages saw, and its scratch: by page,
  // the last count (its serial) that saw it.
  int32_t group_peak_ = 0;
  std::vector<uint32_t> seen_;
  uint32_t serial_ = 0;

  const SchedulerConfig& config_;
  // Bytes a host-tier copy moves (SchedulerConfig::host_page_bytes).
  const int64_t host_page_bytes_;
  SimResult result_;
  HostClock host_clock_;
  double pages_used_sum_ = 0;  // over committed steps.
  // Of completed requests: queue waits, steps to the first token, steps
  // that computed the prompt.
  StepHistogram queue_waits_;
  StepHistogram first_token_waits_;
  StepHistogram prompt_steps_;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_RUN_METRICS_H_
