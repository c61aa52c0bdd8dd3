// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/step_planner.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "sim/random.h"
#include "sim/request_state.h"
#include "sim/scheduler.h"
#include "sim/small_scheduler_config.h"
#include "test_util.h"

namespace kvblock::sim {
namespace {

using ::kvblock::testing::TokenRange;

// The library objects a plan is made against, on a host device.
struct Library {
  explicit Library(const SchedulerConfig& config) : device(Device::Host()) {
    auto created_manager = BlockManager::Create(config.kv, config.manager);
    REQUIRE_OK(created_manager);
    manager = *std::move(created_manager);
    auto created_table =
        KVPageTable::Create(config.kv.max_batch, config.kv.max_pages_per_seq,
                            config.kv.num_pages, *device);
    REQUIRE_OK(created_table);
    table = *std::move(created_table);
    auto created_commit = BatchCommit::Create(*manager, *table);
    REQUIRE_OK(created_commit);
    commit = *std::move(created_commit);
  }

  std::unique_ptr<Device> device;
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<KVPageTable> table;
  std::unique_ptr<BatchCommit> commit;
};

Request MakeRequest(const std::string& id, int prompt_tokens, int32_t n = 1) {
  Request request;
  request.id = id;
  request.prompt =
      TokenRange(1000 * (static_cast<int>(id.size()) + 1), prompt_tokens);
  request.max_tokens = 4;
  request.n = n;
  return request;
}

// The requests' states as a run queues them on arrival: prompts hashed.
std::vector<RequestState> Arrived(const std::vector<Request>& requests,
                                  BlockManager& manager, int32_t page_size) {
  std::vector<RequestState> states;
  for (const Request& request : requests) {
    RequestState& r = states.emplace_back(
        RequestState{.request = &request, .id_hash = HashId(request.id)});
    r.prompt_hashes.resize(request.prompt.size() / page_size);
    REQUIRE_OK(manager.HashPrompt(request.prompt, {},
                                  absl::MakeSpan(r.prompt_hashes)));
  }
  return states;
}

std::deque<RequestState*> QueueOf(std::vector<RequestState>& states) {
  std::deque<RequestState*> waiting;
  for (RequestState& r : states) waiting.push_back(&r);
  return waiting;
}

// What planning must not change of a request.
auto FieldsOf(const RequestState& r) {
  return std::make_tuple(r.done, r.sequences.size(), r.generated, r.next_sample,
                         r.prompt_done, r.prompt_steps, r.forks_pending,
                         r.drafts, r.first_admitted, r.first_token);
}

TEST_CASE("planning changes neither the library nor the requests") {
  const SchedulerConfig config = SmallConfig(64);
  Library library(config);
  const std::vector<Request> requests = {MakeRequest("a", 10),
                                         MakeRequest("bb", 6, /*n=*/2),
                                         MakeRequest("ccc", 9)};
  std::vector<RequestState> states =
      Arrived(requests, *library.manager, config.kv.page_size);
  const std::deque<RequestState*> waiting = QueueOf(states);
  const BlockManagerStats stats = library.manager->stats();
  const BlockPoolSnapshot pool = library.manager->pool().Snapshot();
  std::vector<decltype(FieldsOf(states[0]))> fields;
  for (const RequestState& r : states) fields.push_back(FieldsOf(r));

  StepPlanner planner(config, *library.manager, *library.commit);
  PlannedStep plan(config.kv.max_batch);
  PlannedStep again(config.kv.max_batch);
  const PlanInput input{.waiting = &waiting, .next_sequence_id = 7};
  REQUIRE_OK(planner.Plan(input, plan));
  REQUIRE_OK(planner.Plan(input, again));

  REQUIRE(library.manager->stats() == stats);
  REQUIRE(library.manager->pool().Snapshot() == pool);
  for (size_t i = 0; i < states.size(); ++i) {
    REQUIRE(FieldsOf(states[i]) == fields[i]);
  }
  // Every request admitted: a prompt each, and the second's other sample
  // forks of it in the same step (its prompt is planned whole).
  REQUIRE(plan.rejections.empty());
  REQUIRE(plan.limit == StepLimit::kNone);
  REQUIRE(plan.admissions.size() == 3);
  REQUIRE(plan.admissions[1].first_id == 8);
  REQUIRE(plan.joins.size() == 4);
  REQUIRE(plan.joins[2].fork_of == 8);
  REQUIRE(plan.next_sequence_id == 11);
  // The same inputs, the same plan.
  REQUIRE(again.joins.size() == plan.joins.size());
  for (size_t i = 0; i < plan.joins.size(); ++i) {
    REQUIRE(again.joins[i].id == plan.joins[i].id);
    REQUIRE(again.joins[i].fork_of == plan.joins[i].fork_of);
  }
  // And it commits.
  REQUIRE_OK(library.commit->Commit(plan.step_plan()));
  REQUIRE(library.commit->batch() == 4);
}

TEST_CASE(
    "a request that can never run is listed, not taken out of the queue") {
  const SchedulerConfig config = SmallConfig(8);
  Library library(config);
  // 40 tokens: 10 pages of 4 tokens, more than the pool's 8.
  const std::vector<Request> requests = {MakeRequest("big", 40),
                                         MakeRequest("small", 6)};
  std::vector<RequestState> states =
      Arrived(requests, *library.manager, config.kv.page_size);
  const std::deque<RequestState*> waiting = QueueOf(states);

  StepPlanner planner(config, *library.manager, *library.commit);
  PlannedStep plan(config.kv.max_batch);
  REQUIRE_OK(planner.Plan({.waiting = &waiting}, plan));
  REQUIRE(waiting.size() == 2);
  REQUIRE(plan.rejections.size() == 1);
  REQUIRE(plan.rejections[0].waiting_index == 0);
  REQUIRE(plan.rejections[0].kind == RejectedRequest::Kind::kPoolTooSmall);
  REQUIRE(plan.admissions.size() == 1);
  REQUIRE(plan.joins.size() == 1);
  REQUIRE(plan.joins[0].tokens.size() == 6);
}

TEST_CASE("admissions stop at the admit limit and at the batch") {
  const SchedulerConfig config = SmallConfig(256);
  Library library(config);
  // Samples of 6 each: two requests fill 12 of the 16 seats.
  const std::vector<Request> requests = {MakeRequest("a", 5, 6),
                                         MakeRequest("bb", 5, 6),
                                         MakeRequest("ccc", 5, 6)};
  std::vector<RequestState> states =
      Arrived(requests, *library.manager, config.kv.page_size);
  const std::deque<RequestState*> waiting = QueueOf(states);
  StepPlanner planner(config, *library.manager, *library.commit);
  PlannedStep plan(config.kv.max_batch);

  SECTION("the batch") {
    REQUIRE_OK(planner.Plan({.waiting = &waiting}, plan));
    REQUIRE(plan.admissions.size() == 2);
    REQUIRE(plan.limit == StepLimit::kMaxBatch);
  }
  SECTION("the admit limit") {
    REQUIRE_OK(planner.Plan({.waiting = &waiting, .admit_limit = 1}, plan));
    REQUIRE(plan.admissions.size() == 1);
    REQUIRE(plan.joins.size() == 6);
    REQUIRE(plan.limit == StepLimit::kNone);
  }
}

}  // namespace
}  // namespace kvblock::sim
