// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock-soak: random scheduler steps through the whole library for a number
// of operations or seconds, checking invariants after every step (see
// soak.h). Prints operations, steps, refusals by code, invariant checks,
// host copies, KV events, peak resident memory and violations.
//
// Exit codes: 0 no violation; 1 a violation or an unplanned library failure
// (a finding: the message says which step); 2 bad input (a flag).
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "cli/flags.h"
#include "soak/soak.h"

ABSL_FLAG(int64_t, ops, 1'000'000,
          "stop after this many operations (0: no limit)");
ABSL_FLAG(double, seconds, 0, "stop after this many seconds (0: no limit)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random steps");
ABSL_FLAG(int32_t, pages, 96, "KV pages in the pool");
ABSL_FLAG(int32_t, page_size, 4, "tokens per page");
ABSL_FLAG(int32_t, max_batch, 16, "most sequences running at once");
ABSL_FLAG(int32_t, max_pages_per_seq, 12, "most pages of one sequence");
ABSL_FLAG(bool, prefix_caching, true, "share full pages of equal prefixes");
ABSL_FLAG(std::string, hash, "xxh3", "prefix-cache hash: sha256 or xxh3");
ABSL_FLAG(int32_t, host_pages, 0,
          "pages of the host tier (0: none; needs prefix caching)");
ABSL_FLAG(bool, kv_events, false, "record KV cache events, taken every step");

int main(int argc, char** argv) {
  if (const std::optional<int> exit_code = kvblock::cli::ParseFlags(
          argc, argv, "kvblock-soak",
          "runs random scheduler steps through kvblock and checks its "
          "invariants "
          "after every step.\n"
          "  kvblock-soak --ops=100000000\n"
          "  kvblock-soak --seconds=60 --seed=7 --pages=48\n"
          "Exit codes: 0 no violation, 1 a finding, 2 bad input.",
          "soak/soak_main.cc", std::cout, std::cerr)) {
    return *exit_code;
  }
  kvblock::soak::SoakOptions options;
  options.max_operations = absl::GetFlag(FLAGS_ops);
  options.max_seconds = absl::GetFlag(FLAGS_seconds);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.num_pages = absl::GetFlag(FLAGS_pages);
  options.page_size = absl::GetFlag(FLAGS_page_size);
  options.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.max_pages_per_seq = absl::GetFlag(FLAGS_max_pages_per_seq);
  options.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  options.host_pages = absl::GetFlag(FLAGS_host_pages);
  options.kv_events = absl::GetFlag(FLAGS_kv_events);
  const std::string hash = absl::GetFlag(FLAGS_hash);
  if (hash == "sha256") {
    options.hash = kvblock::HashAlgorithm::kSha256;
  } else if (hash == "xxh3") {
    options.hash = kvblock::HashAlgorithm::kXxh3_128;
  } else {
    std::cerr << "kvblock-soak: --hash must be sha256 or xxh3, got '" << hash
              << "'\n";
    return 2;
  }
  if (options.page_size * int64_t{options.max_pages_per_seq} < 16) {
    std::cerr << "kvblock-soak: --page_size x --max_pages_per_seq must hold "
                 "at least 16 tokens\n";
    return 2;
  }
  const absl::StatusOr<kvblock::soak::SoakReport> report =
      kvblock::soak::RunSoak(options);
  if (!report.ok()) {
    std::cerr << "kvblock-soak: " << report.status().message() << '\n';
    const absl::StatusCode code = report.status().code();
    return code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kResourceExhausted
               ? 2
               : 1;
  }
  std::cout << kvblock::soak::FormatReport(*report);
  return report->violations == 0 ? 0 : 1;
}
