// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "host_copy_array.h"

#include <cstddef>

namespace kvblock::python {

namespace py = pybind11;

py::dtype HostCopyDtype() {
  static_assert(sizeof(HostCopy) == 12);
  static_assert(offsetof(HostCopy, device_page) == 0);
  static_assert(offsetof(HostCopy, host_page) == 4);
  static_assert(offsetof(HostCopy, direction) == 8);
  static_assert(sizeof(HostCopy::Direction) == 1);
  py::list names;
  names.append("device_page");
  names.append("host_page");
  names.append("direction");
  py::list formats;
  formats.append("i4");
  formats.append("i4");
  formats.append("u1");
  py::list offsets;
  offsets.append(0);
  offsets.append(4);
  offsets.append(8);
  return py::dtype(names, formats, offsets, sizeof(HostCopy));
}

py::array HostCopiesArray(absl::Span<const HostCopy> copies, py::handle owner) {
  // Never destroyed: a static's destructor would run after the
  // interpreter is gone.
  static const py::dtype* const dtype = new py::dtype(HostCopyDtype());
  py::array array(*dtype, {static_cast<py::ssize_t>(copies.size())}, {},
                  copies.data(), owner);
  if (owner) {
    py::detail::array_proxy(array.ptr())->flags &=
        ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return array;
}

}  // namespace kvblock::python
