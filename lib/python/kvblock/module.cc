// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock._kvblock: the Python bindings (pybind11). Arrays in and out are
// numpy: a step's counts and tokens are read in place when they are
// contiguous int32 (others are converted once), and a step's results are
// read-only views into the commit layer's buffers, valid until its next
// commit. Calls whose work grows with a prompt or a batch (hashing, planning,
// admitting, prompt chunks, Commit, Upload) run without the GIL. Threads:
// every call on a BlockManager, KVPageTable or BatchCommit takes the object's
// lock (object_lock.h; a commit takes its manager's and its table's), so
// threads sharing them are served one call at a time. Errors raise
// kvblock.Error subclasses (status_error.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "dlpack_export.h"
#include "host_copy_array.h"
#include "int_array.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/kv_events.h"
#include "kvblock/metrics.h"
#include "kvblock/page_table.h"
#include "kvblock/status_macros.h"
#include "kvblock/version.h"
#include "object_lock.h"
#include "status_error.h"
#include "strict_int.h"
#include "vllm_bindings.h"

namespace kvblock::python {
namespace {

namespace py = pybind11;
using py::literals::operator""_a;

// InvalidArgument unless `page` is in [0, num_pages).
absl::Status CheckPage(PageId page, int32_t num_pages) {
  if (page >= 0 && page < num_pages) return absl::OkStatus();
  return absl::InvalidArgumentError("page " + std::to_string(page) +
                                    " is not in [0, " +
                                    std::to_string(num_pages) + ")");
}

// Prompt hashes: an (n, 32) uint8 array (HashesOf checks the shape).
using HashArray =
    py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

template <typename T>
absl::Span<const T> SpanOf(const Array<T>& array) {
  return absl::MakeConstSpan(array.data(), static_cast<size_t>(array.size()));
}

// An argument left out (None) is empty.
template <typename T>
absl::Span<const T> SpanOf(const std::optional<Array<T>>& array) {
  return array.has_value() ? SpanOf(*array) : absl::Span<const T>();
}

// Runs `call` (C++ only: no Python object may be touched) without the GIL,
// for calls whose work grows with a prompt.
template <typename Call>
auto WithoutGil(Call&& call) {
  py::gil_scoped_release release;
  return call();
}

// Prompt hashes as an (n, 32) uint8 array, and back.
absl::Span<const BlockHash> HashesOf(const std::optional<HashArray>& a) {
  if (!a.has_value() || a->size() == 0) return {};
  if (a->ndim() != 2 || a->shape(1) != 32) {
    Raise(absl::InvalidArgumentError(
        "prompt_hashes must be an (n, 32) uint8 array"));
  }
  static_assert(sizeof(BlockHash) == 32);
  return absl::MakeConstSpan(reinterpret_cast<const BlockHash*>(a->data()),
                             static_cast<size_t>(a->shape(0)));
}

// A read-only view of `count` items at `data`, shaped `shape`, kept alive by
// `owner`.
template <typename T>
py::array ReadOnlyView(const T* data, std::vector<py::ssize_t> shape,
                       py::handle owner) {
  py::array view(py::dtype::of<T>(), shape, {}, data, owner);
  py::detail::array_proxy(view.ptr())->flags &=
      ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}

// A read-only view of `items`, kept alive by `owner`: shape (n) for items of
// one T, (n, k) for items that are k T's (a struct of them).
template <typename T, typename Item>
py::array ItemsView(absl::Span<const Item> items, py::handle owner) {
  static_assert(sizeof(Item) % sizeof(T) == 0);
  constexpr py::ssize_t kColumns = sizeof(Item) / sizeof(T);
  const auto rows = static_cast<py::ssize_t>(items.size());
  std::vector<py::ssize_t> shape = {rows};
  if (kColumns > 1) shape.push_back(kColumns);
  return ReadOnlyView(reinterpret_cast<const T*>(items.data()),
                      std::move(shape), owner);
}

py::dict StatsDict(const BlockManagerStats& s) {
  return py::dict(
      "admitted"_a = s.admitted, "forks"_a = s.forks, "freed"_a = s.freed,
      "preemptions"_a = s.preemptions, "prompt_tokens"_a = s.prompt_tokens,
      "prefix_hit_tokens"_a = s.prefix_hit_tokens,
      "prompt_chunks"_a = s.prompt_chunks,
      "appended_tokens"_a = s.appended_tokens, "draft_slots"_a = s.draft_slots,
      "cow_copies"_a = s.cow_copies, "evictions"_a = s.evictions,
      "pages_in_use"_a = s.pages_in_use,
      "peak_pages_in_use"_a = s.peak_pages_in_use,
      "host_hit_tokens"_a = s.host_hit_tokens, "host_stores"_a = s.host_stores,
      "host_loads"_a = s.host_loads, "host_evictions"_a = s.host_evictions);
}

// A device, where DLPack says it is, and the lock of its copy counters
// (Device::stats): tables that share it upload from their own threads. Taken
// last, with the GIL released, and never held while taking another. (The
// event calls of __dlpack__ touch no counter, and CUDA's are thread-safe.)
struct PyDevice {
  std::unique_ptr<Device> device;
  DLDevice dl_device;
  std::unique_ptr<std::mutex> uploads = std::make_unique<std::mutex>();
};

// A manager and the lock its Python threads take (object_lock.h).
struct PyBlockManager {
  std::unique_ptr<BlockManager> manager;
  ObjectMutex mutex;
};

// A page table, the device it lives on (kept alive by the Python object) and
// its lock.
struct PyTable {
  std::unique_ptr<KVPageTable> table;
  Device* device = nullptr;              // kept alive by the Python table.
  std::mutex* device_uploads = nullptr;  // PyDevice::uploads.
  DLDevice dl_device;
  // Recorded on the default stream, after the uploads, for a consumer's
  // stream to wait on (__dlpack__(stream=...)); made at the first need.
  DeviceEvent uploads_done;
  ObjectMutex mutex;
};

// The array API's __dlpack__(stream=...) on CUDA: what the consumer will
// read the table on. None and 1 are the legacy default stream, the one the
// uploads run on, and -1 asks for no synchronization: nothing to do. 2 is
// the per-thread default stream and any larger int a cudaStream_t: that
// stream is made to wait for the uploads so far (an event recorded on the
// default stream), never the host. 0 (ambiguous), other negative ints and
// anything but an int are refused.
absl::Status MakeStreamWaitForUploads(PyTable& t, const py::object& stream) {
  if (stream.is_none()) return absl::OkStatus();
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "__dlpack__: stream must be None, -1, 1, 2 or a CUDA stream "
        "(a positive int), got ",
        std::string(py::repr(stream))));
  };
  if (!PyLong_Check(stream.ptr()) || PyBool_Check(stream.ptr())) return bad();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(stream.ptr(), &overflow);
  uintptr_t handle = 0;
  if (overflow > 0) {
    // A pointer past INT64_MAX: read it unsigned.
    const unsigned long long pointer = PyLong_AsUnsignedLongLong(stream.ptr());
    if (PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return bad();
    }
    handle = static_cast<uintptr_t>(pointer);
  } else if (overflow < 0 || value == 0 || value < -1) {
    PyErr_Clear();
    return bad();
  } else if (value == -1 || value == 1) {
    return absl::OkStatus();
  } else {
    handle = static_cast<uintptr_t>(value);
  }
  if (!t.uploads_done.valid()) {
    KVBLOCK_ASSIGN_OR_RETURN(t.uploads_done, t.device->CreateEvent());
  }
  KVBLOCK_RETURN_IF_ERROR(t.device->RecordEvent(t.uploads_done, nullptr));
  // DLPack's 2 is cudaStreamPerThread's own value.
  return t.device->StreamWaitEvent(reinterpret_cast<Stream>(handle),
                                   t.uploads_done);
}

// A commit over a manager and a table that the Python object keeps alive;
// its calls take both their locks.
struct PyBatchCommit {
  PyBatchCommit(PyBlockManager& manager, PyTable& table)
      : manager(manager), table(table) {}
  // Hands the running sequences back to the manager, under its lock.
  ~PyBatchCommit() {
    if (manager.mutex.HeldByThisThread()) {
      commit.reset();  // a finalizer inside a call on the manager.
      return;
    }
    const ObjectLock lock(manager.mutex, "BlockManager");
    commit.reset();
  }
  PyBatchCommit(const PyBatchCommit&) = delete;
  PyBatchCommit& operator=(const PyBatchCommit&) = delete;

  PyBlockManager& manager;
  PyTable& table;
  std::unique_ptr<BatchCommit> commit;
};

// Both locks of a commit's call, the manager's first.
class CommitLock {
 public:
  explicit CommitLock(PyBatchCommit& c)
      : manager_(c.manager.mutex, "BlockManager"),
        table_(c.table.mutex, "KVPageTable") {}

 private:
  ObjectLock manager_;
  ObjectLock table_;
};

// A committed step: its counts, and views into the commit's buffers made
// when asked for (valid until the next commit).
struct PyStepResult {
  StepResult step;
  py::object commit;  // keeps the buffers alive.
};

// One join of a step, as Python builds it.
struct PyJoin {
  SequenceId id = kNoSequence;
  SequenceId fork_of = kNoSequence;
  Array<TokenId> tokens;
  std::string cache_salt;
  int64_t adapter_id = 0;
  std::optional<HashArray> prompt_hashes;
  std::optional<int64_t> prefill_tokens;
  bool read_prefix_cache = true;
};

struct PyChunk {
  SequenceId id = kNoSequence;
  Array<TokenId> tokens;
  std::optional<HashArray> prompt_hashes;
};

AdmitOptions AdmitOf(std::optional<int64_t> prefill_tokens,
                     bool read_prefix_cache) {
  AdmitOptions admit;
  if (prefill_tokens.has_value()) admit.prefill_tokens = *prefill_tokens;
  admit.read_prefix_cache = read_prefix_cache;
  return admit;
}

void BindConfig(py::module_& m) {
  py::enum_<DType>(m, "DType")
      .value("F16", DType::kF16)
      .value("BF16", DType::kBf16)
      .value("F32", DType::kF32);
  py::class_<PagedKvConfig>(m, "PagedKvConfig",
                            "Pool and page-table geometry, and the KV layout.")
      .def(py::init<>())
      .def_readwrite("num_pages", &PagedKvConfig::num_pages)
      .def_readwrite("max_batch", &PagedKvConfig::max_batch)
      .def_readwrite("max_pages_per_seq", &PagedKvConfig::max_pages_per_seq)
      .def_readwrite("page_size", &PagedKvConfig::page_size)
      .def_readwrite("num_layers", &PagedKvConfig::num_layers)
      .def_readwrite("num_kv_heads", &PagedKvConfig::num_kv_heads)
      .def_readwrite("head_dim", &PagedKvConfig::head_dim)
      .def_readwrite("dtype", &PagedKvConfig::dtype)
      .def("validate",
           [](const PagedKvConfig& c) { ThrowIfError(c.Validate()); })
      .def_property_readonly("max_tokens_per_seq",
                             &PagedKvConfig::MaxTokensPerSeq);
  py::enum_<HashAlgorithm>(m, "HashAlgorithm")
      .value("SHA256", HashAlgorithm::kSha256)
      .value("XXH3_128", HashAlgorithm::kXxh3_128);
  py::enum_<AttentionKind>(m, "AttentionKind")
      .value("FULL", AttentionKind::kFull)
      .value("SLIDING_WINDOW", AttentionKind::kSlidingWindow)
      .value("CHUNKED_LOCAL", AttentionKind::kChunkedLocal);
  py::enum_<HostWritePolicy>(
      m, "HostWritePolicy",
      "When the host tier stores a cached page: WRITE_BACK when the pool "
      "evicts it, WRITE_THROUGH in the copy batch after the step that "
      "cached it.")
      .value("WRITE_BACK", HostWritePolicy::kWriteBack)
      .value("WRITE_THROUGH", HostWritePolicy::kWriteThrough);
  // An IntEnum, so that a HOST_COPY_DTYPE array's `direction` field (its
  // values) compares equal to it: numpy compares a pybind11 enum as an
  // object, equal to nothing.
  py::object direction = py::module_::import("enum").attr("IntEnum")(
      "HostCopyDirection",
      py::make_tuple(
          py::make_tuple("DEVICE_TO_HOST",
                         static_cast<int>(HostCopy::Direction::kDeviceToHost)),
          py::make_tuple("HOST_TO_DEVICE",
                         static_cast<int>(HostCopy::Direction::kHostToDevice))),
      "module"_a = "kvblock");
  direction.attr("__doc__") =
      "A host copy's direction, the `direction` field of a HOST_COPY_DTYPE "
      "row: DEVICE_TO_HOST (a store) or HOST_TO_DEVICE (a load).";
  m.attr("HostCopyDirection") = direction;
  m.attr("HOST_COPY_DTYPE") = HostCopyDtype();
  py::class_<KvCacheGroupSpec>(
      m, "KvCacheGroupSpec",
      "One KV cache group of a hybrid model: its attention kind, page size, "
      "window or chunk, and whether EAGLE drafting reads it.")
      .def(py::init([](AttentionKind kind, int32_t page_size,
                       int32_t sliding_window, int32_t attention_chunk_size,
                       bool eagle) {
             return KvCacheGroupSpec{
                 .kind = kind,
                 .page_size = page_size,
                 .sliding_window = sliding_window,
                 .attention_chunk_size = attention_chunk_size,
                 .eagle = eagle};
           }),
           "kind"_a = AttentionKind::kFull, "page_size"_a = 16,
           "sliding_window"_a = 0, "attention_chunk_size"_a = 0,
           "eagle"_a = false)
      .def_readwrite("kind", &KvCacheGroupSpec::kind)
      .def_readwrite("page_size", &KvCacheGroupSpec::page_size)
      .def_readwrite("sliding_window", &KvCacheGroupSpec::sliding_window)
      .def_readwrite("attention_chunk_size",
                     &KvCacheGroupSpec::attention_chunk_size)
      .def_readwrite("eagle", &KvCacheGroupSpec::eagle)
      .def("__eq__", [](const KvCacheGroupSpec& a, const KvCacheGroupSpec& b) {
        return a == b;
      });
  py::class_<BlockManagerOptions>(m, "BlockManagerOptions")
      .def(py::init<>())
      .def_readwrite("enable_prefix_caching",
                     &BlockManagerOptions::enable_prefix_caching)
      .def_readwrite("hash_algorithm", &BlockManagerOptions::hash_algorithm)
      .def_readwrite("watermark_pages", &BlockManagerOptions::watermark_pages)
      .def_readwrite("max_sequences", &BlockManagerOptions::max_sequences)
      .def_readwrite("reserve_prompt_pages",
                     &BlockManagerOptions::reserve_prompt_pages)
      .def_readwrite("enable_kv_events", &BlockManagerOptions::enable_kv_events)
      .def_readwrite("reserved_kv_changes",
                     &BlockManagerOptions::reserved_kv_changes)
      .def_readwrite("kv_cache_groups", &BlockManagerOptions::kv_cache_groups,
                     "The model's KV cache groups (a list of "
                     "KvCacheGroupSpec; assign a whole list). Empty: one "
                     "full-attention group of the config's page size.")
      .def_readwrite("host_pages", &BlockManagerOptions::host_pages,
                     "Pages of the host tier, which keeps the cached pages "
                     "the pool evicts (0: none). Needs prefix caching and "
                     "one full-attention group.")
      .def_readwrite("host_write_policy",
                     &BlockManagerOptions::host_write_policy);
  py::class_<AdmissionPlan>(m, "AdmissionPlan")
      .def_readonly("hit_pages", &AdmissionPlan::hit_pages)
      .def_readonly("hit_tokens", &AdmissionPlan::hit_tokens)
      .def_readonly("host_hit_pages", &AdmissionPlan::host_hit_pages,
                    "Of the hits, pages loaded from the host tier.")
      .def_readonly("revived_pages", &AdmissionPlan::revived_pages)
      .def_readonly("new_pages", &AdmissionPlan::new_pages)
      .def_readonly("computed_tokens", &AdmissionPlan::computed_tokens)
      .def_readonly("reserved_pages", &AdmissionPlan::reserved_pages)
      .def_property_readonly("pages_consumed", &AdmissionPlan::pages_consumed);
  py::class_<CommitPhaseTimes>(
      m, "CommitPhaseTimes",
      "Host time in BatchCommit.commit by part, in ns, summed over the "
      "steps committed while BatchCommit.time_phases was on.")
      .def_readonly("frees_ns", &CommitPhaseTimes::frees_ns)
      .def_readonly("admissions_ns", &CommitPhaseTimes::admissions_ns)
      .def_readonly("appends_ns", &CommitPhaseTimes::appends_ns)
      .def_readonly("page_table_ns", &CommitPhaseTimes::page_table_ns)
      .def_readonly("total_ns", &CommitPhaseTimes::total_ns);
  py::class_<AppendResult>(m, "AppendResult")
      .def_readonly("new_pages", &AppendResult::new_pages)
      .def_readonly("released_pages", &AppendResult::released_pages)
      .def_property_readonly("copy",
                             [](const AppendResult& r) -> py::object {
                               if (!r.copy.has_value()) return py::none();
                               return py::make_tuple(r.copy->source,
                                                     r.copy->destination);
                             })
      .def_property_readonly(
          "group_copies",
          [](const AppendResult& r) {
            py::list copies;
            for (const GroupPageCopy& copy : r.group_copies) {
              copies.append(py::make_tuple(copy.group, copy.copy.source,
                                           copy.copy.destination));
            }
            return copies;
          },
          "With KV cache groups: every group's copy, (group, source, "
          "destination) tuples.");
}

py::bytes BytesOf(const BlockHash& hash) {
  return py::bytes(reinterpret_cast<const char*>(hash.bytes.data()),
                   hash.bytes.size());
}

py::list BytesOf(absl::Span<const BlockHash> hashes) {
  py::list list;
  for (const BlockHash& hash : hashes) list.append(BytesOf(hash));
  return list;
}

const char* KindName(KvCacheEvent::Kind kind) {
  switch (kind) {
    case KvCacheEvent::Kind::kBlockStored:
      return "BlockStored";
    case KvCacheEvent::Kind::kBlockRemoved:
      return "BlockRemoved";
    case KvCacheEvent::Kind::kAllBlocksCleared:
      return "AllBlocksCleared";
  }
  return "?";
}

void BindEvents(py::module_& m) {
  py::class_<KvCacheEvent>(
      m, "KvCacheEvent",
      "A change of the prefix cache (BlockManager.take_kv_events): kind "
      "BlockStored, BlockRemoved or AllBlocksCleared; hashes as 32 bytes.")
      .def_property_readonly(
          "kind", [](const KvCacheEvent& e) { return KindName(e.kind); })
      .def_property_readonly(
          "block_hashes",
          [](const KvCacheEvent& e) { return BytesOf(e.block_hashes); })
      .def_property_readonly("parent_block_hash",
                             [](const KvCacheEvent& e) -> py::object {
                               if (!e.parent_block_hash.has_value()) {
                                 return py::none();
                               }
                               return BytesOf(*e.parent_block_hash);
                             })
      .def_readonly("token_ids", &KvCacheEvent::token_ids)
      .def_readonly("cache_salt", &KvCacheEvent::cache_salt)
      .def_readonly("adapter_id", &KvCacheEvent::adapter_id)
      .def_readonly("group_idx", &KvCacheEvent::group_idx)
      .def_property_readonly(
          "medium",
          [](const KvCacheEvent& e) {
            return e.medium == KvCacheEvent::Medium::kCpu ? "CPU" : "GPU";
          },
          "Where the pages are: \"GPU\" (the pool) or \"CPU\" (its host "
          "tier: hashes only, no parent, tokens, salt or adapter).")
      .def("__repr__", [](const KvCacheEvent& e) {
        return std::string("KvCacheEvent(") + KindName(e.kind) + ", " +
               (e.medium == KvCacheEvent::Medium::kCpu ? "CPU, " : "") +
               std::to_string(e.block_hashes.size()) + " pages)";
      });
}

BlockHash HashOf(const py::bytes& bytes) {
  const std::string text = bytes;
  if (text.size() != 32) {
    Raise(absl::InvalidArgumentError("a block hash is 32 bytes, got " +
                                     std::to_string(text.size())));
  }
  BlockHash hash;
  std::copy(text.begin(), text.end(), hash.bytes.begin());
  return hash;
}

void BindPool(py::module_& m) {
  py::class_<BlockPool>(
      m, "BlockPool",
      "The refcounted page pool with its prefix cache: pages, refcounts, "
      "copy-on-write, cached pages and their LRU eviction.")
      .def(py::init([](int32_t num_pages, int32_t host_pages,
                       HostWritePolicy host_write_policy) {
             return ValueOrThrow(BlockPool::Create(
                 num_pages, {.host_pages = host_pages,
                             .host_write_policy = host_write_policy}));
           }),
           "num_pages"_a, "host_pages"_a = 0,
           "host_write_policy"_a = HostWritePolicy::kWriteBack)
      .def("allocate", [](BlockPool& p) { return ValueOrThrow(p.Allocate()); })
      .def(
          "retain",
          [](BlockPool& p, PageId page) { ThrowIfError(p.Retain(page)); },
          "page"_a)
      .def(
          "release",
          [](BlockPool& p, PageId page) { ThrowIfError(p.Release(page)); },
          "page"_a)
      .def(
          "writable",
          [](BlockPool& p, PageId page) {
            const CopyOnWrite cow = ValueOrThrow(p.Writable(page));
            return py::make_tuple(cow.page, cow.source,
                                  cow.kind == CopyOnWrite::Kind::kCopy);
          },
          "page"_a,
          "The page to write for `page`: (page, source, copied); a shared page "
          "is copied first.")
      .def(
          "register_cached",
          [](BlockPool& p, PageId page, const py::bytes& hash) {
            return ValueOrThrow(p.RegisterCached(page, HashOf(hash)));
          },
          "page"_a, "hash"_a,
          "Files a full page under its 32-byte hash; the page already filed "
          "under it, if another.")
      .def(
          "lookup",
          [](const BlockPool& p, const py::bytes& hash) -> py::object {
            const std::optional<PageId> page = p.Lookup(HashOf(hash));
            if (!page.has_value()) return py::none();
            return py::int_(*page);
          },
          "hash"_a)
      .def(
          "ref_count",
          [](const BlockPool& pool, PageId page) {
            ThrowIfError(CheckPage(page, pool.num_pages()));
            return pool.RefCount(page);
          },
          "page"_a, "References on page `page` (ValueError out of range).")
      .def_property_readonly("num_pages", &BlockPool::num_pages)
      .def_property_readonly("num_free", &BlockPool::NumFree)
      .def_property_readonly("num_evictable", &BlockPool::NumEvictable)
      .def_property_readonly("num_cached", &BlockPool::NumCached)
      .def_property_readonly("num_used", &BlockPool::NumUsed)
      .def(
          "host_lookup",
          [](const BlockPool& p, const py::bytes& hash) -> py::object {
            const std::optional<HostPageId> page = p.HostLookup(HashOf(hash));
            if (!page.has_value()) return py::none();
            return py::int_(*page);
          },
          "hash"_a, "The host page cached under `hash`, or None.")
      .def(
          "load_from_host",
          [](BlockPool& p, const py::bytes& hash) {
            return ValueOrThrow(p.LoadFromHost(HashOf(hash)));
          },
          "hash"_a,
          "Loads the host tier's page of `hash` into a new page (refcount 1, "
          "cached under `hash`) and returns it; the load is listed in the "
          "open copy batch.")
      .def(
          "take_host_copies",
          [](BlockPool& p) {
            std::vector<HostCopy> copies;
            ThrowIfError(p.TakeHostCopies(copies));
            return HostCopiesArray(copies);
          },
          "The open copy batch (HOST_COPY_DTYPE rows, in order), and opens "
          "the next one: run every store (DEVICE_TO_HOST), then every load.")
      .def_property_readonly(
          "host_copies",
          [](const BlockPool& p) { return HostCopiesArray(p.host_copies()); },
          "The open copy batch's copies so far (a copy).")
      .def_property_readonly(
          "parked_pages",
          [](const BlockPool& p) {
            const absl::Span<const PageId> parked = p.parked_pages();
            return std::vector<PageId>(parked.begin(), parked.end());
          },
          "Pages loaded and released in the open batch, held by the pool "
          "until it is taken.")
      .def_property_readonly("host_pages", &BlockPool::host_pages)
      .def_property_readonly("num_host_cached", &BlockPool::NumHostCached)
      .def("reset_prefix_cache",
           [](BlockPool& p) { ThrowIfError(p.ResetPrefixCache()); })
      .def("check_invariants",
           [](const BlockPool& p) { ThrowIfError(p.CheckInvariants()); })
      .def_property_readonly("stats", [](const BlockPool& p) {
        const BlockPoolStats& s = p.stats();
        return py::dict(
            "allocations"_a = s.allocations, "evictions"_a = s.evictions,
            "cow_copies"_a = s.cow_copies, "cache_hits"_a = s.cache_hits,
            "cache_revivals"_a = s.cache_revivals,
            "cache_registrations"_a = s.cache_registrations,
            "peak_used"_a = s.peak_used, "host_stores"_a = s.host_stores,
            "host_loads"_a = s.host_loads,
            "host_evictions"_a = s.host_evictions,
            "host_store_skips"_a = s.host_store_skips);
      });
}

void BindManager(py::module_& m) {
  py::class_<PyBlockManager>(
      m, "BlockManager",
      "Sequences by id: admission with prefix hits, appends, chunked prefill, "
      "drafts, fork, free, preempt. Every failing call changes nothing.")
      .def(py::init([](const PagedKvConfig& config,
                       const BlockManagerOptions& options) {
             auto self = std::make_unique<PyBlockManager>();
             self->manager =
                 ValueOrThrow(BlockManager::Create(config, options));
             return self;
           }),
           "config"_a, "options"_a = BlockManagerOptions{})
      .def(
          "hash_prompt",
          [](PyBlockManager& self, const Array<TokenId>& prompt,
             const std::string& cache_salt, int64_t adapter_id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            // With groups, blocks of their hash page size (HashPrompt).
            const int32_t block_size =
                bm.has_kv_cache_groups()
                    ? HashPageSize(bm.options().kv_cache_groups)
                    : bm.config().page_size;
            py::array_t<uint8_t> out(
                {static_cast<py::ssize_t>(prompt.size() / block_size),
                 py::ssize_t{32}});
            const absl::Span<BlockHash> hashes(
                reinterpret_cast<BlockHash*>(out.mutable_data()),
                static_cast<size_t>(out.shape(0)));
            const absl::Span<const TokenId> tokens = SpanOf(prompt);
            const int64_t written = ValueOrThrow(WithoutGil([&] {
              return bm.HashPrompt(
                  tokens, {.cache_salt = cache_salt, .adapter_id = adapter_id},
                  hashes);
            }));
            // Only what was written (never rows of uninitialized memory).
            if (written != out.shape(0)) {
              out.resize({static_cast<py::ssize_t>(written), py::ssize_t{32}});
            }
            return out;
          },
          "prompt"_a, "cache_salt"_a = "", "adapter_id"_a = 0,
          "The hashes of the prompt's full pages (with KV cache groups, "
          "of its blocks of their hash page size), (pages, 32) uint8.")
      .def(
          "plan_admission",
          [](PyBlockManager& self, const Array<TokenId>& prompt,
             const std::string& cache_salt, int64_t adapter_id,
             const std::optional<HashArray>& prompt_hashes,
             std::optional<int64_t> prefill_tokens, bool read_prefix_cache) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            const absl::Span<const TokenId> tokens = SpanOf(prompt);
            const absl::Span<const BlockHash> hashes = HashesOf(prompt_hashes);
            return ValueOrThrow(WithoutGil([&] {
              return bm.PlanAdmission(
                  tokens, {.cache_salt = cache_salt, .adapter_id = adapter_id},
                  hashes, AdmitOf(prefill_tokens, read_prefix_cache));
            }));
          },
          "prompt"_a, "cache_salt"_a = "", "adapter_id"_a = 0,
          "prompt_hashes"_a = py::none(), "prefill_tokens"_a = py::none(),
          "read_prefix_cache"_a = true)
      .def(
          "admit",
          [](PyBlockManager& self, SequenceId id, const Array<TokenId>& prompt,
             const std::string& cache_salt, int64_t adapter_id,
             const std::optional<HashArray>& prompt_hashes,
             std::optional<int64_t> prefill_tokens, bool read_prefix_cache) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            const absl::Span<const TokenId> tokens = SpanOf(prompt);
            const absl::Span<const BlockHash> hashes = HashesOf(prompt_hashes);
            return ValueOrThrow(WithoutGil([&] {
              return bm.Admit(
                  id, tokens,
                  {.cache_salt = cache_salt, .adapter_id = adapter_id}, hashes,
                  AdmitOf(prefill_tokens, read_prefix_cache));
            }));
          },
          "id"_a, "prompt"_a, "cache_salt"_a = "", "adapter_id"_a = 0,
          "prompt_hashes"_a = py::none(), "prefill_tokens"_a = py::none(),
          "read_prefix_cache"_a = true)
      .def(
          "append",
          [](PyBlockManager& self, SequenceId id,
             const Array<TokenId>& tokens) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            return ValueOrThrow(bm.Append(id, SpanOf(tokens)));
          },
          "id"_a, "tokens"_a)
      .def(
          "append_token",
          [](PyBlockManager& self, SequenceId id, TokenId token) -> py::object {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            const AppendResult result =
                ValueOrThrow(bm.Append(id, absl::MakeConstSpan(&token, 1)));
            if (result.new_pages == 0 && !result.copy.has_value()) {
              return py::none();
            }
            return py::cast(result);
          },
          "id"_a, "token"_a,
          "Append of one token (decode), without an array: None when it "
          "stayed in the partial page, else the AppendResult.")
      .def(
          "append_prompt",
          [](PyBlockManager& self, SequenceId id, const Array<TokenId>& tokens,
             const std::optional<HashArray>& prompt_hashes) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            const absl::Span<const TokenId> chunk = SpanOf(tokens);
            const absl::Span<const BlockHash> hashes = HashesOf(prompt_hashes);
            return ValueOrThrow(
                WithoutGil([&] { return bm.AppendPrompt(id, chunk, hashes); }));
          },
          "id"_a, "tokens"_a, "prompt_hashes"_a = py::none())
      .def(
          "set_drafts",
          [](PyBlockManager& self, SequenceId id, int32_t count) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            return ValueOrThrow(bm.SetDrafts(id, count));
          },
          "id"_a, "count"_a)
      .def(
          "fork",
          [](PyBlockManager& self, SequenceId parent, SequenceId child) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            ThrowIfError(bm.Fork(parent, child));
          },
          "parent"_a, "child"_a)
      .def(
          "free",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            ThrowIfError(bm.Free(id));
          },
          "id"_a)
      .def(
          "preempt",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            ThrowIfError(bm.Preempt(id));
          },
          "id"_a)
      .def(
          "__contains__",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            return self.manager->Contains(id);
          },
          "id"_a)
      .def("__len__",
           [](PyBlockManager& self) {
             const ObjectLock lock(self.mutex, "BlockManager");
             return self.manager->num_sequences();
           })
      .def(
          "pages",
          [](PyBlockManager& self, SequenceId id, int32_t start) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            const absl::Span<const PageId> pages = ValueOrThrow(bm.Pages(id));
            if (start < 0 || static_cast<size_t>(start) > pages.size()) {
              Raise(absl::OutOfRangeError(
                  "pages: start " + std::to_string(start) + " of a sequence " +
                  "of " + std::to_string(pages.size()) + " pages"));
            }
            return std::vector<PageId>(pages.begin() + start, pages.end());
          },
          "id"_a, "start"_a = 0,
          "The sequence's page ids from page `start` on, a list.")
      .def(
          "group_pages",
          [](PyBlockManager& self, SequenceId id, int32_t group) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const absl::Span<const PageId> pages =
                ValueOrThrow(self.manager->GroupPages(id, group));
            return std::vector<PageId>(pages.begin(), pages.end());
          },
          "id"_a, "group"_a,
          "The sequence's page ids in KV cache group `group`, a list (a "
          "window group's skipped pages are null_page).")
      .def_property_readonly("num_groups",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               return self.manager->num_groups();
                             })
      .def_property_readonly(
          "null_page",
          [](PyBlockManager& self) {
            const ObjectLock lock(self.mutex, "BlockManager");
            return self.manager->null_page();
          },
          "The page window groups point skipped entries at; -1 without one.")
      .def(
          "ref_count",
          [](PyBlockManager& self, PageId page) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            ThrowIfError(CheckPage(page, bm.pool().num_pages()));
            return bm.pool().RefCount(page);
          },
          "page"_a,
          "Sequences holding page `page` (0 when free; ValueError out of "
          "range).")
      .def(
          "num_tokens",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            return ValueOrThrow(bm.NumTokens(id));
          },
          "id"_a)
      .def(
          "prompt_tokens_left",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            return ValueOrThrow(bm.PromptTokensLeft(id));
          },
          "id"_a)
      .def(
          "num_drafts",
          [](PyBlockManager& self, SequenceId id) {
            const ObjectLock lock(self.mutex, "BlockManager");
            const BlockManager& bm = *self.manager;
            return ValueOrThrow(bm.NumDrafts(id));
          },
          "id"_a)
      .def_property_readonly("num_free",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               const BlockManager& bm = *self.manager;
                               return bm.pool().NumFree();
                             })
      .def_property_readonly("num_allocatable",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               return self.manager->NumAllocatable();
                             })
      .def_property_readonly("num_cached",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               const BlockManager& bm = *self.manager;
                               return bm.pool().NumCached();
                             })
      .def_property_readonly("reserved_pages",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               return self.manager->reserved_pages();
                             })
      .def_property_readonly("stats",
                             [](PyBlockManager& self) {
                               const ObjectLock lock(self.mutex,
                                                     "BlockManager");
                               const BlockManager& bm = *self.manager;
                               return StatsDict(bm.stats());
                             })
      .def_property_readonly(
          "config",
          [](const PyBlockManager& self) { return self.manager->config(); })

      .def("reset_prefix_cache",
           [](PyBlockManager& self) {
             const ObjectLock lock(self.mutex, "BlockManager");
             BlockManager& bm = *self.manager;
             ThrowIfError(bm.ResetPrefixCache());
           })
      .def(
          "take_kv_events",
          [](PyBlockManager& self) {
            const ObjectLock lock(self.mutex, "BlockManager");
            BlockManager& bm = *self.manager;
            std::vector<KvCacheEvent> events;
            ThrowIfError(bm.TakeKvEvents(events));
            return events;
          },
          "The KV cache events since the last call, in order (with "
          "BlockManagerOptions.enable_kv_events; between steps).")
      .def(
          "take_host_copies",
          [](PyBlockManager& self) {
            std::vector<HostCopy> copies;
            {
              const ObjectLock lock(self.mutex, "BlockManager");
              ThrowIfError(self.manager->TakeHostCopies(copies));
            }
            return HostCopiesArray(copies);
          },
          "The copies between the pool and its host tier since the last "
          "call (HOST_COPY_DTYPE rows, in order; empty without a host "
          "tier), and opens the next batch. Run every store "
          "(DEVICE_TO_HOST), then every load, after the last forward pass "
          "and before the next. A BatchCommit's steps carry theirs in "
          "StepResult.host_copies instead.")
      .def_property_readonly(
          "num_host_cached",
          [](PyBlockManager& self) {
            const ObjectLock lock(self.mutex, "BlockManager");
            return self.manager->pool().NumHostCached();
          },
          "Host tier pages holding a cached page (0 without a host tier).")
      .def("check_invariants", [](PyBlockManager& self) {
        const ObjectLock lock(self.mutex, "BlockManager");
        const BlockManager& bm = *self.manager;
        ThrowIfError(bm.CheckInvariants());
      });
}

void BindTable(py::module_& m) {
  py::class_<PyDevice>(m, "Device",
                       "Where the page table lives: the host, or a CUDA GPU.")
      .def_static(
          "host",
          [] {
            return PyDevice{.device = Device::Host(), .dl_device = {kDLCPU, 0}};
          })
      .def_static(
          "cuda",
          [](int ordinal) {
            return PyDevice{.device = ValueOrThrow(Device::Cuda(ordinal)),
                            .dl_device = {kDLCUDA, ordinal}};
          },
          "ordinal"_a = 0)
      .def_property_readonly("name", [](const PyDevice& d) {
        return std::string(d.device->name());
      });
  py::class_<PyTable>(
      m, "KVPageTable",
      "The batched device page table, int32 [max_batch, 2, "
      "max_pages_per_seq]: K page ids, then V ids (K id + num_pages). "
      "__dlpack__ exports the device copy without copying.")
      .def(py::init([](int32_t max_batch, int32_t max_pages_per_seq,
                       int32_t num_pages, PyDevice& device) {
             auto self = std::make_unique<PyTable>();
             self->table = ValueOrThrow(KVPageTable::Create(
                 max_batch, max_pages_per_seq, num_pages, *device.device));
             self->device = device.device.get();
             self->device_uploads = device.uploads.get();
             self->dl_device = device.dl_device;
             return self;
           }),
           "max_batch"_a, "max_pages_per_seq"_a, "num_pages"_a, "device"_a,
           py::keep_alive<1, 5>())
      .def(
          "upload",
          [](PyTable& t) {
            absl::StatusOr<bool> uploaded;
            {
              const ObjectLock lock(t.mutex, "KVPageTable");
              uploaded = WithoutGil([&] {
                const std::lock_guard<std::mutex> device(*t.device_uploads);
                return t.table->Upload(nullptr);
              });
            }
            return ValueOrThrow(std::move(uploaded));  // after the lock.
          },
          "Uploads the entries written since the last upload; True when "
          "anything was copied.")
      .def(
          "host_row",
          [](const py::object& self, SlotId slot) {
            PyTable& t = self.cast<PyTable&>();
            absl::StatusOr<absl::Span<const PageId>> row;
            {
              const ObjectLock lock(t.mutex, "KVPageTable");
              row = t.table->HostRow(slot);
            }
            // The view (a fixed address) is made after the lock.
            return ItemsView<PageId>(ValueOrThrow(std::move(row)), self);
          },
          "slot"_a,
          "The K page ids of row `slot` on the host, a read-only view.")
      .def(
          "__dlpack__",
          [](const py::object& self, const py::object& stream) {
            PyTable& t = self.cast<PyTable&>();
            // The Python array API: a CPU tensor is asked for with no stream.
            if (t.dl_device.device_type == kDLCPU && !stream.is_none()) {
              ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
                  "__dlpack__: a host device's table has no stream, got "
                  "stream=",
                  std::string(py::repr(stream)))));
            }
            absl::Status waited;
            DeviceTensor view;
            {
              const ObjectLock lock(t.mutex, "KVPageTable");
              if (t.dl_device.device_type == kDLCUDA) {
                waited = MakeStreamWaitForUploads(t, stream);
              }
              view = t.table->kernel_view();
            }
            // The capsule (of a fixed address) is made after the lock.
            ThrowIfError(waited);
            return ExportDlpack(view, t.dl_device, self);
          },
          "stream"_a = py::none(),
          "The device table as a DLPack capsule (no copy): on the host device "
          "a CPU tensor, on a GPU a CUDA one, which `stream` (the consumer's, "
          "as the array API passes it) may read once the uploads so far are "
          "done: it waits for them, the host does not. Upload first; the "
          "capsule keeps the table alive.")
      .def("__dlpack_device__",
           [](const PyTable& t) {
             return py::make_tuple(static_cast<int>(t.dl_device.device_type),
                                   t.dl_device.device_id);
           })
      .def_property_readonly(
          "max_batch", [](const PyTable& t) { return t.table->max_batch(); })
      .def_property_readonly(
          "max_pages_per_seq",
          [](const PyTable& t) { return t.table->max_pages_per_seq(); })
      .def_property_readonly(
          "num_pages", [](const PyTable& t) { return t.table->num_pages(); })
      .def("check_invariants", [](PyTable& t) {
        const ObjectLock lock(t.mutex, "KVPageTable");
        ThrowIfError(t.table->CheckInvariants());
      });
}

void BindCommit(py::module_& m) {
  py::class_<PyJoin>(m, "Join",
                     "A sequence joining a step: a prompt or a fork.")
      .def(py::init([](SequenceId id, const Array<TokenId>& tokens,
                       SequenceId fork_of, std::string cache_salt,
                       int64_t adapter_id,
                       std::optional<HashArray> prompt_hashes,
                       std::optional<int64_t> prefill_tokens,
                       bool read_prefix_cache) {
             return PyJoin{.id = id,
                           .fork_of = fork_of,
                           .tokens = tokens,
                           .cache_salt = std::move(cache_salt),
                           .adapter_id = adapter_id,
                           .prompt_hashes = std::move(prompt_hashes),
                           .prefill_tokens = prefill_tokens,
                           .read_prefix_cache = read_prefix_cache};
           }),
           "id"_a, "tokens"_a = Array<TokenId>(), "fork_of"_a = kNoSequence,
           "cache_salt"_a = "", "adapter_id"_a = 0,
           "prompt_hashes"_a = py::none(), "prefill_tokens"_a = py::none(),
           "read_prefix_cache"_a = true)
      .def_readonly("id", &PyJoin::id)
      .def_readonly("fork_of", &PyJoin::fork_of);
  py::class_<PyChunk>(m, "PromptChunk",
                      "The next part of a running sequence's prompt.")
      .def(py::init([](SequenceId id, const Array<TokenId>& tokens,
                       std::optional<HashArray> prompt_hashes) {
             return PyChunk{.id = id,
                            .tokens = tokens,
                            .prompt_hashes = std::move(prompt_hashes)};
           }),
           "id"_a, "tokens"_a, "prompt_hashes"_a = py::none())
      .def_readonly("id", &PyChunk::id);
  py::class_<PyStepResult>(
      m, "StepResult",
      "What a committed step did. The arrays are read-only views into the "
      "commit layer's buffers, valid until its next commit.")
      .def_property_readonly(
          "old_to_new",
          [](const PyStepResult& r) {
            return ItemsView<SlotId>(r.step.old_to_new, r.commit);
          },
          "By old slot (max_batch entries): its sequence's new slot, or -1.")
      .def_property_readonly(
          "moves",
          [](const PyStepResult& r) {
            return ItemsView<SlotId>(r.step.moves, r.commit);
          },
          "The rows that moved, (n, 2): old slot, new slot.")
      .def_property_readonly(
          "changed_slots",
          [](const PyStepResult& r) {
            return ItemsView<SlotId>(r.step.changed_slots, r.commit);
          },
          "New slots whose rows were rewritten.")
      .def_property_readonly(
          "copies",
          [](const PyStepResult& r) {
            return ItemsView<PageId>(r.step.copies, r.commit);
          },
          "Copy-on-write copies to run, (n, 2): source, destination page.")
      .def_property_readonly(
          "copy_groups",
          [](const PyStepResult& r) {
            return ItemsView<int32_t>(r.step.copy_groups, r.commit);
          },
          "With KV cache groups: the group of each copy; empty for one.")
      .def_property_readonly("batch",
                             [](const PyStepResult& r) { return r.step.batch; })
      .def_property_readonly(
          "new_pages", [](const PyStepResult& r) { return r.step.new_pages; })
      .def_property_readonly(
          "draft_copies",
          [](const PyStepResult& r) { return r.step.draft_copies; })
      .def_property_readonly(
          "host_copies",
          [](const PyStepResult& r) {
            return HostCopiesArray(r.step.host_copies, r.commit);
          },
          "With a host tier: the step's copy batch, HOST_COPY_DTYPE rows "
          "(device_page, host_page, direction). Run every store "
          "(DEVICE_TO_HOST), then every load, before `copies` and the "
          "step's forward pass.");
  py::class_<PyBatchCommit>(
      m, "BatchCommit",
      "Applies one scheduler step as a transaction and compacts it into the "
      "page table.")
      .def(py::init([](PyBlockManager& manager, PyTable& table) {
             auto self = std::make_unique<PyBatchCommit>(manager, table);
             const CommitLock lock(*self);
             self->commit = ValueOrThrow(
                 BatchCommit::Create(*manager.manager, *table.table));
             return self;
           }),
           "manager"_a, "table"_a, py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def(
          "commit",
          [](const py::object& self,
             const std::optional<Array<SequenceId>>& finished,
             const std::optional<Array<SequenceId>>& preempted,
             const std::optional<std::vector<PyJoin>>& joins,
             const std::optional<Array<int32_t>>& append_counts,
             const std::optional<Array<TokenId>>& append_tokens,
             const std::optional<std::vector<PyChunk>>& prompt_chunks,
             const std::optional<Array<int32_t>>& draft_counts) {
            PyBatchCommit& locked = self.cast<PyBatchCommit&>();
            const CommitLock lock(locked);
            BatchCommit& commit = *locked.commit;
            // The plan views the joins' and chunks' tokens, hashes and
            // salts: the lists stay alive (and unchanged) through Commit.
            static const std::vector<PyJoin> kNoJoins;
            static const std::vector<PyChunk> kNoChunks;
            std::vector<JoinRequest> join_requests;
            for (const PyJoin& j : joins.has_value() ? *joins : kNoJoins) {
              join_requests.push_back(
                  {.id = j.id,
                   .fork_of = j.fork_of,
                   .tokens = SpanOf(j.tokens),
                   .extra = {.cache_salt = j.cache_salt,
                             .adapter_id = j.adapter_id},
                   .prompt_hashes = HashesOf(j.prompt_hashes),
                   .admit = AdmitOf(j.prefill_tokens, j.read_prefix_cache)});
            }
            std::vector<PromptChunk> chunks;
            for (const PyChunk& c :
                 prompt_chunks.has_value() ? *prompt_chunks : kNoChunks) {
              chunks.push_back({.id = c.id,
                                .tokens = SpanOf(c.tokens),
                                .prompt_hashes = HashesOf(c.prompt_hashes)});
            }
            const StepPlan plan{.finished = SpanOf(finished),
                                .preempted = SpanOf(preempted),
                                .joins = join_requests,
                                .append_counts = SpanOf(append_counts),
                                .append_tokens = SpanOf(append_tokens),
                                .prompt_chunks = chunks,
                                .draft_counts = SpanOf(draft_counts)};
            const StepResult step =
                ValueOrThrow(WithoutGil([&] { return commit.Commit(plan); }));
            return PyStepResult{.step = step, .commit = self};
          },
          "finished"_a = py::none(), "preempted"_a = py::none(),
          "joins"_a = py::none(), "append_counts"_a = py::none(),
          "append_tokens"_a = py::none(), "prompt_chunks"_a = py::none(),
          "draft_counts"_a = py::none(),
          "Commits one step (BatchCommit::Commit) as one transaction; its "
          "StepResult.")
      .def_property_readonly(
          "slots",
          [](const py::object& self) {
            PyBatchCommit& c = self.cast<PyBatchCommit&>();
            const CommitLock lock(c);
            return ItemsView<SequenceId>(c.commit->slots(), self);
          },
          "The running sequences in slot order, a read-only view (valid "
          "until the next commit).")
      .def_property_readonly("batch",
                             [](PyBatchCommit& c) {
                               const CommitLock lock(c);
                               return c.commit->batch();
                             })
      .def_property(
          "time_phases",
          [](PyBatchCommit& c) {
            const CommitLock lock(c);
            return c.commit->time_phases();
          },
          [](PyBatchCommit& c, bool on) {
            const CommitLock lock(c);
            c.commit->set_time_phases(on);
          },
          "Whether commits time their parts (phase_times).")
      .def_property_readonly("phase_times",
                             [](PyBatchCommit& c) {
                               const CommitLock lock(c);
                               return c.commit->phase_times();
                             })
      .def("__len__",
           [](PyBatchCommit& c) {
             const CommitLock lock(c);
             return c.commit->batch();
           })
      .def(
          "__iter__",
          [](PyBatchCommit& c) {
            const CommitLock lock(c);
            const absl::Span<const SequenceId> slots = c.commit->slots();
            return py::iter(
                py::cast(std::vector<SequenceId>(slots.begin(), slots.end())));
          },
          "The running sequences in slot order (a copy).")
      .def(
          "append_pages",
          [](PyBatchCommit& c, const Array<int32_t>& append_counts,
             const Array<int32_t>& draft_counts) {
            const CommitLock lock(c);
            return ValueOrThrow(c.commit->AppendPages(SpanOf(append_counts),
                                                      SpanOf(draft_counts)));
          },
          "append_counts"_a, "draft_counts"_a = Array<int32_t>())
      .def("check_invariants", [](PyBatchCommit& c) {
        const CommitLock lock(c);
        ThrowIfError(c.commit->CheckInvariants());
      });
}

// The metrics of a manager and (optionally) its page table, for
// kvblock.metrics: (name, help, "counter" or "gauge", value) tuples, read
// under the objects' locks in their order (the manager's first).
void BindMetrics(py::module_& m) {
  m.def(
      "collect_metrics",
      [](PyBlockManager& manager, PyTable* table) {
        std::optional<ObjectLock> table_lock;
        const ObjectLock manager_lock(manager.mutex, "BlockManager");
        if (table != nullptr) table_lock.emplace(table->mutex, "KVPageTable");
        std::vector<Metric> metrics = ValueOrThrow(CollectMetrics(
            {.manager = manager.manager.get(),
             .page_table = table != nullptr ? table->table.get() : nullptr}));
        py::list out;
        for (const Metric& metric : metrics) {
          out.append(py::make_tuple(
              std::string(metric.name), std::string(metric.help),
              metric.type == Metric::Type::kCounter ? "counter" : "gauge",
              metric.value));
        }
        return out;
      },
      "manager"_a, "page_table"_a = nullptr,
      "The metrics of `manager` and, when given, `page_table` "
      "(kvblock/metrics.h): a list of (name, help, kind, value), kind "
      "\"counter\" or \"gauge\", a counter's name without _total.");
}

}  // namespace
}  // namespace kvblock::python

PYBIND11_MODULE(_kvblock, m) {
  m.doc() = "kvblock: the KV-cache block manager of an LLM serving engine.";
  m.attr("__version__") = KVBLOCK_VERSION;
  kvblock::python::RegisterErrors(m);
  kvblock::python::BindConfig(m);
  kvblock::python::BindPool(m);
  kvblock::python::BindEvents(m);
  kvblock::python::BindManager(m);
  kvblock::python::BindTable(m);
  kvblock::python::BindCommit(m);
  kvblock::python::BindMetrics(m);
  kvblock::python::BindVllm(m);
}
