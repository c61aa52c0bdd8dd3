// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "dlpack_export.h"

#include <Python.h>

#include <array>
#include <cstdint>

namespace kvblock::python {
namespace {

namespace py = pybind11;

// A consumer renames the capsule "used_dltensor" when it takes the tensor.
constexpr const char* kCapsuleName = "dltensor";

// What a DLManagedTensor owns: its shape and strides, and a reference to the
// Python object that keeps the memory.
struct Export {
  DLManagedTensor managed;
  std::array<int64_t, 3> shape;
  std::array<int64_t, 3> strides;
  PyObject* owner;
};

void DeleteExport(DLManagedTensor* managed) {
  auto* export_ = static_cast<Export*>(managed->manager_ctx);
  // A consumer may let go from any thread.
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(export_->owner);
  PyGILState_Release(gil);
  delete export_;
}

// A capsule no consumer took still owns its tensor.
void DeleteUnusedCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed.
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) {
    managed->deleter(managed);
  }
}

}  // namespace

py::capsule ExportDlpack(const DeviceTensor& view, DLDevice device,
                         py::handle owner) {
  auto* export_ = new Export{};
  export_->shape = view.shape();
  export_->strides = {view.shape()[1] * view.shape()[2], view.shape()[2], 1};
  export_->owner = owner.ptr();
  Py_INCREF(export_->owner);
  DLTensor& tensor = export_->managed.dl_tensor;
  tensor.data = view.data();
  tensor.device = device;
  tensor.ndim = 3;
  tensor.dtype = DLDataType{.code = kDLInt, .bits = 32, .lanes = 1};
  tensor.shape = export_->shape.data();
  tensor.strides = export_->strides.data();
  tensor.byte_offset = 0;
  export_->managed.manager_ctx = export_;
  export_->managed.deleter = DeleteExport;
  PyObject* capsule =
      PyCapsule_New(&export_->managed, kCapsuleName, DeleteUnusedCapsule);
  if (capsule == nullptr) {
    DeleteExport(&export_->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace kvblock::python
