// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/workloads.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sim/random.h"

namespace kvblock::sim {
namespace {

// How many requests (or conversations) a generator makes, arriving over
// [0, span) steps.
struct Shape {
  int32_t count = 0;
  int64_t span = 0;
};

void AppendRandomTokens(Rng& rng, int64_t count, std::vector<TokenId>& out) {
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(static_cast<TokenId>(rng.Uniform(0, kGeneratedVocab - 1)));
  }
}

std::vector<TokenId> RandomTokens(Rng& rng, int64_t count) {
  std::vector<TokenId> tokens;
  tokens.reserve(count);
  AppendRandomTokens(rng, count, tokens);
  return tokens;
}

// Requests with a fresh random prompt each; `n` samples or `beam` beams.
void AddFresh(Rng& rng, absl::string_view prefix, Shape shape,
              int64_t min_prompt, int64_t max_prompt, int64_t min_output,
              int64_t max_output, int32_t n, int32_t beam,
              std::vector<Request>& out) {
  for (int32_t i = 0; i < shape.count; ++i) {
    Request request;
    request.id = absl::StrCat(prefix, i);
    request.arrival = rng.Uniform(0, shape.span - 1);
    request.prompt = RandomTokens(rng, rng.Uniform(min_prompt, max_prompt));
    request.max_tokens = rng.Uniform(min_output, max_output);
    request.n = n;
    request.beam = beam;
    out.push_back(std::move(request));
  }
}

// Four system prompts, the first most popular; two tenants whose caches are
// kept apart by their salts.
void AddSysprompt(Rng& rng, Shape shape, std::vector<Request>& out) {
  constexpr int kSystemPrompts = 4;
  std::vector<std::vector<TokenId>> system(kSystemPrompts);
  for (std::vector<TokenId>& prompt : system) {
    prompt = RandomTokens(rng, rng.Uniform(200, 400));
  }
  for (int32_t i = 0; i < shape.count; ++i) {
    Request request;
    request.id = absl::StrCat("sys-", i);
    request.arrival = rng.Uniform(0, shape.span - 1);
    const int64_t k = std::min(rng.Uniform(0, kSystemPrompts - 1),
                               rng.Uniform(0, kSystemPrompts - 1));
    request.prompt = system[k];
    AppendRandomTokens(rng, rng.Uniform(16, 96), request.prompt);
    request.max_tokens = rng.Uniform(16, 96);
    request.cache_salt = absl::StrCat("tenant-", rng.Uniform(0, 1));
    out.push_back(std::move(request));
  }
}

// Conversations of 3 to 5 turns: each turn's prompt is the previous prompt,
// the previous answer (its `output`) and a new user message, arriving
// `think` steps (drawn from [min, max]) after the previous answer is
// complete, at the earliest.
struct ThinkTime {
  int64_t min = 2;
  int64_t max = 24;
};
void AddMultiturn(Rng& rng, Shape shape, std::vector<Request>& out,
                  ThinkTime think = {}, absl::string_view prefix = "chat-") {
  for (int32_t c = 0; c < shape.count; ++c) {
    const int64_t turns = rng.Uniform(3, 5);
    std::vector<TokenId> history = RandomTokens(rng, rng.Uniform(48, 160));
    int64_t arrival = rng.Uniform(0, shape.span / 2);
    for (int64_t t = 0; t < turns; ++t) {
      Request request;
      request.id = absl::StrCat(prefix, c, "-", t);
      request.arrival = arrival;
      request.prompt = history;
      request.max_tokens = rng.Uniform(24, 64);
      request.output = RandomTokens(rng, request.max_tokens);
      history.insert(history.end(), request.output.begin(),
                     request.output.end());
      AppendRandomTokens(rng, rng.Uniform(16, 48), history);
      arrival += request.max_tokens + rng.Uniform(think.min, think.max);
      out.push_back(std::move(request));
    }
  }
}

void AddParallel(Rng& rng, Shape shape, std::vector<Request>& out) {
  AddFresh(rng, "par-", shape, 64, 256, 32, 96, /*n=*/4, /*beam=*/1, out);
}

void AddBeam(Rng& rng, Shape shape, std::vector<Request>& out) {
  AddFresh(rng, "beam-", shape, 64, 192, 24, 64, /*n=*/1, /*beam=*/4, out);
}

void AddUnique(Rng& rng, Shape shape, std::vector<Request>& out) {
  AddFresh(rng, "uniq-", shape, 32, 384, 16, 160, /*n=*/1, /*beam=*/1, out);
}

// A serving trace at scale: unrelated prompts of 128 to 2048 tokens, 32 to
// 256 output tokens, arriving about 0.7 a step, so that about 100 run at
// once.
void AddServing(Rng& rng, Shape shape, std::vector<Request>& out) {
  AddFresh(rng, "req-", shape, 128, 2048, 32, 256, /*n=*/1, /*beam=*/1, out);
}

// Long contexts: unrelated prompts of 8k to 32k tokens, 1k output tokens
// each, where a sliding window's savings show.
void AddLongContext(Rng& rng, Shape shape, std::vector<Request>& out) {
  AddFresh(rng, "long-", shape, 8192, 32768, 1024, 1024, /*n=*/1, /*beam=*/1,
           out);
}

// The chat workload: many conversations whose users take a while to answer,
// so that a small pool forgets a conversation between its turns.
constexpr int32_t kChatConversations = 1216;
constexpr int64_t kChatSpan = 6000;
constexpr int64_t kChatThinkMin = 100;
constexpr int64_t kChatThinkMax = 600;

constexpr WorkloadInfo kWorkloads[] = {
    {"sysprompt", "requests sharing a few long system prompts, two tenants",
     1024},
    {"multiturn", "conversations whose next turn contains the last answer",
     1024},
    {"chat",
     "1216 conversations of the multiturn shape whose users answer 100 to 600 "
     "steps later: a pool of 2000 pages forgets them between turns",
     1024},
    {"parallel", "n = 4 parallel samples per prompt", 1024},
    {"beam", "beam search of width 4", 1024},
    {"unique", "unrelated prompts, no sharing", 1024},
    {"mixed", "all of the above at once", 1024},
    {"serving",
     "2000 unrelated 128-2048-token prompts, ~100 running: the scale of a "
     "serving replica (needs --max_pages_per_seq=144 --pages=16384 or more)",
     2048 + 256},
    {"longcontext",
     "64 unrelated 8k-32k-token prompts, 1k output tokens each (needs "
     "--max_pages_per_seq=2112 --pages=65536 or more)",
     32768 + 1024},
};

}  // namespace

absl::Span<const WorkloadInfo> Workloads() { return kWorkloads; }

absl::StatusOr<std::vector<Request>> MakeWorkload(absl::string_view name,
                                                  uint64_t seed) {
  constexpr int64_t kSpan = 600;
  Rng rng(Mix(seed ^ HashId(name)));
  std::vector<Request> requests;
  if (name == "sysprompt") {
    AddSysprompt(rng, {.count = 240, .span = kSpan}, requests);
  } else if (name == "multiturn") {
    AddMultiturn(rng, {.count = 48, .span = kSpan}, requests);
  } else if (name == "chat") {
    AddMultiturn(rng, {.count = kChatConversations, .span = kChatSpan},
                 requests, {.min = kChatThinkMin, .max = kChatThinkMax},
                 "conv-");
  } else if (name == "parallel") {
    AddParallel(rng, {.count = 64, .span = kSpan}, requests);
  } else if (name == "beam") {
    AddBeam(rng, {.count = 48, .span = kSpan}, requests);
  } else if (name == "unique") {
    AddUnique(rng, {.count = 200, .span = kSpan}, requests);
  } else if (name == "serving") {
    AddServing(rng, {.count = 2000, .span = 2900}, requests);
  } else if (name == "longcontext") {
    AddLongContext(rng, {.count = 64, .span = 4000}, requests);
  } else if (name == "mixed") {
    AddSysprompt(rng, {.count = 100, .span = kSpan}, requests);
    AddMultiturn(rng, {.count = 16, .span = kSpan}, requests);
    AddParallel(rng, {.count = 20, .span = kSpan}, requests);
    AddBeam(rng, {.count = 16, .span = kSpan}, requests);
    AddUnique(rng, {.count = 80, .span = kSpan}, requests);
  } else {
    std::vector<absl::string_view> names;
    for (const WorkloadInfo& info : kWorkloads) names.push_back(info.name);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown workload '", name,
                     "' (known: ", absl::StrJoin(names, ", "), ")"));
  }
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  return requests;
}

}  // namespace kvblock::sim
