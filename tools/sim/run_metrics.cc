// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/run_metrics.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "kvblock/block_hash.h"
#include "kvblock/kernels.h"
#include "kvblock/status_macros.h"

namespace kvblock::sim {
namespace {

// `ns` in whole nanoseconds, at most 2^62: a modelled time that long (146
// years) says only that the flags' bus moves nothing in a run.
int64_t CappedNanos(double ns) {
  constexpr double kMax = 0x1p62;
  return ns < kMax ? static_cast<int64_t>(ns) : static_cast<int64_t>(kMax);
}

}  // namespace

void HostClock::Lap(int64_t HostPhases::*phase) {
  const auto now = std::chrono::steady_clock::now();
  phases_.*phase +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
  last_ = now;
}

RunMetrics::RunMetrics(const SchedulerConfig& config, int64_t requests)
    : config_(config),
      host_page_bytes_(config.host_page_bytes > 0 ? config.host_page_bytes
                                                  : HostPageBytes(config.kv)) {
  result_.requests = requests;
  result_.num_pages = config.kv.num_pages;
  result_.host_pages = config.manager.host_pages;
}

void RunMetrics::Complete(const RequestState& r) {
  ++result_.completed;
  queue_waits_.Add(r.first_admitted - r.request->arrival);
  first_token_waits_.Add(r.first_token - r.request->arrival + 1);
  prompt_steps_.Add(r.prompt_steps);
}

void RunMetrics::Reject(const Request& request, RejectedRequest::Kind kind,
                        std::string reason) {
  if (result_.rejected.size() < kMaxListedRejections) {
    result_.rejected.push_back(
        {.id = request.id, .reason = std::move(reason), .kind = kind});
  } else {
    ++result_.unlisted_rejections[static_cast<size_t>(kind)];
  }
}

void RunMetrics::AddKvEventBatch(const KvEventBatch& batch) {
  ++result_.kv_events.batches;
  result_.kv_events.changes += batch.num_changes();
}

void RunMetrics::AddStep(const StepResult& step,
                         const BlockManagerStats& before,
                         const BlockManagerStats& after,
                         const StepSummary& summary) {
  // The copies the step ran, not the stats' stores: write-through lists a
  // step's stores in the next step's batch, when it takes this one's.
  const auto stores = static_cast<int32_t>(std::count_if(
      step.host_copies.begin(), step.host_copies.end(), [](const HostCopy& c) {
        return c.direction == HostCopy::Direction::kDeviceToHost;
      }));
  const StepRecord record{
      .step = summary.step,
      .batch = step.batch,
      .pages_used = after.pages_in_use,
      .hit_tokens = after.prefix_hit_tokens - before.prefix_hit_tokens,
      .prompt_tokens = after.prompt_tokens - before.prompt_tokens,
      .preemptions = summary.preemptions,
      .cow_copies = static_cast<int32_t>(after.cow_copies - before.cow_copies),
      .evictions = static_cast<int32_t>(after.evictions - before.evictions),
      .waiting = summary.waiting,
      .limit = summary.limit,
      .host_hit_tokens = after.host_hit_tokens - before.host_hit_tokens,
      .host_stores = stores,
      .host_loads = static_cast<int32_t>(step.host_copies.size()) - stores,
      .host_copy_ns =
          HostCopyNanos(static_cast<int64_t>(step.host_copies.size())),
  };
  switch (record.limit) {
    case StepLimit::kPages:
      ++result_.steps_limited_by_pages;
      break;
    case StepLimit::kMaxBatch:
      ++result_.steps_limited_by_max_batch;
      break;
    case StepLimit::kTokenBudget:
      ++result_.steps_limited_by_token_budget;
      break;
    case StepLimit::kNone:
      break;
  }
  result_.host_stores += record.host_stores;
  result_.host_loads += record.host_loads;
  result_.host_copy_ns = CappedNanos(static_cast<double>(result_.host_copy_ns) +
                                     static_cast<double>(record.host_copy_ns));
  result_.host_copy_ns_max_step =
      std::max(result_.host_copy_ns_max_step, record.host_copy_ns);
  result_.draft_copies += step.draft_copies;
  result_.peak_draft_pages =
      std::max(result_.peak_draft_pages, summary.draft_only_pages);
  result_.peak_waiting =
      std::max<int64_t>(result_.peak_waiting, summary.waiting);
  if (config_.keep_timeline) result_.timeline.push_back(record);
  ++result_.steps;
  result_.sequence_steps += step.batch;
  result_.preemptions += summary.preemptions;
  pages_used_sum_ += record.pages_used;
}

absl::Status RunMetrics::NoteGroupPages(const SchedulerState& state) {
  const std::vector<KvCacheGroupSpec>& groups = config_.manager.kv_cache_groups;
  const BlockManager& manager = *state.manager;
  const int32_t in_use = manager.pool().NumUsed();
  if (groups.empty() || in_use <= group_peak_) return absl::OkStatus();
  group_peak_ = in_use;
  seen_.resize(static_cast<size_t>(manager.pool().num_pages()), 0);
  result_.pages_by_group.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    ++serial_;
    int32_t pages = 0;
    for (const SequenceId id : state.commit->slots()) {
      KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> held,
                               manager.GroupPages(id, static_cast<int32_t>(g)));
      for (const PageId page : held) {
        if (page == manager.null_page() || seen_[page] == serial_) continue;
        seen_[page] = serial_;
        ++pages;
      }
    }
    result_.pages_by_group.push_back({.group = groups[g], .pages = pages});
  }
  return absl::OkStatus();
}

SimResult RunMetrics::Finish(const SchedulerState& state, double wall_seconds,
                             int64_t scheduler_thread_ns) {
  const BlockManagerStats& stats = state.manager->stats();
  result_.prompt_tokens = stats.prompt_tokens;
  result_.prefix_hit_tokens = stats.prefix_hit_tokens;
  result_.generated_tokens = stats.appended_tokens;
  result_.cow_copies = stats.cow_copies;
  result_.evictions = stats.evictions;
  result_.peak_pages_used = stats.peak_pages_in_use;
  result_.prompt_chunks = stats.prompt_chunks;
  result_.host_hit_tokens = stats.host_hit_tokens;
  result_.host_bytes_stored = result_.host_stores * host_page_bytes_;
  result_.host_bytes_loaded = result_.host_loads * host_page_bytes_;
  result_.host_evictions = stats.host_evictions;
  result_.mean_pages_used =
      result_.steps > 0 ? pages_used_sum_ / static_cast<double>(result_.steps)
                        : 0;
  result_.queue_steps = queue_waits_.Stats();
  result_.ttft_steps = first_token_waits_.Stats();
  result_.prompt_steps = prompt_steps_.Stats();
  FinishHostTime(state.commit->phase_times());
  result_.kv_events.on = config_.kv_event_sink.on();
  if (result_.kv_events.on) FinishKvEvents(*state.manager);
  FinishUploads(state);
  result_.scheduler_thread_ns = scheduler_thread_ns;
  result_.wall_seconds = wall_seconds;
  return std::move(result_);
}

int64_t RunMetrics::HostCopyNanos(int64_t copies) const {
  // Stores, then loads: one direction at a time at the bus's rate.
  return CappedNanos(static_cast<double>(copies) *
                     static_cast<double>(host_page_bytes_) /
                     config_.host_bandwidth_gbps);
}

void RunMetrics::FinishHostTime(const CommitPhaseTimes& commit) {
  HostPhases phases = host_clock_.phases();
  phases.frees_ns = commit.frees_ns;
  phases.admissions_ns = commit.admissions_ns;
  phases.appends_ns = commit.appends_ns;
  phases.page_table_ns = commit.page_table_ns;
  // The rest of each Commit call.
  phases.bookkeeping_ns = commit.total_ns - commit.frees_ns -
                          commit.admissions_ns - commit.appends_ns -
                          commit.page_table_ns;
  // Every Commit ran inside the planning phase, retries included.
  phases.planning_ns -= commit.total_ns;
  result_.host_ns_by_phase = phases;
  result_.host_ns_total = phases.total_ns();
}

void RunMetrics::FinishKvEvents(const BlockManager& manager) {
  // vLLM's integer form of each hash: its digest's low 64 bits.
  const size_t digest =
      static_cast<size_t>(DigestSize(config_.manager.hash_algorithm));
  // The hashes the events named (a KV cache group's key is not).
  for (const auto& [page, key] : manager.pool().Snapshot().cached) {
    const BlockHash hash = manager.pool().EventHash(page).value_or(key);
    uint64_t low = 0;
    for (size_t i = digest - 8; i < digest; ++i) {
      low = low << 8 | hash.bytes[i];
    }
    result_.kv_events.cached_hash_xor ^= low;
    ++result_.kv_events.cached_pages;
  }
}

void RunMetrics::FinishUploads(const SchedulerState& state) {
  const KVPageTableUploadStats& uploads = state.table->upload_stats();
  const KVPageTableUploadStats& setup = state.setup_uploads;
  result_.table_setup_ns = state.table_setup_ns;
  result_.upload_copies = uploads.copies - setup.copies;
  result_.upload_bytes = uploads.bytes - setup.bytes;
  result_.upload_entries = uploads.entries - setup.entries;
  result_.upload_ranges = uploads.ranges - setup.ranges;
}

}  // namespace kvblock::sim
