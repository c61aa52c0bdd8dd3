// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// For the tests of BlockManager's handle and step protocol, which only its
// implementation speaks (BatchCommit's side of it).
#ifndef KVBLOCK_TESTS_MANAGER_BLOCK_MANAGER_TEST_UTIL_H_
#define KVBLOCK_TESTS_MANAGER_BLOCK_MANAGER_TEST_UTIL_H_

#include "kvblock/block_manager.h"
#include "manager/block_manager_impl.h"

namespace kvblock {

inline internal::BlockManagerImpl& Impl(BlockManager& manager) {
  return internal::BlockManagerImpl::Of(manager);
}
inline const internal::BlockManagerImpl& Impl(const BlockManager& manager) {
  return internal::BlockManagerImpl::Of(manager);
}

}  // namespace kvblock

#endif  // KVBLOCK_TESTS_MANAGER_BLOCK_MANAGER_TEST_UTIL_H_
