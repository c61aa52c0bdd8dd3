// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// vLLM's request block hasher in C++ (kvblock/vllm_block_hash.h has the
// bytes): kvblock.vllm.get_request_block_hasher's function is a CPython
// function bound to its settings, so a request's update_block_hashes after
// every token (nothing to hash until a block fills) costs one C call.
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvblock/vllm_block_hash.h"
#include "status_error.h"
#include "strict_int.h"
#include "vllm_bindings.h"
#include "vllm_request.h"

namespace kvblock::python {
namespace {

namespace py = pybind11;
using py::literals::operator""_a;

VllmHashFunction HashFunctionOf(const std::string& name) {
  if (name == "sha256_cbor") return VllmHashFunction::kSha256Cbor;
  if (name == "xxhash_cbor") return VllmHashFunction::kXxhashCbor;
  Raise(absl::InvalidArgumentError(
      absl::StrCat("kvblock's block hasher computes vLLM's CBOR hash functions "
                   "sha256_cbor and xxhash_cbor, not '",
                   name, "'")));
}

// Canonical CBOR of an extra-keys value: None, bool, int, str, bytes, or a
// tuple or list of them.
void EncodeCbor(py::handle value, CborWriter& out, int depth) {
  PyObject* v = value.ptr();
  if (depth > 16) {
    Raise(absl::InvalidArgumentError("extra keys nest deeper than 16"));
  }
  if (v == Py_None) {
    out.Null();
  } else if (PyBool_Check(v)) {
    out.Bool(v == Py_True);
  } else if (PyLong_Check(v)) {
    out.Int(IntOf(v, "an extra key"));
  } else if (PyUnicode_Check(v)) {
    out.Text(StrOf(v, "an extra key"));
  } else if (PyBytes_Check(v)) {
    out.Bytes(absl::string_view(PyBytes_AS_STRING(v),
                                static_cast<size_t>(PyBytes_GET_SIZE(v))));
  } else if (PyTuple_Check(v) || PyList_Check(v)) {
    out.Array(static_cast<uint64_t>(py::len(value)));
    for (py::handle item : value) EncodeCbor(item, out, depth + 1);
  } else {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "an extra key must be None, bool, int, str, bytes or a tuple of "
        "them, got ",
        py::repr(value).cast<std::string>().substr(0, 80))));
  }
}

// The digests of the full blocks of tokens[start:], chained from `parent`,
// with `extra_keys` (None, or one value a block, or one for all).
py::list HashBlocks(VllmHashFunction function, absl::string_view parent,
                    py::handle tokens, int64_t start, int32_t block_size,
                    py::handle extra_keys) {
  // A list or tuple is read in place; another sequence (vLLM's
  // ConstantList) is copied to one first.
  py::object fast = py::reinterpret_steal<py::object>(
      PySequence_Fast(tokens.ptr(), "tokens must be a sequence of ints"));
  if (!fast) throw py::error_already_set();
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.ptr());
  if (start < 0 || start > size) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("start ", start, " is not in [0, ", size, "]")));
  }
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<int64_t> ids(static_cast<size_t>(size - start));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = IntOf(items[start + static_cast<Py_ssize_t>(i)], "a token id");
  }
  std::vector<std::string> keys;
  if (!extra_keys.is_none()) {
    for (py::handle key : extra_keys) {
      CborWriter cbor;
      if (!key.is_none()) EncodeCbor(key, cbor, 0);
      keys.push_back(cbor.data());
    }
  }
  std::string digests;
  ThrowIfError(
      VllmHashBlocks(function, parent, ids, block_size, keys, digests));
  const size_t digest = static_cast<size_t>(VllmDigestSize(function));
  py::list out;
  for (size_t at = 0; at < digests.size(); at += digest) {
    out.append(py::bytes(digests.data() + at, digest));
  }
  return out;
}

// A request block hasher's settings.
struct BlockHasher {
  VllmHashFunction function;
  int32_t block_size;
  std::string none_hash;
  // extra_keys(request, start): the extra keys of each full block from
  // token `start` on (vLLM's generate_block_hash_extra_keys).
  py::object extra_keys;
};

// Whether the request's blocks from `start` on hash without extra keys.
bool IsPlain(PyObject* request, int64_t start) {
  static PyObject* const kLora = PyUnicode_InternFromString("lora_request");
  static PyObject* const kFeatures = PyUnicode_InternFromString("mm_features");
  static PyObject* const kEmbeds = PyUnicode_InternFromString("prompt_embeds");
  static PyObject* const kSalt = PyUnicode_InternFromString("cache_salt");
  auto field = [request](PyObject* name) {
    PyObject* value = PyObject_GetAttr(request, name);
    if (value == nullptr) PyErr_Clear();  // vLLM's Request has them all.
    return py::reinterpret_steal<py::object>(value);
  };
  const py::object lora = field(kLora);
  const py::object features = field(kFeatures);
  const py::object embeds = field(kEmbeds);
  if ((lora && !lora.is_none()) || (embeds && !embeds.is_none()) ||
      (features && PyObject_IsTrue(features.ptr()) == 1)) {
    return false;
  }
  if (start != 0) return true;
  const py::object salt = field(kSalt);
  return !salt || PyObject_IsTrue(salt.ptr()) != 1;
}

PyObject* HashRequest(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  static PyObject* const kHashes = PyUnicode_InternFromString("block_hashes");
  static PyObject* const kTokens = PyUnicode_InternFromString("num_tokens");
  static PyObject* const kAllIds = PyUnicode_InternFromString("_all_token_ids");
  static PyObject* const kIds = PyUnicode_InternFromString("all_token_ids");
  try {
    if (nargs != 1) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("a request block hasher takes the request, got ", nargs,
                       " arguments")));
    }
    const BlockHasher& hasher = py::handle(self).cast<const BlockHasher&>();
    PyObject* request = args[0];
    py::object hashes =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(request, kHashes));
    if (!hashes) throw py::error_already_set();
    const int64_t start =
        static_cast<int64_t>(py::len(hashes)) * hasher.block_size;
    const int64_t num_tokens = IntAttr(request, kTokens, "num_tokens");
    if (start + hasher.block_size > num_tokens) return PyList_New(0);
    py::object tokens =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(request, kAllIds));
    if (!tokens || !PyList_Check(tokens.ptr())) {
      PyErr_Clear();
      tokens =
          py::reinterpret_steal<py::object>(PyObject_GetAttr(request, kIds));
      if (!tokens) throw py::error_already_set();
    }
    std::string parent = hasher.none_hash;
    if (start > 0) {
      py::object last = hashes[py::int_(-1)];
      parent = last.cast<std::string>();
    }
    py::object keys = py::none();
    if (!IsPlain(request, start)) {
      keys = hasher.extra_keys(py::handle(request), start);
    }
    return HashBlocks(hasher.function, parent, tokens, start, hasher.block_size,
                      keys)
        .release()
        .ptr();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (py::builtin_exception& error) {
    error.set_error();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

PyMethodDef kHashRequest = {
    "request_block_hasher", AsPyCFunction(HashRequest), METH_FASTCALL,
    "request_block_hasher(request)\n\nThe hashes of the request's full "
    "blocks beyond request.block_hashes, as vLLM's hasher computes them."};

}  // namespace

void BindVllmHasher(py::module_& m) {
  py::class_<BlockHasher>(m, "VllmBlockHasher",
                          "The settings of a request block hasher.");
  m.def(
      "vllm_request_block_hasher",
      [](const std::string& function, int32_t block_size, py::bytes none_hash,
         py::object extra_keys) {
        if (block_size < 1) {
          Raise(absl::InvalidArgumentError(
              absl::StrCat("block_size must be positive, got ", block_size)));
        }
        py::object settings = py::cast(
            BlockHasher{HashFunctionOf(function), block_size,
                        std::string(none_hash), std::move(extra_keys)});
        PyObject* call =
            PyCFunction_NewEx(&kHashRequest, settings.ptr(), nullptr);
        if (call == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(call);
      },
      "function"_a, "block_size"_a, "none_hash"_a, "extra_keys"_a,
      "A request block hasher (see kvblock.vllm.get_request_block_hasher); "
      "extra_keys(request, start) gives the blocks' extra keys for requests "
      "with LoRA, multimodal features, prompt embeddings or a salt.");
  m.def(
      "vllm_digest",
      [](const std::string& function, py::handle value) {
        CborWriter cbor;
        EncodeCbor(value, cbor, 0);
        return py::bytes(VllmDigest(HashFunctionOf(function), cbor.data()));
      },
      "function"_a, "value"_a,
      "vLLM's sha256_cbor / xxhash_cbor of a value (NONE_HASH's seed).");
  m.def(
      "vllm_hash_blocks",
      [](const std::string& function, py::bytes parent, py::handle tokens,
         int64_t start, int32_t block_size, py::handle extra_keys) {
        return HashBlocks(HashFunctionOf(function), std::string(parent), tokens,
                          start, block_size, extra_keys);
      },
      "function"_a, "parent"_a, "tokens"_a, "start"_a, "block_size"_a,
      "extra_keys"_a,
      "The hashes of the full blocks of tokens[start:] chained from parent; "
      "extra_keys: None (None for every block), or a list of one value "
      "(None or a tuple) a block, or of one for all.");
}

}  // namespace kvblock::python
