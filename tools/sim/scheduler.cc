// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/scheduler.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "kvblock/kernels.h"
#include "kvblock/status_macros.h"
#include "sim/request_queue.h"
#include "sim/request_state.h"
#include "sim/run_metrics.h"
#include "sim/scheduler_state.h"
#include "sim/step_executor.h"
#include "sim/step_planner.h"

namespace kvblock::sim {
namespace {

// The host device's KV pool and the host tier's pages are written at
// start-up (Scheduler::Create): more than the machine's memory is refused,
// not paged out or killed. `what` names the bytes, and how many.
absl::Status CheckFitsHostMemory(uint64_t bytes, absl::string_view what) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return absl::OkStatus();  // unknown.
  const auto memory =
      static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
  if (bytes <= memory) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "host device: %s exceed this machine's %d bytes of memory", what,
      memory));
}

// a x b and a + b, or the largest uint64 where they overflow: bytes no
// machine has.
uint64_t SaturatedProduct(uint64_t a, uint64_t b) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  return b != 0 && a > kMax / b ? kMax : a * b;
}
uint64_t SaturatedSum(uint64_t a, uint64_t b) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  return a > kMax - b ? kMax : a + b;
}

// The calling thread's CPU time.
int64_t ThreadCpuNanos() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// One Run: the loop that ties the parts of a step together. Each step, the
// arrivals join the queue, the executor plans and commits the step (the
// planner reads the queue, the executor lets requests give way), the queue
// applies the committed plan, the KV events are handed over, the executor
// runs the device work, and the metrics take the step's result.
class Runner {
 public:
  // Over `requests`, then those `feed` (when not null) hands over.
  Runner(SchedulerState& state, absl::Span<const Request> requests,
         RequestFeed* feed,
         const std::function<void(const Progress&)>& progress);

  absl::StatusOr<SimResult> Run();

 private:
  // Runs step clock_: nothing when it has nothing to commit.
  absl::Status Step();
  // Queues the requests that have arrived by clock_, hashing each prompt's
  // pages once.
  absl::Status Arrive();
  // Hands the KV cache events recorded since the last hand-off to the
  // config's sink, if it is ready or `force`, ending the kv_events phase on
  // the HostClock when it does.
  absl::Status HandOffKvEvents(bool force);
  // Takes the feed's next arrivals and horizon.
  absl::Status ReadFeed();
  // Hands over the last events, waits for the device and checks that the
  // run left nothing behind.
  absl::Status Finish();

  SchedulerState& state_;
  BlockManager& manager_;
  const std::function<void(const Progress&)>& progress_;
  RequestFeed* feed_ = nullptr;  // null once it has ended.
  int64_t horizon_ = 0;          // the feed's: steps before it may run.
  int64_t clock_ = 0;
  RunMetrics metrics_;
  RequestQueue requests_;
  StepPlanner planner_;
  StepExecutor executor_;
  KvEventBatch kv_events_;  // a hand-off's, reused.
};

Runner::Runner(SchedulerState& state, absl::Span<const Request> requests,
               RequestFeed* feed,
               const std::function<void(const Progress&)>& progress)
    : state_(state),
      manager_(*state.manager),
      progress_(progress),
      feed_(feed),
      metrics_(state.config, static_cast<int64_t>(requests.size())),
      requests_(requests, state.config.kv.max_batch, metrics_),
      planner_(state.config, *state.manager, *state.commit),
      executor_(state, planner_, requests_, metrics_) {}

absl::StatusOr<SimResult> Runner::Run() {
  const auto wall_start = std::chrono::steady_clock::now();
  const int64_t cpu_start = ThreadCpuNanos();
  while (true) {
    if (feed_ != nullptr && clock_ >= horizon_) {
      // The report counts every batch of the steps before it.
      metrics_.host_clock().Start();
      KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/true));
      KVBLOCK_RETURN_IF_ERROR(ReadFeed());
    }
    if (requests_.idle()) {
      // Idle: skip to the next arrival, or to the feed's horizon.
      if (const std::optional<int64_t> arrival =
              requests_.next_arrival_step()) {
        clock_ = std::max(clock_, *arrival);
      } else if (feed_ != nullptr) {
        clock_ = horizon_;
        continue;
      } else {
        break;
      }
    }
    KVBLOCK_RETURN_IF_ERROR(Step());
  }
  KVBLOCK_RETURN_IF_ERROR(Finish());
  const double wall_seconds = std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - wall_start)
                                  .count();
  return metrics_.Finish(state_, wall_seconds, ThreadCpuNanos() - cpu_start);
}

absl::Status Runner::Step() {
  // The step's host time runs from here to the end of its device work.
  HostClock& host_clock = metrics_.host_clock();
  host_clock.Start();
  KVBLOCK_RETURN_IF_ERROR(Arrive());
  const BlockManagerStats before = manager_.stats();
  KVBLOCK_ASSIGN_OR_RETURN(const std::optional<StepResult> step,
                           executor_.Commit(clock_));
  requests_.ReleaseDone();
  if (!step.has_value()) {
    host_clock.Lap(&HostPhases::planning_ns);
    // Nothing to commit: planning rejected every waiting request.
    if (!requests_.waiting().empty()) {
      return absl::InternalError(absl::StrFormat(
          "step %d: nothing runs and the queue head cannot be admitted",
          clock_));
    }
    return absl::OkStatus();
  }
  KVBLOCK_RETURN_IF_ERROR(
      requests_.ApplyStep(executor_.plan(), clock_, manager_));
  requests_.ReleaseDone();
  host_clock.Lap(&HostPhases::planning_ns);
  KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/false));
  KVBLOCK_RETURN_IF_ERROR(
      executor_.RunDevice(step->copies, step->host_copies, clock_));
  const int32_t draft_only_pages =
      state_.config.spec_tokens > 0
          ? requests_.DraftOnlyPages(state_.config.kv.page_size)
          : 0;
  metrics_.AddStep(*step, before, manager_.stats(),
                   {.step = clock_,
                    .preemptions = executor_.preemptions(),
                    .waiting = static_cast<int32_t>(requests_.waiting().size()),
                    .limit = executor_.pages_ran_out() ? StepLimit::kPages
                                                       : executor_.plan().limit,
                    .draft_only_pages = draft_only_pages});
  KVBLOCK_RETURN_IF_ERROR(metrics_.NoteGroupPages(state_));
  ++clock_;
  if (progress_) {
    progress_({.step = clock_,
               .running = static_cast<int64_t>(requests_.running().size()),
               .waiting = static_cast<int64_t>(requests_.waiting().size()),
               .finished = metrics_.completed() + metrics_.rejected(),
               .total = metrics_.requests()});
  }
  return absl::OkStatus();
}

absl::Status Runner::Arrive() {
  const int32_t page_size = state_.config.kv.page_size;
  while (RequestState* r = requests_.NextArrival(clock_)) {
    if (manager_.options().enable_prefix_caching) {
      const Request& request = *r->request;
      r->prompt_hashes.resize(request.prompt.size() / page_size);
      KVBLOCK_RETURN_IF_ERROR(
          manager_
              .HashPrompt(request.prompt, {.cache_salt = request.cache_salt},
                          absl::MakeSpan(r->prompt_hashes))
              .status());
    }
    requests_.Enqueue(*r);
  }
  return absl::OkStatus();
}

absl::Status Runner::HandOffKvEvents(bool force) {
  const KvEventSink& sink = state_.config.kv_event_sink;
  if (!sink.on()) return absl::OkStatus();
  // Not a phase of its own while the sink is not ready: an atomic load most
  // steps, less than a clock read, left to the phase that follows.
  if (!force && sink.ready && !sink.ready() &&
      manager_.pending_kv_changes() < kMaxPendingKvChanges) {
    return absl::OkStatus();
  }
  KVBLOCK_RETURN_IF_ERROR(manager_.TakeKvEvents(kv_events_));
  if (!kv_events_.empty()) {
    metrics_.AddKvEventBatch(kv_events_);
    sink.publish(kv_events_);
  }
  metrics_.host_clock().Lap(&HostPhases::kv_events_ns);
  return absl::OkStatus();
}

absl::Status Runner::ReadFeed() {
  KVBLOCK_ASSIGN_OR_RETURN(const std::optional<int64_t> horizon,
                           requests_.ReadFeed(*feed_, clock_));
  if (horizon.has_value()) {
    horizon_ = *horizon;
  } else {
    feed_ = nullptr;
  }
  return absl::OkStatus();
}

absl::Status Runner::Finish() {
  HostClock& host_clock = metrics_.host_clock();
  host_clock.Start();
  KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/true));
  // The last step's device work, waited for: none without a step (an
  // empty --serve run reported 310 ns of host time over 0 steps).
  host_clock.Start();
  KVBLOCK_RETURN_IF_ERROR(state_.device.Synchronize(nullptr));
  if (metrics_.steps() > 0) host_clock.Lap(&HostPhases::copy_on_write_ns);
  KVBLOCK_RETURN_IF_ERROR(manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(state_.commit->CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(state_.table->CheckInvariants());
  // The null page of a model with a window group stays the manager's.
  const int32_t held = manager_.null_page() == kNoPage ? 0 : 1;
  if (manager_.num_sequences() != 0 || manager_.pool().NumUsed() != held) {
    return absl::InternalError(absl::StrFormat(
        "after the run %d sequences and %d pages are still in use",
        manager_.num_sequences(), manager_.pool().NumUsed()));
  }
  return absl::OkStatus();
}

}  // namespace

const char* StepLimitName(StepLimit limit) {
  switch (limit) {
    case StepLimit::kNone:
      return "none";
    case StepLimit::kPages:
      return "pages";
    case StepLimit::kMaxBatch:
      return "max_batch";
    case StepLimit::kTokenBudget:
      return "token_budget";
  }
  return "unknown";
}

const char* RejectedKindName(RejectedRequest::Kind kind) {
  switch (kind) {
    case RejectedRequest::Kind::kPoolTooSmall:
      return "pool_too_small";
    case RejectedRequest::Kind::kOverTokenBudget:
      return "over_token_budget";
    case RejectedRequest::Kind::kRanOutAlone:
      return "ran_out_alone";
  }
  return "unknown";
}

TraceLimits TraceLimitsFor(const SchedulerConfig& config) {
  return {.max_tokens_per_seq = config.kv.MaxTokensPerSeq(),
          .max_samples = config.kv.max_batch};
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    const SchedulerConfig& config, Device& device) {
  KVBLOCK_RETURN_IF_ERROR(config.kv.Validate());
  if (config.max_tokens_per_step <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens_per_step must be positive, got %d",
                        config.max_tokens_per_step));
  }
  if (config.chunk_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk_tokens must be 0 or positive, got %d", config.chunk_tokens));
  }
  if (config.spec_tokens < 0 || config.spec_tokens > kMaxSpecTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("spec_tokens must be in [0, %d], got %d",
                        kMaxSpecTokens, config.spec_tokens));
  }
  if (!(config.spec_acceptance >= 0 && config.spec_acceptance <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec_acceptance must be in [0, 1], got %g", config.spec_acceptance));
  }
  if (!(config.host_bandwidth_gbps >= kMinHostBandwidthGbps &&
        config.host_bandwidth_gbps <= kMaxHostBandwidthGbps) ||
      config.host_page_bytes < 0 ||
      config.host_page_bytes > kMaxHostPageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host_bandwidth_gbps must be in [%g, %g] and host_page_bytes in [0, "
        "%d], got %g and %d",
        kMinHostBandwidthGbps, kMaxHostBandwidthGbps, kMaxHostPageBytes,
        config.host_bandwidth_gbps, config.host_page_bytes));
  }
  const auto pool_bytes =
      static_cast<uint64_t>(config.kv.num_layers * config.kv.LayerPoolBytes());
  const bool host = device.kind() == Device::Kind::kHost;
  // Pinned host memory on any device, checked before the manager builds the
  // tier's bookkeeping (a negative host_pages is the manager's to refuse).
  const uint64_t host_bytes = SaturatedProduct(
      static_cast<uint64_t>(std::max(config.manager.host_pages, 0)),
      static_cast<uint64_t>(HostPageBytes(config.kv)));
  if (host_bytes > 0) {
    const uint64_t bytes =
        host ? SaturatedSum(pool_bytes, host_bytes) : host_bytes;
    KVBLOCK_RETURN_IF_ERROR(CheckFitsHostMemory(
        bytes,
        absl::StrFormat("%d bytes of %sthe host tier (host_pages %d x %d "
                        "bytes a page)",
                        bytes, host ? "the KV pool and " : "",
                        config.manager.host_pages, HostPageBytes(config.kv))));
  }
  auto state = std::make_unique<SchedulerState>(device);
  state->config = config;
  BlockManagerOptions options = config.manager;
  options.enable_kv_events = config.kv_event_sink.on();
  KVBLOCK_ASSIGN_OR_RETURN(state->manager,
                           BlockManager::Create(config.kv, options));
  // One table of every KV cache group's rows (BatchCommit::Create), groups
  // at the run's page size.
  const int32_t groups = std::max<int32_t>(
      1, static_cast<int32_t>(config.manager.kv_cache_groups.size()));
  KVBLOCK_ASSIGN_OR_RETURN(state->table,
                           KVPageTable::Create(groups * config.kv.max_batch,
                                               config.kv.max_pages_per_seq,
                                               config.kv.num_pages, device));
  KVBLOCK_ASSIGN_OR_RETURN(state->commit,
                           BatchCommit::Create(*state->manager, *state->table));
  state->commit->set_time_phases(true);
  if (host) {
    KVBLOCK_RETURN_IF_ERROR(CheckFitsHostMemory(
        pool_bytes, absl::StrFormat("the KV pool's %d bytes (num_layers x 2 x "
                                    "num_pages x page bytes)",
                                    pool_bytes)));
  }
  KVBLOCK_ASSIGN_OR_RETURN(state->kv_pool, device.Allocate(pool_bytes));
  if (host) {
    // A GPU's memory is resident once allocated; calloc's is mapped by the
    // steps that first copy into it, and a page read before it is written
    // (a copy's source, later a destination) is mapped twice, the second
    // time with a TLB shootdown: an interrupt, waited for, to every other
    // CPU running one of the process's threads (a KV event publisher's).
    // Written once here, so that no step pays for either.
    std::memset(state->kv_pool.data(), 0, pool_bytes);
  }
  const size_t list_bytes =
      static_cast<size_t>(state->table->max_batch()) * 2 * sizeof(PageId);
  KVBLOCK_ASSIGN_OR_RETURN(state->copy_staging,
                           device.AllocatePinned(list_bytes));
  KVBLOCK_ASSIGN_OR_RETURN(state->copy_list, device.Allocate(list_bytes));
  KVBLOCK_ASSIGN_OR_RETURN(state->copies_done, device.CreateEvent());
  if (config.manager.host_pages > 0) {
    KVBLOCK_ASSIGN_OR_RETURN(state->host_kv, device.AllocatePinned(host_bytes));
    // Written once, as the pool is: no step pays for mapping it.
    if (host) std::memset(state->host_kv.data(), 0, host_bytes);
    // A step stores at most a page for each it allocates and loads at
    // most one for each: twice the pool bounds a step's copies.
    state->host_copy_capacity = 2 * static_cast<size_t>(config.kv.num_pages);
    KVBLOCK_ASSIGN_OR_RETURN(
        state->host_copy_staging,
        device.AllocatePinned(state->host_copy_capacity * sizeof(HostCopy)));
    KVBLOCK_ASSIGN_OR_RETURN(state->host_copies_done, device.CreateEvent());
  }
  // The first upload sets every entry of the device table, O(max_batch x
  // max_pages_per_seq) once: done here, at start-up, as a serving engine
  // would, so that a run's host time is the steps' alone.
  const auto start = std::chrono::steady_clock::now();
  KVBLOCK_RETURN_IF_ERROR(state->table->Upload(nullptr).status());
  KVBLOCK_RETURN_IF_ERROR(device.Synchronize(nullptr));
  state->table_setup_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  state->setup_uploads = state->table->upload_stats();
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(state)));
}

Scheduler::Scheduler(std::unique_ptr<SchedulerState> state)
    : state_(std::move(state)) {}

Scheduler::~Scheduler() = default;

absl::StatusOr<SimResult> Scheduler::Run(
    absl::Span<const Request> requests,
    const std::function<void(const Progress&)>& progress) {
  if (state_->ran) {
    return absl::FailedPreconditionError("scheduler: Run was already called");
  }
  KVBLOCK_RETURN_IF_ERROR(
      ValidateRequests(requests, TraceLimitsFor(state_->config)));
  state_->ran = true;
  return Runner(*state_, requests, /*feed=*/nullptr, progress).Run();
}

absl::StatusOr<SimResult> Scheduler::Serve(
    RequestFeed& feed, const std::function<void(const Progress&)>& progress) {
  if (state_->ran) {
    return absl::FailedPreconditionError("scheduler: Run was already called");
  }
  state_->ran = true;
  return Runner(*state_, {}, &feed, progress).Run();
}

const BlockManager& Scheduler::manager() const { return *state_->manager; }

const KVPageTable& Scheduler::page_table() const { return *state_->table; }

}  // namespace kvblock::sim
