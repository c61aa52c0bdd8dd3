// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "vllm_request.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "status_error.h"

namespace kvblock::python {

namespace py = pybind11;

namespace {

std::string Shown(PyObject* value) {
  return py::repr(value).cast<std::string>().substr(0, 80);
}

}  // namespace

void BlockHashChain::Sync(py::handle hashes) {
  PyObject* list = hashes.ptr();
  if (!PyList_Check(list)) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "block_hashes must be a list of bytes, got ", Shown(list))));
  }
  const size_t size = static_cast<size_t>(PyList_GET_SIZE(list));
  if (size < hashes_.size()) {
    hashes_.clear();
    width_ = 0;
  }
  for (size_t i = hashes_.size(); i < size; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    const Py_ssize_t length = PyBytes_Check(item) ? PyBytes_GET_SIZE(item) : 0;
    if (length < 1 || length > 32) {
      Raise(absl::InvalidArgumentError(absl::StrCat(
          "block_hashes[", i, "] must be bytes of 1 to 32 (a digest), got ",
          Shown(item))));
    }
    if (width_ != 0 && length != width_) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("block_hashes[", i, "] has ", length,
                       " bytes, the others ", width_)));
    }
    width_ = static_cast<int32_t>(length);
    BlockHash& hash = hashes_.emplace_back();
    std::memcpy(hash.bytes.data(), PyBytes_AS_STRING(item),
                static_cast<size_t>(length));
  }
}

HeldChain ChainObjectOf(py::handle request) {
  static PyObject* const kChain = PyUnicode_InternFromString("_kvblock_chain");
  py::object chain = py::reinterpret_steal<py::object>(
      PyObject_GetAttr(request.ptr(), kChain));
  if (!chain || !py::isinstance<BlockHashChain>(chain)) {
    PyErr_Clear();
    chain = py::cast(BlockHashChain());
    if (PyObject_SetAttr(request.ptr(), kChain, chain.ptr()) != 0) {
      PyErr_Clear();
      Raise(absl::InvalidArgumentError(
          "kvblock.vllm keeps a request's converted block hashes on it as "
          "_kvblock_chain; this request takes no attributes"));
    }
  }
  BlockHashChain* held = &chain.cast<BlockHashChain&>();
  return {std::move(chain), held};
}

void SyncChain(const HeldChain& held, py::handle request) {
  static PyObject* const kHashes = PyUnicode_InternFromString("block_hashes");
  py::object hashes = py::reinterpret_steal<py::object>(
      PyObject_GetAttr(request.ptr(), kHashes));
  if (!hashes) {
    PyErr_Clear();
    Raise(absl::InvalidArgumentError(
        "the request has no block_hashes: give requests a block hasher "
        "(vLLM's, or kvblock.vllm.get_request_block_hasher)"));
  }
  held.chain->Sync(hashes);
}

HeldChain ChainOf(py::handle request) {
  HeldChain held = ChainObjectOf(request);
  SyncChain(held, request);
  return held;
}

absl::string_view StrOf(PyObject* object, const char* what) {
  Py_ssize_t size = 0;
  const char* data = object != nullptr && PyUnicode_Check(object)
                         ? PyUnicode_AsUTF8AndSize(object, &size)
                         : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    throw py::type_error(absl::StrCat(
        what, " must be a str, got ",
        object == nullptr ? std::string("nothing") : Shown(object)));
  }
  return absl::string_view(data, static_cast<size_t>(size));
}

namespace {

// `value` as a 64-bit int: OutOfRange naming `what` when it does not fit.
int64_t Fits64(PyObject* value, const char* what) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0) {
    Raise(absl::OutOfRangeError(
        absl::StrCat(what, " does not fit 64 bits: ", Shown(value))));
  }
  if (v == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  return v;
}

[[noreturn]] void NotAnInt(PyObject* value, const char* what) {
  throw py::type_error(
      absl::StrCat(what, " must be an int, got ",
                   value == nullptr ? std::string("nothing") : Shown(value)));
}

}  // namespace

int64_t IntOf(PyObject* value, const char* what) {
  if (value == nullptr || !PyLong_Check(value) || PyBool_Check(value)) {
    NotAnInt(value, what);
  }
  return Fits64(value, what);
}

int64_t IndexOf(PyObject* value, const char* what) {
  if (value == nullptr || PyBool_Check(value) || !PyIndex_Check(value)) {
    NotAnInt(value, what);
  }
  const py::object index =
      py::reinterpret_steal<py::object>(PyNumber_Index(value));
  if (!index) throw py::error_already_set();
  return Fits64(index.ptr(), what);
}

int64_t IntAttr(PyObject* object, PyObject* name, const char* what) {
  py::object value =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(object, name));
  if (!value) throw py::error_already_set();
  return IndexOf(value.ptr(), what);
}

}  // namespace kvblock::python
