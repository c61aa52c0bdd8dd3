// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: the reference of the page-table patch kernel, which is also the
// host device's Device::ApplyPageTablePatch. Apart from the other kernels'
// references (device/kernels_reference.h), which use kvblock/kernels.h: the
// device layer sits below the kernels.
//
// Complexity: linear in the entries the patch writes.
// Thread safety: a stateless function.
#ifndef KVBLOCK_LIB_DEVICE_PAGE_TABLE_PATCH_REFERENCE_H_
#define KVBLOCK_LIB_DEVICE_PAGE_TABLE_PATCH_REFERENCE_H_

#include "kvblock/device.h"

namespace kvblock::internal {

// Applies the ranges in order, skipping any that does not fit the table (as
// the kernel does). `patch.table` is host memory.
void ApplyPageTablePatchReference(const PageTablePatch& patch);

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_DEVICE_PAGE_TABLE_PATCH_REFERENCE_H_
