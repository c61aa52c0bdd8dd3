// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// RequestQueue: the requests of a kvblock-sim run and where each one is: not
// yet arrived (by arrival step, ties in trace order), waiting in the FCFS
// queue, running (in admission order), or done: completed or rejected, and
// released by the end of its step, so that a served run's memory does not
// grow with the requests it has finished. It takes a RequestFeed's arrivals
// (Serve), applies a committed step's plan to the requests (ApplyStep, as
// vLLM's Scheduler.update_from_output applies a step's output), and records
// completions and rejections in the run's RunMetrics.
//
// Pointers to a RequestState stay valid until it is released (the states
// are in a deque: arrivals and releases at its ends move nothing).
// Complexity: O(1) per arrival and per release; ApplyStep is O(running
// sequences + admissions).
// Thread safety: thread-compatible; the scheduler's thread owns it.
#ifndef KVBLOCK_TOOLS_SIM_REQUEST_QUEUE_H_
#define KVBLOCK_TOOLS_SIM_REQUEST_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/block_manager.h"
#include "sim/request_state.h"
#include "sim/run_metrics.h"
#include "sim/scheduler.h"
#include "sim/step_planner.h"
#include "sim/trace.h"

namespace kvblock::sim {

class RequestQueue {
 public:
  // Over `requests` (which must outlive it), sorted by arrival; `metrics`
  // must outlive it too.
  RequestQueue(absl::Span<const Request> requests, int32_t max_batch,
               RunMetrics& metrics);

  // The next request that has arrived by step `clock` and is not yet
  // queued, taken from the arrivals (the caller queues it); null when none.
  RequestState* NextArrival(int64_t clock);
  // The step at which the next request arrives; nullopt when none is left.
  std::optional<int64_t> next_arrival_step() const;
  void Enqueue(RequestState& request) { waiting_.push_back(&request); }

  // Reports where the run stands at `clock` to `feed` and takes the
  // requests it hands over; returns its next horizon, nullopt when it has
  // ended. Internal when the feed breaks its contract (an arrival outside
  // its window, a horizon that does not pass `clock`); the feed's errors.
  absl::StatusOr<std::optional<int64_t>> ReadFeed(RequestFeed& feed,
                                                  int64_t clock);

  // Takes the requests `plan` rejected out of the queue, as rejected.
  void RejectPlanned(const PlannedStep& plan);
  // Applies committed step `clock`'s `plan` to the requests: completions
  // leave, sequences fork and drop, tokens, chunks and drafts are counted,
  // admissions move from the queue to the batch. The manager's errors
  // (reading an admission's prompt progress).
  absl::Status ApplyStep(const PlannedStep& plan, int64_t clock,
                         const BlockManager& manager);

  // The latest admitted running request, taken out of the batch (to give
  // way). REQUIRES: running() is not empty.
  RequestState& PopLatestRunning();
  // Back at the front of the queue (a preempted request).
  void Requeue(RequestState& request) { waiting_.push_front(&request); }
  // Records that `request` can never run and marks it done; the caller
  // takes it out of the queue or the batch.
  void Reject(RequestState& request, RejectedRequest::Kind kind,
              std::string reason);
  // Frees what the run holds of the requests done since the last call.
  void ReleaseDone();

  // Pages that hold nothing but draft slots, over the running sequences.
  int32_t DraftOnlyPages(int32_t page_size) const;
  bool idle() const { return waiting_.empty() && running_.empty(); }
  absl::Span<RequestState* const> running() const { return running_; }
  const std::deque<RequestState*>& waiting() const { return waiting_; }
  // The first id the next step's joins take.
  SequenceId next_sequence_id() const { return next_sequence_id_; }

 private:
  // ApplyStep's parts: the running requests, then the admitted ones.
  void ApplyRunning(const PlannedStep& plan, int64_t clock);
  absl::Status ApplyAdmissions(const PlannedStep& plan, int64_t clock,
                               const BlockManager& manager);
  // Marks a completed or rejected request done, for ReleaseDone.
  void Done(RequestState& request);

  RunMetrics& metrics_;
  // By arrival, ties in trace order, from the first not yet done (those
  // before are dropped); a deque, so that the feed's arrivals and the drops
  // leave the queue's and the batch's pointers valid.
  std::deque<RequestState> requests_;
  size_t next_arrival_ = 0;
  // The feed's requests, each the `owned` of the state at the same index of
  // requests_ (a served run has no others).
  std::deque<Request> fed_;
  // Requests done since the last ReleaseDone, and the ids of the feed's
  // ones released since the last report to the feed.
  std::vector<RequestState*> done_;
  std::vector<std::string> finished_ids_;
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;        // in admission order.
  std::vector<RequestState*> still_running_;  // ApplyStep's scratch.
  SequenceId next_sequence_id_ = 0;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_REQUEST_QUEUE_H_
