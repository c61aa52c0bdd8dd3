// Copyright 2026 The kvblock Authors.
#include "sim/scheduler.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "kvblock/kernels.h"
#include "kvblock/status_macros.h"
#include "sim/random.h"

namespace kvblock::sim {

struct SchedulerState {
  explicit SchedulerState(Device& device) : device(device) {}

  SchedulerConfig config;
  Device& device;
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<KVPageTable> table;
  std::unique_ptr<BatchCommit> commit;
  DeviceBuffer kv_pool;  // every layer's K and V pages.
  // A step's copy-on-write list, PageId [max_batch, 2]: staged in pinned
  // memory, copied to the device, read by the copy kernel; `copies_done`
  // completes when the staging may be rewritten.
  PinnedBuffer copy_staging;
  DeviceBuffer copy_list;
  DeviceEvent copies_done;
  // The whole-table upload Create makes: its time and what it sent.
  int64_t table_setup_ns = 0;
  KVPageTableUploadStats setup_uploads;
  bool ran = false;
};

namespace {

// The host device's KV pool is written at start-up (Scheduler::Create): one
// larger than the machine's memory is refused, not paged out or killed.
absl::Status CheckFitsHostMemory(size_t pool_bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return absl::OkStatus();  // unknown.
  const auto memory =
      static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
  if (pool_bytes <= memory) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "host device: the KV pool's %d bytes (num_layers x 2 x num_pages x "
      "page bytes) exceed this machine's %d bytes of memory",
      pool_bytes, memory));
}

// The calling thread's CPU time.
int64_t ThreadCpuNanos() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// One running sample or beam of a request.
struct Sequence {
  SequenceId id = 0;
  int32_t sample = 0;  // its GeneratedToken stream.
};

struct RequestState {
  const Request* request = nullptr;
  // The feed's copy of `request` (Serve), released once the request is done;
  // null for a trace's request, which the caller owns.
  Request* owned = nullptr;
  // Completed or rejected: nothing refers to it any more (ReleaseDone).
  bool done = false;
  uint64_t id_hash = 0;
  std::vector<Sequence> sequences = {};  // running, in creation order.
  int64_t generated = 0;                 // tokens appended to each sequence.
  int32_t next_sample = 0;
  // Chunked prefill, this admission: prompt tokens in the first sequence
  // (hits and computed), the steps that computed some, and whether the
  // other samples still wait to fork (until the prompt is done).
  int64_t prompt_done = 0;
  int32_t prompt_steps = 0;
  bool forks_pending = false;
  int32_t drafts = 0;  // draft slots each sequence holds.
  // This step's plan (recomputed on every retry): all sequences leave, the
  // index of a dropped beam and of a forked one (-1: none), the id of that
  // fork or of the first sample forked now that the prompt is done, the
  // prompt chunk, the drafts accepted, the tokens each sequence appends and
  // the drafts it then holds.
  bool finishing = false;
  int32_t drop = -1;
  int32_t fork = -1;
  bool samples_fork = false;
  SequenceId fork_id = 0;
  int64_t chunk = 0;
  int32_t accepted = 0;
  int32_t appends = 0;
  int32_t new_drafts = 0;
  SequenceId first_id = 0;      // of an admission: sample i gets first_id + i.
  int64_t planned_prompt = 0;   // of an admission: prompt_done after it.
  int64_t first_admitted = -1;  // the step that first admitted it.
  int64_t first_token = -1;     // the step that first completed its prompt.
  // The prompt's page hashes, computed once on arrival (empty without
  // prefix caching): planning every step and admitting reuse them.
  std::vector<BlockHash> prompt_hashes = {};
};

// The beam rule: at `position`, a request with `live` of `width` beams forks
// beam `fork` and drops beam `drop` (-1: none; never the same beam), keeping
// 1..width beams.
void DecideBeams(uint64_t id_hash, int64_t position, int32_t live,
                 int32_t width, int32_t& fork, int32_t& drop) {
  const uint64_t h = Mix(id_hash ^ Mix(static_cast<uint64_t>(position)));
  fork =
      live < width && (h & 1) == 0 ? static_cast<int32_t>((h >> 8) % live) : -1;
  drop = -1;
  if (live > 1 && (h >> 4) % 3 == 0) {
    drop = static_cast<int32_t>((h >> 16) % live);
    if (drop == fork) drop = (drop + 1) % live;
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t PromptLeft(const RequestState& r) {
  return static_cast<int64_t>(r.request->prompt.size()) - r.prompt_done;
}

// Of `drafts` drafts proposed after `position` tokens, how many the target
// model accepts: each with probability `acceptance`, decided by a hash of
// (request, position, seed); the first rejection ends the run.
int32_t AcceptedDrafts(uint64_t id_hash, uint64_t seed, int64_t position,
                       int32_t drafts, double acceptance) {
  int32_t accepted = 0;
  while (accepted < drafts) {
    const uint64_t h = Mix(
        id_hash ^ Mix(seed ^ Mix(static_cast<uint64_t>(position + accepted))));
    // The top 53 bits as a uniform double in [0, 1).
    if (static_cast<double>(h >> 11) * 0x1.0p-53 >= acceptance) break;
    ++accepted;
  }
  return accepted;
}

// One Run: the queue, the running requests and the step being planned.
class Runner {
 public:
  // Over `requests`, then those `feed` (when not null) hands over.
  Runner(SchedulerState& state, absl::Span<const Request> requests,
         RequestFeed* feed,
         const std::function<void(const Progress&)>& progress);

  absl::StatusOr<SimResult> Run();

 private:
  // Times a library call into `phase` (a field of phases_).
  template <typename Call>
  auto Timed(int64_t& phase, Call&& call) -> decltype(call()) {
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    phase += std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now() - start)
                 .count();
    return result;
  }

  // Plans and commits this step, letting the latest admitted requests give
  // way until it fits the pool; nullopt when there is nothing to commit.
  absl::StatusOr<std::optional<StepResult>> CommitStep();
  // Hands the KV cache events recorded since the last hand-off to the
  // config's sink, if it is ready or `force`.
  absl::Status HandOffKvEvents(bool force);
  // Fills the plan of this step, admitting at most `admit_limit` requests.
  absl::Status PlanStep(int64_t admit_limit);
  // Plans the leaving, appending, drafting, prefilling and forking sequences
  // of running requests.
  void PlanRunning();
  // Plans the decode of request `r` (its prompt done): tokens to append,
  // drafts, the beam or sample forks.
  void PlanDecode(RequestState& r, int64_t batch_after);
  // Gives decoding requests their drafts and prefilling ones their chunks
  // from the token budget left after one token per decoding sequence.
  void PlanBudget();
  // Running sequences once the planned leaves are done.
  int64_t BatchAfterLeaving() const {
    return commit_.batch() -
           static_cast<int64_t>(finished_.size() + preempted_.size());
  }
  // Reports to the feed and takes its next arrivals and horizon.
  absl::Status ReadFeed();
  // Queues an arriving request, hashing its prompt's pages once.
  absl::Status Arrive(RequestState& request);
  // Plans admissions from the queue head; rejects requests that never fit.
  absl::Status PlanAdmissions(int64_t admit_limit);
  // Applies a committed plan to the request states.
  absl::Status ApplyStep();
  // Pages that hold nothing but draft slots, over the running sequences.
  int32_t DraftOnlyPages() const;
  // Uploads the page table and runs the step's copy-on-write copies.
  absl::Status RunDevice(absl::Span<const PageCopy> copies);
  // Makes the latest admitted running request give way after the pool ran
  // out: preempted and re-queued, or rejected when it ran alone.
  absl::Status GiveWay();
  void Reject(RequestState& request, RejectedRequest::Kind kind,
              std::string reason);
  // Marks a completed or rejected request done, for ReleaseDone.
  void Done(RequestState& request);
  // Frees what the run holds of the requests done since the last call, and
  // drops the states at the front of requests_ that are done: a served run's
  // memory does not grow with the requests it has finished.
  void ReleaseDone();
  absl::Status CheckFinalState() const;

  SchedulerState& state_;
  BlockManager& manager_;
  BatchCommit& commit_;
  const PagedKvConfig& kv_;
  const std::function<void(const Progress&)>& progress_;

  // By arrival, ties in trace order, from the first not yet done (those
  // before are dropped); a deque, so that the feed's arrivals and the drops
  // leave the queue's and the batch's pointers valid.
  std::deque<RequestState> requests_;
  size_t next_arrival_ = 0;
  RequestFeed* feed_ = nullptr;  // null once it has ended.
  // The feed's requests, each the `owned` of the state at the same index of
  // requests_ (a served run has no others).
  std::deque<Request> fed_;
  // Requests done since the last ReleaseDone, and the ids of the feed's
  // ones released since the last report to the feed.
  std::vector<RequestState*> done_;
  std::vector<std::string> finished_ids_;
  int64_t horizon_ = 0;  // the feed's: steps before it may run.
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;        // in admission order.
  std::vector<RequestState*> still_running_;  // ApplyStep's scratch.
  SequenceId next_sequence_id_ = 0;
  int64_t clock_ = 0;
  // Host time in library calls: by phase, and Commit's whole (whose parts
  // BatchCommit times).
  HostPhases phases_;
  int64_t commit_ns_ = 0;
  // The step's KV cache events, for the sink.
  KvEventBatch kv_events_;
  SimResult result_;

  // The step being planned. Victims of this step (preempted or rejected
  // while running) stay in the leave lists across retries.
  std::vector<SequenceId> victims_finished_;
  std::vector<SequenceId> victims_preempted_;
  int32_t step_preemptions_ = 0;
  std::vector<SequenceId> finished_;
  std::vector<SequenceId> preempted_;
  std::vector<JoinRequest> joins_;
  std::vector<TokenId> fork_tokens_;  // reserved: joins_ point into it.
  std::vector<int32_t> append_counts_;
  std::vector<TokenId> append_tokens_;
  std::vector<int32_t> draft_counts_;  // per slot; empty without drafts.
  std::vector<int32_t> page_counts_;   // per slot: appends and chunks.
  std::vector<PromptChunk> prompt_chunks_;
  // The running sequences that append or take a prompt chunk this step.
  struct Stepping {
    RequestState* request = nullptr;
    int32_t sample = 0;
  };
  absl::flat_hash_map<SequenceId, Stepping> stepping_;
  int32_t forks_ = 0;
  int32_t held_seats_ = 0;    // for samples forking once their prompt is done.
  int64_t budget_ = 0;        // tokens the step has left to compute.
  int64_t append_pages_ = 0;  // pages the step's appends may allocate.
  SequenceId next_id_ = 0;    // after the step's forks and admissions.
  int64_t admitted_ = 0;      // requests at the queue head admitted.
  StepLimit limit_ = StepLimit::kNone;  // what stopped this plan's admissions.
  bool pages_ran_out_ = false;          // a commit of this step did.
  // Of completed requests: queue waits, steps to the first token, steps
  // that computed the prompt.
  StepHistogram queue_waits_;
  StepHistogram first_token_waits_;
  StepHistogram prompt_steps_;
};

Runner::Runner(SchedulerState& state, absl::Span<const Request> requests,
               RequestFeed* feed,
               const std::function<void(const Progress&)>& progress)
    : state_(state),
      manager_(*state.manager),
      commit_(*state.commit),
      kv_(state.config.kv),
      progress_(progress),
      feed_(feed) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].arrival < requests[b].arrival;
  });
  for (const size_t i : order) {
    requests_.push_back(
        {.request = &requests[i], .id_hash = HashId(requests[i].id)});
  }
  const size_t max_batch = kv_.max_batch;
  running_.reserve(max_batch);
  still_running_.reserve(max_batch);
  for (auto* list :
       {&victims_finished_, &victims_preempted_, &finished_, &preempted_}) {
    list->reserve(max_batch);
  }
  joins_.reserve(max_batch);
  fork_tokens_.reserve(max_batch);
  append_counts_.reserve(max_batch);
  append_tokens_.reserve(max_batch);
  draft_counts_.reserve(max_batch);
  page_counts_.reserve(max_batch);
  prompt_chunks_.reserve(max_batch);
  stepping_.reserve(max_batch);
  result_.requests = static_cast<int64_t>(requests.size());
  result_.num_pages = kv_.num_pages;
}

void Runner::Reject(RequestState& request, RejectedRequest::Kind kind,
                    std::string reason) {
  if (result_.rejected.size() < kMaxListedRejections) {
    result_.rejected.push_back(
        {.id = request.request->id, .reason = std::move(reason), .kind = kind});
  } else {
    ++result_.unlisted_rejections[static_cast<size_t>(kind)];
  }
  Done(request);
}

void Runner::Done(RequestState& request) {
  request.done = true;
  done_.push_back(&request);
}

void Runner::ReleaseDone() {
  for (RequestState* r : done_) {
    r->sequences = {};
    r->prompt_hashes = {};
    if (r->owned != nullptr) {
      finished_ids_.push_back(std::move(r->owned->id));
      r->owned->prompt = {};
      r->owned->output = {};
      r->owned->cache_salt = {};
    }
  }
  done_.clear();
  while (next_arrival_ > 0 && requests_.front().done) {
    if (requests_.front().owned != nullptr) fed_.pop_front();
    requests_.pop_front();
    --next_arrival_;
  }
}

void Runner::PlanRunning() {
  // Leaving sequences first, so forks know the room left in the batch.
  for (RequestState* r : running_) {
    r->finishing = r->generated == r->request->max_tokens;
    r->drop = r->fork = -1;
    r->samples_fork = false;
    r->chunk = 0;
    r->accepted = r->appends = r->new_drafts = 0;
    if (r->finishing) {
      for (const Sequence& s : r->sequences) finished_.push_back(s.id);
    } else if (r->request->beam > 1) {
      DecideBeams(r->id_hash, r->generated,
                  static_cast<int32_t>(r->sequences.size()), r->request->beam,
                  r->fork, r->drop);
      if (r->drop >= 0) finished_.push_back(r->sequences[r->drop].id);
    }
    if (r->forks_pending && PromptLeft(*r) > 0) {
      held_seats_ += r->request->n - 1;
    }
  }
  const int64_t batch_after = BatchAfterLeaving();
  for (RequestState* r : running_) {
    if (!r->finishing && PromptLeft(*r) == 0) PlanDecode(*r, batch_after);
  }
  PlanBudget();
}

void Runner::PlanDecode(RequestState& r, int64_t batch_after) {
  const Request& request = *r.request;
  if (r.forks_pending) {
    // The prompt is done: the other samples fork, each with its first token.
    r.samples_fork = true;
    r.fork_id = next_sequence_id_ + forks_;
    for (int32_t sample = 1; sample < request.n; ++sample) {
      fork_tokens_.push_back(GeneratedToken(request, sample, r.generated));
      joins_.push_back({.id = r.fork_id + sample - 1,
                        .fork_of = r.sequences[0].id,
                        .tokens = absl::MakeConstSpan(&fork_tokens_.back(), 1),
                        .extra = {}});
    }
    forks_ += request.n - 1;
    budget_ -= request.n - 1;
    append_pages_ += request.n - 1;  // each fork's token: a page or a copy.
  }
  if (r.fork >= 0 && batch_after + forks_ + held_seats_ >= kv_.max_batch) {
    r.fork = -1;
  }
  r.accepted = AcceptedDrafts(r.id_hash, state_.config.spec_seed, r.generated,
                              r.drafts, state_.config.spec_acceptance);
  r.appends = static_cast<int32_t>(
      std::min<int64_t>(r.accepted + 1, request.max_tokens - r.generated));
  for (int32_t i = 0; i < static_cast<int32_t>(r.sequences.size()); ++i) {
    if (i == r.drop) continue;
    const Sequence& s = r.sequences[i];
    stepping_[s.id] = {.request = &r, .sample = s.sample};
    --budget_;
  }
  if (r.fork >= 0) {
    r.fork_id = next_sequence_id_ + forks_;
    fork_tokens_.push_back(GeneratedToken(request, r.next_sample, r.generated));
    joins_.push_back({.id = r.fork_id,
                      .fork_of = r.sequences[r.fork].id,
                      .tokens = absl::MakeConstSpan(&fork_tokens_.back(), 1),
                      .extra = {}});
    ++forks_;
    --budget_;
    ++append_pages_;  // the fork's token: a new page or a copy.
  }
}

void Runner::PlanBudget() {
  const SchedulerConfig& config = state_.config;
  for (RequestState* r : running_) {
    if (r->finishing) continue;
    const Request& request = *r->request;
    const int64_t left = PromptLeft(*r);
    if (left > 0) {
      int64_t chunk = std::min(left, budget_);
      if (config.chunk_tokens > 0) chunk = std::min(chunk, config.chunk_tokens);
      if (chunk <= 0) continue;
      r->chunk = chunk;
      budget_ -= chunk;
      const SequenceId id = r->sequences[0].id;
      prompt_chunks_.push_back(
          {.id = id,
           .tokens = absl::MakeConstSpan(request.prompt)
                         .subspan(static_cast<size_t>(r->prompt_done),
                                  static_cast<size_t>(chunk)),
           .prompt_hashes = r->prompt_hashes});
      stepping_[id] = {.request = r, .sample = 0};
      continue;
    }
    if (config.spec_tokens == 0 || request.beam > 1 || r->samples_fork) {
      continue;
    }
    // Drafts the next step can verify: it appends at most the tokens left.
    const int64_t after = request.max_tokens - r->generated - r->appends;
    const int64_t live =
        static_cast<int64_t>(r->sequences.size()) - (r->drop >= 0 ? 1 : 0);
    const int64_t drafts =
        std::min({static_cast<int64_t>(config.spec_tokens), after - 1,
                  budget_ / std::max<int64_t>(live, 1)});
    if (drafts <= 0) continue;
    r->new_drafts = static_cast<int32_t>(drafts);
    budget_ -= drafts * live;
  }
}

absl::Status Runner::Arrive(RequestState& r) {
  if (manager_.options().enable_prefix_caching) {
    const Request& request = *r.request;
    r.prompt_hashes.resize(request.prompt.size() / kv_.page_size);
    KVBLOCK_RETURN_IF_ERROR(Timed(phases_.planning_ns, [&] {
                              return manager_.HashPrompt(
                                  request.prompt,
                                  {.cache_salt = request.cache_salt},
                                  absl::MakeSpan(r.prompt_hashes));
                            }).status());
  }
  waiting_.push_back(&r);
  return absl::OkStatus();
}

absl::Status Runner::PlanAdmissions(int64_t admit_limit) {
  const SchedulerConfig& config = state_.config;
  const int32_t watermark = config.manager.watermark_pages;
  int64_t seats = kv_.max_batch - BatchAfterLeaving() - forks_ - held_seats_;
  int64_t pages =
      Timed(phases_.planning_ns, [&] { return manager_.NumAllocatable(); }) -
      watermark - append_pages_;
  for (size_t i = 0; i < waiting_.size() && admitted_ < admit_limit;) {
    RequestState& r = *waiting_[i];
    const Request& request = *r.request;
    const int32_t samples = request.n;
    if (samples > seats) {
      limit_ = StepLimit::kMaxBatch;
      break;
    }
    AdmitOptions admit;
    if (config.chunked_prefill) {
      if (budget_ <= 0) {
        limit_ = StepLimit::kTokenBudget;
        break;
      }
      admit.prefill_tokens = config.chunk_tokens > 0
                                 ? std::min(budget_, config.chunk_tokens)
                                 : budget_;
    }
    const HashExtraKeys extra{.cache_salt = request.cache_salt};
    KVBLOCK_ASSIGN_OR_RETURN(
        const AdmissionPlan plan, Timed(phases_.planning_ns, [&] {
          return manager_.PlanAdmission(request.prompt, extra, r.prompt_hashes,
                                        admit);
        }));
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    const int64_t prompt_pages = CeilDiv(prompt, kv_.page_size);
    std::string reason;
    RejectedRequest::Kind kind = RejectedRequest::Kind::kPoolTooSmall;
    if (prompt_pages > kv_.num_pages - watermark) {
      reason = absl::StrFormat(
          "its prompt needs %d pages, the pool admits %d (%d less a watermark "
          "of %d)",
          prompt_pages, kv_.num_pages - watermark, kv_.num_pages, watermark);
    } else if (!config.chunked_prefill &&
               plan.computed_tokens > config.max_tokens_per_step) {
      kind = RejectedRequest::Kind::kOverTokenBudget;
      reason = absl::StrFormat(
          "%d uncached prompt tokens exceed max_tokens_per_step %d (chunked "
          "prefill is off)",
          plan.computed_tokens, config.max_tokens_per_step);
    }
    if (!reason.empty()) {
      Reject(r, kind, std::move(reason));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (plan.computed_tokens > budget_) {
      limit_ = StepLimit::kTokenBudget;
      break;
    }
    const int64_t taken = plan.pages_consumed() + plan.reserved_pages;
    if (taken > pages) {
      limit_ = StepLimit::kPages;
      break;
    }
    r.first_id = next_id_;
    r.planned_prompt = plan.hit_tokens + plan.computed_tokens;
    joins_.push_back({.id = next_id_,
                      .fork_of = kNoSequence,
                      .tokens = request.prompt,
                      .extra = extra,
                      .prompt_hashes = r.prompt_hashes,
                      .admit = admit});
    ++next_id_;
    // A chunked prompt's samples fork once it is done; their seats are held.
    if (r.planned_prompt == prompt) {
      for (int32_t sample = 1; sample < samples; ++sample) {
        joins_.push_back({.id = next_id_++,
                          .fork_of = r.first_id,
                          .tokens = {},
                          .extra = {}});
      }
    }
    seats -= samples;
    budget_ -= plan.computed_tokens;
    pages -= taken;
    ++admitted_;
    ++i;
  }
  return absl::OkStatus();
}

absl::Status Runner::PlanStep(int64_t admit_limit) {
  finished_.assign(victims_finished_.begin(), victims_finished_.end());
  preempted_.assign(victims_preempted_.begin(), victims_preempted_.end());
  joins_.clear();
  fork_tokens_.clear();
  prompt_chunks_.clear();
  stepping_.clear();
  forks_ = 0;
  held_seats_ = 0;
  budget_ = state_.config.max_tokens_per_step;
  append_pages_ = 0;
  admitted_ = 0;
  limit_ = StepLimit::kNone;
  PlanRunning();
  next_id_ = next_sequence_id_ + forks_;
  append_counts_.clear();
  append_tokens_.clear();
  draft_counts_.clear();
  page_counts_.clear();
  const bool drafting = state_.config.spec_tokens > 0;
  for (const SequenceId id : commit_.slots()) {
    const auto it = stepping_.find(id);
    int32_t appends = 0, drafts = 0, chunk = 0;
    if (it != stepping_.end()) {
      const RequestState& r = *it->second.request;
      if (r.chunk > 0) {
        chunk = static_cast<int32_t>(r.chunk);
      } else {
        appends = r.appends;
        drafts = r.new_drafts;
        for (int32_t j = 0; j < appends; ++j) {
          append_tokens_.push_back(
              GeneratedToken(*r.request, it->second.sample, r.generated + j));
        }
      }
    }
    append_counts_.push_back(appends);
    page_counts_.push_back(appends + chunk);
    if (drafting) draft_counts_.push_back(drafts);
  }
  // What the appends, chunks and drafts take from the pool, the manager's
  // own count (new pages, copies of shared partial pages, less the pages
  // reserved for the prompts).
  KVBLOCK_ASSIGN_OR_RETURN(
      const int64_t append_pages, Timed(phases_.planning_ns, [&] {
        return commit_.AppendPages(page_counts_, draft_counts_);
      }));
  append_pages_ += append_pages;
  return PlanAdmissions(admit_limit);
}

absl::Status Runner::GiveWay() {
  if (running_.empty()) {
    return absl::InternalError(absl::StrFormat(
        "step %d: out of pages with no request left to preempt", clock_));
  }
  RequestState& victim = *running_.back();
  running_.pop_back();
  const bool alone = running_.empty();
  for (const Sequence& s : victim.sequences) {
    (alone ? victims_finished_ : victims_preempted_).push_back(s.id);
  }
  const int64_t sequences = static_cast<int64_t>(victim.sequences.size());
  victim.sequences.clear();
  if (alone) {
    Reject(victim, RejectedRequest::Kind::kRanOutAlone,
           absl::StrFormat("ran out of pages running alone (pool of %d pages)",
                           kv_.num_pages));
    return absl::OkStatus();
  }
  result_.recomputed_tokens += victim.generated * sequences;
  // Recompute: the request restarts from its prompt.
  victim.generated = 0;
  victim.next_sample = 0;
  victim.prompt_done = 0;
  victim.prompt_steps = 0;
  victim.forks_pending = false;
  victim.drafts = 0;
  waiting_.push_front(&victim);
  ++step_preemptions_;
  return absl::OkStatus();
}

absl::Status Runner::ApplyStep() {
  still_running_.clear();
  for (RequestState* r : running_) {
    const Request& request = *r->request;
    if (r->finishing) {
      r->sequences.clear();
      ++result_.completed;
      queue_waits_.Add(r->first_admitted - request.arrival);
      first_token_waits_.Add(r->first_token - request.arrival + 1);
      prompt_steps_.Add(r->prompt_steps);
      Done(*r);
      continue;
    }
    still_running_.push_back(r);
    if (r->chunk > 0) {
      r->prompt_done += r->chunk;
      ++r->prompt_steps;
      if (PromptLeft(*r) == 0 && r->first_token < 0) r->first_token = clock_;
      continue;
    }
    if (PromptLeft(*r) > 0) continue;  // no budget for its chunk this step.
    if (r->samples_fork) {
      for (int32_t sample = 1; sample < request.n; ++sample) {
        r->sequences.push_back(
            {.id = r->fork_id + sample - 1, .sample = sample});
      }
      r->next_sample = request.n;
      r->forks_pending = false;
    }
    if (r->fork >= 0) {
      r->sequences.push_back({.id = r->fork_id, .sample = r->next_sample++});
    }
    if (r->drop >= 0) r->sequences.erase(r->sequences.begin() + r->drop);
    const int64_t live = static_cast<int64_t>(r->sequences.size());
    result_.drafts_accepted += int64_t{r->accepted} * live;
    result_.drafts_proposed += int64_t{r->new_drafts} * live;
    r->generated += r->appends;
    r->drafts = r->new_drafts;
  }
  for (int64_t i = 0; i < admitted_; ++i) {
    RequestState& r = *waiting_.front();
    waiting_.pop_front();
    if (r.first_admitted < 0) r.first_admitted = clock_;
    const Request& request = *r.request;
    // The manager's count: a prompt may hit pages that a join before it in
    // this step registered, which planning did not see.
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    KVBLOCK_ASSIGN_OR_RETURN(const int64_t left,
                             Timed(phases_.planning_ns, [&] {
                               return manager_.PromptTokensLeft(r.first_id);
                             }));
    r.prompt_done = prompt - left;
    r.prompt_steps = 1;
    if (PromptLeft(r) == 0 && r.first_token < 0) r.first_token = clock_;
    // Samples join with a prompt planned whole, else fork once it is done.
    const bool whole = r.planned_prompt == prompt;
    r.forks_pending = !whole && request.n > 1;
    const int32_t samples = whole ? request.n : 1;
    for (int32_t sample = 0; sample < samples; ++sample) {
      r.sequences.push_back({.id = r.first_id + sample, .sample = sample});
    }
    r.next_sample = samples;
    still_running_.push_back(&r);
  }
  next_sequence_id_ = next_id_;
  running_.swap(still_running_);
  return absl::OkStatus();
}

int32_t Runner::DraftOnlyPages() const {
  int64_t pages = 0;
  for (const RequestState* r : running_) {
    if (r->drafts == 0) continue;
    const int64_t tokens =
        static_cast<int64_t>(r->request->prompt.size()) + r->generated;
    pages += static_cast<int64_t>(r->sequences.size()) *
             (CeilDiv(tokens + r->drafts, kv_.page_size) -
              CeilDiv(tokens, kv_.page_size));
  }
  return static_cast<int32_t>(pages);
}

absl::Status Runner::RunDevice(absl::Span<const PageCopy> copies) {
  Device& device = state_.device;
  KVBLOCK_RETURN_IF_ERROR(Timed(phases_.upload_ns, [&] {
                            return state_.table->Upload(nullptr);
                          }).status());
  if (copies.empty()) return absl::OkStatus();
  if (copies.size() > static_cast<size_t>(kv_.max_batch)) {
    return absl::InternalError(
        absl::StrFormat("step %d: %d copies exceed the %d the copy list holds",
                        clock_, copies.size(), kv_.max_batch));
  }
  // The previous step's list may still be in flight from the staging.
  KVBLOCK_RETURN_IF_ERROR(Timed(phases_.copy_on_write_ns, [&] {
    return device.WaitEvent(state_.copies_done);
  }));
  auto* staging = static_cast<PageId*>(state_.copy_staging.data());
  for (size_t i = 0; i < copies.size(); ++i) {
    staging[2 * i] = copies[i].source;
    staging[2 * i + 1] = copies[i].destination;
  }
  return Timed(phases_.copy_on_write_ns, [&]() -> absl::Status {
    KVBLOCK_RETURN_IF_ERROR(
        device.CopyToDevice(staging, state_.copy_list.data(),
                            copies.size() * 2 * sizeof(PageId), nullptr));
    KVBLOCK_RETURN_IF_ERROR(
        CopyPages(device, KvPool{.config = kv_, .data = state_.kv_pool.data()},
                  static_cast<const PageId*>(state_.copy_list.data()),
                  static_cast<int64_t>(copies.size()), nullptr));
    return device.RecordEvent(state_.copies_done, nullptr);
  });
}

absl::Status Runner::CheckFinalState() const {
  KVBLOCK_RETURN_IF_ERROR(manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(commit_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(state_.table->CheckInvariants());
  if (manager_.num_sequences() != 0 || manager_.pool().NumUsed() != 0) {
    return absl::InternalError(absl::StrFormat(
        "after the run %d sequences and %d pages are still in use",
        manager_.num_sequences(), manager_.pool().NumUsed()));
  }
  return absl::OkStatus();
}

absl::Status Runner::HandOffKvEvents(bool force) {
  const KvEventSink& sink = state_.config.kv_event_sink;
  if (!sink.on()) return absl::OkStatus();
  // Not timed: an atomic load most steps, less than the clock's reads.
  if (!force && sink.ready && !sink.ready() &&
      manager_.pending_kv_changes() < kMaxPendingKvChanges) {
    return absl::OkStatus();
  }
  return Timed(phases_.kv_events_ns, [&]() -> absl::Status {
    KVBLOCK_RETURN_IF_ERROR(manager_.TakeKvEvents(kv_events_));
    if (kv_events_.empty()) return absl::OkStatus();
    ++result_.kv_events.batches;
    result_.kv_events.changes += kv_events_.num_changes();
    sink.publish(kv_events_);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<StepResult>> Runner::CommitStep() {
  victims_finished_.clear();
  victims_preempted_.clear();
  step_preemptions_ = 0;
  pages_ran_out_ = false;
  int64_t admit_limit = std::numeric_limits<int64_t>::max();
  for (;;) {
    KVBLOCK_RETURN_IF_ERROR(PlanStep(admit_limit));
    if (running_.empty() && joins_.empty() && finished_.empty()) {
      return std::nullopt;
    }
    const StepPlan plan{.finished = finished_,
                        .preempted = preempted_,
                        .joins = joins_,
                        .append_counts = append_counts_,
                        .append_tokens = append_tokens_,
                        .prompt_chunks = prompt_chunks_,
                        .draft_counts = draft_counts_};
    absl::StatusOr<StepResult> step =
        Timed(commit_ns_, [&] { return commit_.Commit(plan); });
    if (step.ok()) return *step;
    if (step.status().code() != absl::StatusCode::kResourceExhausted) {
      return absl::InternalError(absl::StrFormat("step %d: commit: %s", clock_,
                                                 step.status().ToString()));
    }
    pages_ran_out_ = true;
    if (admitted_ > 0) {
      admit_limit = admitted_ - 1;  // the latest admission waits.
    } else {
      KVBLOCK_RETURN_IF_ERROR(GiveWay());
      admit_limit = 0;
    }
  }
}

absl::Status Runner::ReadFeed() {
  const FeedReport report{.clock = clock_,
                          .kv_event_batches = result_.kv_events.batches,
                          .running = static_cast<int64_t>(running_.size()),
                          .waiting = static_cast<int64_t>(waiting_.size()),
                          .completed = result_.completed,
                          .rejected = result_.num_rejected(),
                          .finished_ids = finished_ids_};
  const size_t known = fed_.size();
  KVBLOCK_ASSIGN_OR_RETURN(const std::optional<int64_t> horizon,
                           feed_->Next(report, fed_));
  finished_ids_.clear();
  if (horizon.has_value() && *horizon <= clock_) {
    return absl::InternalError(absl::StrFormat(
        "feed: horizon %d does not pass step %d", *horizon, clock_));
  }
  int64_t earliest = clock_;
  for (size_t i = known; i < fed_.size(); ++i) {
    Request& request = fed_[i];
    if (request.arrival < earliest ||
        (horizon.has_value() && request.arrival >= *horizon)) {
      return absl::InternalError(absl::StrFormat(
          "feed: request '%s' arrives at step %d, outside [%d, %s)", request.id,
          request.arrival, earliest,
          horizon.has_value() ? absl::StrCat(*horizon) : "end"));
    }
    earliest = request.arrival;
    requests_.push_back({.request = &request,
                         .owned = &request,
                         .id_hash = HashId(request.id)});
  }
  result_.requests += static_cast<int64_t>(fed_.size() - known);
  if (horizon.has_value()) {
    horizon_ = *horizon;
  } else {
    feed_ = nullptr;
  }
  return absl::OkStatus();
}

absl::StatusOr<SimResult> Runner::Run() {
  const auto wall_start = std::chrono::steady_clock::now();
  const int64_t cpu_start = ThreadCpuNanos();
  double pages_sum = 0;
  while (true) {
    if (feed_ != nullptr && clock_ >= horizon_) {
      // The report counts every batch of the steps before it.
      KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/true));
      KVBLOCK_RETURN_IF_ERROR(ReadFeed());
    }
    if (waiting_.empty() && running_.empty()) {
      // Idle: skip to the next arrival, or to the feed's horizon.
      if (next_arrival_ < requests_.size()) {
        clock_ = std::max(clock_, requests_[next_arrival_].request->arrival);
      } else if (feed_ != nullptr) {
        clock_ = horizon_;
        continue;
      } else {
        break;
      }
    }
    while (next_arrival_ < requests_.size() &&
           requests_[next_arrival_].request->arrival <= clock_) {
      KVBLOCK_RETURN_IF_ERROR(Arrive(requests_[next_arrival_++]));
    }
    const BlockManagerStats before = manager_.stats();
    KVBLOCK_ASSIGN_OR_RETURN(const std::optional<StepResult> step,
                             CommitStep());
    ReleaseDone();
    if (!step.has_value()) {
      // Nothing to commit: planning rejected every waiting request.
      if (!waiting_.empty()) {
        return absl::InternalError(absl::StrFormat(
            "step %d: nothing runs and the queue head cannot be admitted",
            clock_));
      }
      continue;
    }
    KVBLOCK_RETURN_IF_ERROR(ApplyStep());
    ReleaseDone();
    KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/false));
    result_.draft_copies += step->draft_copies;
    if (state_.config.spec_tokens > 0) {
      result_.peak_draft_pages =
          std::max(result_.peak_draft_pages, DraftOnlyPages());
    }
    KVBLOCK_RETURN_IF_ERROR(RunDevice(step->copies));
    const BlockManagerStats& after = manager_.stats();
    const StepRecord record{
        .step = clock_,
        .batch = step->batch,
        .pages_used = after.pages_in_use,
        .hit_tokens = after.prefix_hit_tokens - before.prefix_hit_tokens,
        .prompt_tokens = after.prompt_tokens - before.prompt_tokens,
        .preemptions = step_preemptions_,
        .cow_copies =
            static_cast<int32_t>(after.cow_copies - before.cow_copies),
        .evictions = static_cast<int32_t>(after.evictions - before.evictions),
        .waiting = static_cast<int32_t>(waiting_.size()),
        .limit = pages_ran_out_ ? StepLimit::kPages : limit_,
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
    result_.peak_waiting = std::max<int64_t>(
        result_.peak_waiting, static_cast<int64_t>(waiting_.size()));
    if (state_.config.keep_timeline) result_.timeline.push_back(record);
    ++result_.steps;
    result_.sequence_steps += step->batch;
    result_.preemptions += step_preemptions_;
    pages_sum += record.pages_used;
    ++clock_;
    if (progress_) {
      progress_({.step = clock_,
                 .running = static_cast<int64_t>(running_.size()),
                 .waiting = static_cast<int64_t>(waiting_.size()),
                 .finished = result_.completed + result_.num_rejected(),
                 .total = result_.requests});
    }
  }
  KVBLOCK_RETURN_IF_ERROR(HandOffKvEvents(/*force=*/true));
  KVBLOCK_RETURN_IF_ERROR(Timed(phases_.copy_on_write_ns, [&] {
    return state_.device.Synchronize(nullptr);
  }));
  KVBLOCK_RETURN_IF_ERROR(CheckFinalState());
  const BlockManagerStats& stats = manager_.stats();
  result_.prompt_tokens = stats.prompt_tokens;
  result_.prefix_hit_tokens = stats.prefix_hit_tokens;
  result_.generated_tokens = stats.appended_tokens;
  result_.cow_copies = stats.cow_copies;
  result_.evictions = stats.evictions;
  result_.peak_pages_used = stats.peak_pages_in_use;
  result_.mean_pages_used =
      result_.steps > 0 ? pages_sum / static_cast<double>(result_.steps) : 0;
  const CommitPhaseTimes& commit = commit_.phase_times();
  phases_.frees_ns = commit.frees_ns;
  phases_.admissions_ns = commit.admissions_ns;
  phases_.appends_ns = commit.appends_ns;
  phases_.page_table_ns = commit.page_table_ns;
  // The rest of each Commit call, and of the calls into it.
  phases_.bookkeeping_ns = commit_ns_ - commit.frees_ns - commit.admissions_ns -
                           commit.appends_ns - commit.page_table_ns;
  result_.queue_steps = queue_waits_.Stats();
  result_.ttft_steps = first_token_waits_.Stats();
  result_.prompt_steps = prompt_steps_.Stats();
  result_.prompt_chunks = stats.prompt_chunks;
  result_.host_ns_by_phase = phases_;
  result_.kv_events.on = state_.config.kv_event_sink.on();
  if (result_.kv_events.on) {
    // vLLM's integer form of each hash: its digest's low 64 bits.
    const size_t digest =
        static_cast<size_t>(DigestSize(state_.config.manager.hash_algorithm));
    for (const auto& [page, hash] : manager_.pool().Snapshot().cached) {
      uint64_t low = 0;
      for (size_t i = digest - 8; i < digest; ++i) {
        low = low << 8 | hash.bytes[i];
      }
      result_.kv_events.cached_hash_xor ^= low;
      ++result_.kv_events.cached_pages;
    }
  }
  result_.host_ns_total = phases_.total_ns();
  const KVPageTableUploadStats& uploads = state_.table->upload_stats();
  const KVPageTableUploadStats& setup = state_.setup_uploads;
  result_.table_setup_ns = state_.table_setup_ns;
  result_.upload_copies = uploads.copies - setup.copies;
  result_.upload_bytes = uploads.bytes - setup.bytes;
  result_.upload_entries = uploads.entries - setup.entries;
  result_.upload_ranges = uploads.ranges - setup.ranges;
  result_.scheduler_thread_ns = ThreadCpuNanos() - cpu_start;
  result_.wall_seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - wall_start)
                             .count();
  return std::move(result_);
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
  auto state = std::make_unique<SchedulerState>(device);
  state->config = config;
  BlockManagerOptions options = config.manager;
  options.enable_kv_events = config.kv_event_sink.on();
  KVBLOCK_ASSIGN_OR_RETURN(state->manager,
                           BlockManager::Create(config.kv, options));
  KVBLOCK_ASSIGN_OR_RETURN(
      state->table,
      KVPageTable::Create(config.kv.max_batch, config.kv.max_pages_per_seq,
                          config.kv.num_pages, device));
  KVBLOCK_ASSIGN_OR_RETURN(state->commit,
                           BatchCommit::Create(*state->manager, *state->table));
  state->commit->set_time_phases(true);
  const auto pool_bytes =
      static_cast<size_t>(config.kv.num_layers * config.kv.LayerPoolBytes());
  const bool host = device.kind() == Device::Kind::kHost;
  if (host) KVBLOCK_RETURN_IF_ERROR(CheckFitsHostMemory(pool_bytes));
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
      static_cast<size_t>(config.kv.max_batch) * 2 * sizeof(PageId);
  KVBLOCK_ASSIGN_OR_RETURN(state->copy_staging,
                           device.AllocatePinned(list_bytes));
  KVBLOCK_ASSIGN_OR_RETURN(state->copy_list, device.Allocate(list_bytes));
  KVBLOCK_ASSIGN_OR_RETURN(state->copies_done, device.CreateEvent());
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
