// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "soak/soak.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/kv_events.h"
#include "kvblock/page_table.h"
#include "kvblock/status_macros.h"

namespace kvblock::soak {
namespace {

int64_t PeakRssKb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;  // KB on Linux.
}

// Everything a refused step must leave as it was.
struct State {
  BlockManagerSnapshot manager;
  std::vector<PageId> rows;
  std::vector<SequenceId> slots;
  friend bool operator==(const State&, const State&) = default;
};

// A step's plan and the storage it views.
struct Plan {
  std::vector<SequenceId> finished;
  std::vector<SequenceId> preempted;
  std::vector<std::vector<TokenId>> join_tokens;
  std::vector<JoinRequest> joins;
  std::vector<int32_t> counts;
  std::vector<TokenId> tokens;

  StepPlan View() const {
    return {.finished = finished,
            .preempted = preempted,
            .joins = joins,
            .append_counts = counts,
            .append_tokens = tokens};
  }
  int64_t Operations() const {
    return static_cast<int64_t>(finished.size() + preempted.size() +
                                joins.size()) +
           static_cast<int64_t>(
               std::count_if(counts.begin(), counts.end(),
                             [](int32_t count) { return count > 0; }));
  }
};

class Soaker {
 public:
  Soaker(const SoakOptions& options, std::unique_ptr<Device> device,
         std::unique_ptr<BlockManager> manager,
         std::unique_ptr<KVPageTable> table,
         std::unique_ptr<BatchCommit> commit)
      : options_(options),
        rng_(options.seed),
        device_(std::move(device)),
        manager_(std::move(manager)),
        table_(std::move(table)),
        commit_(std::move(commit)),
        max_tokens_(int64_t{options.max_pages_per_seq} * options.page_size) {
    for (int i = 0; i < 4; ++i) {
      std::vector<TokenId> prefix(Uniform(1, 3) * options.page_size);
      for (TokenId& token : prefix) token = Uniform(0, 999);
      prefixes_.push_back(std::move(prefix));
    }
  }

  absl::StatusOr<SoakReport> Run() {
    const auto start = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           start)
          .count();
    };
    while ((options_.max_operations == 0 ||
            report_.operations < options_.max_operations) &&
           (options_.max_seconds == 0 || elapsed() < options_.max_seconds) &&
           report_.violations == 0) {
      if (absl::Status status = Step(); !status.ok()) return status;
      // A run without a limit has no tenth: only its end is measured.
      if (report_.peak_rss_kb_at_tenth == 0 &&
          (options_.max_seconds > 0 ? elapsed() >= options_.max_seconds / 10
           : options_.max_operations > 0
               ? report_.operations >= options_.max_operations / 10
               : false)) {
        report_.peak_rss_kb_at_tenth = PeakRssKb();
      }
    }
    report_.seconds = elapsed();
    report_.peak_rss_kb = PeakRssKb();
    return report_;
  }

 private:
  int Uniform(int lo, int hi) {  // in [lo, hi].
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  void Violation(std::string what) {
    if (report_.violations++ == 0) {
      report_.first_violation =
          absl::StrCat("step ", report_.steps, ": ", what);
    }
  }

  State Capture() const {
    State state{manager_->Snapshot(), {}, {}};
    for (SlotId slot = 0; slot < table_->max_batch(); ++slot) {
      const absl::Span<const PageId> row = *table_->HostRow(slot);
      state.rows.insert(state.rows.end(), row.begin(), row.end());
    }
    const absl::Span<const SequenceId> slots = commit_->slots();
    state.slots.assign(slots.begin(), slots.end());
    return state;
  }

  // A new prompt: a shared prefix (or none) and a unique tail.
  std::vector<TokenId> Prompt() {
    std::vector<TokenId> prompt;
    if (options_.prefix_caching && Chance(0.7)) {
      prompt = prefixes_[Uniform(0, static_cast<int>(prefixes_.size()) - 1)];
    }
    const int tail = Uniform(1, 2 * options_.page_size);
    for (int i = 0; i < tail; ++i) prompt.push_back(Uniform(0, 999));
    if (static_cast<int64_t>(prompt.size()) > max_tokens_ / 2) {
      prompt.resize(max_tokens_ / 2);
    }
    return prompt;
  }

  // Draws a valid plan: leaves, joins, appends.
  void Draft(Plan& plan) {
    plan = Plan{};
    const absl::Span<const SequenceId> slots = commit_->slots();
    std::vector<bool> leaving(slots.size(), false);
    for (size_t slot = 0; slot < slots.size(); ++slot) {
      const int64_t tokens = tokens_.at(slots[slot]);
      // A sequence near the end of its row must leave.
      if (tokens + 4 > max_tokens_ || Chance(0.04)) {
        plan.finished.push_back(slots[slot]);
        leaving[slot] = true;
      } else if (Chance(0.01)) {
        plan.preempted.push_back(slots[slot]);
        leaving[slot] = true;
      }
    }
    int64_t room =
        table_->max_batch() - static_cast<int64_t>(slots.size()) +
        static_cast<int64_t>(plan.finished.size() + plan.preempted.size());
    const int joins = std::min<int64_t>(room, Uniform(0, 2));
    plan.join_tokens.reserve(joins);
    for (int j = 0; j < joins; ++j) {
      const bool fork = !slots.empty() && Chance(0.3);
      const size_t parent =
          fork ? Uniform(0, static_cast<int>(slots.size()) - 1) : 0;
      if (fork && !leaving[parent]) {
        plan.join_tokens.push_back({static_cast<TokenId>(Uniform(0, 999))});
        plan.joins.push_back({.id = next_id_++,
                              .fork_of = slots[parent],
                              .tokens = plan.join_tokens.back()});
      } else {
        plan.join_tokens.push_back(Prompt());
        plan.joins.push_back(
            {.id = next_id_++,
             .tokens = plan.join_tokens.back(),
             .extra = {.cache_salt = Chance(0.2) ? "tenant-b" : ""}});
      }
    }
    plan.counts.assign(slots.size(), 0);
    for (size_t slot = 0; slot < slots.size(); ++slot) {
      if (leaving[slot]) continue;
      plan.counts[slot] = Chance(0.9) ? 1 : Uniform(2, 4);
      for (int32_t i = 0; i < plan.counts[slot]; ++i) {
        plan.tokens.push_back(Uniform(0, 999));
      }
    }
  }

  // One way to break `plan`, and the code the commit must answer with.
  absl::StatusCode Break(Plan& plan) {
    const absl::Span<const SequenceId> slots = commit_->slots();
    switch (Uniform(0, 5)) {
      case 0:  // a leaving sequence that is not running.
        plan.finished.push_back(next_id_ + 1000);
        return absl::StatusCode::kNotFound;
      case 1:  // a count of the wrong sign, or counts of the wrong length.
        if (!plan.counts.empty() && Chance(0.5)) {
          plan.counts[Uniform(0, static_cast<int>(plan.counts.size()) - 1)] =
              -1;
        } else {
          plan.counts.push_back(0);
        }
        return absl::StatusCode::kInvalidArgument;
      case 2:  // a join of a live id.
        if (!slots.empty()) {
          plan.join_tokens.push_back(Prompt());
          plan.joins.push_back(
              {.id = slots[0], .tokens = plan.join_tokens.back()});
          return absl::StatusCode::kAlreadyExists;
        }
        [[fallthrough]];
      case 3:  // a fork of an unknown sequence.
        plan.joins.push_back({.id = next_id_++, .fork_of = next_id_ + 5000});
        return absl::StatusCode::kInvalidArgument;
      case 4:  // a negative join id.
        plan.join_tokens.push_back(Prompt());
        plan.joins.push_back({.id = -2, .tokens = plan.join_tokens.back()});
        return absl::StatusCode::kInvalidArgument;
      default:  // tokens that do not add up.
        plan.tokens.push_back(7);
        return absl::StatusCode::kInvalidArgument;
    }
  }

  // A commit that failed must change nothing.
  void RecordRefusal(const absl::Status& status, const State& before) {
    ++report_.refused_steps;
    ++report_.failures_by_code[absl::StatusCodeToString(status.code())];
    if (Capture() != before) {
      Violation(absl::StrCat("a refused step changed the state: ",
                             status.ToString()));
    }
  }

  absl::Status Step() {
    Plan plan;
    const State before = Capture();
    if (Chance(1.0 / 16)) {
      Draft(plan);
      const absl::StatusCode want = Break(plan);
      const absl::StatusOr<StepResult> refused = commit_->Commit(plan.View());
      ++report_.operations;
      if (refused.ok() || refused.status().code() != want) {
        Violation(absl::StrCat("an invalid plan got ",
                               refused.status().ToString(), ", want ",
                               absl::StatusCodeToString(want)));
        return absl::OkStatus();
      }
      RecordRefusal(refused.status(), before);
    }
    Draft(plan);
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<StepResult> result = commit_->Commit(plan.View());
      if (result.ok()) {
        report_.operations += plan.Operations();
        report_.host_copies += static_cast<int64_t>(result->host_copies.size());
        return Committed(plan);
      }
      if (result.status().code() != absl::StatusCode::kResourceExhausted) {
        return absl::InternalError(absl::StrCat(
            "soak: step ", report_.steps, ": ", result.status().ToString()));
      }
      RecordRefusal(result.status(), before);
      // Out of pages: drop the joins, then preempt the last running ones.
      if (!plan.joins.empty()) {
        plan.joins.clear();
      } else {
        const absl::Span<const SequenceId> slots = commit_->slots();
        for (size_t slot = slots.size(); slot-- > 0;) {
          if (plan.counts[slot] == 0) continue;  // leaving already.
          plan.preempted.push_back(slots[slot]);
          plan.counts[slot] = 0;
          break;
        }
        plan.tokens.clear();
        for (size_t slot = 0; slot < plan.counts.size(); ++slot) {
          for (int32_t i = 0; i < plan.counts[slot]; ++i) {
            plan.tokens.push_back(Uniform(0, 999));
          }
        }
      }
      if (attempt > table_->max_batch() + 2) {
        return absl::InternalError(
            absl::StrCat("soak: step ", report_.steps, " never fits the pool"));
      }
    }
  }

  absl::Status Committed(const Plan& plan) {
    ++report_.steps;
    // The soak's token counts. Forks are made before any append: a fork
    // starts from its parent's count before the step.
    for (const JoinRequest& join : plan.joins) {
      tokens_[join.id] =
          (join.fork_of == kNoSequence ? 0 : tokens_.at(join.fork_of)) +
          static_cast<int64_t>(join.tokens.size());
    }
    for (size_t slot = 0; slot < last_slots_.size(); ++slot) {
      tokens_[last_slots_[slot]] += plan.counts[slot];
    }
    for (const SequenceId id : plan.finished) tokens_.erase(id);
    for (const SequenceId id : plan.preempted) tokens_.erase(id);
    const absl::Span<const SequenceId> slots = commit_->slots();
    last_slots_.assign(slots.begin(), slots.end());

    ++report_.invariant_checks;
    if (absl::Status status = commit_->CheckInvariants(); !status.ok()) {
      Violation(status.ToString());
      return absl::OkStatus();
    }
    for (const SequenceId id : slots) {
      const absl::StatusOr<int64_t> held = manager_->NumTokens(id);
      if (!held.ok() || *held != tokens_.at(id)) {
        Violation(absl::StrCat("sequence ", id, " holds ", held.value_or(-1),
                               " tokens, the soak counted ", tokens_.at(id)));
        return absl::OkStatus();
      }
    }
    const absl::StatusOr<bool> uploaded = table_->Upload(nullptr);
    if (!uploaded.ok()) return uploaded.status();
    CheckMirror();
    if (options_.kv_events) {
      KVBLOCK_RETURN_IF_ERROR(manager_->TakeKvEvents(events_));
      report_.kv_changes += events_.num_changes();
    }
    return absl::OkStatus();
  }

  // The device table (host device: readable memory) against the host rows.
  void CheckMirror() {
    const DeviceTensor view = table_->kernel_view();
    const int32_t* const mirror = view.data();
    const int32_t width = table_->max_pages_per_seq();
    for (SlotId slot = 0; slot < table_->max_batch(); ++slot) {
      const absl::Span<const PageId> row = *table_->HostRow(slot);
      const int32_t* const device_row = mirror + int64_t{slot} * 2 * width;
      for (int32_t i = 0; i < width; ++i) {
        const PageId v =
            row[i] == kNoPage ? kNoPage : row[i] + table_->num_pages();
        if (device_row[i] != row[i] || device_row[width + i] != v) {
          Violation(absl::StrCat("device row ", slot, " entry ", i, " holds ",
                                 device_row[i], "/", device_row[width + i],
                                 ", the host ", row[i]));
          return;
        }
      }
    }
  }

  const SoakOptions options_;
  std::mt19937_64 rng_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<BlockManager> manager_;
  std::unique_ptr<KVPageTable> table_;
  std::unique_ptr<BatchCommit> commit_;
  const int64_t max_tokens_;
  std::vector<std::vector<TokenId>> prefixes_;
  absl::flat_hash_map<SequenceId, int64_t> tokens_;  // by running sequence.
  std::vector<SequenceId> last_slots_;
  SequenceId next_id_ = 0;
  KvEventBatch events_;  // reused: taking events allocates nothing.
  SoakReport report_;
};

}  // namespace

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options) {
  // Written so that a NaN time limit is refused too: it would stop nothing.
  if (options.max_operations < 0 || !(options.max_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "soak: limits must be numbers >= 0, got ", options.max_operations,
        " operations and ", options.max_seconds, " seconds"));
  }
  PagedKvConfig config;
  config.num_pages = options.num_pages;
  config.page_size = options.page_size;
  config.max_batch = options.max_batch;
  config.max_pages_per_seq = options.max_pages_per_seq;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  BlockManagerOptions manager_options;
  manager_options.enable_prefix_caching = options.prefix_caching;
  manager_options.hash_algorithm = options.hash;
  manager_options.host_pages = options.host_pages;
  manager_options.enable_kv_events = options.kv_events;
  absl::StatusOr<std::unique_ptr<BlockManager>> manager =
      BlockManager::Create(config, manager_options);
  if (!manager.ok()) return manager.status();
  std::unique_ptr<Device> device = Device::Host();
  absl::StatusOr<std::unique_ptr<KVPageTable>> table = KVPageTable::Create(
      config.max_batch, config.max_pages_per_seq, config.num_pages, *device);
  if (!table.ok()) return table.status();
  if (absl::Status status = (*table)->Upload(nullptr).status(); !status.ok()) {
    return status;
  }
  absl::StatusOr<std::unique_ptr<BatchCommit>> commit =
      BatchCommit::Create(**manager, **table);
  if (!commit.ok()) return commit.status();
  return Soaker(options, std::move(device), *std::move(manager),
                *std::move(table), *std::move(commit))
      .Run();
}

std::string FormatReport(const SoakReport& report) {
  std::string text = absl::StrFormat(
      "operations        %d\n"
      "steps             %d committed, %d refused\n",
      report.operations, report.steps, report.refused_steps);
  for (const auto& [code, count] : report.failures_by_code) {
    absl::StrAppendFormat(&text, "  refused         %d %s\n", count, code);
  }
  absl::StrAppendFormat(&text,
                        "invariant checks  %d\n"
                        "host copies       %d\n"
                        "kv cache changes  %d\n"
                        "peak RSS          %d KB (%d KB after the first "
                        "tenth)\n"
                        "violations        %d\n",
                        report.invariant_checks, report.host_copies,
                        report.kv_changes, report.peak_rss_kb,
                        report.peak_rss_kb_at_tenth, report.violations);
  if (!report.first_violation.empty()) {
    absl::StrAppendFormat(&text, "first violation   %s\n",
                          report.first_violation);
  }
  absl::StrAppendFormat(&text, "time              %.1f s\n", report.seconds);
  return text;
}

}  // namespace kvblock::soak
