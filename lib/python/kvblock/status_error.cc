// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "status_error.h"

#include <Python.h>

#include <array>
#include <string>

namespace kvblock::python {
namespace {

namespace py = pybind11;

// One exception class per status code; the built-in it also derives from.
struct ErrorClass {
  absl::StatusCode code;
  const char* name;
  PyObject* builtin;
  PyObject* type = nullptr;  // set by RegisterErrors, alive with the module.
};

PyObject* base_error = nullptr;

std::array<ErrorClass, 8>& ErrorClasses() {
  static std::array<ErrorClass, 8> classes = {{
      {absl::StatusCode::kInvalidArgument, "InvalidArgumentError",
       PyExc_ValueError},
      {absl::StatusCode::kNotFound, "NotFoundError", PyExc_KeyError},
      {absl::StatusCode::kAlreadyExists, "AlreadyExistsError",
       PyExc_ValueError},
      {absl::StatusCode::kOutOfRange, "OutOfRangeError", PyExc_IndexError},
      {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError",
       PyExc_RuntimeError},
      {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError",
       PyExc_RuntimeError},
      {absl::StatusCode::kUnimplemented, "UnimplementedError",
       PyExc_NotImplementedError},
      {absl::StatusCode::kInternal, "InternalError", PyExc_RuntimeError},
  }};
  return classes;
}

}  // namespace

void RegisterErrors(py::module_& module) {
  base_error = PyErr_NewExceptionWithDoc(
      "kvblock.Error",
      "Base class of every kvblock error; the subclasses name the status code "
      "and also derive from the matching built-in exception.",
      PyExc_Exception, nullptr);
  if (base_error == nullptr) throw py::error_already_set();
  module.add_object("Error", py::handle(base_error));
  for (ErrorClass& error : ErrorClasses()) {
    const py::tuple bases =
        py::make_tuple(py::handle(base_error), py::handle(error.builtin));
    const std::string name = std::string("kvblock.") + error.name;
    error.type = PyErr_NewException(name.c_str(), bases.ptr(), nullptr);
    if (error.type == nullptr) throw py::error_already_set();
    module.add_object(error.name, py::handle(error.type));
  }
}

void Raise(const absl::Status& status) {
  PyObject* type = base_error;
  for (const ErrorClass& error : ErrorClasses()) {
    if (error.code == status.code()) type = error.type;
  }
  const std::string message(status.message());
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

}  // namespace kvblock::python
