// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A host tier's copy batch (kvblock/block_pool.h's HostCopy) as numpy: rows
// of HOST_COPY_DTYPE, the C++ struct's 12-byte layout (device_page int32,
// host_page int32, direction uint8), so that the array's buffer is the copy
// list RunHostCopies (kvblock/kernels.h) or a caller's copy code takes.
// Used by the manager's, the commit's and kvblock.vllm's calls.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_HOST_COPY_ARRAY_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_HOST_COPY_ARRAY_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "absl/types/span.h"
#include "kvblock/block_pool.h"
#include "strict_int.h"

namespace kvblock::python {

// The numpy dtype of a HostCopy (a new object each call).
pybind11::dtype HostCopyDtype();

// `copies` as an array of HostCopyDtype rows: a read-only view of them kept
// alive by `owner`, or (no owner) a copy the array owns.
pybind11::array HostCopiesArray(absl::Span<const HostCopy> copies,
                                pybind11::handle owner = pybind11::handle());

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_HOST_COPY_ARRAY_H_
