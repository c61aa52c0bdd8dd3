// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Soak: random scheduler steps through the whole library (BlockManager,
// BatchCommit, KVPageTable with its uploads, on the host device), for a
// number of operations or seconds, checking after every step what must
// always hold:
//   - the invariants of the commit layer, the manager, the pool and the
//     table (BatchCommit::CheckInvariants);
//   - the uploaded device table equals the host rows (K ids, V = K +
//     num_pages, -1 past the live ids);
//   - a refused step changed nothing (manager snapshot, every host row,
//     the slot order).
// Steps are drawn from one seeded generator: sequences finish and are
// preempted at random, prompts join (from a few shared prefixes and salts,
// so the prefix cache hits and evicts), running sequences fork, everyone
// appends 1 to 4 tokens, and one step in 16 is first tried in an invalid
// form (a stale or unknown id, a bad count, a duplicate join, a fork of a
// leaving sequence), which must fail with its code and change nothing. A
// step that runs out of pages is retried without its joins, then with the
// latest running sequences preempted.
//
// Optionally with a host tier (its copy lists taken every step, as a
// scheduler runs them) and KV cache events (taken every step). The report
// gives the process's peak resident memory after the first tenth of the run
// and at its end: a leak shows as growth between the two.
//
// An operation is one element of a plan (a leave, a join, an append) or one
// refused invalid plan. Public API only.
//
// Thread safety: one thread per Soak.
#ifndef KVBLOCK_TOOLS_SOAK_SOAK_H_
#define KVBLOCK_TOOLS_SOAK_SOAK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvblock/block_hash.h"
#include "kvblock/config.h"

namespace kvblock::soak {

struct SoakOptions {
  uint64_t seed = 1;
  int64_t max_operations = 1'000'000;  // stop after this many (0: no limit).
  double max_seconds = 0;              // stop after this long (0: no limit).
  // Geometry: small, so pages run out and the cache evicts.
  int32_t num_pages = 96;
  int32_t page_size = 4;
  int32_t max_batch = 16;
  int32_t max_pages_per_seq = 12;
  bool prefix_caching = true;
  HashAlgorithm hash = HashAlgorithm::kXxh3_128;
  int32_t host_pages = 0;  // the host tier's pages (0: none).
  bool kv_events = false;  // record KV cache events, taken every step.
};

struct SoakReport {
  int64_t operations = 0;
  int64_t steps = 0;          // committed steps.
  int64_t refused_steps = 0;  // commits that failed (valid or invalid plans).
  // Refused commits by status code name ("RESOURCE_EXHAUSTED", ...).
  std::map<std::string, int64_t> failures_by_code;
  int64_t invariant_checks = 0;
  int64_t host_copies = 0;  // listed by the committed steps.
  int64_t kv_changes = 0;   // the KV cache events' changes taken.
  // Peak resident memory (getrusage), after the first tenth of the
  // operations or seconds (0 for a run without a limit), and at the end.
  int64_t peak_rss_kb_at_tenth = 0;
  int64_t peak_rss_kb = 0;
  int64_t violations = 0;
  std::string first_violation;  // empty when none.
  double seconds = 0;
};

// Runs a soak. InvalidArgument for options the library refuses (the
// geometry) or a negative limit; Internal when the library fails in a way
// the soak does not plan for (that, like a violation, is a finding).
absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options);

// The report as readable lines.
std::string FormatReport(const SoakReport& report);

}  // namespace kvblock::soak

#endif  // KVBLOCK_TOOLS_SOAK_SOAK_H_
