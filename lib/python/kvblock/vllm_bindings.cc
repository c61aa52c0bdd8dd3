// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The C++ side of kvblock.vllm: VllmKvCacheManager, called with vLLM's
// Request objects as they are (vllm_request.h reads them).
//
// The calls a scheduler makes every step for every request (allocate_slots,
// get_computed_blocks, free, and with a host tier
// get_num_new_matched_tokens) are plain CPython functions (METH_FASTCALL)
// bound to the manager, which kvblock.vllm.KVCacheManager puts on itself:
// vLLM's scheduler calls straight into C++, with no Python frame or
// pybind11 dispatch on the way. Their arguments and results are vLLM's.
// The rest are pybind11 methods. The manager hands out the KVCacheBlock
// objects of its `_blocks` list (by block id) and keeps the prefix cache
// stats as counters that make_prefix_cache_stats turns into vLLM's object.
#include "vllm_bindings.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "host_copy_array.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/vllm_kv_cache_manager.h"
#include "status_error.h"
#include "strict_int.h"
#include "vllm_request.h"

namespace kvblock::python {
namespace {

namespace py = pybind11;
using py::literals::operator""_a;

// vLLM's PrefixCacheStats fields, as counters.
struct PrefixCounters {
  bool reset = false;
  int64_t requests = 0, queries = 0, hits = 0;
  int64_t preempted_requests = 0, preempted_queries = 0, preempted_hits = 0;
};

struct PyManager {
  std::unique_ptr<VllmKvCacheManager> manager;
  int32_t width = 0;  // of the digests, for the removed hashes.
  bool log_stats = false;
  PrefixCounters stats;
  // Set by bind(): vLLM's KVCacheBlocks class and the empty instance.
  py::object blocks_class;
  py::object empty_blocks;
  bool busy = false;  // a call is inside (Busy).
};

// Refuses a call while another one is inside the manager: the GIL passes to
// another thread whenever Python code runs (a property read, a finalizer),
// and a second call in the middle of the first would see it half done. One
// scheduler thread never meets it.
class Busy {
 public:
  explicit Busy(PyManager& state) : state_(state) {
    if (state_.busy) {
      Raise(absl::FailedPreconditionError(
          "kvblock.vllm: the KV cache manager is inside another call (from "
          "another thread); it serves one scheduler thread at a time"));
    }
    state_.busy = true;
  }
  ~Busy() { state_.busy = false; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  PyManager& state_;
};

PyObject* Intern(const char* name) { return PyUnicode_InternFromString(name); }

// InternalError unless `table` can be the manager's list of blocks: a list
// of one entry a block id.
void CheckBlockTable(const PyManager& manager, py::handle table) {
  if (!PyList_Check(table.ptr()) ||
      PyList_GET_SIZE(table.ptr()) < manager.manager->options().num_blocks) {
    Raise(absl::InternalError(
        "kvblock.vllm: the manager's _blocks is not its list of blocks"));
  }
}

// The manager's KVCacheBlock objects (its `_blocks`, by block id).
py::object BlockTable(py::handle self) {
  static PyObject* const kBlocks = Intern("_blocks");
  py::object table =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(self.ptr(), kBlocks));
  if (!table) throw py::error_already_set();
  CheckBlockTable(self.cast<const PyManager&>(), table);
  return table;
}

// Block `id` of BlockTable's list (borrowed). Python code a call runs after
// BlockTable (a property, a __bool__) may have shortened the list: each read
// checks it.
PyObject* BlockAt(py::handle table, PageId id) {
  if (id >= PyList_GET_SIZE(table.ptr())) {
    Raise(absl::InternalError(
        absl::StrCat("kvblock.vllm: the manager's _blocks lost block ", id,
                     " during the call (it has ", PyList_GET_SIZE(table.ptr()),
                     " entries)")));
  }
  return PyList_GET_ITEM(table.ptr(), id);
}

// The KVCacheBlock objects for `ids`, from BlockTable.
py::list BlocksOf(py::handle table, absl::Span<const PageId> ids) {
  py::list list(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    PyObject* block = BlockAt(table, ids[i]);
    Py_INCREF(block);
    PyList_SET_ITEM(list.ptr(), static_cast<Py_ssize_t>(i), block);
  }
  return list;
}

// Whether `list` still holds exactly the blocks of `ids` (a caller may have
// changed a list it was given).
bool HoldsBlocks(py::handle list, py::handle table,
                 absl::Span<const PageId> ids) {
  if (!list || !PyList_Check(list.ptr()) ||
      PyList_GET_SIZE(list.ptr()) != static_cast<Py_ssize_t>(ids.size())) {
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (PyList_GET_ITEM(list.ptr(), i) != BlockAt(table, ids[i])) {
      return false;
    }
  }
  return true;
}

// KVCacheBlocks(tuple(lists)), or the empty one when every list is.
py::object KvCacheBlocksOf(const PyManager& self, py::tuple lists) {
  for (py::handle list : lists) {
    if (PyList_GET_SIZE(list.ptr()) != 0) return self.blocks_class(lists);
  }
  return self.empty_blocks;
}

// Each group's blocks as KVCacheBlocks: from `slots[g].first_new_block` on
// (a call's new blocks) or, with `all`, all of them.
py::object GroupBlocksOf(const PyManager& self, py::handle table,
                         absl::Span<const VllmGroupSlots> slots, bool all) {
  if (!all) {
    // A decode step mostly adds no block: no lists to build then.
    bool any = false;
    for (const VllmGroupSlots& group : slots) {
      any = any ||
            static_cast<size_t>(group.first_new_block) < group.blocks.size();
    }
    if (!any) return self.empty_blocks;
  }
  py::tuple lists(slots.size());
  for (size_t g = 0; g < slots.size(); ++g) {
    lists[g] = BlocksOf(
        table, all ? slots[g].blocks
                   : slots[g].blocks.subspan(slots[g].first_new_block));
  }
  return KvCacheBlocksOf(self, std::move(lists));
}

// The ids of new_computed_blocks (a KVCacheBlocks or None), a list a
// group, into `ids` (and `lists` viewing them): the chain's last hit when
// they are its lists, unchanged, else read from the blocks
// (InvalidArgument for an id outside [0, num_blocks), or a count of lists
// other than the groups').
void HitIdsOf(const BlockHashChain* chain, py::handle table,
              const VllmKvCacheManager& manager, PyObject* blocks,
              std::vector<std::vector<PageId>>& ids,
              std::vector<absl::Span<const PageId>>& lists) {
  lists.clear();
  if (blocks == nullptr || blocks == Py_None) return;
  static PyObject* const kBlocks = Intern("blocks");
  static PyObject* const kBlockId = Intern("block_id");
  py::object groups =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(blocks, kBlocks));
  if (!groups) throw py::error_already_set();
  const int32_t num_groups = manager.num_groups();
  if (py::len(groups) != static_cast<size_t>(num_groups)) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "new_computed_blocks has ", py::len(groups),
        " lists of blocks, one a kv cache group (", num_groups, ")")));
  }
  ids.resize(num_groups);
  const int32_t num_blocks = manager.options().num_blocks;
  for (int32_t g = 0; g < num_groups; ++g) {
    py::object group = groups[py::int_(g)];
    if (chain != nullptr &&
        chain->hit_lists.size() == static_cast<size_t>(num_groups) &&
        group.is(chain->hit_lists[g]) &&
        HoldsBlocks(group, table, chain->hit.pages[g])) {
      lists.push_back(chain->hit.pages[g]);
      continue;
    }
    ids[g].clear();
    for (py::handle block : group) {
      const int64_t id =
          IntAttr(block.ptr(), kBlockId, "a computed block's block_id");
      if (id < 0 || id >= num_blocks) {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("a computed block's block_id ", id, " is not in [0, ",
                         num_blocks, ")")));
      }
      ids[g].push_back(static_cast<PageId>(id));
    }
    lists.push_back(ids[g]);
  }
}

// Refuses digests of another size than the manager's first: zero-padded,
// b"\x01" and b"\x01\x00" would be one hash.
void CheckWidth(PyManager& state, const BlockHashChain& chain) {
  if (chain.width() == 0) return;
  if (state.width == 0) state.width = chain.width();
  if (chain.width() != state.width) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("the request's block hashes have ", chain.width(),
                     " bytes, the manager's ", state.width,
                     " (one hash function serves a manager)")));
  }
}

// Arguments of a METH_FASTCALL | METH_KEYWORDS call, by position or name; a
// call that does not fit them is a TypeError, as Python's own calls.
template <size_t N>
class Arguments {
 public:
  Arguments(const char* function, const std::array<const char*, N>& names,
            size_t required, PyObject* const* args, Py_ssize_t nargs,
            PyObject* kwnames) {
    if (static_cast<size_t>(nargs) > N) {
      throw py::type_error(absl::StrCat(function, "() takes at most ", N,
                                        " arguments, got ", nargs));
    }
    for (Py_ssize_t i = 0; i < nargs; ++i) values_[i] = args[i];
    const Py_ssize_t keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < keywords; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      size_t i = 0;
      while (i < N && PyUnicode_CompareWithASCIIString(key, names[i]) != 0) {
        ++i;
      }
      if (i == N || values_[i] != nullptr) {
        throw py::type_error(absl::StrCat(
            function, "() got ", i == N ? "an unexpected" : "a repeated",
            " keyword argument '", StrOf(key, "a keyword"), "'"));
      }
      values_[i] = args[nargs + k];
    }
    for (size_t i = 0; i < required; ++i) {
      if (values_[i] == nullptr) {
        throw py::type_error(absl::StrCat(
            function, "() is missing the argument '", names[i], "'"));
      }
    }
    names_ = &names;
  }

  PyObject* operator[](size_t i) const { return values_[i]; }
  int64_t Int(size_t i) const {
    return values_[i] == nullptr ? 0 : IndexOf(values_[i], (*names_)[i]);
  }
  bool Bool(size_t i) const {
    if (values_[i] == nullptr) return false;
    const int truth = PyObject_IsTrue(values_[i]);
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }

 private:
  std::array<PyObject*, N> values_{};
  const std::array<const char*, N>* names_ = nullptr;
};

// Runs `body`, turning a C++ exception into the Python error it carries.
template <typename Body>
PyObject* Guarded(Body&& body) {
  try {
    return body().release().ptr();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (py::builtin_exception& error) {
    error.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

// The adapter's `_record(request, cached_from, cached_to)`, with events on.
// `ranges`: each group's (cached_from, cached_to).
void RecordEvents(py::handle self, py::handle request, py::list ranges) {
  static PyObject* const kAdapter = Intern("_adapter");
  py::object adapter =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(self.ptr(), kAdapter));
  if (!adapter) throw py::error_already_set();
  adapter.attr("_record")(request, ranges);
}

py::list RangesOf(absl::Span<const VllmGroupSlots> slots) {
  py::list ranges;
  for (const VllmGroupSlots& group : slots) {
    ranges.append(py::make_tuple(group.cached_from, group.cached_to));
  }
  return ranges;
}

PyObject* AllocateSlots(PyObject* self_object, PyObject* const* args,
                        Py_ssize_t nargs, PyObject* kwnames) {
  return Guarded([&]() -> py::object {
    static const std::array<const char*, 9> kNames = {
        "request",
        "num_new_tokens",
        "num_new_computed_tokens",
        "new_computed_blocks",
        "num_lookahead_tokens",
        "num_external_computed_tokens",
        "delay_cache_blocks",
        "num_encoder_tokens",
        "full_sequence_must_fit"};
    static PyObject* const kId = Intern("request_id");
    static PyObject* const kTokens = Intern("num_tokens");
    static PyObject* const kComputed = Intern("num_computed_tokens");
    const Arguments<9> arguments("allocate_slots", kNames, 2, args, nargs,
                                 kwnames);
    py::handle self(self_object);
    PyManager& state = self.cast<PyManager&>();
    PyObject* request = arguments[0];
    py::object new_blocks;
    py::list ranges;
    {
      const Busy busy(state);
      py::object id =
          py::reinterpret_steal<py::object>(PyObject_GetAttr(request, kId));
      if (!id) throw py::error_already_set();
      // The reads that may run Python code (properties) come first.
      const int64_t num_tokens = IntAttr(request, kTokens, "num_tokens");
      const int64_t num_computed =
          IntAttr(request, kComputed, "num_computed_tokens");
      const bool caching = state.manager->options().enable_caching;
      HeldChain held;
      if (caching) held = ChainObjectOf(request);
      const py::object table = BlockTable(self);
      std::vector<std::vector<PageId>> hit_ids;
      std::vector<absl::Span<const PageId>> hits;
      HitIdsOf(held.chain, table, *state.manager, arguments[3], hit_ids, hits);
      const int64_t num_new_tokens = arguments.Int(1);
      const int64_t num_new_computed_tokens = arguments.Int(2);
      const int64_t num_lookahead_tokens = arguments.Int(4);
      const int64_t num_external_computed_tokens = arguments.Int(5);
      const bool delay_cache_blocks = arguments.Bool(6);
      arguments.Int(7);  // num_encoder_tokens: for cross-attention groups.
      const bool full_sequence_must_fit = arguments.Bool(8);
      // The hashes last: no Python code runs from here to the C++ call. The
      // code that ran may have changed the list of blocks: checked again.
      if (caching) {
        SyncChain(held, request);
        CheckWidth(state, *held.chain);
      }
      CheckBlockTable(state, table);
      const VllmSlotRequest slots{
          .request_id = StrOf(id.ptr(), "request_id"),
          .block_hashes =
              caching ? held.chain->hashes() : absl::Span<const BlockHash>(),
          .num_tokens = num_tokens,
          .num_computed_tokens = num_computed,
          .num_new_tokens = num_new_tokens,
          .num_new_computed_tokens = num_new_computed_tokens,
          .new_computed_blocks = hits,
          .num_lookahead_tokens = num_lookahead_tokens,
          .num_external_computed_tokens = num_external_computed_tokens,
          .delay_cache_blocks = delay_cache_blocks,
          .full_sequence_must_fit = full_sequence_must_fit,
      };
      const VllmSlotResult result =
          ValueOrThrow(state.manager->AllocateSlots(slots));
      if (!result.allocated) return py::none();
      new_blocks = GroupBlocksOf(state, table, result.groups, false);
      if (state.manager->options().enable_kv_cache_events) {
        ranges = RangesOf(result.groups);
      }
    }
    // The adapter's Python records the events, outside the call.
    if (state.manager->options().enable_kv_cache_events) {
      RecordEvents(self, request, std::move(ranges));
    }
    return new_blocks;
  });
}

PyObject* GetComputedBlocks(PyObject* self_object, PyObject* const* args,
                            Py_ssize_t nargs, PyObject* kwnames) {
  return Guarded([&]() -> py::object {
    static const std::array<const char*, 1> kNames = {"request"};
    static PyObject* const kSkip = Intern("skip_reading_prefix_cache");
    static PyObject* const kTokens = Intern("num_tokens");
    static PyObject* const kPreemptions = Intern("num_preemptions");
    const Arguments<1> arguments("get_computed_blocks", kNames, 1, args, nargs,
                                 kwnames);
    py::handle self(self_object);
    PyManager& state = self.cast<PyManager&>();
    const Busy busy(state);
    PyObject* request = arguments[0];
    VllmKvCacheManager& manager = *state.manager;
    if (!manager.options().enable_caching) {
      return py::make_tuple(state.empty_blocks, 0);
    }
    py::object skip =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(request, kSkip));
    if (!skip) throw py::error_already_set();
    const int skipping = PyObject_IsTrue(skip.ptr());
    if (skipping < 0) throw py::error_already_set();
    if (skipping) return py::make_tuple(state.empty_blocks, 0);
    const int64_t num_tokens = IntAttr(request, kTokens, "num_tokens");
    if (num_tokens < 1) {
      // vLLM's itertools.islice(block_hashes, -1) refuses an empty prompt.
      Raise(absl::InvalidArgumentError(
          absl::StrCat("get_computed_blocks of a request with ", num_tokens,
                       " tokens (vLLM refuses it too)")));
    }
    const bool preempted = state.log_stats && IntAttr(request, kPreemptions,
                                                      "num_preemptions") > 0;
    const py::object table = BlockTable(self);
    const HeldChain held = ChainOf(request);
    BlockHashChain& chain = *held.chain;
    CheckWidth(state, chain);
    const int64_t max_length = num_tokens - 1;
    // A waiting request is asked again every step: its hit is kept while
    // the cache still gives it (and the lists handed out are unchanged).
    bool kept = chain.hit_max_length == max_length &&
                manager.IsHitUnchanged(chain.hashes(), max_length, chain.hit) &&
                chain.hit_lists.size() == chain.hit.pages.size();
    for (size_t g = 0; kept && g < chain.hit_lists.size(); ++g) {
      kept = HoldsBlocks(chain.hit_lists[g], table, chain.hit.pages[g]);
    }
    if (!kept) {
      chain.hit = manager.FindLongestCacheHit(chain.hashes(), max_length);
      chain.hit_lists.clear();
      for (const std::vector<PageId>& pages : chain.hit.pages) {
        chain.hit_lists.push_back(BlocksOf(table, pages));
      }
      chain.hit_max_length = max_length;
    }
    const int64_t hit_tokens = chain.hit.hit_tokens;
    if (state.log_stats) {
      PrefixCounters& stats = state.stats;
      if (preempted) {
        ++stats.preempted_requests;
        stats.preempted_queries += num_tokens;
        stats.preempted_hits += hit_tokens;
      } else {
        ++stats.requests;
        stats.queries += num_tokens;
        stats.hits += hit_tokens;
      }
    }
    py::tuple lists(chain.hit_lists.size());
    for (size_t g = 0; g < chain.hit_lists.size(); ++g) {
      lists[g] = chain.hit_lists[g];
    }
    return py::make_tuple(KvCacheBlocksOf(state, std::move(lists)), hit_tokens);
  });
}

PyObject* Free(PyObject* self_object, PyObject* const* args, Py_ssize_t nargs,
               PyObject* kwnames) {
  return Guarded([&]() -> py::object {
    static const std::array<const char*, 1> kNames = {"request"};
    static PyObject* const kId = Intern("request_id");
    const Arguments<1> arguments("free", kNames, 1, args, nargs, kwnames);
    PyManager& state = py::handle(self_object).cast<PyManager&>();
    const Busy busy(state);
    py::object id =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(arguments[0], kId));
    if (!id) throw py::error_already_set();
    state.manager->Free(StrOf(id.ptr(), "request_id"));
    return py::none();
  });
}

PyObject* GetNumNewMatchedTokens(PyObject* self_object, PyObject* const* args,
                                 Py_ssize_t nargs, PyObject* kwnames) {
  return Guarded([&]() -> py::object {
    static const std::array<const char*, 2> kNames = {"request",
                                                      "num_computed_tokens"};
    static PyObject* const kTokens = Intern("num_tokens");
    const Arguments<2> arguments("get_num_new_matched_tokens", kNames, 2, args,
                                 nargs, kwnames);
    PyManager& state = py::handle(self_object).cast<PyManager&>();
    const Busy busy(state);
    VllmKvCacheManager& manager = *state.manager;
    const int64_t num_computed = arguments.Int(1);
    if (manager.host_pages() == 0) return py::make_tuple(0, false);
    PyObject* request = arguments[0];
    const int64_t num_tokens = IntAttr(request, kTokens, "num_tokens");
    const HeldChain held = ChainOf(request);
    CheckWidth(state, *held.chain);
    // Loaded in the step's copy batch, before its forward pass: not
    // asynchronous (vLLM's load_kv_async).
    return py::make_tuple(manager.GetNumNewMatchedTokens(
                              held.chain->hashes(), num_tokens, num_computed),
                          false);
  });
}

PyMethodDef kFastCalls[] = {
    {"allocate_slots", AsPyCFunction(AllocateSlots),
     METH_FASTCALL | METH_KEYWORDS,
     "allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, "
     "new_computed_blocks=None, num_lookahead_tokens=0, "
     "num_external_computed_tokens=0, delay_cache_blocks=False, "
     "num_encoder_tokens=0, full_sequence_must_fit=False)\n\nvLLM's: slots "
     "for num_new_tokens more tokens (drafts included) and "
     "num_lookahead_tokens lookahead ones; the NEW blocks as a "
     "KVCacheBlocks, or None when the pool cannot hold them (nothing "
     "changed). num_encoder_tokens is for cross-attention groups, which "
     "this manager has none of."},
    {"get_computed_blocks", AsPyCFunction(GetComputedBlocks),
     METH_FASTCALL | METH_KEYWORDS,
     "get_computed_blocks(request)\n\nvLLM's: (the blocks of the request's "
     "longest cached prefix within num_tokens - 1 tokens, their token "
     "count); takes no reference."},
    {"free", AsPyCFunction(Free), METH_FASTCALL | METH_KEYWORDS,
     "free(request)\n\nvLLM's: frees the request's blocks, last first (its "
     "tail is evicted first)."},
    {"get_num_new_matched_tokens", AsPyCFunction(GetNumNewMatchedTokens),
     METH_FASTCALL | METH_KEYWORDS,
     "get_num_new_matched_tokens(request, num_computed_tokens)\n\nThe "
     "OffloadingConnector's: (the tokens after the request's device hit of "
     "num_computed_tokens that the host tier can load, False: the loads run "
     "in the step's copy batch, not asynchronously). (0, False) without a "
     "host tier."},
};

// The digests of `hashes`, `width` bytes each (all of them for 0), joined.
py::bytes JoinedDigest(absl::Span<const BlockHash> hashes, int32_t width) {
  const size_t size = width == 0 ? sizeof(BlockHash::bytes) : width;
  std::string joined;
  joined.reserve(hashes.size() * size);
  for (const BlockHash& hash : hashes) {
    joined.append(reinterpret_cast<const char*>(hash.bytes.data()), size);
  }
  return py::bytes(joined);
}

absl::string_view IdOf(py::handle request_id) {
  return StrOf(request_id.ptr(), "request_id");
}

void AddStats(const PrefixCounters& c, py::handle stats) {
  auto add = [&stats](const char* field, int64_t value) {
    if (value != 0)
      stats.attr(field) = stats.attr(field).cast<int64_t>() + value;
  };
  if (c.reset) stats.attr("reset") = true;
  add("requests", c.requests);
  add("queries", c.queries);
  add("hits", c.hits);
  add("preempted_requests", c.preempted_requests);
  add("preempted_queries", c.preempted_queries);
  add("preempted_hits", c.preempted_hits);
}

}  // namespace

void BindVllmManager(py::module_& m) {
  py::class_<BlockHashChain>(m, "BlockHashChain",
                             "A request's block hashes, converted once.")
      .def(py::init<>())
      .def("__len__",
           [](const BlockHashChain& c) { return c.hashes().size(); });

  py::class_<PyManager>(m, "VllmKvCacheManager", py::dynamic_attr(),
                        "vLLM v1's KV cache manager (C++); kvblock.vllm's "
                        "KVCacheManager wraps it. Block 0 is the null block.")
      .def(py::init([](int32_t num_blocks, int32_t block_size,
                       std::vector<KvCacheGroupSpec> kv_cache_groups,
                       int64_t max_model_len, int64_t max_num_batched_tokens,
                       bool enable_caching, bool use_eagle,
                       bool enable_kv_cache_events, bool vllm_eviction_order,
                       bool log_stats, int32_t host_pages,
                       HostWritePolicy host_write_policy) {
             PyManager made;
             made.manager = ValueOrThrow(VllmKvCacheManager::Create(
                 {.num_blocks = num_blocks,
                  .block_size = block_size,
                  .kv_cache_groups = std::move(kv_cache_groups),
                  .max_model_len = max_model_len,
                  .max_num_batched_tokens = max_num_batched_tokens,
                  .enable_caching = enable_caching,
                  .use_eagle = use_eagle,
                  .enable_kv_cache_events = enable_kv_cache_events,
                  .eviction_order = vllm_eviction_order
                                        ? EvictionOrder::kLeastRecentlyFreed
                                        : EvictionOrder::kNeverCachedFirst,
                  .host_pages = host_pages,
                  .host_write_policy = host_write_policy}));
             made.log_stats = log_stats;
             return made;
           }),
           "num_blocks"_a, "block_size"_a, "kv_cache_groups"_a,
           "max_model_len"_a, "max_num_batched_tokens"_a, "enable_caching"_a,
           "use_eagle"_a, "enable_kv_cache_events"_a, "vllm_eviction_order"_a,
           "log_stats"_a, "host_pages"_a = 0,
           "host_write_policy"_a = HostWritePolicy::kWriteBack,
           "block_size: the request hashes' block size (vLLM's "
           "hash_block_size); kv_cache_groups: KvCacheGroupSpec a group "
           "(empty: one full-attention group of block_size); host_pages: "
           "the host tier's pages (0: none).")
      .def(
          "bind",
          [](py::object self, py::object adapter, py::object blocks,
             py::object blocks_class, py::object empty_blocks) {
            PyManager& state = self.cast<PyManager&>();
            // In the object's __dict__, which the garbage collector sees
            // (the adapter and the blocks refer back to this object).
            self.attr("_adapter") = adapter;
            self.attr("_blocks") = blocks;
            state.blocks_class = std::move(blocks_class);
            state.empty_blocks = std::move(empty_blocks);
            py::list calls;
            for (PyMethodDef& def : kFastCalls) {
              PyObject* call = PyCFunction_NewEx(&def, self.ptr(), nullptr);
              if (call == nullptr) throw py::error_already_set();
              calls.append(py::reinterpret_steal<py::object>(call));
            }
            return py::tuple(calls);
          },
          "adapter"_a, "blocks"_a, "blocks_class"_a, "empty_blocks"_a,
          "Keeps the adapter and its block objects; returns allocate_slots, "
          "get_computed_blocks, free and get_num_new_matched_tokens bound to "
          "this manager.")
      .def(
          "cache_blocks",
          [](PyManager& self, py::handle request, int64_t num_tokens) {
            const Busy busy(self);
            py::object id = request.attr("request_id");
            return RangesOf(ValueOrThrow(self.manager->CacheBlocks(
                IdOf(id), ChainOf(request).chain->hashes(), num_tokens)));
          },
          "request"_a, "num_tokens"_a, "Each group's (cached_from, cached_to).")
      .def(
          "remove_skipped_blocks",
          [](PyManager& self, py::handle request_id, int64_t total_computed) {
            const Busy busy(self);
            self.manager->RemoveSkippedBlocks(IdOf(request_id), total_computed);
          },
          "request_id"_a, "total_computed_tokens"_a)
      .def(
          "evict_blocks",
          [](PyManager& self, const std::vector<PageId>& ids) {
            const Busy busy(self);
            ThrowIfError(self.manager->EvictBlocks(ids));
          },
          "block_ids"_a)
      .def("reset_prefix_cache",
           [](PyManager& self) {
             const Busy busy(self);
             if (!self.manager->ResetPrefixCache()) return false;
             self.stats.reset = true;
             return true;
           })
      .def(
          "blocks",
          [](py::object self, py::handle request_id) {
            const PyManager& state = self.cast<const PyManager&>();
            const VllmKvCacheManager& manager = *state.manager;
            std::vector<VllmGroupSlots> groups(manager.num_groups());
            for (int32_t g = 0; g < manager.num_groups(); ++g) {
              groups[g].blocks = manager.Blocks(IdOf(request_id), g);
            }
            return GroupBlocksOf(state, BlockTable(self), groups, true);
          },
          "request_id"_a, "The request's blocks as KVCacheBlocks.")
      .def(
          "block_ids",
          [](const PyManager& self, py::handle request_id) {
            py::tuple ids(self.manager->num_groups());
            for (int32_t g = 0; g < self.manager->num_groups(); ++g) {
              const auto blocks = self.manager->Blocks(IdOf(request_id), g);
              ids[g] =
                  py::cast(std::vector<PageId>(blocks.begin(), blocks.end()));
            }
            return ids;
          },
          "request_id"_a, "The request's block ids, a list a group.")
      .def(
          "get_num_common_prefix_blocks",
          [](PyManager& self, py::handle request_id) {
            const Busy busy(self);  // it enters an unknown request.
            return self.manager->GetNumCommonPrefixBlocks(IdOf(request_id));
          },
          "request_id"_a)
      .def("take_new_block_ids",
           [](PyManager& self) {
             const Busy busy(self);
             return self.manager->TakeNewBlockIds();
           })
      .def(
          "take_removed_hashes",
          [](PyManager& self) {
            const Busy busy(self);
            py::list out;
            for (const auto& block : self.manager->TakeRemovedHashes()) {
              out.append(py::make_tuple(
                  block.group, JoinedDigest(block.hashes, self.width)));
            }
            return out;
          },
          "(group, digest) of each block evicted or uncached since the last "
          "call; a block of several request hashes has them joined.")
      .def(
          "take_host_events",
          [](PyManager& self) {
            const Busy busy(self);
            py::list out;
            for (const auto& event : self.manager->TakeHostEvents()) {
              out.append(py::make_tuple(
                  event.removed,
                  JoinedDigest(absl::MakeConstSpan(&event.hash, 1),
                               self.width)));
            }
            return out;
          },
          "(removed, digest) of each block the host tier stored (False) or "
          "dropped (True) since the last call, in order.")
      .def(
          "take_host_copies",
          [](PyManager& self) {
            std::vector<HostCopy> copies;
            {
              const Busy busy(self);
              ThrowIfError(self.manager->TakeHostCopies(copies));
            }
            return HostCopiesArray(copies);
          },
          "The copy batch since the last call, HOST_COPY_DTYPE rows "
          "(device_page: the block id), and opens the next one.")
      .def_property_readonly(
          "host_pages",
          [](const PyManager& self) { return self.manager->host_pages(); })
      .def_property_readonly(
          "num_host_cached",
          [](const PyManager& self) { return self.manager->NumHostCached(); })
      .def(
          "add_prefix_cache_stats",
          [](PyManager& self, py::handle stats) {
            const Busy busy(self);
            AddStats(self.stats, stats);
            self.stats = PrefixCounters{};
          },
          "stats"_a,
          "Adds the counters since the last call to `stats` (vLLM's "
          "PrefixCacheStats fields) and clears them.")
      .def_property_readonly(
          "num_free_blocks",
          [](const PyManager& self) { return self.manager->NumFreeBlocks(); })
      .def_property_readonly(
          "usage", [](const PyManager& self) { return self.manager->Usage(); })
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
            std::vector<BlockHash> hashes(
                self.manager->CachedHashPrefix(block).begin(),
                self.manager->CachedHashPrefix(block).end());
            hashes.push_back(*hash);
            return py::make_tuple(self.manager->CachedGroup(block),
                                  JoinedDigest(hashes, self.width));
          },
          "block_id"_a,
          "(group, digest) block_id is cached under (vLLM's "
          "BlockHashListWithBlockSize entry), or None.")
      .def(
          "caches_block",
          [](const PyManager& self, int32_t group, int64_t index) {
            if (group < 0 || group >= self.manager->num_groups()) {
              Raise(absl::InvalidArgumentError(
                  absl::StrCat("caches_block: group ", group, " is not in [0, ",
                               self.manager->num_groups(), ")")));
            }
            return self.manager->CachesBlock(group, index);
          },
          "group"_a, "index"_a,
          "Whether a full block at `index` of `group` is cached as its "
          "tokens are computed.")
      .def("check_invariants", [](const PyManager& self) {
        ThrowIfError(self.manager->CheckInvariants());
      });
}

void BindVllm(py::module_& m) {
  BindVllmManager(m);
  BindVllmHasher(m);
}

}  // namespace kvblock::python
