// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The module's integer arguments: a Python int, or an object that says it
// is one (__index__: numpy's integers), that fits the C++ type; never a
// bool, a float or another number. pybind11's own caster, in its
// converting pass, takes any number through int(), so that
// append_token(s, np.float32(5.7)) appended token 5 and admit(True, ...)
// admitted sequence 1. A refused argument is pybind11's TypeError naming
// the call's signatures, as for any other wrong type. (The vLLM adapter's
// request fields follow the same rule: vllm_request.h's Int64Field.)
//
// Every file of the module that uses pybind11 includes it (its own
// headers do), so that these specializations come before any use of the
// casters: one that came after would not compile.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_STRICT_INT_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_STRICT_INT_H_

#include <pybind11/pybind11.h>

#include <limits>
#include <type_traits>

namespace pybind11::detail {

template <typename T>
class StrictIntCaster {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);

 public:
  PYBIND11_TYPE_CASTER(T, const_name("int"));

  bool load(handle src, bool /*convert*/) {
    if (!src || PyBool_Check(src.ptr()) || !PyIndex_Check(src.ptr())) {
      return false;
    }
    const object index = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
    if (!index) {
      PyErr_Clear();
      return false;
    }
    if constexpr (std::is_signed_v<T>) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred() != nullptr)) {
        PyErr_Clear();
        return false;
      }
      if (v < std::numeric_limits<T>::min() ||
          v > std::numeric_limits<T>::max()) {
        return false;
      }
      value = static_cast<T>(v);
    } else {
      if (_PyLong_Sign(index.ptr()) < 0) return false;
      const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
      if (v == static_cast<unsigned long long>(-1) &&
          PyErr_Occurred() != nullptr) {
        PyErr_Clear();
        return false;
      }
      if (v > std::numeric_limits<T>::max()) return false;
      value = static_cast<T>(v);
    }
    return true;
  }

  static handle cast(T src, return_value_policy /*policy*/, handle /*parent*/) {
    if constexpr (std::is_signed_v<T>) {
      return PyLong_FromLongLong(static_cast<long long>(src));
    } else {
      return PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(src));
    }
  }
};

template <>
class type_caster<signed char> : public StrictIntCaster<signed char> {};
template <>
class type_caster<unsigned char> : public StrictIntCaster<unsigned char> {};
template <>
class type_caster<short> : public StrictIntCaster<short> {};
template <>
class type_caster<unsigned short> : public StrictIntCaster<unsigned short> {};
template <>
class type_caster<int> : public StrictIntCaster<int> {};
template <>
class type_caster<unsigned int> : public StrictIntCaster<unsigned int> {};
template <>
class type_caster<long> : public StrictIntCaster<long> {};
template <>
class type_caster<unsigned long> : public StrictIntCaster<unsigned long> {};
template <>
class type_caster<long long> : public StrictIntCaster<long long> {};
template <>
class type_caster<unsigned long long>
    : public StrictIntCaster<unsigned long long> {};

}  // namespace pybind11::detail

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_STRICT_INT_H_
