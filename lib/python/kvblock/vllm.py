# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""vLLM v1's KVCacheManager on kvblock: a drop-in for a vLLM engine.

Swap it in where vLLM constructs its manager (`vllm/v1/core/sched/
scheduler.py`)::

    from kvblock.vllm import KVCacheManager

and nothing else changes: `KVCacheManager(kv_cache_config, max_model_len,
hash_block_size, ...)` takes vLLM's arguments and objects (duck-typed), and
`get_computed_blocks`, `allocate_slots`, `free`, `get_blocks`,
`get_block_ids`, `cache_blocks`, `remove_skipped_blocks`, `evict_blocks`,
`take_new_block_ids`, `new_step_starts`, `usage`, `make_prefix_cache_stats`,
`reset_prefix_cache`, `take_events`, `get_num_common_prefix_blocks`,
`create_kv_cache_blocks` and `empty_kv_cache_blocks` behave as vLLM's
(vllm-project/vllm commit 28be48fa944d8c58aeffd1ab1b56e27828c6b268, its
`vllm/v1/core/kv_cache_manager.py`, `single_type_kv_cache_manager.py` and
`block_pool.py`). Each call is one C++ call (kvblock's VllmKvCacheManager).

What vLLM's scheduler and worker see is vLLM's:

- `num_blocks` blocks shared by every KV cache group; block 0 is the null
  block and is never handed out. Blocks are `KVCacheBlock` objects with
  `block_id`, `ref_cnt`, `block_hash` (digest + 4-byte group id) and
  `is_null`.
- Hybrid models: a config of several groups of full-attention
  (`FullAttentionSpec`, `MLAAttentionSpec`), sliding-window
  (`SlidingWindowSpec`) and chunked-local (`ChunkedLocalAttentionSpec`)
  specs, of block sizes that are multiples of `hash_block_size`, as vLLM's
  hybrid coordinator serves it: a request holds a block list a group, the
  blocks a window or chunk no longer reads are freed (null in the list) as
  the request advances (`allocate_slots`, `remove_skipped_blocks`), prefix
  hits are what every group can serve (EAGLE's drop included, in the
  `is_eagle_group` groups or all), a group of k times `hash_block_size`
  keys a block by its k request hashes joined, and events carry
  `group_idx`, `kv_cache_spec_kind` and `kv_cache_spec_sliding_window`.
- Prefix hits use the request's own `block_hashes`, which vLLM's `Request`
  computes with its block hasher (multimodal features, LoRA, cache salt and
  prompt embeddings folded in): hits and KV events equal vLLM's bit for bit,
  and two prompts with equal tokens and different images share no block. A
  request's hashes are converted once and kept on it (`_kvblock_chain`); a
  request without `block_hashes` is refused while caching is on.
  `get_request_block_hasher(block_size, "sha256_cbor" | "xxhash_cbor")` is a
  C++ hasher computing the same bytes as vLLM's CBOR hashers.
- Eviction is vLLM's order by default (one free queue, least recently freed
  first, a freed request's tail first), so block ids equal vLLM's call for
  call; `eviction_order="kvblock"` evicts never-cached blocks first (0.3 to
  1.4% more hits under pressure; ids then differ from vLLM's).
- `take_events` returns vLLM's own event classes when
  `vllm.distributed.kv_events` imports, look-alikes with the same fields
  otherwise; hashes as vLLM sends them (the low 64 bits as an int, or the
  digest's bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).

A host tier (`KVCacheManager(..., host_pages=N)`, one full-attention group):
the blocks the pool evicts are kept in N pages of host memory and loaded
back, as vLLM's OffloadingConnector serves its CPU tier.
`get_num_new_matched_tokens(request, num_computed_tokens)` is the
connector's (the tokens after the device hit the host tier can load, and
False: the loads are not asynchronous), `allocate_slots(...,
num_external_computed_tokens=N)` loads those blocks, `take_host_copies()`
hands out the copies to run (block id, host page, direction; stores first,
then loads, before the step's forward pass), and `take_events` adds the
connector's CPU events. VLLM.md has the loop and the differences.

Not supported (each refused with a clear error at construction): Mamba,
cross-attention, sink and encoder-only specs, context parallelism with
several groups (vLLM asserts against it too), and a metrics collector.
`block_pool` (used only to bind a KV connector) raises. Where vLLM fails an
assertion or raises half way, the adapter raises a kvblock.Error first and
changes nothing. The guide beside this file (VLLM.md) has the swap step by
step, the figures against vLLM's own manager (tools/bench/vllm_bench.py) and
the call-for-call check against it on hybrid configs
(tools/bench/vllm_check.py).

Thread safety: one scheduler thread owns a manager, as in vLLM; a call that
meets another one inside the manager (from another thread) raises
kvblock.FailedPreconditionError.
"""

import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Optional

from kvblock import _kvblock

# vLLM's event and stats classes where vLLM is installed, look-alikes with the
# same fields otherwise.
try:  # pragma: no cover - depends on the environment.
    from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                            BlockStored)
except ImportError:
    @dataclass
    class BlockStored:
        block_hashes: list
        parent_block_hash: object
        token_ids: list
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

    @dataclass
    class BlockRemoved:
        block_hashes: list
        medium: Optional[str]
        group_idx: Optional[int] = None

    @dataclass
    class AllBlocksCleared:
        pass

try:  # pragma: no cover - depends on the environment.
    from vllm.v1.metrics.stats import PrefixCacheStats
except ImportError:
    @dataclass
    class PrefixCacheStats:
        reset: bool = False
        requests: int = 0
        queries: int = 0
        hits: int = 0
        preempted_requests: int = 0
        preempted_queries: int = 0
        preempted_hits: int = 0

        def record(self, num_tokens: int, num_hits: int,
                   preempted: bool) -> None:
            if preempted:
                self.preempted_requests += 1
                self.preempted_queries += num_tokens
                self.preempted_hits += num_hits
            else:
                self.requests += 1
                self.queries += num_tokens
                self.hits += num_hits

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # vLLM's CPULoadStoreSpec.medium()
_HOST_WRITE_POLICIES = {
    "write_back": _kvblock.HostWritePolicy.WRITE_BACK,
    "write_through": _kvblock.HostWritePolicy.WRITE_THROUGH,
}
# vLLM's scheduler zeroes new blocks of these spec types only.
_ZEROED_SPECS = ("FullAttentionSpec", "TQFullAttentionSpec")
# vLLM's get_kv_cache_spec_kind, by class name, subclasses first.
_SPEC_KINDS = (
    ("SlidingWindowMLASpec", "sliding_window_mla"),
    ("MLAAttentionSpec", "mla_attention"),
    ("SinkFullAttentionSpec", "sink_full_attention"),
    ("FullAttentionSpec", "full_attention"),
    ("ChunkedLocalAttentionSpec", "chunked_local_attention"),
    ("SlidingWindowSpec", "sliding_window"),
)


class KVCacheBlock:
    """A block as vLLM's scheduler reads it; its state is the manager's."""

    __slots__ = ("block_id", "is_null", "_manager")

    def __init__(self, block_id: int, manager):
        self.block_id = block_id
        self.is_null = block_id == 0
        self._manager = manager

    @property
    def ref_cnt(self) -> int:
        return self._manager.ref_count(self.block_id)

    @property
    def block_hash(self) -> Optional[bytes]:
        """vLLM's BlockHashWithGroupId: the digest (for a group of k times
        the hash block size, its k request hashes joined) and the 4-byte
        group id."""
        cached = self._manager.cached_hash(self.block_id)
        if cached is None:
            return None
        group, digest = cached
        return digest + group.to_bytes(4, "big")

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


@dataclass
class KVCacheBlocks:
    """vLLM's KVCacheBlocks: `blocks[g]` holds group g's blocks."""

    blocks: tuple

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(list(a) + list(b)
                                   for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and all(len(group) == 0 for group in self.blocks):
            return None
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list:
        return [[b.block_id for b in group
                 if b.block_hash is None and not b.is_null]
                for group in self.blocks]

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(() for _ in self.blocks))


# Block hashing ---------------------------------------------------------------

_HASH_FUNCTIONS = ("sha256_cbor", "xxhash_cbor")
_none_hashes: dict = {}


def _hash_function_name(function) -> str:
    name = function if isinstance(function, str) else getattr(
        function, "__name__", repr(function))
    if name not in _HASH_FUNCTIONS:
        raise ValueError(
            f"kvblock's block hasher computes {' and '.join(_HASH_FUNCTIONS)}, "
            f"not {name!r} (vLLM's pickle-based sha256 and xxhash have no "
            "stable bytes outside Python)")
    return name


def none_hash(function) -> bytes:
    """The parent hash of a first block, as vLLM's `init_none_hash` makes it:
    vLLM's own NONE_HASH when vLLM is loaded and has set it, else H(the
    PYTHONHASHSEED string), else 32 random bytes (kept for the process)."""
    name = _hash_function_name(function)
    try:  # pragma: no cover - depends on the environment.
        from vllm.v1.core import kv_cache_utils
        return kv_cache_utils.NONE_HASH
    except (ImportError, AttributeError):
        pass
    if name not in _none_hashes:
        seed = os.getenv("PYTHONHASHSEED")
        _none_hashes[name] = (os.urandom(32) if seed is None else
                              _kvblock.vllm_digest(name, seed))
    return _none_hashes[name]


def _extra_keys(request, start: int, end: int, mm_index: int):
    """vLLM's generate_block_hash_extra_keys for tokens [start, end): the LoRA
    name, the multimodal (identifier, offset in block) pairs, the cache salt
    (first block only) and prompt-embedding digests; (keys or None, the next
    multimodal index)."""
    keys = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    features = getattr(request, "mm_features", None) or ()
    if features:
        last = features[-1].mm_position
        if last.offset + last.length > start:
            if mm_index < 0:
                mm_index += len(features)
            while mm_index < len(features):
                feature = features[mm_index]
                offset = feature.mm_position.offset
                length = feature.mm_position.length
                if end <= offset:
                    break
                if start >= offset + length:
                    mm_index += 1
                    continue
                keys.append((feature.identifier, offset - start))
                if end >= offset + length:
                    mm_index += 1
                else:
                    break
    salt = getattr(request, "cache_salt", None)
    if start == 0 and salt:
        keys.append(salt)
    if getattr(request, "prompt_embeds", None) is not None:
        keys.append(_prompt_embeds_digest(request, start, end))
    return (tuple(keys) if keys else None), mm_index


def _prompt_embeds_digest(request, start: int, end: int) -> bytes:
    """SHA-256 of the block's prompt embeddings' bytes, kept on the request
    as vLLM's hasher keeps it (`_prompt_embeds_per_block_hashes`)."""
    kept = request.__dict__.setdefault("_prompt_embeds_per_block_hashes", {})
    digest = kept.get((start, end))
    if digest is None:
        block = request.prompt_embeds[start:end]
        try:  # pragma: no cover - depends on the environment.
            from vllm.v1.utils import tensor_data
            data = tensor_data(block)
        except ImportError:  # a numpy array (or anything with its bytes).
            import numpy as np
            data = np.ascontiguousarray(block).tobytes()
        digest = kept[(start, end)] = hashlib.sha256(data).digest()
    return digest


def _extra_keys_from(request, start: int) -> list:
    """The extra keys of each full block of `request` from token `start` on,
    as vLLM's request block hasher computes them."""
    size = request._kvblock_block_size
    keys, mm_index = [], 0 if start == 0 else -1
    for begin in range(start, request.num_tokens - size + 1, size):
        block_keys, mm_index = _extra_keys(request, begin, begin + size,
                                           mm_index)
        keys.append(block_keys)
    return keys


def get_request_block_hasher(block_size: int, caching_hash_fn):
    """vLLM's get_request_block_hasher in C++: a function of a request that
    returns the hashes of its full blocks beyond `request.block_hashes`, the
    bytes vLLM's hasher computes (canonical CBOR of (parent, tokens,
    extra_keys), SHA-256 or XXH3-128, from vLLM's NONE_HASH)."""
    name = _hash_function_name(caching_hash_fn)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")

    def extra_keys(request, start):
        request._kvblock_block_size = block_size
        return _extra_keys_from(request, start)

    return _kvblock.vllm_request_block_hasher(name, block_size,
                                              none_hash(name), extra_keys)


# The manager -----------------------------------------------------------------

def _class_names(spec) -> set:
    return {cls.__name__ for cls in type(spec).__mro__}


def _spec_kind(spec) -> str:
    try:  # pragma: no cover - depends on the environment.
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind
        return get_kv_cache_spec_kind(spec).value
    except ImportError:
        names = _class_names(spec)
        return next((kind for name, kind in _SPEC_KINDS if name in names),
                    "unknown")


# vLLM's spec_manager_map: the spec classes each manager serves, by name.
_SLIDING_WINDOW_SPECS = ("SlidingWindowSpec", "SlidingWindowMLASpec")
_FULL_ATTENTION_SPECS = ("FullAttentionSpec", "TQFullAttentionSpec",
                         "MLAAttentionSpec", "HiddenStateCacheSpec")
_UNSUPPORTED_SPECS = ("MambaSpec", "CrossAttentionSpec",
                      "SinkFullAttentionSpec", "EncoderOnlyAttentionSpec",
                      "UniformTypeKVCacheSpecs")


def _group_spec(index: int, group, block_size: int):
    """kvblock's KvCacheGroupSpec for vLLM's KVCacheGroupSpec `group`, whose
    blocks hold `block_size` tokens."""
    spec = group.kv_cache_spec
    name = type(spec).__name__
    names = _class_names(spec)
    eagle = bool(getattr(group, "is_eagle_group", False))
    if names.intersection(_UNSUPPORTED_SPECS):
        raise NotImplementedError(
            f"kvblock.vllm serves full-attention, sliding-window and "
            f"chunked-local KV cache groups; group {index} is {name} "
            f"({', '.join(sorted(names.intersection(_UNSUPPORTED_SPECS)))})")
    if name in _SLIDING_WINDOW_SPECS:
        return _kvblock.KvCacheGroupSpec(
            kind=_kvblock.AttentionKind.SLIDING_WINDOW, page_size=block_size,
            sliding_window=spec.sliding_window, eagle=eagle)
    if name == "ChunkedLocalAttentionSpec":
        return _kvblock.KvCacheGroupSpec(
            kind=_kvblock.AttentionKind.CHUNKED_LOCAL, page_size=block_size,
            attention_chunk_size=spec.attention_chunk_size, eagle=eagle)
    if name in _FULL_ATTENTION_SPECS:
        # A FullAttentionSpec with a sliding_window is full attention to
        # vLLM's manager.
        return _kvblock.KvCacheGroupSpec(
            kind=_kvblock.AttentionKind.FULL, page_size=block_size,
            eagle=eagle)
    raise NotImplementedError(
        f"kvblock.vllm does not know KV cache group {index}'s spec {name}")


class KVCacheManager:
    """vLLM v1's KVCacheManager over kvblock (see the module's notes)."""

    def __init__(self, kv_cache_config, max_model_len: int,
                 hash_block_size: int,
                 max_num_batched_tokens: Optional[int] = None,
                 enable_caching: bool = True, use_eagle: bool = False,
                 log_stats: bool = False,
                 enable_kv_cache_events: bool = False,
                 dcp_world_size: int = 1, pcp_world_size: int = 1,
                 metrics_collector=None, *, eviction_order: str = "vllm",
                 host_pages: int = 0,
                 host_write_policy: str = "write_back"):
        groups = list(kv_cache_config.kv_cache_groups)
        if not groups:
            raise NotImplementedError(
                "kvblock.vllm needs at least one KV cache group")
        if metrics_collector is not None:
            raise NotImplementedError(
                "kvblock.vllm does not feed vLLM's KVCacheMetricsCollector")
        if eviction_order not in ("vllm", "kvblock"):
            raise ValueError(f"eviction_order must be 'vllm' or 'kvblock', "
                             f"got {eviction_order!r}")
        if host_write_policy not in _HOST_WRITE_POLICIES:
            raise ValueError(f"host_write_policy must be 'write_back' or "
                             f"'write_through', got {host_write_policy!r}")
        world = dcp_world_size * pcp_world_size
        if len(groups) > 1 and world != 1:
            raise ValueError(
                f"context parallelism (dcp_world_size {dcp_world_size}, "
                f"pcp_world_size {pcp_world_size}) does not serve hybrid "
                "models (vLLM asserts it too)")
        specs = [_group_spec(i, group, group.kv_cache_spec.block_size * world)
                 for i, group in enumerate(groups)]
        if len(groups) == 1:
            block_size = specs[0].page_size
            if enable_caching and hash_block_size != block_size:
                raise ValueError(
                    f"hash_block_size {hash_block_size} must equal the block "
                    f"size {block_size} of the one KV cache group")
            # One group's blocks are hashed at its own size, caching or not.
            hash_block_size = block_size
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = None
        self.block_size = specs[0].page_size
        self.hash_block_size = hash_block_size
        self.num_kv_cache_groups = len(groups)
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in groups))
        self._stats = PrefixCacheStats() if log_stats else None
        self._cpp = _kvblock.VllmKvCacheManager(
            num_blocks=kv_cache_config.num_blocks, block_size=hash_block_size,
            kv_cache_groups=specs, max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens or 0,
            enable_caching=enable_caching, use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            vllm_eviction_order=eviction_order == "vllm", log_stats=log_stats,
            host_pages=host_pages,
            host_write_policy=_HOST_WRITE_POLICIES[host_write_policy])
        # The calls of every step are C++ functions bound to the manager,
        # put on this object: vLLM's scheduler calls them with no Python
        # frame in between. allocate_slots, get_computed_blocks and free
        # take vLLM's arguments and return what vLLM's return, and
        # get_num_new_matched_tokens what vLLM's OffloadingConnector's
        # returns (their docstrings, and vllm_bindings.cc).
        (self.allocate_slots, self.get_computed_blocks, self.free,
         self.get_num_new_matched_tokens) = self._cpp.bind(
             self, [KVCacheBlock(i, self._cpp)
                    for i in range(kv_cache_config.num_blocks)],
             KVCacheBlocks, self.empty_kv_cache_blocks)
        self._group_sizes = [spec.page_size for spec in specs]
        self._zeroed_groups = [type(group.kv_cache_spec).__name__ in
                               _ZEROED_SPECS for group in groups]
        self._events = [] if enable_kv_cache_events else None
        # vLLM names a window for SlidingWindowSpec groups only.
        self._event_metadata = tuple(
            (_spec_kind(group.kv_cache_spec),
             getattr(group.kv_cache_spec, "sliding_window", None)
             if type(group.kv_cache_spec).__name__ in _SLIDING_WINDOW_SPECS
             else None)
            for group in groups)
        # As vllm/envs.py reads it, with events on: "00" is false, "x" a
        # ValueError.
        self._int_hashes = enable_kv_cache_events and bool(int(os.getenv(
            "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))

    @property
    def block_pool(self):
        raise NotImplementedError(
            "kvblock.vllm has no vLLM BlockPool to bind: KV connectors are not "
            "supported")

    # Queries -----------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self._cpp.usage

    @property
    def host_pages(self) -> int:
        """The host tier's pages (0: none)."""
        return self._cpp.host_pages

    @property
    def num_host_cached(self) -> int:
        """Host tier pages holding a block."""
        return self._cpp.num_host_cached

    @property
    def num_free_blocks(self) -> int:
        """vLLM's block_pool.get_num_free_blocks(): allocatable blocks."""
        return self._cpp.num_free_blocks

    @property
    def blocks(self) -> list:
        """Every block by id (vLLM's block_pool.blocks), for reading."""
        return self._cpp._blocks

    @property
    def prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        """The stats since the last make_prefix_cache_stats (vLLM's live
        object: the C++ counters are added to it when it is read)."""
        if self._stats is not None:
            self._cpp.add_prefix_cache_stats(self._stats)
        return self._stats

    def make_prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        stats = self.prefix_cache_stats
        if stats is not None:
            self._stats = PrefixCacheStats()
        return stats

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._cpp.blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple:
        return self._cpp.block_ids(request_id)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list:
        if not self.enable_caching:
            # vLLM's KVCacheCoordinatorNoPrefixCache.
            return [0] * self.num_kv_cache_groups
        return self._cpp.get_num_common_prefix_blocks(running_request_id)

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else \
            self.empty_kv_cache_blocks

    def take_events(self) -> list:
        """vLLM's events since the last call; with a host tier, the
        OffloadingConnector's CPU events after them (vLLM's scheduler appends
        the connector's to the manager's)."""
        if self._events is None:
            return []
        self._record_host()
        events, self._events = self._events, []
        for event in events:
            if isinstance(event, BlockStored) and event.group_idx is not None:
                (event.kv_cache_spec_kind,
                 event.kv_cache_spec_sliding_window) = \
                    self._event_metadata[event.group_idx]
        return events

    def take_host_copies(self):
        """The host tier's copies since the last call, a numpy array of
        kvblock.HOST_COPY_DTYPE rows (device_page: the block id, host_page,
        direction: kvblock.HostCopyDirection), in the order they were
        listed; empty without a host tier. Run every DEVICE_TO_HOST row (a
        store), then every HOST_TO_DEVICE row (a load), after the last
        step's forward pass and before this step's: take them once a step,
        after scheduling."""
        return self._cpp.take_host_copies()

    def take_new_block_ids(self) -> list:
        """The new blocks of the groups vLLM zeroes (full attention)."""
        return [block for zeroed, ids in
                zip(self._zeroed_groups, self._cpp.take_new_block_ids())
                if zeroed for block in ids]

    def new_step_starts(self) -> None:
        """vLLM's hook at each step's start; only Mamba groups use it."""

    # Changes -----------------------------------------------------------------

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        ranges = self._cpp.cache_blocks(request, num_computed_tokens)
        if self._events is not None:
            self._record(request, ranges)

    def remove_skipped_blocks(self, request_id: str,
                              total_computed_tokens: int) -> None:
        """Frees the blocks of the request's sliding-window and
        chunked-local groups that no later token reads; the null block takes
        their place."""
        self._cpp.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids) -> None:
        self._cpp.evict_blocks(list(block_ids))
        if self._events is not None:
            self._record_removed()

    def reset_prefix_cache(self) -> bool:
        """vLLM's; with a host tier it forgets the host tier's blocks too,
        and is refused (False) while copies are not taken."""
        if not self._cpp.reset_prefix_cache():
            return False
        if self._events is not None:
            # The host tier's events before the reset go out before it.
            self._record_host()
            self._events.append(AllBlocksCleared())
        return True

    def check_invariants(self) -> None:
        """kvblock's own check: the pool's invariants and every request's
        blocks are in use (raises kvblock.InternalError otherwise)."""
        self._cpp.check_invariants()

    # Events ------------------------------------------------------------------

    def _external(self, digest: bytes):
        return int.from_bytes(digest[-8:], "big") if self._int_hashes \
            else digest

    def _record_removed(self) -> None:
        for group, digest in self._cpp.take_removed_hashes():
            self._events.append(BlockRemoved(
                block_hashes=[self._external(digest)], medium=MEDIUM_GPU,
                group_idx=group))

    def _record_host(self) -> None:
        """The host tier's stores and drops, as the OffloadingConnector's
        take_events yields them: consecutive ones of a kind in one event,
        the hashes the digests themselves (the connector's
        get_offload_block_hash; vLLM converts only the manager's)."""
        for removed, run in itertools.groupby(self._cpp.take_host_events(),
                                              key=lambda event: event[0]):
            hashes = [digest for _, digest in run]
            self._events.append(
                BlockRemoved(block_hashes=hashes, medium=MEDIUM_CPU)
                if removed else
                BlockStored(block_hashes=hashes, parent_block_hash=None,
                            token_ids=[], block_size=0, lora_id=None,
                            medium=MEDIUM_CPU, lora_name=None))

    def _joined(self, hashes, group: int, block: int) -> bytes:
        """vLLM's BlockHashListWithBlockSize entry `block` of `group`."""
        scale = self._group_sizes[group] // self.hash_block_size
        return b"".join(hashes[block * scale:(block + 1) * scale])

    def _record(self, request, ranges) -> None:
        """The events of a call that evicted blocks and cached blocks
        [cached_from, cached_to) of each group of `request` (`ranges`), in
        vLLM's order: the evictions, then a BlockStored a group that cached
        (null blocks and the ones the group does not cache left out, as
        vLLM's cache_full_blocks does). The C++ allocate_slots calls it when
        events are on."""
        self._record_removed()
        ids = None
        hashes = request.block_hashes
        lora = getattr(request, "lora_request", None)
        for group, (cached_from, cached_to) in enumerate(ranges):
            if cached_to <= cached_from:
                continue
            if ids is None:
                ids = self._cpp.block_ids(request.request_id)
            size = self._group_sizes[group]
            stored, extra, mm_index = [], [], 0
            for block in range(cached_from, cached_to):
                if ids[group][block] == 0 or \
                        not self._cpp.caches_block(group, block):
                    continue
                stored.append(self._external(
                    self._joined(hashes, group, block)))
                keys, mm_index = _extra_keys(request, block * size,
                                             (block + 1) * size, mm_index)
                extra.append(keys)
            self._events.append(BlockStored(
                block_hashes=stored,
                parent_block_hash=(None if cached_from == 0 else
                                   self._external(self._joined(
                                       hashes, group, cached_from - 1))),
                token_ids=list(request.all_token_ids[cached_from * size:
                                                     cached_to * size]),
                block_size=size,
                lora_id=None if lora is None else lora.adapter_id,
                medium=MEDIUM_GPU,
                lora_name=None if lora is None else lora.name,
                extra_keys=extra or None,
                group_idx=group))
