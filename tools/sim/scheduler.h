// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Scheduler: the continuous-batching serving loop of kvblock-sim, driving the
// real library (BlockManager + BatchCommit + KVPageTable + the copy kernel on
// a Device) with a trace of requests, one scheduler step at a time.
//
// A step:
//   1. Requests whose arrival step has come join the FCFS waiting queue.
//   2. Running requests: those that have generated max_tokens tokens leave
//      (their sequences finish); every other sequence whose prompt is done
//      appends its next token (GeneratedToken). A beam-search request first
//      applies the beam rule: a deterministic function of (id, position)
//      forks one beam (when fewer than W run and the batch has room) and/or
//      drops another (when more than one runs), so 1..W beams live; a fork
//      joins with its own token.
//      Speculative decoding (spec_tokens > 0; not for beams): a sequence
//      also holds up to spec_tokens draft slots the step writes KV for. The
//      next step verifies them: each draft is accepted with probability
//      spec_acceptance, decided by a hash of (request id, position, seed),
//      and the first rejection ends the run, so the step appends the
//      accepted drafts plus the target model's own token (never past
//      max_tokens) and proposes new drafts. The samples of a request move in
//      lockstep (one acceptance decision for all).
//      Token budget (max_tokens_per_step): each decoding sequence takes 1
//      token; then, in admission order, each decoding request its new
//      drafts (fewer when the budget runs short) and each request being
//      prefilled its next prompt chunk: min(prompt left, budget left,
//      chunk_tokens).
//   3. Admission, FCFS from the queue head, stopping at the first request
//      that does not fit: the batch must have room for its samples, the
//      step's token budget for the prompt tokens it computes (with chunked
//      prefill, the first chunk: what the budget has left, at most
//      chunk_tokens; without, the whole uncached prompt), and the
//      allocatable pages (BlockManager::NumAllocatable, less the watermark
//      and the pages this step's appends, chunks and drafts may take) for
//      the pages BlockManager::PlanAdmission says it consumes and reserves.
//      A request with n > 1 joins as its prompt plus n - 1 forks of it
//      (forks are not prefix hits); when its prompt is chunked, its samples
//      fork, each with its first token, in the step after the prompt is done
//      (their seats are held meanwhile). A beam request joins with one beam.
//   4. The step is committed through BatchCommit as one transaction. When
//      it fails with ResourceExhausted, the most recently admitted request
//      gives way and the step is planned and committed again: first this
//      step's admissions (latest first; they stay queued), then running
//      requests, which are preempted (every sequence; recompute: the request
//      restarts from its prompt) and re-queued at the front of the queue.
//   5. The page table is uploaded (KVPageTable::Upload) and the step's
//      copy-on-write copies run through the copy kernel on the device's KV
//      pool.
//
// Preempting a request half-way through its prompt releases its pages and
// keeps the ones it registered: re-admitted, it hits them.
//
// Rejection: a request that can never run is reported as rejected and the
// rest run: a prompt needing more pages than the pool holds (less the
// watermark), a prompt whose uncached tokens exceed max_tokens_per_step
// (without chunked prefill only), or a request that runs out of pages while
// it is the only one running.
//
// Start-up: Create uploads the empty page table once (the first upload sets
// every entry, O(max_batch x max_pages_per_seq)); its time is
// SimResult::table_setup_ns, apart from the steps'.
//
// Host time (SimResult::host_ns_total) is the wall time of the steps' host
// work. Each step is timed once, as one stretch from its arrivals to the end
// of its device work, read at the boundaries of its phases rather than
// around each library call (SimResult::host_ns_by_phase, see HostPhases):
// planning (the scheduler's own work with the library queries it makes),
// the parts of each commit (BatchCommit times them), the KV events'
// hand-off, the upload and the copy-on-write copies. The simulator's
// reporting after a step (its counts, progress) and a feed's input between
// steps are not in it.
//
// The loop's parts (tools/sim/): StepPlanner plans a step from the queue
// and the running requests without changing either; StepExecutor commits
// the plan, lets requests give way and runs the device work; RequestQueue
// holds the requests and applies a committed step to them; RunMetrics
// builds the SimResult from each step's StepResult and the library's stats.
//
// After a run every sequence has left: every page is free or evictable, and
// the manager, commit layer and page table pass CheckInvariants (Run checks).
//
// Complexity: per step O(batch + pages touched) plus the library's own work;
// idle stretches between arrivals are skipped, not stepped through.
// Thread safety: thread-compatible; one thread owns a Scheduler, its Device
// and the callbacks it runs.
#ifndef KVBLOCK_TOOLS_SIM_SCHEDULER_H_
#define KVBLOCK_TOOLS_SIM_SCHEDULER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/kv_events.h"
#include "kvblock/page_table.h"
#include "sim/step_histogram.h"
#include "sim/trace.h"

namespace kvblock::sim {

// Where the scheduler hands the KV cache events its steps record.
struct KvEventSink {
  // Takes a recorded batch (the scheduler's, taken into again), leaving it
  // empty; must not block. Null: events off.
  std::function<void(KvEventBatch&)> publish;
  // Whether to hand over now (KvEventPublisher::idle); until then the
  // events wait in the manager. Null: after every step with events. Ready
  // or not, the scheduler hands over when kMaxPendingKvChanges are
  // pending, before each report to a RequestFeed, and at the end of a run.
  std::function<bool()> ready;

  bool on() const { return publish != nullptr; }
};

// The cache changes a KvEventSink that is not ready may leave pending.
inline constexpr int64_t kMaxPendingKvChanges = 16384;

struct SchedulerConfig {
  // Pool and table geometry (num_pages, page_size, max_batch,
  // max_pages_per_seq) and the KV geometry of the device pool the copy
  // kernel works on.
  PagedKvConfig kv;
  // Prefix caching, hash algorithm, watermark pages.
  BlockManagerOptions manager;
  // Tokens one step may compute: one per decoding sequence plus its new
  // drafts, plus the prompt tokens it computes. Positive.
  int64_t max_tokens_per_step = 2048;
  // Chunked prefill (on by default, as in vLLM v1 and SGLang): a prompt is
  // computed over as many steps as the budget needs, at most chunk_tokens a
  // step (0: no cap but the budget; else positive). Off: a prompt is
  // computed in the step that admits it, and one whose uncached tokens
  // exceed max_tokens_per_step is rejected.
  bool chunked_prefill = true;
  int64_t chunk_tokens = 0;
  // Speculative decoding: draft slots per decoding sequence (0: none; at
  // most kMaxSpecTokens), the probability each draft is accepted (in
  // [0, 1]) and the seed of those decisions.
  int32_t spec_tokens = 0;
  double spec_acceptance = 0.7;
  uint64_t spec_seed = 1;
  // KV cache events (--kv_events): with a sink, the manager records them
  // and the scheduler hands them over, once, in order.
  KvEventSink kv_event_sink;
  // Whether SimResult::timeline keeps a record of every step (for
  // --timeline and --plot): memory that grows with the steps, which a
  // long --serve run without those flags does not keep.
  bool keep_timeline = true;
  // The host tier (manager.host_pages > 0): the copies each step runs
  // between the KV pool and pinned host pages are costed at
  // host_bandwidth_gbps (10^9 bytes a second, in [kMinHostBandwidthGbps,
  // kMaxHostBandwidthGbps]) for pages of host_page_bytes (in [0,
  // kMaxHostPageBytes]; 0: the simulated pool's, HostPageBytes(kv); set it
  // to a real model's bytes a page over every layer, K and V, when the
  // simulated pool is small), stores then loads: the time a step's copies
  // keep its forward pass waiting, modelled, not measured.
  double host_bandwidth_gbps = 64;
  int64_t host_page_bytes = 0;
};

// The host tier's costing: a bus of 1 MB/s to 1 PB/s, pages of up to 1 GiB
// (Llama 3 405B's 16 tokens over every layer are 8.3 MB).
inline constexpr double kMinHostBandwidthGbps = 1e-3;
inline constexpr double kMaxHostBandwidthGbps = 1e6;
inline constexpr int64_t kMaxHostPageBytes = int64_t{1} << 30;

// The rejected requests SimResult::rejected lists; later ones are counted
// only (SimResult::unlisted_rejections).
inline constexpr size_t kMaxListedRejections = 1000;

// The most draft slots SchedulerConfig::spec_tokens may ask for.
inline constexpr int32_t kMaxSpecTokens = 64;

// What stopped a step's admissions while requests were still waiting.
enum class StepLimit : uint8_t {
  kNone = 0,    // nothing waited, or every waiting request was admitted.
  kPages,       // the pool: pages to admit (or to run) ran out.
  kMaxBatch,    // the batch: no room for the next request's samples.
  kTokenBudget  // max_tokens_per_step: its uncached prompt tokens.
};

// "none", "pages", "max_batch" or "token_budget".
const char* StepLimitName(StepLimit limit);

// One committed step (a row of --timeline).
struct StepRecord {
  int64_t step = 0;           // the scheduler clock.
  int32_t batch = 0;          // running sequences after the step.
  int32_t pages_used = 0;     // pages with refcount > 0 after the step.
  int64_t hit_tokens = 0;     // prompt tokens served from the prefix cache.
  int64_t prompt_tokens = 0;  // prompt tokens admitted.
  int32_t preemptions = 0;    // requests preempted.
  int32_t cow_copies = 0;
  int32_t evictions = 0;
  int32_t waiting = 0;  // requests arrived and queued after the step.
  StepLimit limit = StepLimit::kNone;
  // The host tier's part of hit_tokens (loaded, not computed), the pages the
  // step stored into it and loaded from it, and the modelled time of those
  // copies (SchedulerConfig::host_bandwidth_gbps), in nanoseconds.
  int64_t host_hit_tokens = 0;
  int32_t host_stores = 0;
  int32_t host_loads = 0;
  int64_t host_copy_ns = 0;

  friend bool operator==(const StepRecord&, const StepRecord&) = default;
};

// Host time of the steps, by phase, in nanoseconds (see the file comment).
struct HostPhases {
  // The scheduler's part of a step: queueing the arrivals (hashing their
  // prompts), planning (its own work and the library queries it makes:
  // PlanAdmission, NumAllocatable, AppendPages), again after each give-way,
  // and applying the committed step to the requests (PromptTokensLeft);
  // the commits' time is not in it.
  int64_t planning_ns = 0;
  // The parts of BatchCommit::Commit (CommitPhaseTimes): frees, admissions
  // (hits, allocation, registering pages, the first-page hash check),
  // appends, the page table's edit, and the rest of Commit (validation,
  // slot assignment, row updates, the transaction, the timing itself).
  int64_t frees_ns = 0;
  int64_t admissions_ns = 0;
  int64_t appends_ns = 0;
  int64_t page_table_ns = 0;
  int64_t bookkeeping_ns = 0;
  int64_t upload_ns = 0;  // KVPageTable::Upload.
  // The host tier's copies: waiting for the previous list, staging the
  // list, RunHostCopies (memcpy on the host device, a launch each way on
  // CUDA).
  int64_t host_copies_ns = 0;
  // Copy-on-write: waiting for the previous list, staging the copy list,
  // its copy, the copy kernel; and the wait for the device at the end.
  int64_t copy_on_write_ns = 0;
  // Taking each step's KV cache events and handing them to the sink (the
  // publisher's queue; its thread's time is apart, in SimResult).
  int64_t kv_events_ns = 0;

  int64_t total_ns() const {
    return planning_ns + frees_ns + admissions_ns + appends_ns + page_table_ns +
           bookkeeping_ns + upload_ns + host_copies_ns + copy_on_write_ns +
           kv_events_ns;
  }
  friend bool operator==(const HostPhases&, const HostPhases&) = default;
};

struct RejectedRequest {
  // Why a request can never run here.
  enum class Kind : uint8_t {
    kPoolTooSmall,     // its prompt needs more pages than the pool admits.
    kOverTokenBudget,  // its uncached prompt exceeds max_tokens_per_step.
    kRanOutAlone,      // it ran out of pages with nothing else running.
  };
  std::string id;
  std::string reason;
  Kind kind = Kind::kPoolTooSmall;
};

// "pool_too_small", "over_token_budget" or "ran_out_alone".
const char* RejectedKindName(RejectedRequest::Kind kind);

// The same run with every KV cache group full attention (a model with a
// window group; see SimResult::full_attention).
struct FullAttentionRun {
  int32_t peak_pages_used = 0;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t steps = 0;
};

// Pages one KV cache group's sequences held (distinct pages, the null page
// not counted).
struct GroupPages {
  KvCacheGroupSpec group;
  int32_t pages = 0;
};

struct SimResult {
  int64_t requests = 0;   // in the trace.
  int64_t completed = 0;  // ran to max_tokens.
  // The first kMaxListedRejections rejected requests, in the order they
  // were rejected; the count of later ones by kind (RejectedRequest::Kind).
  std::vector<RejectedRequest> rejected;
  std::array<int64_t, 3> unlisted_rejections = {};
  // Every rejected request, listed or not.
  int64_t num_rejected() const {
    return static_cast<int64_t>(rejected.size()) + unlisted_rejections[0] +
           unlisted_rejections[1] + unlisted_rejections[2];
  }
  // The library's counts (BlockManagerStats): prompts of every admission
  // (re-admissions after preemption included), the part of them served from
  // the prefix cache in whole pages, and tokens appended to sequences (every
  // sample and beam).
  int64_t prompt_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t generated_tokens = 0;
  // The host tier (SchedulerConfig::manager.host_pages; all 0 without
  // one): its pages, the part of prefix_hit_tokens it served, the pages
  // stored into it and loaded from it and their bytes (at
  // SchedulerConfig::host_page_bytes), the host pages it dropped to make
  // room, and the copies' modelled time: in all and the longest step's.
  int32_t host_pages = 0;
  int64_t host_hit_tokens = 0;
  int64_t host_stores = 0;
  int64_t host_loads = 0;
  int64_t host_bytes_stored = 0;
  int64_t host_bytes_loaded = 0;
  int64_t host_evictions = 0;
  int64_t host_copy_ns = 0;
  int64_t host_copy_ns_max_step = 0;
  // Of generated_tokens, those a preemption threw away (the request
  // restarted from its prompt and generated them again): a preempted
  // request's tokens times its running sequences.
  int64_t recomputed_tokens = 0;
  int64_t steps = 0;        // committed steps.
  int64_t preemptions = 0;  // requests preempted.
  int64_t cow_copies = 0;
  int64_t evictions = 0;
  int32_t num_pages = 0;
  int32_t peak_pages_used = 0;
  // With KV cache groups: each group's share of peak_pages_used, at the
  // step that reached it (the null page is the rest).
  std::vector<GroupPages> pages_by_group;
  // A model with a window group: the same trace and flags run again with
  // every group full attention (a run of its own: where memory or prefix
  // hits differ, its schedule does too; its preemptions say so).
  std::optional<FullAttentionRun> full_attention;
  double mean_pages_used = 0;  // over committed steps.
  int64_t host_ns_total = 0;   // the steps' host work: the phases' sum.
  HostPhases host_ns_by_phase;
  // Running sequences summed over committed steps (host time per running
  // sequence per step is host_ns_total / sequence_steps).
  int64_t sequence_steps = 0;
  double wall_seconds = 0;  // of the whole run.
  // CPU time of the thread that ran it (the scheduler's own work and the
  // library calls), without other threads' (a KV event publisher's) or
  // the time it waited for a core.
  int64_t scheduler_thread_ns = 0;
  // The steps' page-table patches: host-to-device copies, their bytes, the
  // K entries they set and the rows (ranges) they patched; and the time of
  // the whole-table upload at start-up, not in host_ns_total.
  int64_t upload_copies = 0;
  int64_t upload_bytes = 0;
  int64_t upload_entries = 0;
  int64_t upload_ranges = 0;
  int64_t table_setup_ns = 0;
  // Every committed step, with SchedulerConfig::keep_timeline (else empty).
  std::vector<StepRecord> timeline;
  // Queueing, over completed requests, in steps: from arrival to the step
  // that first admits it (queue wait), and to the end of the step that
  // first completes its prompt, when its first token exists (time to first
  // token: queue wait + 1 for a prompt computed in the step that admits
  // it).
  StepStats queue_steps;
  StepStats ttft_steps;
  // Chunked prefill: the prompt chunks after the admitting steps (the
  // manager's AppendPrompt calls), and over completed requests the steps
  // their prompt was computed in, in the admission that completed (1: in
  // the admitting step alone).
  int64_t prompt_chunks = 0;
  StepStats prompt_steps;
  // Speculative decoding: draft slots proposed and drafts accepted, summed
  // over sequences and steps; the most pages that held nothing but draft
  // slots after a step; the copy-on-write copies drafts made (of
  // cow_copies).
  int64_t drafts_proposed = 0;
  int64_t drafts_accepted = 0;
  int32_t peak_draft_pages = 0;
  int64_t draft_copies = 0;
  // KV cache events (with a sink): batches (steps with events) and the
  // cache changes they record (pages stored and removed, resets) handed to
  // it; the publisher's counts and its thread's CPU time, filled in by
  // kvblock-sim's main after the run.
  struct KvEvents {
    bool on = false;
    int64_t batches = 0;
    int64_t changes = 0;
    int64_t batches_published = 0;
    int64_t events_published = 0;
    int64_t batches_dropped = 0;
    // KvEventPublisherStats::batches_unsent: numbered and kept for replay,
    // not sent (ZeroMQ held --kv_events_max_queued_bytes).
    int64_t batches_unsent = 0;
    int64_t publisher_thread_ns = 0;
    // The endpoints as bound (a "*" port resolved), set by the caller that
    // made the publisher; the replay one empty when there is none.
    std::string endpoint;
    std::string replay_endpoint;
    // The prefix cache at the end: its pages, and the XOR of their hashes'
    // 64-bit forms (the low 64 bits, big-endian), for a subscriber that
    // rebuilt it from the events to compare with.
    int64_t cached_pages = 0;
    uint64_t cached_hash_xor = 0;
    friend bool operator==(const KvEvents&, const KvEvents&) = default;
  };
  KvEvents kv_events;
  int64_t peak_waiting = 0;  // requests arrived and queued, at most.
  // Committed steps whose admissions stopped at each limit while requests
  // waited.
  int64_t steps_limited_by_pages = 0;
  int64_t steps_limited_by_max_batch = 0;
  int64_t steps_limited_by_token_budget = 0;
};

// A snapshot for progress displays, passed after every committed step.
struct Progress {
  int64_t step = 0;
  int64_t running = 0;   // requests.
  int64_t waiting = 0;   // requests arrived and queued.
  int64_t finished = 0;  // completed or rejected.
  int64_t total = 0;
};

// Where a served run stands (Scheduler::Serve), for the feed's router.
struct FeedReport {
  int64_t clock = 0;  // the steps before it are done.
  // Batches handed to the KV event sink so far (steps with events).
  int64_t kv_event_batches = 0;
  int64_t running = 0;  // requests.
  int64_t waiting = 0;
  int64_t completed = 0;
  int64_t rejected = 0;
  // The ids of the requests that completed or were rejected since the last
  // report: the run holds nothing of them any more, and a new request may
  // reuse their ids.
  absl::Span<const std::string> finished_ids;
};

// Requests that reach a run while it goes on (Scheduler::Serve), from a
// router that decides where each runs from what the replicas report
// (kvblock-sim --serve, tools/router). The run and the feed move in
// lockstep: the run steps up to the feed's horizon, reports, and the feed
// hands over the requests that arrive before its next horizon.
class RequestFeed {
 public:
  virtual ~RequestFeed() = default;
  // Given where the run stands (first at clock 0, before any step), appends
  // to `arrivals` the requests arriving in [report.clock, horizon), in
  // arrival order, each validated for the run's TraceLimits with an id that
  // no request the run holds has (one handed over and not yet reported in
  // a FeedReport::finished_ids), and returns the horizon (> report.clock);
  // nullopt when the
  // feed has ended: the run finishes what it holds. An error ends the run
  // with that error.
  virtual absl::StatusOr<std::optional<int64_t>> Next(
      const FeedReport& report, std::deque<Request>& arrivals) = 0;
};

// The library objects a Scheduler owns (defined in scheduler_state.h).
struct SchedulerState;

// The limits a trace must meet to run under `config`: a sequence of
// max_pages_per_seq pages, max_batch samples.
TraceLimits TraceLimitsFor(const SchedulerConfig& config);

class Scheduler {
 public:
  // A scheduler over a fresh manager, page table and KV pool on `device`
  // (which must outlive it). InvalidArgument for a config that fails
  // Validate(), a non-positive max_tokens_per_step, a negative chunk_tokens,
  // spec_tokens outside [0, kMaxSpecTokens] or spec_acceptance outside
  // [0, 1]; the errors of
  // BlockManager::Create, KVPageTable::Create and BatchCommit::Create; and
  // ResourceExhausted when the device cannot hold the KV pool.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerConfig& config, Device& device);

  ~Scheduler();

  // Runs `requests` until each has completed or been rejected, calling
  // `progress` (when set) after every step. InvalidArgument when the
  // requests fail ValidateRequests for this config; FailedPrecondition on a
  // second call; Internal when the library fails in a way the scheduler does
  // not plan for (the message names the step) or an invariant is broken
  // after the run.
  absl::StatusOr<SimResult> Run(
      absl::Span<const Request> requests,
      const std::function<void(const Progress&)>& progress = {});

  // Run over requests `feed` hands over as the run goes on, until the feed
  // ends and every request has completed or been rejected. Internal when the
  // feed breaks its contract (an arrival outside its window, a horizon that
  // does not advance); otherwise as Run. Memory stays bounded however long
  // the feed goes on: a request that completes or is rejected is dropped by
  // the end of its step (its id goes to the next FeedReport), the report's
  // distributions are StepHistograms, and the timeline is kept only with
  // keep_timeline.
  absl::StatusOr<SimResult> Serve(
      RequestFeed& feed,
      const std::function<void(const Progress&)>& progress = {});

  const BlockManager& manager() const;
  const KVPageTable& page_table() const;

 private:
  explicit Scheduler(std::unique_ptr<SchedulerState> state);

  std::unique_ptr<SchedulerState> state_;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_SCHEDULER_H_
