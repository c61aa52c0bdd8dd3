// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/report.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kvblock/block_hash.h"
#include "kvblock/kernels.h"
#include "kvblock/version.h"
#include "nlohmann/json.hpp"
#include "sim/models.h"

namespace kvblock::sim {
namespace {

// Rejected requests the readable report lists before summarizing the rest.
constexpr size_t kListedRejections = 10;

// The ratios both reports give.
struct Rates {
  double hit_rate = 0;  // prefix_hit_tokens / prompt_tokens.
  double host_ns_per_step = 0;
  double host_ns_per_sequence_step = 0;
  double tokens_per_second = 0;
  double steps_per_second = 0;
};

double Ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : 0;
}

Rates RatesOf(const SimResult& result) {
  return {
      .hit_rate = Ratio(static_cast<double>(result.prefix_hit_tokens),
                        static_cast<double>(result.prompt_tokens)),
      .host_ns_per_step = Ratio(static_cast<double>(result.host_ns_total),
                                static_cast<double>(result.steps)),
      .host_ns_per_sequence_step =
          Ratio(static_cast<double>(result.host_ns_total),
                static_cast<double>(result.sequence_steps)),
      .tokens_per_second = Ratio(
          static_cast<double>(result.prompt_tokens + result.generated_tokens),
          result.wall_seconds),
      .steps_per_second =
          Ratio(static_cast<double>(result.steps), result.wall_seconds),
  };
}

// One phase of the host time: its JSON key, its name in the text report,
// what it covers, and its nanoseconds.
struct Phase {
  const char* key;
  const char* name;
  const char* what;
  int64_t ns;
};

std::vector<Phase> PhasesOf(const HostPhases& p) {
  return {
      {"planning", "planning", "the scheduler: arrivals, planning, applying",
       p.planning_ns},
      {"admissions", "admissions", "prefix hits, allocation, registration",
       p.admissions_ns},
      {"appends", "appends", "tokens, new pages, copy-on-write decisions",
       p.appends_ns},
      {"frees", "frees", "finished and preempted sequences, windows' pages",
       p.frees_ns},
      {"bookkeeping", "bookkeeping", "validation, slots, the transaction",
       p.bookkeeping_ns},
      {"page_table", "page table", "the step's row moves and updates",
       p.page_table_ns},
      {"upload", "upload", "the page-table patch to the device", p.upload_ns},
      {"host_copies", "host copies", "copy list, the host tier's copies",
       p.host_copies_ns},
      {"copy_on_write", "copy-on-write", "copy list, copy kernel, waits",
       p.copy_on_write_ns},
      {"kv_events", "kv events", "taking the events, handing them over",
       p.kv_events_ns},
  };
}

// "512 B", "3.4 KB", "5.6 MB" or "7.89 GB" (powers of 10^3).
std::string FormatBytes(double bytes) {
  if (bytes < 1e3) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1e6) return absl::StrFormat("%.1f KB", bytes / 1e3);
  if (bytes < 1e9) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.2f GB", bytes / 1e9);
}

// "950 ns", "12.3 us", "4.56 ms" or "1.23 s".
std::string FormatNanos(double ns) {
  if (ns < 1e3) return absl::StrFormat("%.0f ns", ns);
  if (ns < 1e6) return absl::StrFormat("%.1f us", ns / 1e3);
  if (ns < 1e9) return absl::StrFormat("%.2f ms", ns / 1e6);
  return absl::StrFormat("%.2f s", ns / 1e9);
}

// "chunked prefill on (at most N tokens a prompt a step)" or "... off".
std::string DescribePrefill(const SchedulerConfig& config) {
  if (!config.chunked_prefill) return "chunked prefill off";
  std::string text = "chunked prefill on";
  if (config.chunk_tokens > 0) {
    absl::StrAppendFormat(&text, " (at most %d tokens a prompt a step)",
                          config.chunk_tokens);
  }
  absl::StrAppend(&text, config.manager.reserve_prompt_pages
                             ? ", whole prompts reserved"
                             : ", admitted on the first chunk");
  return text;
}

// "speculative decoding off" or "... 4 drafts, 70% accepted each".
std::string DescribeSpeculation(const SchedulerConfig& config) {
  if (config.spec_tokens == 0) return "speculative decoding off";
  return absl::StrFormat(
      "speculative decoding %d drafts a step, each accepted with p %.2f",
      config.spec_tokens, config.spec_acceptance);
}

}  // namespace

std::string DescribeRun(const RunSetup& setup) {
  const SchedulerConfig& config = setup.config;
  return absl::StrFormat(
      "%s on %s: %d pages x %d tokens, batch <= %d, %d pages per sequence, %d "
      "tokens per step, prefix caching %s (%s), %s, %s",
      setup.source, setup.device, config.kv.num_pages, config.kv.page_size,
      config.kv.max_batch, config.kv.max_pages_per_seq,
      config.max_tokens_per_step,
      config.manager.enable_prefix_caching ? "on" : "off",
      HashAlgorithmName(config.manager.hash_algorithm), DescribePrefill(config),
      DescribeSpeculation(config));
}

void PrintReport(const SimResult& result, const RunSetup& setup,
                 std::ostream& out) {
  const SchedulerConfig& config = setup.config;
  const Rates rates = RatesOf(result);
  out << absl::StrFormat("kvblock-sim: %s on %s\n", setup.source, setup.device);
  out << absl::StrFormat(
      "  pool %d pages x %d tokens, batch <= %d, %d pages per sequence, "
      "%d tokens per step\n",
      config.kv.num_pages, config.kv.page_size, config.kv.max_batch,
      config.kv.max_pages_per_seq, config.max_tokens_per_step);
  out << absl::StrFormat("  prefix caching %s (%s), watermark %d pages\n",
                         config.manager.enable_prefix_caching ? "on" : "off",
                         HashAlgorithmName(config.manager.hash_algorithm),
                         config.manager.watermark_pages);
  out << absl::StrFormat("  %s; %s\n", DescribePrefill(config),
                         DescribeSpeculation(config));
  out << absl::StrFormat("  KV cache groups %s\n\n",
                         DescribeGroups(config.manager.kv_cache_groups));
  out << absl::StrFormat(
      "requests          %d completed, %d rejected (of %d)\n", result.completed,
      result.num_rejected(), result.requests);
  out << absl::StrFormat(
      "prompt tokens     %d admitted, %d from the prefix cache "
      "(%.1f%% hit rate)\n",
      result.prompt_tokens, result.prefix_hit_tokens, 100 * rates.hit_rate);
  if (result.host_pages > 0) {
    const double prompts = static_cast<double>(result.prompt_tokens);
    const int64_t device_hits =
        result.prefix_hit_tokens - result.host_hit_tokens;
    out << absl::StrFormat(
        "  by tier         %d from the device (%.1f%%), %d from the host "
        "tier (%.1f%%)\n",
        device_hits, 100 * Ratio(static_cast<double>(device_hits), prompts),
        result.host_hit_tokens,
        100 * Ratio(static_cast<double>(result.host_hit_tokens), prompts));
    out << absl::StrFormat(
        "host tier         %d pages (%s); %d pages stored (%s), %d loaded "
        "(%s), %d host pages reused; copies at %g GB/s: %s in all, %s a "
        "step, at most %s\n",
        result.host_pages,
        config.manager.host_write_policy == HostWritePolicy::kWriteThrough
            ? "write-through"
            : "write-back",
        result.host_stores,
        FormatBytes(static_cast<double>(result.host_bytes_stored)),
        result.host_loads,
        FormatBytes(static_cast<double>(result.host_bytes_loaded)),
        result.host_evictions, config.host_bandwidth_gbps,
        FormatNanos(static_cast<double>(result.host_copy_ns)),
        FormatNanos(Ratio(static_cast<double>(result.host_copy_ns),
                          static_cast<double>(result.steps))),
        FormatNanos(static_cast<double>(result.host_copy_ns_max_step)));
  }
  out << absl::StrFormat(
      "generated tokens  %d (%d of them recomputed after a preemption)\n",
      result.generated_tokens, result.recomputed_tokens);
  const StepStats& prompt_steps = result.prompt_steps;
  out << absl::StrFormat(
      "prefill           %d prompt chunks after the admitting steps; steps "
      "per prompt %.2f mean, p50 %d, p99 %d, max %d\n",
      result.prompt_chunks, prompt_steps.mean, prompt_steps.p50,
      prompt_steps.p99, prompt_steps.max);
  out << absl::StrFormat(
      "drafts            %d proposed, %d accepted (%.1f%%); peak %d pages "
      "held by drafts alone; %d copy-on-write copies for drafts\n",
      result.drafts_proposed, result.drafts_accepted,
      100 * Ratio(static_cast<double>(result.drafts_accepted),
                  static_cast<double>(result.drafts_proposed)),
      result.peak_draft_pages, result.draft_copies);
  if (const SimResult::KvEvents& kv = result.kv_events; kv.on) {
    out << absl::StrFormat(
        "kv events         %d batches (%d cache changes) handed over; %d "
        "batches (%d events) published, %d dropped, %d unsent; publisher "
        "thread %s%s%s\n",
        kv.batches, kv.changes, kv.batches_published, kv.events_published,
        kv.batches_dropped, kv.batches_unsent,
        FormatNanos(static_cast<double>(kv.publisher_thread_ns)),
        kv.endpoint.empty() ? "" : "; on " + kv.endpoint,
        kv.replay_endpoint.empty() ? "" : ", replay on " + kv.replay_endpoint);
  }
  out << absl::StrFormat("steps             %d\n", result.steps);
  out << absl::StrFormat("pages in use      peak %d, mean %.1f of %d\n",
                         result.peak_pages_used, result.mean_pages_used,
                         result.num_pages);
  if (!result.pages_by_group.empty()) {
    std::vector<std::string> parts;
    for (const GroupPages& group : result.pages_by_group) {
      parts.push_back(absl::StrCat(GroupName(group.group), " ", group.pages));
    }
    out << absl::StrFormat("  by group        %s (at the peak)\n",
                           absl::StrJoin(parts, ", "));
  }
  if (result.full_attention.has_value()) {
    const FullAttentionRun& full = *result.full_attention;
    out << absl::StrFormat(
        "  full attention  peak %d (%.2fx), %d preemptions, %d prefix hit "
        "tokens: the same run with every group full attention\n",
        full.peak_pages_used,
        result.peak_pages_used > 0
            ? full.peak_pages_used / static_cast<double>(result.peak_pages_used)
            : 0.0,
        full.preemptions, full.prefix_hit_tokens);
  }
  out << absl::StrFormat("evictions         %d cached pages reused\n",
                         result.evictions);
  out << absl::StrFormat("preemptions       %d requests recomputed\n",
                         result.preemptions);
  out << absl::StrFormat("copy-on-write     %d page copies\n",
                         result.cow_copies);
  const StepStats& wait = result.queue_steps;
  const StepStats& ttft = result.ttft_steps;
  out << absl::StrFormat(
      "queue wait        %.1f steps mean, p50 %d, p99 %d, max %d; at most %d "
      "requests waiting\n",
      wait.mean, wait.p50, wait.p99, wait.max, result.peak_waiting);
  out << absl::StrFormat(
      "first token       %.1f steps after arrival mean, p50 %d, p99 %d, max "
      "%d\n",
      ttft.mean, ttft.p50, ttft.p99, ttft.max);
  out << absl::StrFormat(
      "batch limits      %d steps left requests waiting: %d for pages, %d for "
      "max_batch, %d for the token budget\n",
      result.steps_limited_by_pages + result.steps_limited_by_max_batch +
          result.steps_limited_by_token_budget,
      result.steps_limited_by_pages, result.steps_limited_by_max_batch,
      result.steps_limited_by_token_budget);
  out << absl::StrFormat(
      "host time         %s in the steps, %s per step, %s per running "
      "sequence per step\n",
      FormatNanos(static_cast<double>(result.host_ns_total)),
      FormatNanos(rates.host_ns_per_step),
      FormatNanos(rates.host_ns_per_sequence_step));
  for (const Phase& phase : PhasesOf(result.host_ns_by_phase)) {
    out << absl::StrFormat(
        "  %-15s %9s  %5.1f%%  %s\n", phase.name,
        FormatNanos(static_cast<double>(phase.ns)),
        100 * Ratio(static_cast<double>(phase.ns),
                    static_cast<double>(result.host_ns_total)),
        phase.what);
  }
  out << absl::StrFormat(
      "page table        %.0f bytes uploaded per step: %.1f entries set in "
      "%.1f rows, %d copies in all (the whole table at start-up: %s, not in "
      "host time)\n",
      Ratio(static_cast<double>(result.upload_bytes),
            static_cast<double>(result.steps)),
      Ratio(static_cast<double>(result.upload_entries),
            static_cast<double>(result.steps)),
      Ratio(static_cast<double>(result.upload_ranges),
            static_cast<double>(result.steps)),
      result.upload_copies,
      FormatNanos(static_cast<double>(result.table_setup_ns)));
  out << absl::StrFormat(
      "simulator speed   %.0f tokens/s, %.0f steps/s of this process's wall "
      "time (%.3f s; not a model's throughput); the scheduler thread's CPU "
      "%s, %s per step\n",
      rates.tokens_per_second, rates.steps_per_second, result.wall_seconds,
      FormatNanos(static_cast<double>(result.scheduler_thread_ns)),
      FormatNanos(Ratio(static_cast<double>(result.scheduler_thread_ns),
                        static_cast<double>(result.steps))));
  if (result.num_rejected() > 0) {
    std::map<std::string, int64_t> kinds;
    for (const RejectedRequest& request : result.rejected) {
      ++kinds[RejectedKindName(request.kind)];
    }
    for (size_t kind = 0; kind < result.unlisted_rejections.size(); ++kind) {
      if (result.unlisted_rejections[kind] == 0) continue;
      kinds[RejectedKindName(static_cast<RejectedRequest::Kind>(kind))] +=
          result.unlisted_rejections[kind];
    }
    std::string summary;
    for (const auto& [kind, count] : kinds) {
      absl::StrAppendFormat(&summary, "%s%d %s", summary.empty() ? "" : ", ",
                            count, kind);
    }
    out << absl::StrFormat("rejected          %d: %s\n", result.num_rejected(),
                           summary);
  }
  const size_t listed = std::min(result.rejected.size(), kListedRejections);
  for (size_t i = 0; i < listed; ++i) {
    out << absl::StrFormat("rejected          %s: %s\n", result.rejected[i].id,
                           result.rejected[i].reason);
  }
  if (result.num_rejected() > static_cast<int64_t>(listed)) {
    out << absl::StrFormat(
        "rejected          ... and %d more\n",
        result.num_rejected() - static_cast<int64_t>(listed));
  }
}

void WriteJsonReport(const SimResult& result, const RunSetup& setup,
                     std::ostream& out) {
  const SchedulerConfig& config = setup.config;
  const Rates rates = RatesOf(result);
  nlohmann::ordered_json report;
  report["version"] = KVBLOCK_VERSION;
  report["source"] = setup.source;
  report["device"] = setup.device;
  report["requests"] = result.requests;
  report["completed"] = result.completed;
  report["rejected"] = result.num_rejected();
  report["prompt_tokens"] = result.prompt_tokens;
  report["prefix_hit_tokens"] = result.prefix_hit_tokens;
  report["prefix_hit_rate"] = rates.hit_rate;
  report["host_pages"] = result.host_pages;
  report["device_hit_tokens"] =
      result.prefix_hit_tokens - result.host_hit_tokens;
  report["host_hit_tokens"] = result.host_hit_tokens;
  report["host_stores"] = result.host_stores;
  report["host_loads"] = result.host_loads;
  report["host_bytes_stored"] = result.host_bytes_stored;
  report["host_bytes_loaded"] = result.host_bytes_loaded;
  report["host_evictions"] = result.host_evictions;
  report["host_copy_ns"] = result.host_copy_ns;
  report["host_copy_ns_per_step"] =
      Ratio(static_cast<double>(result.host_copy_ns),
            static_cast<double>(result.steps));
  report["host_copy_ns_max_step"] = result.host_copy_ns_max_step;
  report["generated_tokens"] = result.generated_tokens;
  report["recomputed_tokens"] = result.recomputed_tokens;
  const auto stats_json = [](const StepStats& stats) {
    return nlohmann::ordered_json{{"count", stats.count},
                                  {"mean", stats.mean},
                                  {"p50", stats.p50},
                                  {"p99", stats.p99},
                                  {"max", stats.max}};
  };
  report["queue_steps"] = stats_json(result.queue_steps);
  report["ttft_steps"] = stats_json(result.ttft_steps);
  report["peak_waiting"] = result.peak_waiting;
  report["prompt_chunks"] = result.prompt_chunks;
  report["prompt_steps"] = stats_json(result.prompt_steps);
  report["drafts_proposed"] = result.drafts_proposed;
  report["drafts_accepted"] = result.drafts_accepted;
  report["draft_acceptance_rate"] =
      Ratio(static_cast<double>(result.drafts_accepted),
            static_cast<double>(result.drafts_proposed));
  report["peak_draft_pages"] = result.peak_draft_pages;
  report["draft_copies"] = result.draft_copies;
  report["steps_limited_by"] = {
      {"pages", result.steps_limited_by_pages},
      {"max_batch", result.steps_limited_by_max_batch},
      {"token_budget", result.steps_limited_by_token_budget}};
  const SimResult::KvEvents& kv = result.kv_events;
  report["kv_events"] = {{"on", kv.on},
                         {"batches", kv.batches},
                         {"changes", kv.changes},
                         {"batches_published", kv.batches_published},
                         {"events_published", kv.events_published},
                         {"batches_dropped", kv.batches_dropped},
                         {"batches_unsent", kv.batches_unsent},
                         {"publisher_thread_ns", kv.publisher_thread_ns},
                         {"endpoint", kv.endpoint},
                         {"replay_endpoint", kv.replay_endpoint},
                         {"cached_pages", kv.cached_pages},
                         {"cached_hash_xor", kv.cached_hash_xor}};
  report["steps"] = result.steps;
  report["preemptions"] = result.preemptions;
  report["cow_copies"] = result.cow_copies;
  report["evictions"] = result.evictions;
  report["num_pages"] = result.num_pages;
  report["peak_pages_used"] = result.peak_pages_used;
  report["kv_cache_groups"] = DescribeGroups(config.manager.kv_cache_groups);
  nlohmann::ordered_json& by_group = report["pages_by_group"];
  by_group = nlohmann::ordered_json::array();
  for (const GroupPages& group : result.pages_by_group) {
    by_group.push_back({{"group", GroupName(group.group)},
                        {"kind", AttentionKindName(group.group.kind)},
                        {"pages", group.pages}});
  }
  if (result.full_attention.has_value()) {
    report["full_attention_peak_pages"] =
        result.full_attention->peak_pages_used;
    report["full_attention_preemptions"] = result.full_attention->preemptions;
    report["full_attention_prefix_hit_tokens"] =
        result.full_attention->prefix_hit_tokens;
  } else {
    report["full_attention_peak_pages"] = nullptr;
  }
  report["mean_pages_used"] = result.mean_pages_used;
  report["host_ns_total"] = result.host_ns_total;
  report["host_ns_per_step"] = rates.host_ns_per_step;
  report["host_ns_per_sequence_step"] = rates.host_ns_per_sequence_step;
  report["sequence_steps"] = result.sequence_steps;
  nlohmann::ordered_json& phases = report["host_ns_by_phase"];
  phases = nlohmann::ordered_json::object();
  for (const Phase& phase : PhasesOf(result.host_ns_by_phase)) {
    phases[phase.key] = phase.ns;
  }
  report["wall_seconds"] = result.wall_seconds;
  report["scheduler_thread_ns"] = result.scheduler_thread_ns;
  report["tokens_per_second"] = rates.tokens_per_second;
  report["steps_per_second"] = rates.steps_per_second;
  report["upload_copies"] = result.upload_copies;
  report["upload_bytes"] = result.upload_bytes;
  report["upload_entries"] = result.upload_entries;
  report["upload_ranges"] = result.upload_ranges;
  report["table_setup_ns"] = result.table_setup_ns;
  report["upload_bytes_per_step"] =
      Ratio(static_cast<double>(result.upload_bytes),
            static_cast<double>(result.steps));
  nlohmann::ordered_json& rejected = report["rejected_requests"];
  rejected = nlohmann::ordered_json::array();
  for (const RejectedRequest& request : result.rejected) {
    rejected.push_back({{"id", request.id},
                        {"kind", RejectedKindName(request.kind)},
                        {"reason", request.reason}});
  }
  report["config"] = {
      {"num_pages", config.kv.num_pages},
      {"page_size", config.kv.page_size},
      {"max_batch", config.kv.max_batch},
      {"max_pages_per_seq", config.kv.max_pages_per_seq},
      {"max_tokens_per_step", config.max_tokens_per_step},
      {"chunked_prefill", config.chunked_prefill},
      {"chunk_tokens", config.chunk_tokens},
      {"reserve_prompt_pages", config.manager.reserve_prompt_pages},
      {"spec_tokens", config.spec_tokens},
      {"spec_acceptance", config.spec_acceptance},
      {"spec_seed", config.spec_seed},
      {"prefix_caching", config.manager.enable_prefix_caching},
      {"hash", std::string(HashAlgorithmName(config.manager.hash_algorithm))},
      {"watermark_pages", config.manager.watermark_pages},
      {"num_layers", config.kv.num_layers},
      {"num_kv_heads", config.kv.num_kv_heads},
      {"head_dim", config.kv.head_dim},
      {"dtype", std::string(DTypeName(config.kv.dtype))},
      {"host_pages", config.manager.host_pages},
      {"host_write_through",
       config.manager.host_write_policy == HostWritePolicy::kWriteThrough},
      {"host_bandwidth_gbps", config.host_bandwidth_gbps},
      {"host_page_bytes", config.host_page_bytes > 0
                              ? config.host_page_bytes
                              : HostPageBytes(config.kv)},
  };
  // A path or endpoint is bytes, not always UTF-8: such a byte is written
  // as U+FFFD, where dump() would throw.
  out << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
      << '\n';
}

}  // namespace kvblock::sim
