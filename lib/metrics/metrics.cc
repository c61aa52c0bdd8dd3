// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/metrics.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace kvblock {
namespace {

Metric Counter(absl::string_view name, absl::string_view help, int64_t value) {
  return {name, help, Metric::Type::kCounter, static_cast<double>(value)};
}

Metric Gauge(absl::string_view name, absl::string_view help, double value) {
  return {name, help, Metric::Type::kGauge, value};
}

void AddManagerMetrics(const BlockManager& manager, std::vector<Metric>& out) {
  const BlockPool& pool = manager.pool();
  const BlockManagerStats stats = manager.stats();
  const BlockPoolStats& pool_stats = pool.stats();
  // The null page of window groups is held for ever and never handed out:
  // not in use, and not among the pages usage counts, as vLLM's usage
  // leaves its null block out.
  const int32_t null_pages = manager.null_page() != kNoPage ? 1 : 0;
  const int32_t in_use = pool.NumUsed() - null_pages;
  const int32_t usable = pool.num_pages() - null_pages;
  out.push_back(Gauge("vllm:kv_cache_usage_perc",
                      "KV-cache usage. 1 means 100 percent usage.",
                      usable > 0 ? static_cast<double>(in_use) / usable : 0));
  out.push_back(
      Counter("vllm:prefix_cache_queries",
              "Prefix cache queries, in terms of number of queried tokens.",
              stats.prompt_tokens));
  out.push_back(
      Counter("vllm:prefix_cache_hits",
              "Prefix cache hits, in terms of number of cached tokens.",
              stats.prefix_hit_tokens));
  out.push_back(Counter("vllm:num_preemptions",
                        "Cumulative number of preemption from the engine.",
                        stats.preemptions));
  out.push_back(
      Gauge("kvblock_pages", "KV pages of the pool.", pool.num_pages()));
  out.push_back(Gauge("kvblock_pages_in_use",
                      "KV pages held by a sequence (refcount > 0).", in_use));
  out.push_back(Gauge("kvblock_pages_peak_in_use",
                      "Most KV pages held by sequences at once.",
                      stats.peak_pages_in_use - null_pages));
  out.push_back(Gauge("kvblock_pages_cached",
                      "KV pages in the prefix cache, used or evictable.",
                      pool.NumCached()));
  out.push_back(Gauge("kvblock_pages_evictable",
                      "Cached KV pages no sequence holds, evicted first "
                      "when the pool needs pages.",
                      pool.NumEvictable()));
  out.push_back(
      Counter("kvblock_admissions", "Sequences admitted.", stats.admitted));
  out.push_back(Counter("kvblock_forks",
                        "Sequences forked (beam search, "
                        "parallel sampling).",
                        stats.forks));
  out.push_back(Counter("kvblock_finished", "Sequences freed when finished.",
                        stats.freed));
  out.push_back(Counter("kvblock_prompt_chunks",
                        "Prompt chunks appended (chunked prefill).",
                        stats.prompt_chunks));
  out.push_back(Counter("kvblock_appended_tokens",
                        "Tokens appended to running sequences.",
                        stats.appended_tokens));
  out.push_back(Counter("kvblock_draft_slots",
                        "Draft slots set for speculative decoding.",
                        stats.draft_slots));
  out.push_back(Counter("kvblock_cow_copies",
                        "KV pages copied on write (a shared page written).",
                        stats.cow_copies));
  out.push_back(Counter("kvblock_evictions",
                        "Cached KV pages evicted for other content.",
                        stats.evictions));
  out.push_back(Counter("kvblock_page_allocations", "KV pages allocated.",
                        pool_stats.allocations));
  out.push_back(Counter("kvblock_cache_registrations",
                        "KV pages stored in the prefix cache.",
                        pool_stats.cache_registrations));
}

void AddPageTableMetrics(const KVPageTableUploadStats& upload,
                         std::vector<Metric>& out) {
  out.push_back(Counter("kvblock_page_table_uploads",
                        "Page table uploads (one a step).", upload.calls));
  out.push_back(Counter("kvblock_page_table_upload_bytes",
                        "Bytes copied to the device by page table uploads.",
                        upload.bytes));
  out.push_back(Counter("kvblock_page_table_upload_copies",
                        "Host-to-device copies of page table patches.",
                        upload.copies));
  out.push_back(Counter("kvblock_page_table_upload_entries",
                        "Page table entries set by uploads.", upload.entries));
  out.push_back(Counter("kvblock_page_table_upload_waits",
                        "Uploads that waited for a staging buffer.",
                        upload.host_waits));
}

void AddKvEventMetrics(const KvEventPublisherStats& events,
                       std::vector<Metric>& out) {
  out.push_back(Counter("kvblock_kv_event_batches_published",
                        "KV event batches sent to subscribers.",
                        events.batches_published));
  out.push_back(Counter("kvblock_kv_events_published",
                        "KV events sent to subscribers.",
                        events.events_published));
  out.push_back(Counter("kvblock_kv_event_batches_dropped",
                        "KV event batches dropped: the publisher's queue "
                        "was full.",
                        events.batches_dropped));
  out.push_back(Counter("kvblock_kv_event_batches_unsent",
                        "KV event batches kept for replay but not sent: "
                        "the send buffers were full.",
                        events.batches_unsent));
  out.push_back(Gauge("kvblock_kv_event_queued_bytes",
                      "Bytes of KV event messages not yet written out.",
                      static_cast<double>(events.queued_bytes)));
  out.push_back(Counter("kvblock_kv_event_replay_requests",
                        "Replay requests answered.", events.replay_requests));
  out.push_back(Counter("kvblock_kv_event_replays_cut",
                        "Replays ended early at the byte bound.",
                        events.replays_cut));
}

bool IsMetricName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != ':') return false;
  }
  return true;
}

bool IsLabelName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

// The format's escapes: backslash and newline, and in a label value (not a
// help line) the quote.
void AppendEscaped(absl::string_view text, bool label_value, std::string& out) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// Integral values as integers; the rest as the shortest exact form.
void AppendValue(double value, std::string& out) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else if (value == std::trunc(value) && std::fabs(value) < 0x1p53) {
    absl::StrAppend(&out, static_cast<int64_t>(value));
  } else {
    absl::StrAppendFormat(&out, "%.17g", value);
  }
}

}  // namespace

absl::StatusOr<std::vector<Metric>> CollectMetrics(
    const MetricsSources& sources) {
  if (sources.manager == nullptr) {
    return absl::InvalidArgumentError(
        "CollectMetrics: sources.manager is null");
  }
  std::vector<Metric> metrics;
  AddManagerMetrics(*sources.manager, metrics);
  if (sources.page_table != nullptr) {
    AddPageTableMetrics(sources.page_table->upload_stats(), metrics);
  }
  if (sources.kv_events != nullptr) {
    AddKvEventMetrics(*sources.kv_events, metrics);
  }
  return metrics;
}

absl::StatusOr<std::string> FormatPrometheusText(
    absl::Span<const Metric> metrics, absl::Span<const MetricLabel> labels) {
  absl::flat_hash_set<absl::string_view> label_names;
  std::string label_text;
  for (const auto& [name, value] : labels) {
    if (!IsLabelName(name) || name.starts_with("__")) {
      return absl::InvalidArgumentError(
          absl::StrFormat("FormatPrometheusText: label name \"%s\" is not "
                          "[a-zA-Z_][a-zA-Z0-9_]* without a leading \"__\"",
                          absl::CEscape(name)));
    }
    if (!label_names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "FormatPrometheusText: label \"%s\" is given twice", name));
    }
    absl::StrAppend(&label_text, label_text.empty() ? "{" : ",", name, "=\"");
    AppendEscaped(value, /*label_value=*/true, label_text);
    label_text += '"';
  }
  if (!label_text.empty()) label_text += '}';

  std::string text;
  for (const Metric& metric : metrics) {
    if (!IsMetricName(metric.name)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("FormatPrometheusText: metric name \"%s\" is not "
                          "[a-zA-Z_:][a-zA-Z0-9_:]*",
                          absl::CEscape(metric.name)));
    }
    // The text format 0.0.4 names a sample's own name in its HELP and TYPE
    // lines: a counter's is NAME_total, as prometheus_client writes it
    // (OpenMetrics would name NAME, in a format of its own).
    const bool counter = metric.type == Metric::Type::kCounter;
    const std::string name = counter ? absl::StrCat(metric.name, "_total")
                                     : std::string(metric.name);
    absl::StrAppend(&text, "# HELP ", name, " ");
    AppendEscaped(metric.help, /*label_value=*/false, text);
    absl::StrAppend(&text, "\n# TYPE ", name,
                    counter ? " counter\n" : " gauge\n", name, label_text, " ");
    AppendValue(metric.value, text);
    text += '\n';
  }
  return text;
}

}  // namespace kvblock
