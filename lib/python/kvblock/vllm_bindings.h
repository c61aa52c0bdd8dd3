// Copyright 2026 The kvblock Authors.
//
// kvblock.vllm's C++ side (vllm_bindings.cc): the VllmKvCacheManager and
// BlockHashChain classes and the vllm_digest / vllm_hash_blocks functions.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace kvblock::python {

// Adds them to `module`. Called once, from the module's init.
void BindVllm(pybind11::module_& module);

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_BINDINGS_H_
