// Copyright 2026 The kvblock Authors.
//
// The C++ side of kvblock.vllm: VllmKvCacheManager, called with vLLM's
// Request objects as they are, and vLLM's CBOR block hasher.
//
// A request's block hashes (its `block_hashes`, a list of bytes that only
// grows) are converted once: a BlockHashChain kept on the request as
// `_kvblock_chain` converts the entries it has not seen, so a decode or a
// retried lookup converts nothing. The manager hands out the KVCacheBlock
// objects of kvblock.vllm (its `_blocks` list, by block id) so that the
// scheduler reads `block_id` as it does from vLLM's blocks.
#include "vllm_bindings.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvblock/block_hash.h"
#include "kvblock/vllm_block_hash.h"
#include "kvblock/vllm_kv_cache_manager.h"
#include "status_error.h"

namespace kvblock::python {
namespace {

namespace py = pybind11;
using py::literals::operator""_a;

// A request's block hashes as BlockHashes (zero-padded digests).
class BlockHashChain {
 public:
  // Converts the entries of `hashes` (bytes of at most 32) not seen yet; all
  // of them when the list is shorter than what was seen (a new list).
  void Sync(py::handle hashes) {
    PyObject* list = hashes.ptr();
    if (!PyList_Check(list)) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("block_hashes must be a list of bytes, got ",
                       py::str(py::type::handle_of(hashes).attr("__name__"))
                           .cast<std::string>())));
    }
    const size_t size = static_cast<size_t>(PyList_GET_SIZE(list));
    if (size < hashes_.size()) hashes_.clear();
    for (size_t i = hashes_.size(); i < size; ++i) {
      PyObject* item = PyList_GET_ITEM(list, i);
      char* data;
      Py_ssize_t length;
      if (!PyBytes_Check(item) ||
          PyBytes_AsStringAndSize(item, &data, &length) != 0 || length > 32 ||
          length == 0) {
        PyErr_Clear();
        Raise(absl::InvalidArgumentError(absl::StrCat(
            "block_hashes[", i, "] must be bytes of 1 to 32 (a digest), got ",
            py::repr(item).cast<std::string>().substr(0, 80))));
      }
      if (width_ == 0) width_ = static_cast<int32_t>(length);
      if (length != width_) {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("block_hashes[", i, "] has ", length,
                         " bytes, the others ", width_)));
      }
      BlockHash& hash = hashes_.emplace_back();
      std::memcpy(hash.bytes.data(), data, static_cast<size_t>(length));
    }
  }
  absl::Span<const BlockHash> hashes() const { return hashes_; }
  int32_t width() const { return width_; }

 private:
  std::vector<BlockHash> hashes_;
  int32_t width_ = 0;
};

// The manager and what it hands out: the last hit list (so that
// allocate_slots reads its ids without touching the blocks again) and the
// digest width of the hashes it was given (for the removed hashes).
struct PyManager {
  std::unique_ptr<VllmKvCacheManager> manager;
  py::object last_hit;  // the list find_longest_cache_hit returned last.
  std::vector<PageId> last_hit_ids;
  int32_t width = 0;
  VllmSlotResult last_result;
};

absl::string_view StrOf(PyObject* object, const char* what) {
  Py_ssize_t size;
  const char* data = PyUnicode_Check(object)
                         ? PyUnicode_AsUTF8AndSize(object, &size)
                         : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    Raise(absl::InvalidArgumentError(absl::StrCat(what, " must be a str")));
  }
  return absl::string_view(data, static_cast<size_t>(size));
}

int64_t IntOf(py::handle value, const char* what) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(what, " must be an int, got ",
                     py::repr(value).cast<std::string>().substr(0, 80))));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0) {
    Raise(absl::OutOfRangeError(absl::StrCat(
        what, " does not fit 64 bits: ", py::repr(value).cast<std::string>())));
  }
  return v;
}

// The request's chain, synced with its block_hashes; kept on the request.
// Empty when caching is off (no hashes are read).
const BlockHashChain& ChainOf(PyManager& self, py::handle request) {
  static const py::str kChain("_kvblock_chain");
  static const py::str kHashes("block_hashes");
  static BlockHashChain empty;
  if (!self.manager->options().enable_caching) return empty;
  PyObject* hashes = PyObject_GetAttr(request.ptr(), kHashes.ptr());
  if (hashes == nullptr) {
    PyErr_Clear();
    Raise(absl::InvalidArgumentError(
        "the request has no block_hashes: give requests a block hasher "
        "(vLLM's, or kvblock.vllm.get_request_block_hasher)"));
  }
  py::object owned = py::reinterpret_steal<py::object>(hashes);
  PyObject* held = PyObject_GetAttr(request.ptr(), kChain.ptr());
  BlockHashChain* chain;
  if (held != nullptr) {
    py::object chain_object = py::reinterpret_steal<py::object>(held);
    chain = chain_object.cast<BlockHashChain*>();
  } else {
    PyErr_Clear();
    py::object chain_object = py::cast(BlockHashChain());
    if (PyObject_SetAttr(request.ptr(), kChain.ptr(), chain_object.ptr()) !=
        0) {
      PyErr_Clear();
      Raise(absl::InvalidArgumentError(
          "kvblock.vllm keeps a request's converted block hashes on it as "
          "_kvblock_chain; this request takes no attributes"));
    }
    chain = chain_object.cast<BlockHashChain*>();
  }
  chain->Sync(owned);
  if (self.width == 0) self.width = chain->width();
  return *chain;
}

// The KVCacheBlock objects for `ids`.
py::list BlocksOf(py::handle self, absl::Span<const PageId> ids) {
  static const py::str kBlocks("_blocks");
  py::object table = self.attr(kBlocks);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    PyObject* block = PyList_GET_ITEM(table.ptr(), ids[i]);
    Py_INCREF(block);
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), block);
  }
  return py::reinterpret_steal<py::list>(list);
}

// The ids of new_computed_blocks (a KVCacheBlocks or None).
absl::Span<const PageId> HitIdsOf(PyManager& self, py::handle blocks,
                                  std::vector<PageId>& scratch) {
  if (blocks.is_none()) return {};
  static const py::str kBlocks("blocks");
  static const py::str kBlockId("block_id");
  py::object groups = blocks.attr(kBlocks);
  if (py::len(groups) == 0) return {};
  py::object group = groups[py::int_(0)];
  if (self.last_hit && group.is(self.last_hit)) return self.last_hit_ids;
  scratch.clear();
  for (py::handle block : group) {
    scratch.push_back(
        static_cast<PageId>(IntOf(block.attr(kBlockId), "a block's block_id")));
  }
  return scratch;
}

py::bytes DigestBytes(const BlockHash& hash, int32_t width) {
  return py::bytes(reinterpret_cast<const char*>(hash.bytes.data()),
                   width == 0 ? hash.bytes.size() : width);
}

void BindManager(py::module_& m) {
  py::class_<BlockHashChain>(m, "BlockHashChain",
                             "A request's block hashes, converted once.")
      .def(py::init<>())
      .def("__len__",
           [](const BlockHashChain& c) { return c.hashes().size(); });

  py::class_<PyManager>(
      m, "VllmKvCacheManager", py::dynamic_attr(),
      "vLLM v1's full-attention KV cache manager (C++); kvblock.vllm's "
      "KVCacheManager wraps it. Block 0 is the null block.")
      .def(py::init([](int32_t num_blocks, int32_t block_size,
                       int64_t max_model_len, bool enable_caching,
                       bool use_eagle, bool enable_kv_cache_events,
                       bool vllm_eviction_order) {
             PyManager made;
             made.manager = ValueOrThrow(VllmKvCacheManager::Create(
                 {.num_blocks = num_blocks,
                  .block_size = block_size,
                  .max_model_len = max_model_len,
                  .enable_caching = enable_caching,
                  .use_eagle = use_eagle,
                  .enable_kv_cache_events = enable_kv_cache_events,
                  .eviction_order = vllm_eviction_order
                                        ? EvictionOrder::kLeastRecentlyFreed
                                        : EvictionOrder::kNeverCachedFirst}));
             return made;
           }),
           "num_blocks"_a, "block_size"_a, "max_model_len"_a,
           "enable_caching"_a, "use_eagle"_a, "enable_kv_cache_events"_a,
           "vllm_eviction_order"_a)
      .def(
          "find_longest_cache_hit",
          [](py::object self_object, py::handle request, int64_t max_length) {
            PyManager& self = self_object.cast<PyManager&>();
            const BlockHashChain& chain = ChainOf(self, request);
            const auto hit =
                self.manager->FindLongestCacheHit(chain.hashes(), max_length);
            self.last_hit_ids.assign(hit.begin(), hit.end());
            py::list blocks = BlocksOf(self_object, hit);
            self.last_hit = blocks;
            return blocks;
          },
          "request"_a, "max_length"_a,
          "The request's cached prefix blocks within max_length tokens; takes "
          "no reference.")
      .def(
          "allocate_slots",
          [](py::object self_object, py::handle request, int64_t num_new_tokens,
             int64_t num_new_computed_tokens, py::handle new_computed_blocks,
             int64_t num_lookahead_tokens, int64_t num_external_computed_tokens,
             bool delay_cache_blocks,
             bool full_sequence_must_fit) -> py::object {
            PyManager& self = self_object.cast<PyManager&>();
            static const py::str kId("request_id");
            static const py::str kTokens("num_tokens");
            static const py::str kComputed("num_computed_tokens");
            py::object id = request.attr(kId);
            std::vector<PageId> scratch;
            const VllmSlotRequest slots{
                .request_id = StrOf(id.ptr(), "request_id"),
                .block_hashes = ChainOf(self, request).hashes(),
                .num_tokens = IntOf(request.attr(kTokens), "num_tokens"),
                .num_computed_tokens =
                    IntOf(request.attr(kComputed), "num_computed_tokens"),
                .num_new_tokens = num_new_tokens,
                .num_new_computed_tokens = num_new_computed_tokens,
                .new_computed_blocks =
                    HitIdsOf(self, new_computed_blocks, scratch),
                .num_lookahead_tokens = num_lookahead_tokens,
                .num_external_computed_tokens = num_external_computed_tokens,
                .delay_cache_blocks = delay_cache_blocks,
                .full_sequence_must_fit = full_sequence_must_fit,
            };
            self.last_result = ValueOrThrow(self.manager->AllocateSlots(slots));
            if (!self.last_result.allocated) return py::none();
            const auto blocks = self.manager->Blocks(slots.request_id);
            return BlocksOf(self_object,
                            blocks.subspan(self.last_result.first_new_block));
          },
          "request"_a, "num_new_tokens"_a, "num_new_computed_tokens"_a,
          "new_computed_blocks"_a, "num_lookahead_tokens"_a,
          "num_external_computed_tokens"_a, "delay_cache_blocks"_a,
          "full_sequence_must_fit"_a,
          "vLLM's allocate_slots: the new blocks, or None (nothing changed).")
      .def_property_readonly(
          "last_cached",
          [](const PyManager& self) {
            return py::make_tuple(self.last_result.cached_from,
                                  self.last_result.cached_to);
          },
          "Blocks [from, to) of the request the last allocate_slots cached.")
      .def(
          "cache_blocks",
          [](PyManager& self, py::handle request, int64_t num_tokens) {
            py::object id = request.attr("request_id");
            const auto range = ValueOrThrow(self.manager->CacheBlocks(
                StrOf(id.ptr(), "request_id"), ChainOf(self, request).hashes(),
                num_tokens));
            return py::make_tuple(range.first, range.second);
          },
          "request"_a, "num_tokens"_a)
      .def(
          "free",
          [](PyManager& self, py::handle request_id) {
            self.manager->Free(StrOf(request_id.ptr(), "request_id"));
          },
          "request_id"_a)
      .def(
          "evict_blocks",
          [](PyManager& self, const std::vector<PageId>& ids) {
            ThrowIfError(self.manager->EvictBlocks(ids));
          },
          "block_ids"_a)
      .def("reset_prefix_cache",
           [](PyManager& self) { return self.manager->ResetPrefixCache(); })
      .def(
          "blocks",
          [](py::object self_object, py::handle request_id) {
            PyManager& self = self_object.cast<PyManager&>();
            return BlocksOf(self_object, self.manager->Blocks(StrOf(
                                             request_id.ptr(), "request_id")));
          },
          "request_id"_a)
      .def(
          "block_ids",
          [](const PyManager& self, py::handle request_id) {
            const auto blocks =
                self.manager->Blocks(StrOf(request_id.ptr(), "request_id"));
            return std::vector<PageId>(blocks.begin(), blocks.end());
          },
          "request_id"_a)
      .def(
          "get_num_common_prefix_blocks",
          [](const PyManager& self, py::handle request_id) {
            return self.manager->GetNumCommonPrefixBlocks(
                StrOf(request_id.ptr(), "request_id"));
          },
          "request_id"_a)
      .def("take_new_block_ids",
           [](PyManager& self) { return self.manager->TakeNewBlockIds(); })
      .def(
          "take_removed_hashes",
          [](PyManager& self) {
            py::list out;
            for (const BlockHash& hash : self.manager->TakeRemovedHashes()) {
              out.append(DigestBytes(hash, self.width));
            }
            return out;
          },
          "The digests of the blocks evicted or uncached since the last call.")
      .def_property_readonly(
          "num_free_blocks",
          [](const PyManager& self) { return self.manager->NumFreeBlocks(); })
      .def_property_readonly(
          "usage", [](const PyManager& self) { return self.manager->Usage(); })
      .def_property_readonly(
          "num_requests",
          [](const PyManager& self) { return self.manager->num_requests(); })
      .def(
          "ref_count",
          [](const PyManager& self, PageId block) {
            return self.manager->RefCount(block);
          },
          "block_id"_a)
      .def(
          "cached_hash",
          [](const PyManager& self, PageId block) -> py::object {
            const std::optional<BlockHash> hash =
                self.manager->CachedHash(block);
            if (!hash) return py::none();
            return DigestBytes(*hash, self.width);
          },
          "block_id"_a, "The digest block_id is cached under, or None.")
      .def("check_invariants", [](const PyManager& self) {
        ThrowIfError(self.manager->CheckInvariants());
      });
}

VllmHashFunction HashFunctionOf(const std::string& name) {
  if (name == "sha256_cbor") return VllmHashFunction::kSha256Cbor;
  if (name == "xxhash_cbor") return VllmHashFunction::kXxhashCbor;
  Raise(absl::InvalidArgumentError(absl::StrCat(
      "kvblock's block hasher computes vLLM's CBOR hash functions "
      "sha256_cbor and xxhash_cbor, not '",
      name, "' (vLLM's pickle-based sha256 and xxhash are Python-only)")));
}

// Canonical CBOR of one extra-keys value: None, bool, int, str, bytes, or a
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
    out.Int(IntOf(value, "an extra key"));
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

void BindHasher(py::module_& m) {
  m.def(
      "vllm_digest",
      [](const std::string& function, py::handle value) {
        CborWriter cbor;
        EncodeCbor(value, cbor, 0);
        const std::string digest =
            VllmDigest(HashFunctionOf(function), cbor.data());
        return py::bytes(digest);
      },
      "function"_a, "value"_a,
      "vLLM's sha256_cbor / xxhash_cbor of a value (NONE_HASH's seed).");
  m.def(
      "vllm_hash_blocks",
      [](const std::string& function, py::bytes parent, py::handle tokens,
         int64_t start, int32_t block_size, py::handle extra_keys) {
        const VllmHashFunction fn = HashFunctionOf(function);
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
          ids[i] =
              IntOf(items[start + static_cast<Py_ssize_t>(i)], "a token id");
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
        ThrowIfError(VllmHashBlocks(fn, std::string(parent), ids, block_size,
                                    keys, digests));
        const size_t digest = static_cast<size_t>(VllmDigestSize(fn));
        py::list out;
        for (size_t at = 0; at < digests.size(); at += digest) {
          out.append(py::bytes(digests.data() + at, digest));
        }
        return out;
      },
      "function"_a, "parent"_a, "tokens"_a, "start"_a, "block_size"_a,
      "extra_keys"_a,
      "The hashes of the full blocks of tokens[start:] chained from parent; "
      "extra_keys: None (None for every block), or a list of one value "
      "(None or a tuple) a block, or of one for all.");
}

}  // namespace

void BindVllm(py::module_& m) {
  BindManager(m);
  BindHasher(m);
}

}  // namespace kvblock::python
