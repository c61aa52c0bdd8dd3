// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/group_spec_test_util.h"
#include "kvblock/device.h"
#include "kvblock/kernels.h"
#include "kvblock/kv_events.h"
#include "sim/models.h"
#include "sim/random.h"
#include "sim/small_scheduler_config.h"
#include "sim/workloads.h"
#include "test_util.h"

namespace kvblock::sim {
namespace {

// Resources so ample that every request is admitted at its arrival step and
// nothing is ever evicted or preempted.
SchedulerConfig AmpleConfig(int32_t page_size) {
  SchedulerConfig config = SmallConfig(8192);
  config.kv.page_size = page_size;
  config.kv.max_batch = 256;
  config.kv.max_pages_per_seq = 512;
  config.max_tokens_per_step = 1 << 20;
  return config;
}

// kvblock-sim's default geometry (384 pages of 16 tokens, a batch of 32, 64
// pages a sequence, a 1% watermark, 2048 tokens a step), with a model of one
// 8-wide KV head.
SchedulerConfig SimDefaultConfig() {
  SchedulerConfig config;
  config.kv.num_pages = 384;
  config.kv.max_batch = 32;
  config.kv.max_pages_per_seq = 64;
  config.kv.num_kv_heads = 1;
  config.kv.head_dim = 8;
  config.manager.watermark_pages = 3;
  config.max_tokens_per_step = 2048;
  return config;
}

// Runs `requests` on a fresh host scheduler and checks what must hold after
// any run: every page is back (free or evictable), invariants hold, every
// request completed or was rejected.
SimResult RunChecked(const SchedulerConfig& config,
                     const std::vector<Request>& requests) {
  std::unique_ptr<Device> device = Device::Host();
  auto scheduler = Scheduler::Create(config, *device);
  REQUIRE_OK(scheduler);
  int64_t progress_calls = 0;
  auto result =
      (*scheduler)->Run(requests, [&](const Progress&) { ++progress_calls; });
  REQUIRE_OK(result);
  const BlockManager& manager = (*scheduler)->manager();
  REQUIRE_OK(manager.CheckInvariants());
  REQUIRE_OK((*scheduler)->page_table().CheckInvariants());
  REQUIRE(manager.num_sequences() == 0);
  // A model with a window group holds its null page for ever.
  const int32_t held = manager.null_page() == kNoPage ? 0 : 1;
  REQUIRE(manager.pool().NumUsed() == held);
  REQUIRE(manager.pool().NumFree() == config.kv.num_pages - held);
  REQUIRE(result->requests == static_cast<int64_t>(requests.size()));
  REQUIRE(result->completed + result->num_rejected() == result->requests);
  REQUIRE(progress_calls == result->steps);
  REQUIRE(result->steps == static_cast<int64_t>(result->timeline.size()));
  return *std::move(result);
}

// An independent model of the prefix cache under ample resources: every
// request joins at its arrival step (in trace order), sample s appends its
// j-th generated token at step arrival + j, and every page that becomes full
// is cached (prompt pages at the join, generated pages after the step's
// joins). A join hits its leading whole pages that are cached, but at most
// (prompt - 1) / page_size of them: a fully cached prompt recomputes its last
// page. Forks of n > 1 take no hits. Returns the hit tokens per step.
std::map<int64_t, int64_t> ModelHits(const std::vector<Request>& requests,
                                     int32_t page_size) {
  using Key = std::pair<std::string, std::vector<TokenId>>;  // salt, prefix.
  std::set<Key> cache;
  // Generated pages become cached at these steps.
  std::map<int64_t, std::vector<Key>> filled;
  std::vector<const Request*> order;
  for (const Request& r : requests) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(),
                   [](const Request* a, const Request* b) {
                     return a->arrival < b->arrival;
                   });
  const auto prefix_key = [](const Request& r,
                             const std::vector<TokenId>& tokens, size_t end) {
    return Key{r.cache_salt,
               std::vector<TokenId>(tokens.begin(), tokens.begin() + end)};
  };
  std::map<int64_t, int64_t> hits;
  size_t next = 0;
  int64_t last_step = 0;
  for (const Request* r : order) {
    last_step = std::max(last_step, r->arrival + r->max_tokens);
  }
  for (int64_t step = 0; step <= last_step; ++step) {
    for (; next < order.size() && order[next]->arrival == step; ++next) {
      const Request& r = *order[next];
      const size_t prompt = r.prompt.size();
      const size_t max_hits = (prompt - 1) / page_size;
      size_t hit_pages = 0;
      while (
          hit_pages < max_hits &&
          cache.count(prefix_key(r, r.prompt, (hit_pages + 1) * page_size))) {
        ++hit_pages;
      }
      hits[step] += static_cast<int64_t>(hit_pages) * page_size;
      for (size_t end = page_size; end <= prompt; end += page_size) {
        cache.insert(prefix_key(r, r.prompt, end));
      }
      for (int32_t sample = 0; sample < r.n; ++sample) {
        std::vector<TokenId> tokens = r.prompt;
        for (int64_t j = 0; j < r.max_tokens; ++j) {
          tokens.push_back(GeneratedToken(r, sample, j));
          if (tokens.size() % page_size == 0) {
            filled[r.arrival + j + 1].push_back(
                prefix_key(r, tokens, tokens.size()));
          }
        }
      }
    }
    for (Key& key : filled[step]) cache.insert(std::move(key));
  }
  return hits;
}

// A small random trace with much sharing: prompts start from a few bases,
// some continue an earlier request's prompt and output (multi-turn), some
// repeat a page-aligned prompt exactly; n up to 3; two cache salts.
std::vector<Request> SharingTrace(uint64_t seed, int32_t page_size) {
  Rng rng(seed);
  const auto random_tokens = [&](int64_t count) {
    std::vector<TokenId> tokens;
    for (int64_t i = 0; i < count; ++i) {
      tokens.push_back(static_cast<TokenId>(rng.Uniform(0, 50)));
    }
    return tokens;
  };
  std::vector<std::vector<TokenId>> bases;
  for (int i = 0; i < 3; ++i)
    bases.push_back(random_tokens(rng.Uniform(1, 13)));
  std::vector<Request> requests;
  for (int i = 0; i < 24; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.arrival = rng.Uniform(0, 40);
    r.max_tokens = rng.Uniform(1, 12);
    r.cache_salt = rng.Uniform(0, 3) == 0 ? "tenant" : "";
    const int64_t kind = rng.Uniform(0, 3);
    if (kind == 0 && !requests.empty()) {
      // The next turn of an earlier request: its prompt and its output.
      const Request& earlier = requests[rng.Uniform(0, i - 1)];
      r.prompt = earlier.prompt;
      for (int64_t j = 0; j < earlier.max_tokens; ++j) {
        r.prompt.push_back(GeneratedToken(earlier, 0, j));
      }
      r.cache_salt = earlier.cache_salt;
      r.arrival = std::max(r.arrival, earlier.arrival + earlier.max_tokens + 1);
    } else if (kind == 1 && !requests.empty()) {
      // A page-aligned prompt repeated exactly.
      const Request& earlier = requests[rng.Uniform(0, i - 1)];
      r.prompt = earlier.prompt;
      r.prompt.resize(
          std::max<size_t>(page_size, r.prompt.size() / page_size * page_size));
      r.cache_salt = earlier.cache_salt;
    } else {
      r.prompt = bases[rng.Uniform(0, 2)];
      const std::vector<TokenId> tail = random_tokens(rng.Uniform(0, 9));
      r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    }
    if (rng.Uniform(0, 3) == 0) {
      r.n = static_cast<int32_t>(rng.Uniform(2, 3));
    } else if (rng.Uniform(0, 2) == 0) {
      r.output = random_tokens(rng.Uniform(1, r.max_tokens));
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST_CASE("with ample pages, prefix hits equal an independent count") {
  for (const int32_t page_size : {1, 2, 4, 5}) {
    int64_t hits_of_all_seeds = 0;
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      const std::vector<Request> requests = SharingTrace(seed, page_size);
      const SimResult result = RunChecked(AmpleConfig(page_size), requests);
      const std::map<int64_t, int64_t> expected =
          ModelHits(requests, page_size);
      INFO("page_size " << page_size << " seed " << seed);
      REQUIRE(result.preemptions == 0);
      REQUIRE(result.evictions == 0);
      REQUIRE(result.rejected.empty());
      int64_t expected_total = 0;
      for (const auto& [step, hits] : expected) expected_total += hits;
      REQUIRE(result.prefix_hit_tokens == expected_total);
      for (const StepRecord& record : result.timeline) {
        const auto it = expected.find(record.step);
        INFO("step " << record.step);
        REQUIRE(record.hit_tokens == (it == expected.end() ? 0 : it->second));
      }
      hits_of_all_seeds += expected_total;
    }
    // The traces share enough for the comparison to mean something.
    REQUIRE(hits_of_all_seeds > 100);
  }
}

TEST_CASE("hybrid models run: window groups hold fewer pages") {
  const auto groups = [](std::initializer_list<KvCacheGroupSpec> specs) {
    return std::vector<KvCacheGroupSpec>(specs);
  };
  const auto spec = [](AttentionKind kind, int32_t span) {
    return testing::GroupSpec(kind, 16, span);
  };
  using enum AttentionKind;
  const std::vector<std::vector<KvCacheGroupSpec>> models = {
      groups({spec(kFull, 0), spec(kSlidingWindow, 128)}),
      groups(
          {spec(kSlidingWindow, 64), spec(kSlidingWindow, 64), spec(kFull, 0)}),
      groups({spec(kChunkedLocal, 256), spec(kFull, 0)}),
  };
  const absl::StatusOr<std::vector<Request>> requests =
      MakeWorkload("mixed", 1);
  REQUIRE_OK(requests);
  for (const std::vector<KvCacheGroupSpec>& model : models) {
    // Memory-bound (the default pool) and ample.
    for (const int32_t pages : {384, 8192}) {
      INFO(model.size() << " groups, " << pages << " pages");
      SchedulerConfig config = SimDefaultConfig();
      config.kv.num_pages = pages;
      config.manager.kv_cache_groups = model;
      const SimResult hybrid = RunChecked(config, *requests);
      REQUIRE(hybrid.completed == hybrid.requests);
      REQUIRE(hybrid.pages_by_group.size() == model.size());
      int32_t by_group = 0;
      for (const GroupPages& group : hybrid.pages_by_group) {
        by_group += group.pages;
      }
      // Within a step the pool may peak higher than after it.
      REQUIRE(by_group + 1 <= hybrid.peak_pages_used);
      REQUIRE(by_group > 0);
      if (pages < 8192) continue;
      // With ample pages both runs schedule alike: windows hold less.
      config.manager.kv_cache_groups = AllFullAttention(model);
      const SimResult full = RunChecked(config, *requests);
      REQUIRE(full.preemptions == 0);
      REQUIRE(hybrid.preemptions == 0);
      REQUIRE(hybrid.peak_pages_used < full.peak_pages_used);
    }
  }
}

TEST_CASE("without prefix caching nothing hits") {
  SchedulerConfig config = AmpleConfig(4);
  config.manager.enable_prefix_caching = false;
  const SimResult result = RunChecked(config, SharingTrace(3, 4));
  REQUIRE(result.prefix_hit_tokens == 0);
  REQUIRE(result.prompt_tokens > 0);
}

TEST_CASE("parallel samples fork after the prompt and copy its last page") {
  // 10 tokens: two full pages and a shared partial one.
  const std::vector<Request> requests = {
      {.id = "p",
       .prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
       .max_tokens = 6,
       .n = 3}};
  const SimResult result = RunChecked(SmallConfig(64), requests);
  REQUIRE(result.completed == 1);
  REQUIRE(result.cow_copies == 2);  // two of the three samples copy.
  REQUIRE(result.prefix_hit_tokens == 0);
  REQUIRE(result.prompt_tokens == 10);
  REQUIRE(result.generated_tokens == 3 * 6);
  // The join step, six appends, the leave step.
  REQUIRE(result.steps == 8);
  REQUIRE(result.timeline.front().batch == 3);
  REQUIRE(result.timeline.back().batch == 0);
  // Three pages of the prompt (the last one now a sample's) plus two new
  // ones for each of the two copying samples: tokens 10..15 fill page 2 and
  // start page 3.
  REQUIRE(result.peak_pages_used == 2 + 3 * 2);
}

TEST_CASE("beam search forks and drops beams, keeping 1 to W") {
  const std::vector<Request> requests = {
      {.id = "b", .prompt = {5, 6, 7, 8, 9}, .max_tokens = 40, .beam = 4}};
  const SimResult result = RunChecked(SmallConfig(256), requests);
  REQUIRE(result.completed == 1);
  bool grew = false;
  bool shrank = false;
  for (size_t i = 0; i < result.timeline.size() - 1; ++i) {
    const int32_t batch = result.timeline[i].batch;
    REQUIRE(batch >= 1);
    REQUIRE(batch <= 4);
    if (i > 0) {
      grew |= batch > result.timeline[i - 1].batch;
      shrank |= batch < result.timeline[i - 1].batch;
    }
  }
  REQUIRE(grew);
  REQUIRE(shrank);
  REQUIRE(result.cow_copies > 0);
}

TEST_CASE("requests that can never run are rejected and the rest run") {
  SchedulerConfig config = SmallConfig(16);  // 64 tokens of KV.
  config.max_tokens_per_step = 48;
  config.chunked_prefill = false;
  std::vector<TokenId> long_prompt(80, 3);    // 20 pages: more than the pool.
  std::vector<TokenId> budget_prompt(50, 4);  // over the step budget.
  std::vector<TokenId> grows_prompt(40, 5);   // fits, but 80 tokens do not.
  const std::vector<Request> requests = {
      {.id = "ok1", .prompt = {1, 2, 3}, .max_tokens = 4},
      {.id = "huge", .arrival = 1, .prompt = long_prompt, .max_tokens = 1},
      {.id = "budget", .arrival = 1, .prompt = budget_prompt, .max_tokens = 1},
      {.id = "grows", .arrival = 10, .prompt = grows_prompt, .max_tokens = 40},
      {.id = "ok2", .arrival = 60, .prompt = {1, 2, 3, 4, 5}, .max_tokens = 4},
  };
  const SimResult result = RunChecked(config, requests);
  REQUIRE(result.completed == 2);
  REQUIRE(result.rejected.size() == 3);
  std::map<std::string, std::string> reasons;
  std::map<std::string, RejectedRequest::Kind> kinds;
  for (const RejectedRequest& r : result.rejected) {
    reasons[r.id] = r.reason;
    kinds[r.id] = r.kind;
  }
  REQUIRE(kinds["huge"] == RejectedRequest::Kind::kPoolTooSmall);
  REQUIRE(kinds["budget"] == RejectedRequest::Kind::kOverTokenBudget);
  REQUIRE(kinds["grows"] == RejectedRequest::Kind::kRanOutAlone);
  REQUIRE(reasons["huge"].find("needs 20 pages") != std::string::npos);
  REQUIRE(reasons["budget"].find("exceed max_tokens_per_step 48 (chunked "
                                 "prefill is off)") != std::string::npos);
  REQUIRE(reasons["grows"].find("ran out of pages running alone") !=
          std::string::npos);
}

TEST_CASE("a prompt no pool of groups can hold is rejected and the rest run") {
  // gpt-oss's groups on 16 pages of 4 tokens, one the null page: 40 tokens
  // need 10 pages in each group at once (no chunked prefill); 3 fit.
  SchedulerConfig config = SmallConfig(16);
  config.chunked_prefill = false;
  config.manager.kv_cache_groups = {
      testing::GroupSpec(AttentionKind::kFull, 4, 0),
      testing::GroupSpec(AttentionKind::kSlidingWindow, 4, 8)};
  std::vector<TokenId> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  const std::vector<Request> requests = {
      {.id = "big", .prompt = prompt, .max_tokens = 1},
      {.id = "small", .prompt = {1, 2, 3}, .max_tokens = 1},
  };
  const SimResult result = RunChecked(config, requests);
  REQUIRE(result.completed == 1);
  REQUIRE(result.rejected.size() == 1);
  REQUIRE(result.rejected[0].id == "big");
  REQUIRE(result.rejected[0].kind == RejectedRequest::Kind::kPoolTooSmall);
  REQUIRE(result.rejected[0].reason ==
          "its admission needs 20 pages in its 2 KV cache groups, the pool "
          "admits 15");
  // Its full-attention group alone needs more than the pool: rejected on
  // arrival, whatever else runs.
  prompt.resize(80);
  std::iota(prompt.begin(), prompt.end(), 1);
  const SimResult alone = RunChecked(
      config, {{.id = "huge", .prompt = prompt, .max_tokens = 1},
               {.id = "small", .prompt = {1, 2, 3}, .max_tokens = 1}});
  REQUIRE(alone.completed == 1);
  REQUIRE(alone.rejected.size() == 1);
  REQUIRE(alone.rejected[0].reason.find("needs 20 pages") != std::string::npos);
}

TEST_CASE("rejections past the listed ones are counted by kind") {
  std::vector<TokenId> long_prompt(80, 3);  // 20 pages: more than the pool.
  std::vector<Request> requests;
  const int64_t total = static_cast<int64_t>(kMaxListedRejections) + 5;
  for (int64_t i = 0; i < total; ++i) {
    requests.push_back({.id = "huge" + std::to_string(i),
                        .arrival = i,
                        .prompt = long_prompt,
                        .max_tokens = 1});
  }
  const SimResult result = RunChecked(SmallConfig(16), requests);
  REQUIRE(result.rejected.size() == kMaxListedRejections);
  REQUIRE(result.rejected.back().id ==
          "huge" + std::to_string(kMaxListedRejections - 1));
  REQUIRE(result.unlisted_rejections[static_cast<size_t>(
              RejectedRequest::Kind::kPoolTooSmall)] == 5);
  REQUIRE(result.num_rejected() == total);
}

TEST_CASE("when pages run out the latest request is preempted and recomputed") {
  // Eight requests of 24 + 24 tokens (12 pages each at the end) in 40 pages.
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.prompt.assign(24, static_cast<TokenId>(100 + i));
    r.max_tokens = 24;
    requests.push_back(std::move(r));
  }
  const SimResult result = RunChecked(SmallConfig(40), requests);
  REQUIRE(result.completed == 8);
  REQUIRE(result.preemptions > 0);
  // Recomputed prompts count again; their cached pages are hits.
  REQUIRE(result.prompt_tokens > 8 * 24);
  REQUIRE(result.prefix_hit_tokens > 0);
  int64_t preemptions = 0;
  for (const StepRecord& record : result.timeline) {
    preemptions += record.preemptions;
    REQUIRE(record.pages_used <= 40);
  }
  REQUIRE(preemptions == result.preemptions);
  REQUIRE(result.peak_pages_used <= 40);
  // What a preemption threw away was generated again.
  REQUIRE(result.recomputed_tokens > 0);
  REQUIRE(result.generated_tokens == 8 * 24 + result.recomputed_tokens);
  REQUIRE(result.steps_limited_by_pages > 0);
}

TEST_CASE("a full batch keeps requests waiting; the report says so") {
  SchedulerConfig config = SmallConfig(64);
  config.kv.max_batch = 2;
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back({.id = "r" + std::to_string(i),
                        .prompt = {1, 2, static_cast<TokenId>(10 + i)},
                        .max_tokens = 3});
  }
  const SimResult result = RunChecked(config, requests);
  // r0 and r1 join at step 0, append at 1..3 and leave at 4, where r2 and r3
  // join; they leave at step 8.
  REQUIRE(result.steps == 9);
  REQUIRE(result.steps_limited_by_max_batch == 4);
  REQUIRE(result.steps_limited_by_pages == 0);
  REQUIRE(result.steps_limited_by_token_budget == 0);
  REQUIRE(result.peak_waiting == 2);
  for (int64_t step = 0; step < 4; ++step) {
    REQUIRE(result.timeline[step].waiting == 2);
    REQUIRE(result.timeline[step].limit == StepLimit::kMaxBatch);
  }
  REQUIRE(result.timeline[4].waiting == 0);
  REQUIRE(result.timeline[4].limit == StepLimit::kNone);
  REQUIRE(result.queue_steps ==
          StepStats{.count = 4, .mean = 2, .p50 = 0, .p99 = 4, .max = 4});
  REQUIRE(result.ttft_steps ==
          StepStats{.count = 4, .mean = 3, .p50 = 1, .p99 = 5, .max = 5});
  REQUIRE(result.recomputed_tokens == 0);
}

TEST_CASE("without chunked prefill the budget holds a prompt back a step") {
  SchedulerConfig config = SmallConfig(64);
  config.max_tokens_per_step = 10;
  config.chunked_prefill = false;
  const std::vector<Request> requests = {
      {.id = "a", .prompt = {1, 2, 3, 4, 5, 6, 7, 8}, .max_tokens = 2},
      {.id = "b", .prompt = {9, 8, 7, 6, 5, 4, 3, 2}, .max_tokens = 2},
  };
  const SimResult result = RunChecked(config, requests);
  // Step 0 admits a (8 of 10 tokens); step 1 has 9 left after a's token.
  REQUIRE(result.steps_limited_by_token_budget == 1);
  REQUIRE(result.timeline[0].limit == StepLimit::kTokenBudget);
  REQUIRE(result.timeline[0].waiting == 1);
  REQUIRE(result.timeline[1].limit == StepLimit::kNone);
  REQUIRE(result.queue_steps.max == 1);
  REQUIRE(result.ttft_steps.max == 2);
}

TEST_CASE("with chunked prefill the budget's rest starts the next prompt") {
  SchedulerConfig config = SmallConfig(64);
  config.max_tokens_per_step = 10;
  const std::vector<Request> requests = {
      {.id = "a", .prompt = {1, 2, 3, 4, 5, 6, 7, 8}, .max_tokens = 2},
      {.id = "b", .prompt = {9, 8, 7, 6, 5, 4, 3, 2}, .max_tokens = 2},
  };
  const SimResult result = RunChecked(config, requests);
  // Step 0: a whole (8 tokens) and b's first 2; step 1: a's token and b's
  // other 6; step 2: a's last token, b's first.
  REQUIRE(result.steps_limited_by_token_budget == 0);
  REQUIRE(result.timeline[0].batch == 2);
  REQUIRE(result.timeline[0].prompt_tokens == 16);  // whole prompts, at
                                                    // admission.
  REQUIRE(result.prompt_chunks == 1);
  REQUIRE(result.prompt_steps ==
          StepStats{.count = 2, .mean = 1.5, .p50 = 1, .p99 = 2, .max = 2});
  REQUIRE(result.queue_steps.max == 0);
  REQUIRE(result.ttft_steps.max == 2);  // b's prompt is done in step 1.
  REQUIRE(result.generated_tokens == 4);
}

TEST_CASE("a prompt longer than the budget runs in chunks, capped") {
  SchedulerConfig config = SmallConfig(64);
  config.max_tokens_per_step = 48;
  std::vector<TokenId> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = i;
  const std::vector<Request> one = {
      {.id = "long", .prompt = prompt, .max_tokens = 3}};
  SimResult result = RunChecked(config, one);
  REQUIRE(result.rejected.empty());
  REQUIRE(result.prompt_steps.max == 3);  // 48 + 48 + 4.
  REQUIRE(result.prompt_chunks == 2);
  REQUIRE(result.ttft_steps.max == 3);
  REQUIRE(result.generated_tokens == 3);
  config.chunk_tokens = 16;
  result = RunChecked(config, one);
  REQUIRE(result.prompt_steps.max == 7);  // 6 x 16 + 4.
  REQUIRE(result.prompt_chunks == 6);
  REQUIRE(result.ttft_steps.max == 7);
  // The next run of the same prompt hits its 25 pages less the last.
  const std::vector<Request> twice = {
      {.id = "first", .prompt = prompt, .max_tokens = 1},
      {.id = "again", .arrival = 20, .prompt = prompt, .max_tokens = 1}};
  result = RunChecked(config, twice);
  REQUIRE(result.prefix_hit_tokens == 96);
  REQUIRE(result.prompt_steps.max == 7);
  REQUIRE(result.prompt_steps.p50 == 1);
}

TEST_CASE("a chunked prompt's samples fork when the prompt is done") {
  SchedulerConfig config = SmallConfig(64);
  config.chunk_tokens = 8;
  std::vector<TokenId> prompt(18, 7);
  const std::vector<Request> requests = {
      {.id = "n3", .prompt = prompt, .max_tokens = 5, .n = 3}};
  const SimResult result = RunChecked(config, requests);
  // Steps 0-2 compute 8 + 8 + 2 prompt tokens in one sequence; step 3
  // appends sample 0's first token and forks samples 1 and 2 with theirs.
  REQUIRE(result.timeline[0].batch == 1);
  REQUIRE(result.timeline[2].batch == 1);
  REQUIRE(result.timeline[3].batch == 3);
  REQUIRE(result.prompt_steps.max == 3);
  REQUIRE(result.generated_tokens == 15);
  REQUIRE(result.ttft_steps.max == 3);
}

TEST_CASE("a beam's fork leaves the seats of samples that fork later on") {
  // kvblock-sim's defaults on its default workload, in chunks: beams fork
  // in steps where a chunked prompt's samples fork too (the batch once
  // came to 33 of 32 at step 76 with 64-token chunks, 192 with 128).
  SchedulerConfig config = SimDefaultConfig();
  auto requests = MakeWorkload(kDefaultWorkload, 1);
  REQUIRE_OK(requests);
  for (const int64_t chunk : {64, 128, 256}) {
    INFO("chunk_tokens " << chunk);
    config.chunk_tokens = chunk;
    const SimResult result = RunChecked(config, *requests);
    for (const StepRecord& step : result.timeline) {
      REQUIRE(step.batch <= config.kv.max_batch);
    }
  }
}

TEST_CASE("speculative decoding appends accepted drafts and the target's") {
  SchedulerConfig config = SmallConfig(64);
  config.spec_tokens = 4;
  const std::vector<Request> requests = {
      {.id = "spec", .prompt = {1, 2, 3, 4, 5}, .max_tokens = 21}};
  // Every draft accepted: 1 token, then 5 a step (4 drafts + 1).
  config.spec_acceptance = 1;
  SimResult result = RunChecked(config, requests);
  REQUIRE(result.steps == 7);  // admit, 1, 5, 5, 5, 5, leave.
  REQUIRE(result.generated_tokens == 21);
  REQUIRE(result.drafts_proposed == 16);
  REQUIRE(result.drafts_accepted == 16);
  // 5 + 1 tokens and 4 drafts: pages 0-1 verified, page 2 drafts only.
  REQUIRE(result.peak_draft_pages == 1);
  // Every draft rejected: 1 token a step; drafts as long as 2+ tokens are
  // left (the next step appends at most what is left).
  config.spec_acceptance = 0;
  result = RunChecked(config, requests);
  REQUIRE(result.steps == 23);
  REQUIRE(result.generated_tokens == 21);
  REQUIRE(result.drafts_accepted == 0);
  REQUIRE(result.drafts_proposed == 4 * 16 + 3 + 2 + 1);
}

TEST_CASE("drafts change how fast requests run, never what they generate") {
  for (const WorkloadInfo& workload : Workloads()) {
    // Their geometry is their own, below.
    if (workload.name == "serving" || workload.name == "longcontext") continue;
    INFO(workload.name);
    auto requests = MakeWorkload(workload.name, 5);
    REQUIRE_OK(requests);
    SchedulerConfig config = AmpleConfig(16);
    config.max_tokens_per_step = 4096;
    const SimResult plain = RunChecked(config, *requests);
    config.spec_tokens = 4;
    config.spec_acceptance = 0.7;
    config.chunk_tokens = 64;
    const SimResult spec = RunChecked(config, *requests);
    REQUIRE(spec.rejected.empty());
    REQUIRE(spec.preemptions == 0);
    REQUIRE(spec.generated_tokens == plain.generated_tokens);
    REQUIRE(spec.prompt_tokens == plain.prompt_tokens);
    if (workload.name != "beam") {
      REQUIRE(spec.drafts_accepted > 0);
      REQUIRE(spec.drafts_accepted < spec.drafts_proposed);
      REQUIRE(spec.peak_draft_pages > 0);
      REQUIRE(spec.steps < plain.steps);
    } else {
      REQUIRE(spec.drafts_proposed == 0);  // beams never draft.
    }
    // Every drafting sequence appends first in its step, so a shared
    // partial page is copied for the append, never for the drafts.
    REQUIRE(spec.draft_copies == 0);
  }
}

TEST_CASE("every built-in workload runs to completion with its pages back") {
  SchedulerConfig config = SimDefaultConfig();
  config.manager.hash_algorithm = HashAlgorithm::kXxh3_128;
  for (const WorkloadInfo& workload : Workloads()) {
    // Their own tests, below.
    if (workload.name == "serving" || workload.name == "longcontext" ||
        workload.name == "chat") {
      continue;
    }
    INFO(workload.name);
    auto requests = MakeWorkload(workload.name, 7);
    REQUIRE_OK(requests);
    const SimResult result = RunChecked(config, *requests);
    REQUIRE(result.rejected.empty());
    REQUIRE(result.peak_pages_used <= 384);
    if (workload.name == "mixed") {
      REQUIRE(result.prefix_hit_tokens > 0);
      REQUIRE(result.evictions > 0);
      REQUIRE(result.preemptions > 0);
      REQUIRE(result.cow_copies > 0);
    }
  }
}

// A workload's own geometry, with a model of one 8-wide KV head and XXH3
// page hashes.
SchedulerConfig WorkloadConfig(int32_t num_pages, int32_t max_batch,
                               int32_t max_pages_per_seq) {
  SchedulerConfig config;
  config.kv.num_pages = num_pages;
  config.kv.max_batch = max_batch;
  config.kv.max_pages_per_seq = max_pages_per_seq;
  config.kv.num_kv_heads = 1;
  config.kv.head_dim = 8;
  config.manager.hash_algorithm = HashAlgorithm::kXxh3_128;
  return config;
}

TEST_CASE("long contexts on gpt-oss's groups hold about half the pages") {
  SchedulerConfig config = WorkloadConfig(65536, 32, 2112);
  auto groups = ModelGroups("gpt-oss", "", config.kv.page_size);
  REQUIRE_OK(groups);
  auto requests = MakeWorkload("longcontext", 1);
  REQUIRE_OK(requests);
  config.manager.kv_cache_groups = *groups;
  const SimResult hybrid = RunChecked(config, *requests);
  config.manager.kv_cache_groups = AllFullAttention(*groups);
  const SimResult full = RunChecked(config, *requests);
  REQUIRE(hybrid.completed == 64);
  REQUIRE(full.completed == 64);
  REQUIRE(hybrid.preemptions == 0);
  REQUIRE(full.preemptions == 0);
  // The window group holds 128 tokens' pages a sequence, the full one all.
  const double ratio = static_cast<double>(hybrid.peak_pages_used) /
                       static_cast<double>(full.peak_pages_used);
  REQUIRE(ratio > 0.45);
  REQUIRE(ratio < 0.55);
}

TEST_CASE("the serving workload runs at its geometry; time adds up by phase") {
  SchedulerConfig config = WorkloadConfig(16384, 256, 144);
  config.max_tokens_per_step = 1 << 20;
  auto requests = MakeWorkload("serving", 1);
  REQUIRE_OK(requests);
  const SimResult result = RunChecked(config, *requests);
  REQUIRE(result.completed == 2000);
  REQUIRE(result.rejected.empty());
  // About 100 running at once.
  const double mean_batch = static_cast<double>(result.sequence_steps) /
                            static_cast<double>(result.steps);
  REQUIRE(mean_batch > 50);
  REQUIRE(mean_batch < 200);
  const HostPhases& phases = result.host_ns_by_phase;
  REQUIRE(phases.total_ns() == result.host_ns_total);
  for (const int64_t ns :
       {phases.planning_ns, phases.frees_ns, phases.admissions_ns,
        phases.appends_ns, phases.page_table_ns, phases.bookkeeping_ns,
        phases.upload_ns}) {
    REQUIRE(ns > 0);
  }
  // The patches: a few ids per changed row, never whole rows.
  REQUIRE(result.upload_ranges > 0);
  REQUIRE(result.upload_bytes <
          result.upload_ranges * (16 + 4 * int64_t{144}) / 4);
}

TEST_CASE(
    "a host tier ten times the pool brings the chat workload's hits "
    "back") {
  // 2,000 pages forget a conversation between its turns; with ample pages
  // three quarters of the prompt tokens hit.
  SchedulerConfig config = WorkloadConfig(2000, 96, 64);
  auto requests = MakeWorkload("chat", 1);
  REQUIRE_OK(requests);
  const SimResult small = RunChecked(config, *requests);
  SchedulerConfig ample_config = config;
  ample_config.kv.num_pages = 100000;
  const SimResult ample = RunChecked(ample_config, *requests);
  SchedulerConfig host_config = config;
  host_config.manager.host_pages = 20000;
  const SimResult host = RunChecked(host_config, *requests);
  const auto rate = [](const SimResult& r) {
    return static_cast<double>(r.prefix_hit_tokens) /
           static_cast<double>(r.prompt_tokens);
  };
  CAPTURE(rate(small), rate(ample), rate(host));
  REQUIRE(small.prompt_tokens == host.prompt_tokens);
  REQUIRE(rate(small) < 0.05);
  REQUIRE(rate(ample) > 0.70);
  REQUIRE(rate(host) > rate(ample) - 0.05);
  // The hits are the host tier's, each a page loaded back.
  REQUIRE(small.host_hit_tokens == 0);
  REQUIRE(host.host_hit_tokens > host.prefix_hit_tokens / 2);
  REQUIRE(host.host_hit_tokens % config.kv.page_size == 0);
  REQUIRE(host.host_loads >= host.host_hit_tokens / config.kv.page_size);
  REQUIRE(host.host_stores > 0);
  REQUIRE(host.host_bytes_stored ==
          host.host_stores * HostPageBytes(host_config.kv));
  // The timeline adds up to the totals; the modelled copy time too.
  int64_t stores = 0, loads = 0, hits = 0, copy_ns = 0;
  for (const StepRecord& record : host.timeline) {
    stores += record.host_stores;
    loads += record.host_loads;
    hits += record.host_hit_tokens;
    copy_ns += record.host_copy_ns;
  }
  REQUIRE(stores == host.host_stores);
  REQUIRE(loads == host.host_loads);
  REQUIRE(hits == host.host_hit_tokens);
  REQUIRE(copy_ns == host.host_copy_ns);
  REQUIRE(host.host_copy_ns > 0);
  REQUIRE(host.host_ns_by_phase.host_copies_ns > 0);
}

TEST_CASE("write-through stores what is cached, and hits as write-back does") {
  SchedulerConfig config = WorkloadConfig(256, 32, 64);
  auto requests = MakeWorkload("multiturn", 2);
  REQUIRE_OK(requests);
  config.manager.host_pages = 4096;
  const SimResult back = RunChecked(config, *requests);
  config.manager.host_write_policy = HostWritePolicy::kWriteThrough;
  const SimResult through = RunChecked(config, *requests);
  CAPTURE(back.host_stores, through.host_stores, back.prefix_hit_tokens,
          through.prefix_hit_tokens);
  REQUIRE(back.host_hit_tokens > 0);
  REQUIRE(through.host_stores > back.host_stores);
  // A cached page is in the host tier before it can leave the pool.
  REQUIRE(through.prefix_hit_tokens >= back.prefix_hit_tokens);
  // Each step books the copies it ran (a step's write-through stores run in
  // the next one), at their modelled time; the steps add up to the totals.
  int64_t stores = 0, loads = 0;
  for (const StepRecord& record : through.timeline) {
    CAPTURE(record.step);
    REQUIRE(record.host_copy_ns ==
            static_cast<int64_t>(
                static_cast<double>(record.host_stores + record.host_loads) *
                HostPageBytes(config.kv) / config.host_bandwidth_gbps));
    stores += record.host_stores;
    loads += record.host_loads;
  }
  REQUIRE(stores == through.host_stores);
  REQUIRE(loads == through.host_loads);
}

// The geometry the mixed workload needs, in few pages.
SchedulerConfig MixedConfig() {
  SchedulerConfig config = SmallConfig(256);
  config.kv.page_size = 16;
  config.kv.max_pages_per_seq = 64;
  return config;
}

TEST_CASE("runs are deterministic") {
  auto requests = MakeWorkload("mixed", 3);
  REQUIRE_OK(requests);
  const SchedulerConfig config = MixedConfig();
  const SimResult a = RunChecked(config, *requests);
  const SimResult b = RunChecked(config, *requests);
  REQUIRE(a.timeline == b.timeline);
  REQUIRE(a.prefix_hit_tokens == b.prefix_hit_tokens);
}

// A sink that records every page change it is handed, in order, as
// (kind, hash), and how many batches.
struct RecordingSink {
  std::vector<std::pair<KvCacheEvent::Kind, BlockHash>> changes;
  int64_t batches = 0;

  void Take(KvEventBatch& batch) {
    REQUIRE(!batch.empty());
    std::vector<KvCacheEvent> events;
    batch.AppendTo(events);
    for (const KvCacheEvent& event : events) {
      if (event.kind == KvCacheEvent::Kind::kAllBlocksCleared) {
        changes.emplace_back(event.kind, BlockHash{});
      }
      for (const BlockHash& hash : event.block_hashes) {
        changes.emplace_back(event.kind, hash);
      }
    }
    REQUIRE(static_cast<int64_t>(changes.size()) - before_ ==
            batch.num_changes());
    before_ = static_cast<int64_t>(changes.size());
    batch.Clear();
    ++batches;
  }

 private:
  int64_t before_ = 0;
};

TEST_CASE("KV events wait for a sink that is not ready, and all arrive") {
  auto requests = MakeWorkload("mixed", 2);
  REQUIRE_OK(requests);
  SchedulerConfig config = MixedConfig();
  // After every step with events (no `ready`).
  RecordingSink every_step;
  config.kv_event_sink = {
      .publish = [&](KvEventBatch& batch) { every_step.Take(batch); },
      .ready = nullptr};
  const SimResult each = RunChecked(config, *requests);
  REQUIRE(each.kv_events.batches == every_step.batches);
  REQUIRE(each.kv_events.changes ==
          static_cast<int64_t>(every_step.changes.size()));
  REQUIRE(each.kv_events.changes < kMaxPendingKvChanges);
  REQUIRE(every_step.batches > 10);
  // Now and then: the same changes in fewer batches.
  RecordingSink sometimes;
  int64_t asked = 0;
  config.kv_event_sink = {
      .publish = [&](KvEventBatch& batch) { sometimes.Take(batch); },
      .ready = [&] { return ++asked % 7 == 0; }};
  const SimResult some = RunChecked(config, *requests);
  REQUIRE(sometimes.changes == every_step.changes);
  REQUIRE(some.kv_events.batches == sometimes.batches);
  REQUIRE(sometimes.batches < every_step.batches);
  REQUIRE(sometimes.batches > 1);
  REQUIRE(asked >= some.steps - 1);
  // Never ready: every change at the end of the run, in one batch.
  RecordingSink never;
  config.kv_event_sink = {
      .publish = [&](KvEventBatch& batch) { never.Take(batch); },
      .ready = [] { return false; }};
  const SimResult none = RunChecked(config, *requests);
  REQUIRE(never.changes == every_step.changes);
  REQUIRE(never.batches == 1);
  for (const SimResult* result : {&some, &none}) {
    REQUIRE(result->kv_events.changes == each.kv_events.changes);
    REQUIRE(result->kv_events.cached_pages == each.kv_events.cached_pages);
    REQUIRE(result->kv_events.cached_hash_xor ==
            each.kv_events.cached_hash_xor);
  }
  REQUIRE(none.timeline == each.timeline);
}

TEST_CASE("Run validates its requests and runs once") {
  std::unique_ptr<Device> device = Device::Host();
  auto scheduler = Scheduler::Create(SmallConfig(16), *device);
  REQUIRE_OK(scheduler);
  const std::vector<Request> bad = {
      {.id = "x", .prompt = {1}, .max_tokens = 1, .n = 17}};
  const auto rejected = (*scheduler)->Run(bad);
  REQUIRE_STATUS_IS(rejected, kInvalidArgument);
  REQUIRE(rejected.status().message().find("n: 17 exceeds") !=
          absl::string_view::npos);
  const std::vector<Request> good = {
      {.id = "x", .prompt = {1}, .max_tokens = 1}};
  REQUIRE_OK((*scheduler)->Run(good));
  REQUIRE_STATUS_IS((*scheduler)->Run(good), kFailedPrecondition);
}

TEST_CASE("bad scheduler configs are rejected") {
  std::unique_ptr<Device> device = Device::Host();
  SchedulerConfig config = SmallConfig(16);
  config.max_tokens_per_step = 0;
  REQUIRE_STATUS_IS(Scheduler::Create(config, *device), kInvalidArgument);
  config = SmallConfig(0);
  REQUIRE_STATUS_IS(Scheduler::Create(config, *device), kInvalidArgument);
  config = SmallConfig(16);
  config.chunk_tokens = -1;
  auto created = Scheduler::Create(config, *device);
  REQUIRE_STATUS_IS(created, kInvalidArgument);
  REQUIRE(created.status().message().find("chunk_tokens") !=
          absl::string_view::npos);
  config = SmallConfig(16);
  config.spec_tokens = kMaxSpecTokens + 1;
  created = Scheduler::Create(config, *device);
  REQUIRE_STATUS_IS(created, kInvalidArgument);
  REQUIRE(created.status().message().find("spec_tokens must be in [0, 64]") !=
          absl::string_view::npos);
  config = SmallConfig(16);
  config.spec_acceptance = 1.5;
  created = Scheduler::Create(config, *device);
  REQUIRE_STATUS_IS(created, kInvalidArgument);
  REQUIRE(created.status().message().find("spec_acceptance") !=
          absl::string_view::npos);
  config = SmallConfig(16);
  config.host_bandwidth_gbps = 0;
  created = Scheduler::Create(config, *device);
  REQUIRE_STATUS_IS(created, kInvalidArgument);
  REQUIRE(created.status().message().find("host_bandwidth_gbps") !=
          absl::string_view::npos);
  config = SmallConfig(16);
  config.host_page_bytes = -1;
  REQUIRE_STATUS_IS(Scheduler::Create(config, *device), kInvalidArgument);
  // A host KV pool of 2^48 bytes, valid as a geometry, fits no machine.
  config = SmallConfig(16);
  config.kv.num_kv_heads = 1 << 20;
  config.kv.head_dim = 1 << 20;
  created = Scheduler::Create(config, *device);
  REQUIRE_STATUS_IS(created, kResourceExhausted);
  REQUIRE(
      created.status().message().find("the KV pool's 281474976710656 bytes") !=
      absl::string_view::npos);
  // The refusal freed what it made: the device serves the next one.
  created = Scheduler::Create(SmallConfig(16), *device);
  REQUIRE_OK(created);
  REQUIRE_OK((*created)->Run({}));
}

}  // namespace
}  // namespace kvblock::sim
