// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock-sim --serve: the RequestFeed a router drives over a pipe, so that
// several simulator processes serve one trace as replicas behind it
// (tools/router). Input, JSON Lines (a line each, read from `in`):
//
//   {"id": "r1", "arrival": 40, "prompt": [...], "max_tokens": 8}  a request
//   {"run_until": 52}                              run the steps before 52
//
// Requests are in the trace format (tools/sim/README.md), each arriving at
// or after the last horizon (0 at first) and in arrival order, with an id no
// unfinished request of the run has (a finished request's id may be reused:
// the feed keeps the ids of the requests handed over until a report lists
// them in FeedReport::finished_ids, so its memory is bounded by the requests
// in flight); a horizon must pass the last. Before each horizon is read
// (first at step 0) the run's state goes to `out`, a line, flushed:
//
//   {"clock": 52, "kv_event_batches": 17, "running": 3, "waiting": 0,
//    "completed": 9, "rejected": 0}
//
// so that the router knows the steps before `clock` are done and how many
// KV event batches they handed to the publisher (it waits for those on its
// subscription before it routes again). End of input ends the feed.
// `at_horizon`, when set, runs just before each state line (kvblock-sim
// refreshes its metrics there: a scrape after the line sees them).
//
// Errors: a bad line is InvalidArgument "serve input: line N: FIELD: ..."
// and ends the run; a failed write is Internal.
// Thread safety: thread-compatible, used by the scheduler's thread.
#ifndef KVBLOCK_TOOLS_SIM_SERVE_H_
#define KVBLOCK_TOOLS_SIM_SERVE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "sim/scheduler.h"
#include "sim/trace.h"

namespace kvblock::sim {

class LineFeed final : public RequestFeed {
 public:
  LineFeed(std::istream& in, std::ostream& out, TraceLimits limits,
           std::function<void()> at_horizon = {})
      : in_(in),
        out_(out),
        limits_(limits),
        at_horizon_(std::move(at_horizon)) {}

  absl::StatusOr<std::optional<int64_t>> Next(
      const FeedReport& report, std::deque<Request>& arrivals) override;

 private:
  std::istream& in_;
  std::ostream& out_;
  const TraceLimits limits_;
  const std::function<void()> at_horizon_;
  int64_t line_number_ = 0;
  int64_t horizon_ = 0;
  // The ids of the requests handed over and not yet reported finished.
  absl::flat_hash_set<std::string> ids_;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_SERVE_H_
