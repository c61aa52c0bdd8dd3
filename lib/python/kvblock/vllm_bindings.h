// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock.vllm's C++ side: the VllmKvCacheManager and BlockHashChain classes
// (vllm_bindings.cc) and vLLM's block hasher (vllm_hasher.cc).
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_

#include <pybind11/pybind11.h>

#include "strict_int.h"

namespace kvblock::python {

// Add them to `module`. Called once, from the module's init.
void BindVllm(pybind11::module_& module);
void BindVllmManager(pybind11::module_& module);
void BindVllmHasher(pybind11::module_& module);

// A METH_FASTCALL function as PyMethodDef stores it (through void (*)(),
// the cast CPython's own modules make).
template <typename Function>
PyCFunction AsPyCFunction(Function* function) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function));
}

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_
