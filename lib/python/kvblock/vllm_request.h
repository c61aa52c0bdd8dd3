// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Reading vLLM's Request objects from C++, for kvblock.vllm: their ids,
// counts and block hashes. A request's `block_hashes` (a list of digests
// that only grows) is converted once, into the BlockHashChain kept on the
// request as `_kvblock_chain`; each call converts only the entries it has
// not seen. The chain also remembers the request's last prefix hit, which a
// waiting request's retried lookup reuses while it is unchanged.
//
// Errors raise kvblock exceptions (status_error.h): a value of the wrong
// type names the field and the value, and nothing is changed.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_REQUEST_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_REQUEST_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/group_cache_hit.h"
#include "kvblock/types.h"
#include "strict_int.h"

namespace kvblock::python {

class BlockHashChain {
 public:
  // Converts the entries of `hashes` (a list of 1 to 32-byte digests, all of
  // one size) not seen yet; all of them when the list is shorter than what
  // was seen (it was replaced).
  void Sync(pybind11::handle hashes);
  absl::Span<const BlockHash> hashes() const { return hashes_; }
  // The digests' size in bytes (0 before the first).
  int32_t width() const { return width_; }

  // The request's last prefix hit: its block ids, the lists of block
  // objects handed out for it (one a KV cache group), and the max_length it
  // was found within.
  GroupCacheHit hit;
  std::vector<pybind11::object> hit_lists;
  int64_t hit_max_length = -1;

 private:
  std::vector<BlockHash> hashes_;
  int32_t width_ = 0;
};

// A request's chain, kept alive by `owner` while the caller uses it (Python
// code the caller runs may drop it from the request).
struct HeldChain {
  pybind11::object owner;
  BlockHashChain* chain = nullptr;
};

// The request's chain (created on it when it has none), not synced.
// InvalidArgument when the request takes no attributes.
HeldChain ChainObjectOf(pybind11::handle request);
// Syncs `held` with the request's block_hashes. InvalidArgument when it has
// none, or they are not a list of digests.
void SyncChain(const HeldChain& held, pybind11::handle request);
// Both.
HeldChain ChainOf(pybind11::handle request);

// A str field (UTF-8, owned by the object); TypeError naming `what`.
absl::string_view StrOf(PyObject* object, const char* what);
// An int that fits 64 bits: TypeError (not an int, a bool included) or
// OutOfRange naming `what`. For what vLLM hashes (token ids, extra keys),
// where a numpy integer would hash to other bytes than the int.
int64_t IntOf(PyObject* value, const char* what);
// The same, also taking what says it is an int (__index__: numpy's
// integers), as the module's other integer arguments do (strict_int.h).
int64_t IndexOf(PyObject* value, const char* what);
// `object.name` as IndexOf reads it.
int64_t IntAttr(PyObject* object, PyObject* name, const char* what);

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_VLLM_REQUEST_H_
