// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/serve.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace kvblock::sim {

absl::StatusOr<std::optional<int64_t>> LineFeed::Next(
    const FeedReport& report, std::deque<Request>& arrivals) {
  if (at_horizon_) at_horizon_();
  // Integers only: formatted directly, without a JSON library here.
  out_ << absl::StrFormat(
              "{\"clock\":%d,\"kv_event_batches\":%d,\"running\":%d,"
              "\"waiting\":%d,\"completed\":%d,\"rejected\":%d}",
              report.clock, report.kv_event_batches, report.running,
              report.waiting, report.completed, report.rejected)
       << std::endl;
  if (!out_) {
    return absl::InternalError(
        "serve output: write failed (the router closed kvblock-sim's stdout?)");
  }

  // Finished requests' ids may be reused: the set holds the run's others.
  for (const std::string& id : report.finished_ids) ids_.erase(id);

  // The arrivals are validated whole before any is handed over: a bad line
  // ends the run with nothing of its window half-taken.
  std::deque<Request> window;
  int64_t earliest = horizon_;
  std::string line;
  while (std::getline(in_, line)) {
    ++line_number_;
    const auto error = [&](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrFormat("serve input: line %d: %s", line_number_, message));
    };
    absl::StatusOr<TraceLine> parsed =
        ParseTraceLine(line, limits_, /*allow_run_until=*/true);
    if (!parsed.ok()) return error(parsed.status().message());
    if (parsed->run_until.has_value()) {
      if (*parsed->run_until <= horizon_) {
        return error(absl::StrFormat("run_until: %d does not pass step %d",
                                     *parsed->run_until, horizon_));
      }
      if (!window.empty() && window.back().arrival >= *parsed->run_until) {
        return error(absl::StrFormat(
            "run_until: %d is not after the arrival of '%s' (step %d)",
            *parsed->run_until, window.back().id, window.back().arrival));
      }
      horizon_ = *parsed->run_until;
      for (Request& request : window) arrivals.push_back(std::move(request));
      return horizon_;
    }
    if (!parsed->request.has_value()) continue;
    Request& request = *parsed->request;
    if (request.arrival < earliest) {
      return error(absl::StrFormat(
          "arrival: %d is before step %d (the last horizon or arrival)",
          request.arrival, earliest));
    }
    if (!ids_.insert(request.id).second) {
      return error(absl::StrFormat(
          "id: \"%s\" is in use: a request with it has not finished",
          request.id));
    }
    earliest = request.arrival;
    window.push_back(std::move(request));
  }
  if (in_.bad()) return absl::InternalError("serve input: read failed");
  for (Request& request : window) arrivals.push_back(std::move(request));
  return std::nullopt;
}

}  // namespace kvblock::sim
