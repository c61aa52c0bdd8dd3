// Copyright 2026 The kvblock Authors.
//
// Internal: BlockManager's transaction, shared by its two sources
// (block_manager.cc, block_manager_append.cc): a nested transaction is the
// pool's savepoint, the journal's mark and the manager's stats and
// reserved pages when it began;
// Transact runs a change in one, keeping it when it returns OK and undoing
// it otherwise. A template, so the change inlines into it.
//
// Thread safety: as BlockManager.
#ifndef KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_TRANSACT_H_
#define KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_TRANSACT_H_

#include "absl/status/status.h"
#include "kvblock/block_manager.h"
#include "kvblock/block_pool.h"
#include "manager/step_journal.h"

namespace kvblock {

struct BlockManager::Transaction {
  BlockPool::Savepoint pool;
  internal::StepJournal::Mark journal;
  BlockManagerStats stats;
  int32_t reserved_pages;
};

template <typename Change>
absl::Status BlockManager::Transact(Change&& change) {
  const Transaction transaction = BeginTransaction();
  absl::Status status = change();
  if (status.ok()) {
    CommitTransaction(transaction);
  } else {
    RollbackTransaction(transaction);
  }
  return status;
}

}  // namespace kvblock

#endif  // KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_TRANSACT_H_
