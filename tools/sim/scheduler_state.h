// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// SchedulerState: the library objects and device buffers a Scheduler owns
// (scheduler.h), made once by Scheduler::Create and used by the one Run or
// Serve it allows: the manager, page table and commit layer a run steps
// through, the KV pool the copy kernel works on, and the buffers that carry a
// step's copy-on-write list to the device.
//
// Thread safety: thread-compatible; the scheduler's thread owns it.
#ifndef KVBLOCK_TOOLS_SIM_SCHEDULER_STATE_H_
#define KVBLOCK_TOOLS_SIM_SCHEDULER_STATE_H_

#include <cstdint>
#include <memory>

#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "sim/scheduler.h"

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
  // The host tier's pages (HostKvPool: pinned, [host_pages, num_layers, 2,
  // page_size, num_kv_heads, head_dim]) and a step's copy list, staged in
  // pinned memory the device reads in place; `host_copies_done` completes
  // when the staging may be rewritten. Unset without a host tier.
  PinnedBuffer host_kv;
  PinnedBuffer host_copy_staging;
  size_t host_copy_capacity = 0;  // copies the staging holds.
  DeviceEvent host_copies_done;
  // The whole-table upload Create makes: its time and what it sent.
  int64_t table_setup_ns = 0;
  KVPageTableUploadStats setup_uploads;
  bool ran = false;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_SCHEDULER_STATE_H_
