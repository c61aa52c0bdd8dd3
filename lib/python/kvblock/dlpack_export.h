// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The DLPack export of the device page table (the __dlpack__ protocol): a
// "dltensor" capsule over the table's int32 [max_batch, 2, max_pages_per_seq]
// mirror, with no copy, that keeps its Python owner alive until the consumer
// (numpy.from_dlpack, torch.from_dlpack) lets it go.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_DLPACK_EXPORT_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_DLPACK_EXPORT_H_

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include "kvblock/device.h"
#include "strict_int.h"

namespace kvblock::python {

// `view` lives on `device` (kDLCPU for the host device, kDLCUDA for a GPU);
// `owner` keeps it valid.
pybind11::capsule ExportDlpack(const DeviceTensor& view, DLDevice device,
                               pybind11::handle owner);

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_DLPACK_EXPORT_H_
