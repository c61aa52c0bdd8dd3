// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The small scheduler geometry the simulator's tests run in: pages of 4
// tokens, a batch of 16, 32 pages a sequence, a model of one 8-wide KV head.
#ifndef KVBLOCK_TESTS_SIM_SMALL_SCHEDULER_CONFIG_H_
#define KVBLOCK_TESTS_SIM_SMALL_SCHEDULER_CONFIG_H_

#include <cstdint>

#include "sim/scheduler.h"

namespace kvblock::sim {

inline SchedulerConfig SmallConfig(int32_t num_pages) {
  SchedulerConfig config;
  config.kv.num_pages = num_pages;
  config.kv.page_size = 4;
  config.kv.max_batch = 16;
  config.kv.max_pages_per_seq = 32;
  config.kv.num_kv_heads = 1;
  config.kv.head_dim = 8;
  config.max_tokens_per_step = 1024;
  return config;
}

}  // namespace kvblock::sim

#endif  // KVBLOCK_TESTS_SIM_SMALL_SCHEDULER_CONFIG_H_
