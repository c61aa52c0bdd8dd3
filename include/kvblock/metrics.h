// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The library's counters and gauges for monitoring: CollectMetrics reads
// them from a manager, and optionally its page table and KV event
// publisher, as a list of metrics; FormatPrometheusText writes such a list
// in the Prometheus text exposition format (version 0.0.4) that serving
// stacks scrape; the Python package's collectors (kvblock.metrics) turn the
// same list into prometheus_client families. Nothing here serves HTTP: an
// engine hands the text to the server it already runs (kvblock-sim --serve
// --metrics_port shows one).
//
// Where vLLM has a metric the name is vLLM's (vllm/v1/metrics/loggers.py at
// 28be48fa), so that dashboards built for vLLM read kvblock:
// vllm:kv_cache_usage_perc (pages in use / pages, a fraction as vLLM's;
// the null page of window groups is in neither, as vLLM's null block),
// vllm:prefix_cache_queries and vllm:prefix_cache_hits (prompt tokens
// admitted, and those served from the cache), vllm:num_preemptions. The
// rest are kvblock_*. Counters are written as NAME_total, their HELP and
// TYPE lines too, as prometheus_client writes the text format 0.0.4.
//
// Thread safety: CollectMetrics reads the manager and the table, so it runs
// where the scheduler's calls do (between steps); the publisher's stats are
// safe from any thread. FormatPrometheusText is a pure function.
#ifndef KVBLOCK_METRICS_H_
#define KVBLOCK_METRICS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/block_manager.h"
#include "kvblock/kv_event_publisher.h"
#include "kvblock/page_table.h"

namespace kvblock {

struct Metric {
  enum class Type { kCounter, kGauge };
  // A Prometheus metric name (a counter's without "_total"), and its help
  // line: static strings.
  absl::string_view name;
  absl::string_view help;
  Type type = Type::kGauge;
  double value = 0;
};

// What CollectMetrics reads; manager is required, the others are left out
// when null.
struct MetricsSources {
  const BlockManager* manager = nullptr;
  const KVPageTable* page_table = nullptr;
  const KvEventPublisherStats* kv_events = nullptr;
};

// The metrics of `sources`, in a fixed order. InvalidArgument when
// sources.manager is null.
absl::StatusOr<std::vector<Metric>> CollectMetrics(
    const MetricsSources& sources);

// One label name and value, carried by every sample (vLLM's are model_name
// and engine).
using MetricLabel = std::pair<std::string, std::string>;

// `metrics` in the Prometheus text format, each sample with `labels` (in
// that order; values escaped as the format wants). InvalidArgument, naming
// it, for a label name that is not [a-zA-Z_][a-zA-Z0-9_]* or starts with
// "__", for one given twice, or for a metric name that is not
// [a-zA-Z_:][a-zA-Z0-9_:]*.
absl::StatusOr<std::string> FormatPrometheusText(
    absl::Span<const Metric> metrics, absl::Span<const MetricLabel> labels);

}  // namespace kvblock

#endif  // KVBLOCK_METRICS_H_
