// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The report of a kvblock-sim run: a readable summary for people (stdout) and
// the same numbers as one JSON object for machines (--json).
//
// Every line of the text and every JSON field is documented for users in
// tools/sim/README.md ("The report"); the meaning of each count is
// SimResult's.
//
// Complexity: linear in the rejected requests.
// Thread safety: plain functions over values.
#ifndef KVBLOCK_TOOLS_SIM_REPORT_H_
#define KVBLOCK_TOOLS_SIM_REPORT_H_

#include <ostream>
#include <string>

#include "sim/scheduler.h"

namespace kvblock::sim {

// What was run, where, and how: the context of a SimResult.
struct RunSetup {
  std::string source;  // e.g. "workload mixed (seed 1)" or "trace t.jsonl".
  std::string device;  // Device::name().
  SchedulerConfig config;
};

// One line naming the run and its configuration, e.g. "workload mixed (seed
// 1) on host: 384 pages x 16 tokens, batch <= 32, 64 pages per sequence, 2048
// tokens per step, prefix caching on (sha256)".
std::string DescribeRun(const RunSetup& setup);

// The readable report.
void PrintReport(const SimResult& result, const RunSetup& setup,
                 std::ostream& out);

// The JSON report, one object and a newline.
void WriteJsonReport(const SimResult& result, const RunSetup& setup,
                     std::ostream& out);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_REPORT_H_
