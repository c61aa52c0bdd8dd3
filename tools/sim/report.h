// Copyright 2026 The kvblock Authors.
//
// The report of a kvblock-sim run: a readable summary for people (stdout) and
// the same numbers as one JSON object for machines (--json).
//
// JSON fields: requests, completed, rejected (a count), rejected_requests
// ([{id, reason}]), prompt_tokens, prefix_hit_tokens, prefix_hit_rate (0..1),
// generated_tokens, steps, preemptions, cow_copies, evictions, num_pages,
// peak_pages_used, mean_pages_used, host_ns_total, host_ns_per_step,
// host_ns_per_sequence_step (per running sequence per step), sequence_steps,
// host_ns_by_phase ({planning, admissions, appends, frees, bookkeeping,
// page_table, upload, copy_on_write}: HostPhases, summing to host_ns_total),
// wall_seconds, tokens_per_second and steps_per_second (of wall time; tokens
// are prompt plus generated), upload_copies, upload_bytes, upload_entries,
// upload_ranges, upload_bytes_per_step, table_setup_ns (the whole-table
// upload at start-up, not in host_ns_total), source, device, and config (the
// geometry and options of the run). The meaning of each
// count is SimResult's.
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

// The readable report.
void PrintReport(const SimResult& result, const RunSetup& setup,
                 std::ostream& out);

// The JSON report, one object and a newline.
void WriteJsonReport(const SimResult& result, const RunSetup& setup,
                     std::ostream& out);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_REPORT_H_
