// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Array<T>: a one-dimensional array of integers T that a binding takes from
// Python, a numpy array or any sequence. A C-contiguous 1-D array of T is
// read in place (a step's counts and tokens, no copy); anything else is
// converted after it is checked: integers only (no floats, NaN or bools:
// TypeError), each fitting T (OverflowError, naming the value), one
// dimension (ValueError). The call it is an argument of changes nothing
// then.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_INT_ARRAY_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_INT_ARRAY_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "strict_int.h"

namespace kvblock::python {

template <typename T>
class Array {
 public:
  using Exact = pybind11::array_t<T, pybind11::array::c_style>;

  explicit Array(pybind11::ssize_t size = 0) : array_(size) {}
  explicit Array(Exact array) : array_(std::move(array)) {}

  const T* data() const { return array_.data(); }
  pybind11::ssize_t size() const { return array_.size(); }
  const Exact& array() const { return array_; }

  // `value` as an Array, checked as the header says (throws the Python
  // error).
  static Array From(pybind11::handle value) {
    namespace py = pybind11;
    if (Exact::check_(value)) {
      Exact exact = py::reinterpret_borrow<Exact>(value);
      CheckOneDimension(exact.ndim());
      return Array(std::move(exact));
    }
    // Leaked on purpose: alive until the process exits.
    static PyObject* const kAsArray =
        py::object(py::module_::import("numpy").attr("asarray"))
            .release()
            .ptr();
    py::array any = py::reinterpret_borrow<py::object>(kAsArray)(value);
    CheckOneDimension(any.ndim());
    if (any.size() == 0) return Array(0);
    const char kind = any.dtype().kind();
    if (kind == 'O') return FromObjects(any);
    if (kind != 'i' && kind != 'u') {
      throw py::type_error("expected integers, got an array of " +
                           py::str(any.dtype()).cast<std::string>());
    }
    CheckFits(any.attr("min")());
    CheckFits(any.attr("max")());
    static PyObject* const kContiguous =
        py::object(py::module_::import("numpy").attr("ascontiguousarray"))
            .release()
            .ptr();
    return Array(
        py::reinterpret_borrow<py::object>(kContiguous)(any, py::dtype::of<T>())
            .template cast<Exact>());
  }

 private:
  static void CheckOneDimension(pybind11::ssize_t ndim) {
    if (ndim != 1) {
      throw pybind11::value_error(
          "expected a one-dimensional array or sequence of integers, got " +
          std::to_string(ndim) + " dimensions");
    }
  }

  // Throws OverflowError unless the integer `value` fits T.
  static void CheckFits(pybind11::handle value) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw pybind11::error_already_set();
    if (overflow != 0 ||
        v < static_cast<long long>(std::numeric_limits<T>::min()) ||
        v > static_cast<long long>(std::numeric_limits<T>::max())) {
      PyErr_SetString(PyExc_OverflowError,
                      ("integer " + pybind11::repr(value).cast<std::string>() +
                       " does not fit " + TypeName())
                          .c_str());
      throw pybind11::error_already_set();
    }
  }

  // An array of Python objects (ints too large for int64, or not ints).
  static Array FromObjects(const pybind11::array& objects) {
    Exact out(objects.size());
    T* data = out.mutable_data();
    for (pybind11::ssize_t i = 0; i < objects.size(); ++i) {
      pybind11::object item = objects.attr("item")(i);
      if (!PyLong_Check(item.ptr()) || PyBool_Check(item.ptr())) {
        throw pybind11::type_error("expected integers, got " +
                                   pybind11::repr(item).cast<std::string>());
      }
      CheckFits(item);
      data[i] = static_cast<T>(PyLong_AsLongLong(item.ptr()));
    }
    return Array(std::move(out));
  }

  static std::string TypeName() {
    return (std::numeric_limits<T>::is_signed ? "int" : "uint") +
           std::to_string(8 * sizeof(T));
  }

  Exact array_;
};

}  // namespace kvblock::python

namespace pybind11::detail {

template <typename T>
struct type_caster<kvblock::python::Array<T>> {
  PYBIND11_TYPE_CASTER(kvblock::python::Array<T>,
                       const_name("numpy.ndarray[int]"));

  bool load(handle source, bool /*convert*/) {
    value = kvblock::python::Array<T>::From(source);
    return true;
  }

  static handle cast(const kvblock::python::Array<T>& array,
                     return_value_policy /*policy*/, handle /*parent*/) {
    return array.array().inc_ref();
  }
};

}  // namespace pybind11::detail

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_INT_ARRAY_H_
