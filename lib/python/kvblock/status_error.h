// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// absl::Status to Python exceptions: kvblock.Error and one subclass per status
// code, each also derived from the matching built-in (InvalidArgumentError is
// a ValueError, NotFoundError a KeyError, ...), the message kept.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_STATUS_ERROR_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_STATUS_ERROR_H_

#include <pybind11/pybind11.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strict_int.h"

namespace kvblock::python {

// Creates the exception classes as attributes of `module`. Called once, from
// the module's init.
void RegisterErrors(pybind11::module_& module);

// Raises the exception of `status` (not OK) as a C++ throw pybind11 turns
// into the Python exception.
[[noreturn]] void Raise(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) Raise(result.status());
  return *std::move(result);
}

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_STATUS_ERROR_H_
