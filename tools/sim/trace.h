// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Traces of kvblock-sim: the requests a simulated serving engine receives, read
// from and written to JSON Lines (for users: tools/sim/README.md, "Trace
// format"), one request a line:
//
//   {"id": "r1", "arrival": 0, "prompt": [1, 2, 3], "max_tokens": 128,
//    "n": 1, "output": [7, 8]}
//
// Fields: `id` (non-empty string, unique in the trace), `prompt` (non-empty
// array of token ids >= 0), `max_tokens` (tokens to generate, >= 1) are
// required; `arrival` (scheduler step, default 0), `n` (parallel samples,
// default 1), `beam` (beam width W, default 1; exclusive with n > 1), `output`
// (the first sample's tokens, at most max_tokens of them) and `cache_salt`
// (per-tenant prefix-cache salt, a string) are optional. Unknown fields are
// ignored; blank lines are skipped.
//
// Limits that depend on the simulated engine (TraceLimits): a request must be
// able to finish alone, so `prompt + max_tokens` tokens fit one sequence
// (max_pages_per_seq * page_size), and `n` and `beam` fit the batch. Numbers
// beyond those or beyond kMaxArrival are rejected as absurd. Any bad line
// fails the whole parse (nothing is half-run) with InvalidArgument naming the
// line number and the field.
//
// Generated tokens: sample 0 generates `output` while it lasts; every other
// token is GeneratedToken(), a fixed function of (id, sample, position), so a
// run is reproducible across processes and machines.
//
// Complexity: parsing and writing are linear in the trace's size.
// Thread safety: plain functions over values; no shared state.
#ifndef KVBLOCK_TOOLS_SIM_TRACE_H_
#define KVBLOCK_TOOLS_SIM_TRACE_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/types.h"

namespace kvblock::sim {

// Latest arrival step a trace may use (about 30 years of 1 ms steps).
inline constexpr int64_t kMaxArrival = int64_t{1} << 40;

// Token ids GeneratedToken() draws from: [0, kGeneratedVocab).
inline constexpr TokenId kGeneratedVocab = 32000;

struct Request {
  std::string id = {};
  int64_t arrival = 0;  // the scheduler step it arrives at.
  std::vector<TokenId> prompt = {};
  int64_t max_tokens = 0;            // tokens each sample (or beam) generates.
  int32_t n = 1;                     // parallel samples, forks of the first.
  int32_t beam = 1;                  // beam width; 1 = no beam search.
  std::vector<TokenId> output = {};  // sample 0's first tokens (maybe fewer).
  std::string cache_salt = {};

  friend bool operator==(const Request&, const Request&) = default;
};

// What the simulated engine can run at all.
struct TraceLimits {
  int64_t max_tokens_per_seq = 0;  // prompt + max_tokens, at most.
  int32_t max_samples = 0;         // n and beam, at most (the batch).
};

// The token sample `sample` of `request` generates at `position` (0 = its
// first generated token): `output[position]` for sample 0 while the output
// lasts, otherwise a hash of (id, sample, position) in [0, kGeneratedVocab).
TokenId GeneratedToken(const Request& request, int32_t sample,
                       int64_t position);

// OK when `request` is runnable under `limits`; InvalidArgument naming the
// first bad field (e.g. "max_tokens: ...", "prompt[4]: ...") otherwise.
absl::Status ValidateRequest(const Request& request, const TraceLimits& limits);

// ValidateRequest for each request plus unique ids; the message names the
// request by id and index.
absl::Status ValidateRequests(absl::Span<const Request> requests,
                              const TraceLimits& limits);

// One line of JSON Lines requests, parsed: nothing for a blank line, else a
// request (ValidateRequest'ed against `limits`) or, when `allow_run_until`
// (kvblock-sim --serve's input, tools/sim/serve.h), the control object
// {"run_until": T} with T in [0, kMaxArrival].
struct TraceLine {
  std::optional<Request> request;
  std::optional<int64_t> run_until;
};

// InvalidArgument "FIELD: ..." (the caller names the line) for bad JSON, a
// value that is not an object, or a bad request or control object.
absl::StatusOr<TraceLine> ParseTraceLine(absl::string_view line,
                                         const TraceLimits& limits,
                                         bool allow_run_until);

// Reads a JSON Lines trace. InvalidArgument "line N: FIELD: ..." for the
// first bad line (bad JSON, not an object, a missing or mistyped field, a
// value out of range, a duplicate id); nothing is returned then. Internal
// when reading the stream fails.
absl::StatusOr<std::vector<Request>> ParseTrace(std::istream& in,
                                                const TraceLimits& limits);

// ParseTrace of the file at `path`, whose name prefixes any error message;
// NotFound when it cannot be opened.
absl::StatusOr<std::vector<Request>> ReadTraceFile(absl::string_view path,
                                                   const TraceLimits& limits);

// Writes `requests` as JSON Lines that ParseTrace reads back equal (optional
// fields only when they differ from their defaults).
void WriteTrace(absl::Span<const Request> requests, std::ostream& out);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_TRACE_H_
