// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/run_metrics.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "sim/scheduler_state.h"
#include "sim/small_scheduler_config.h"
#include "test_util.h"

namespace kvblock::sim {
namespace {

using ::kvblock::testing::TokenRange;

// A scheduler's library objects on a host device, phase timing on, as
// Scheduler::Create makes them (without the device buffers).
std::unique_ptr<SchedulerState> MakeState(Device& device) {
  auto state = std::make_unique<SchedulerState>(device);
  state->config = SmallConfig(64);
  const SchedulerConfig& config = state->config;
  auto manager = BlockManager::Create(config.kv, config.manager);
  REQUIRE_OK(manager);
  state->manager = *std::move(manager);
  auto table =
      KVPageTable::Create(config.kv.max_batch, config.kv.max_pages_per_seq,
                          config.kv.num_pages, device);
  REQUIRE_OK(table);
  state->table = *std::move(table);
  auto commit = BatchCommit::Create(*state->manager, *state->table);
  REQUIRE_OK(commit);
  state->commit = *std::move(commit);
  state->commit->set_time_phases(true);
  return state;
}

TEST_CASE("the commits' own time is taken out of the phase they ran in") {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<SchedulerState> state = MakeState(*device);
  RunMetrics metrics(state->config, /*requests=*/1);
  const std::vector<TokenId> prompt = TokenRange(1, 10);
  const std::vector<JoinRequest> joins = {{.id = 0, .tokens = prompt}};
  const std::vector<SequenceId> finished = {0};

  HostClock& clock = metrics.host_clock();
  clock.Start();
  const BlockManagerStats before = state->manager->stats();
  auto step = state->commit->Commit({.joins = joins});
  REQUIRE_OK(step);
  clock.Lap(&HostPhases::planning_ns);
  metrics.AddStep(*step, before, state->manager->stats(),
                  {.step = 0, .waiting = 2, .limit = StepLimit::kPages});
  clock.Start();
  REQUIRE_OK(state->commit->Commit({.finished = finished}));
  clock.Lap(&HostPhases::planning_ns);
  REQUIRE_OK(state->table->Upload(nullptr));
  clock.Lap(&HostPhases::upload_ns);

  const HostPhases laps = clock.phases();
  const CommitPhaseTimes commit = state->commit->phase_times();
  const SimResult result = metrics.Finish(*state, 0.5, 1000);
  const HostPhases& phases = result.host_ns_by_phase;
  REQUIRE(commit.total_ns > 0);
  REQUIRE(phases.planning_ns == laps.planning_ns - commit.total_ns);
  REQUIRE(phases.planning_ns >= 0);
  REQUIRE(phases.admissions_ns == commit.admissions_ns);
  REQUIRE(phases.frees_ns == commit.frees_ns);
  REQUIRE(phases.frees_ns + phases.admissions_ns + phases.appends_ns +
              phases.page_table_ns + phases.bookkeeping_ns ==
          commit.total_ns);
  REQUIRE(phases.upload_ns == laps.upload_ns);
  REQUIRE(result.host_ns_total == phases.total_ns());
  REQUIRE(result.host_ns_total == laps.total_ns());
  // The step as AddStep took it.
  REQUIRE(result.steps == 1);
  REQUIRE(result.sequence_steps == 1);
  REQUIRE(result.steps_limited_by_pages == 1);
  REQUIRE(result.peak_waiting == 2);
  REQUIRE(result.timeline.size() == 1);
  REQUIRE(result.timeline[0].prompt_tokens == 10);
  REQUIRE(result.prompt_tokens == 10);
}

}  // namespace
}  // namespace kvblock::sim
