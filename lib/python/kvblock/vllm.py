# Copyright 2026 The kvblock Authors.
"""A vLLM v1-shaped KV cache manager on kvblock.

`KVCacheManager` has the scheduler-facing methods of vLLM v1's
`vllm/v1/core/kv_cache_manager.py` (followed at vllm-project/vllm commit
003df2961dd8830c317a61f9745ccd557da9fa06): `get_computed_blocks`,
`allocate_slots`, `free`, `get_blocks`, `get_block_ids`, `usage`,
`make_prefix_cache_stats`, `reset_prefix_cache`, `take_events`,
`get_num_common_prefix_blocks`, `remove_skipped_blocks`,
`create_kv_cache_blocks` and `empty_kv_cache_blocks`. Requests are
duck-typed with vLLM's `Request` field names: `request_id`,
`all_token_ids`, `num_tokens`, `num_computed_tokens`, `cache_salt`,
`lora_request` (its `lora_int_id`), `skip_reading_prefix_cache` and
`status` (a name ending in WAITING or PREEMPTED gets the watermark).

Where vLLM's semantics and kvblock's differ:

- Block ids are kvblock page ids, 0 to num_blocks - 1. There is no null
  block (vLLM reserves block 0 as one): every id is a real page, and a
  request's blocks never contain a placeholder (full attention only; a
  sliding window is not supported, so `remove_skipped_blocks` frees
  nothing).
- `get_computed_blocks` counts the hit but takes no reference: kvblock
  takes the hit pages atomically with the admission in `allocate_slots`,
  so nothing is held between the two calls. Its `KVCacheBlocks` carries
  the hit pages' count, not their ids; `allocate_slots` returns the ids of
  all the request's new pages, the hits included, on admission.
- Prefix hashes are kvblock's (SHA-256 chains with the cache salt and the
  LoRA id, byte for byte as `include/kvblock/block_hash.h` specifies), not
  vLLM's; a hit is a whole page, and a fully cached prompt recomputes its
  last page, as in vLLM.
- Free and evictable pages: a freed request's full pages stay cached and
  are evicted least recently used first (vLLM frees a request's blocks in
  reverse order so that tail blocks go first; kvblock evicts a chain's tail
  before its head too). `usage` counts evictable pages as free, as vLLM's
  `get_usage` does.
- Draft (lookahead) slots are never cached. The pages holding them are
  kept while the request runs (a request's block list only grows, as
  vLLM's scheduler expects), so a step that rejects drafts keeps those
  pages for the next drafts.
- `full_sequence_must_fit` is the manager's `reserve_prompt_pages`: set at
  construction (on by default) rather than per call; the pages of a
  chunked prompt's rest are reserved at admission.
- KV events (`enable_kv_cache_events`): `take_events` returns
  `BlockStored`, `BlockRemoved` and `AllBlocksCleared` with vLLM's field
  names; block hashes are kvblock's, in vLLM's integer form (the low 64
  bits of the big-endian digest), the cache salt goes in `extra_keys` (one
  `(salt,)` a block, None without one) and the LoRA adapter in `lora_id`
  and `lora_name` (the name of the request that admitted it). `medium` is
  "GPU"; `block_size` the page size.
- `reset_prefix_cache` returns False while any page is in use, as vLLM's.
"""

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

import kvblock


@dataclass
class KVCacheBlocks:
    """Page ids by KV cache group (one group: full attention)."""

    blocks: tuple  # tuple[list[int], ...]
    # get_computed_blocks: the hit pages, taken at admission.
    num_hit_blocks: int = 0

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(
            tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)),
            self.num_hit_blocks + other.num_hit_blocks)

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and all(len(group) == 0 for group in self.blocks):
            return None
        return tuple(list(group) for group in self.blocks)

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(() for _ in self.blocks))


def _hash_int(digest: bytes) -> int:
    """vLLM's integer form of a block hash: the digest's low 64 bits."""
    return int.from_bytes(digest[-8:], "big")


@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: Optional[int]
    token_ids: list
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = "GPU"
    lora_name: Optional[str] = None
    extra_keys: Optional[list] = None


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: Optional[str] = "GPU"


@dataclass
class AllBlocksCleared:
    pass


@dataclass
class PrefixCacheStats:
    """What get_computed_blocks saw since the last make_prefix_cache_stats."""

    reset: bool = False
    requests: int = 0
    queries: int = 0  # prompt tokens looked up.
    hits: int = 0  # of those, served from the cache.
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


def _is_waiting(request) -> bool:
    status = getattr(request, "status", None)
    name = getattr(status, "name", str(status))
    return name.endswith("WAITING") or name.endswith("PREEMPTED")


def _extra_keys(request):
    salt = getattr(request, "cache_salt", None) or ""
    lora = getattr(request, "lora_request", None)
    adapter = getattr(lora, "lora_int_id", 0) if lora is not None else 0
    return salt, adapter


class _Tracked:
    """A request's sequence, and its counts as the manager has them (kept
    here so that a decode makes one call into the manager)."""

    __slots__ = ("seq", "tokens", "prompt_left", "drafts", "pages",
                 "prompt_hashes")

    def __init__(self, seq, tokens, prompt_left):
        self.seq = seq  # kvblock sequence id.
        self.tokens = tokens  # tokens in the sequence.
        self.prompt_left = prompt_left  # prompt tokens not yet in it.
        self.drafts = 0  # draft slots it holds.
        self.pages = 0  # pages the scheduler has been told about.
        self.prompt_hashes = None  # the admission's, for its prompt chunks.


class KVCacheManager:
    """vLLM v1's KVCacheManager interface over kvblock.BlockManager."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 max_num_seqs: int = 256, enable_caching: bool = True,
                 log_stats: bool = False, enable_kv_cache_events: bool = False,
                 watermark: float = 0.0, full_sequence_must_fit: bool = True,
                 hash_algorithm=kvblock.HashAlgorithm.SHA256):
        config = kvblock.PagedKvConfig()
        config.num_pages = num_blocks
        config.page_size = block_size
        config.max_batch = max_num_seqs
        config.max_pages_per_seq = -(-max_model_len // block_size)
        options = kvblock.BlockManagerOptions()
        options.enable_prefix_caching = enable_caching
        options.hash_algorithm = hash_algorithm
        options.reserve_prompt_pages = full_sequence_must_fit
        options.enable_kv_events = enable_kv_cache_events
        # Enough entries for every running request and the admissions of a
        # step.
        options.max_sequences = 4 * max_num_seqs
        self.manager = kvblock.BlockManager(config, options)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.watermark_blocks = int(watermark * num_blocks)
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        self.enable_kv_cache_events = enable_kv_cache_events
        self._lora_names: dict = {}  # lora_int_id -> lora_name, for events.
        self._requests: dict = {}  # request_id -> _Tracked
        self._next_seq = 0
        # The last get_computed_blocks' request id, prompt array and hashes:
        # allocate_slots of the same request reuses them.
        self._looked_up = (None, None, None)

    # Queries -----------------------------------------------------------------

    @property
    def usage(self) -> float:
        """Pages in use (referenced by a request), in [0, 1]."""
        return 1.0 - self.manager.num_free / self.num_blocks

    def make_prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request):
        """The prefix hit of a waiting request: (blocks, computed tokens).

        Takes no reference (see the module's notes): the hit pages are taken
        by allocate_slots, which admits the request."""
        if not self.enable_caching or getattr(
                request, "skip_reading_prefix_cache", False):
            return self.empty_kv_cache_blocks, 0
        prompt, hashes = self._prompt_of(request)
        salt, adapter = _extra_keys(request)
        plan = self.manager.plan_admission(prompt, cache_salt=salt,
                                           adapter_id=adapter,
                                           prompt_hashes=hashes)
        if self.log_stats:
            stats = self.prefix_cache_stats
            stats.requests += 1
            stats.queries += request.num_tokens
            stats.hits += plan.hit_tokens
            if getattr(request, "num_preemptions", 0) > 0:
                stats.preempted_requests += 1
                stats.preempted_queries += request.num_tokens
                stats.preempted_hits += plan.hit_tokens
        if plan.hit_pages == 0:
            return self.empty_kv_cache_blocks, 0
        return KVCacheBlocks(([],), plan.hit_pages), plan.hit_tokens

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        tracked = self._requests.get(request_id)
        if tracked is None:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks((self.manager.pages(tracked.seq),))

    def get_block_ids(self, request_id: str) -> tuple:
        return self.get_blocks(request_id).get_block_ids()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list:
        """Leading pages of the request that every request holding pages
        shares."""
        tracked = self._requests.get(running_request_id)
        if tracked is None:
            return [0]
        holders = len(self.manager)
        common = 0
        for page in self.manager.pages(tracked.seq):
            if self.manager.ref_count(page) != holders:
                break
            common += 1
        return [common]

    def take_events(self) -> list:
        """The KV cache events since the last call (none unless
        enable_kv_cache_events)."""
        if not self.enable_kv_cache_events:
            return []
        events = []
        for e in self.manager.take_kv_events():
            if e.kind == "BlockStored":
                adapter = e.adapter_id or None
                events.append(BlockStored(
                    block_hashes=[_hash_int(h) for h in e.block_hashes],
                    parent_block_hash=(None if e.parent_block_hash is None
                                       else _hash_int(e.parent_block_hash)),
                    token_ids=list(e.token_ids),
                    block_size=self.block_size,
                    lora_id=adapter,
                    lora_name=self._lora_names.get(adapter),
                    extra_keys=([(e.cache_salt,)] * len(e.block_hashes)
                                if e.cache_salt else None)))
            elif e.kind == "BlockRemoved":
                events.append(BlockRemoved(
                    block_hashes=[_hash_int(h) for h in e.block_hashes]))
            else:
                events.append(AllBlocksCleared())
        return events

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(blocks))

    # Changes -----------------------------------------------------------------

    def allocate_slots(self, request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       **unsupported) -> Optional[KVCacheBlocks]:
        """Slots for `num_new_tokens` more tokens of `request` (drafts
        included) and `num_lookahead_tokens` lookahead slots; the new pages,
        or None when the pool cannot hold them (nothing changes then)."""
        tracked = self._requests.get(request.request_id)
        if (tracked is not None and num_new_tokens == 1 and
                not num_lookahead_tokens and not tracked.drafts and
                not tracked.prompt_left and not delay_cache_blocks and
                not unsupported):
            # Decode, the common call: the last sampled token goes in.
            tokens = request.all_token_ids
            if request.num_computed_tokens + 1 == len(tokens) == \
                    tracked.tokens + 1:
                try:
                    self.manager.append_token(tracked.seq, tokens[-1])
                except kvblock.ResourceExhaustedError:
                    return None
                tracked.tokens += 1
                if tracked.tokens % self.block_size != 1 and \
                        self.block_size != 1:
                    return self.empty_kv_cache_blocks
                return self._new_pages(tracked)
        if num_new_tokens <= 0:
            raise ValueError(
                f"num_new_tokens must be positive, got {num_new_tokens}")
        if delay_cache_blocks or any(unsupported.values()):
            raise kvblock.UnimplementedError(
                "kvblock.vllm: delayed caching and KV connectors are not "
                f"supported (got delay_cache_blocks={delay_cache_blocks}, "
                f"{ {k: v for k, v in unsupported.items() if v} })")
        if tracked is None:
            return self._admit(request, num_new_tokens, num_new_computed_tokens,
                               num_lookahead_tokens)
        return self._extend(request, tracked, num_new_tokens,
                            num_lookahead_tokens)

    def free(self, request) -> None:
        tracked = self._requests.pop(request.request_id, None)
        if tracked is not None:
            self.manager.free(tracked.seq)

    def remove_skipped_blocks(self, request_id: str,
                              num_computed_tokens: int, *args) -> None:
        """Full attention skips no block: nothing to free."""

    def reset_prefix_cache(self) -> bool:
        try:
            self.manager.reset_prefix_cache()
        except kvblock.FailedPreconditionError:
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    # Internals ---------------------------------------------------------------

    def _prompt_of(self, request):
        """The request's tokens as an array and their page hashes, made once
        for get_computed_blocks and allocate_slots."""
        looked_up_id, prompt, hashes = self._looked_up
        if looked_up_id != request.request_id or len(prompt) != \
                request.num_tokens:
            prompt = np.array(request.all_token_ids[:request.num_tokens],
                              dtype=np.int32)
            hashes = None
            if self.enable_caching:
                salt, adapter = _extra_keys(request)
                hashes = self.manager.hash_prompt(prompt, cache_salt=salt,
                                                  adapter_id=adapter)
            self._looked_up = (request.request_id, prompt, hashes)
        return prompt, hashes

    def _new_pages(self, tracked: _Tracked) -> KVCacheBlocks:
        # The manager holds the pages of tokens + drafts (its invariant).
        held = -(-(tracked.tokens + tracked.drafts) // self.block_size)
        if held == tracked.pages:
            return self.empty_kv_cache_blocks
        new = self.manager.pages(tracked.seq, tracked.pages)
        tracked.pages = held
        return KVCacheBlocks((new,))

    def _admit(self, request, num_new_tokens, num_new_computed_tokens,
               num_lookahead_tokens):
        salt, adapter = _extra_keys(request)
        if adapter and self.enable_kv_cache_events:
            self._lora_names[adapter] = getattr(request.lora_request,
                                                "lora_name", None)
        prompt, hashes = self._prompt_of(request)
        self._looked_up = (None, None, None)
        read_cache = self.enable_caching and not getattr(
            request, "skip_reading_prefix_cache", False)
        plan = self.manager.plan_admission(
            prompt, cache_salt=salt, adapter_id=adapter, prompt_hashes=hashes,
            prefill_tokens=num_new_tokens, read_prefix_cache=read_cache)
        if plan.hit_tokens != num_new_computed_tokens:
            raise kvblock.FailedPreconditionError(
                f"kvblock.vllm: request {request.request_id} was given "
                f"{num_new_computed_tokens} computed tokens, the cache now "
                f"holds {plan.hit_tokens} (get_computed_blocks is stale)")
        watermark = self.watermark_blocks if _is_waiting(request) else 0
        if (plan.pages_consumed + plan.reserved_pages >
                self.manager.num_allocatable - watermark):
            return None
        seq = self._next_seq
        self._next_seq += 1
        try:
            self.manager.admit(seq, prompt, cache_salt=salt,
                               adapter_id=adapter, prompt_hashes=hashes,
                               prefill_tokens=num_new_tokens,
                               read_prefix_cache=read_cache)
        except kvblock.ResourceExhaustedError:
            return None
        tokens = plan.hit_tokens + plan.computed_tokens
        tracked = _Tracked(seq, tokens, len(prompt) - tokens)
        tracked.prompt_hashes = hashes
        self._requests[request.request_id] = tracked
        if num_lookahead_tokens > 0 and tracked.prompt_left == 0:
            try:
                self.manager.set_drafts(seq, num_lookahead_tokens)
            except kvblock.ResourceExhaustedError:
                self._requests.pop(request.request_id)
                self.manager.free(seq)
                return None
            tracked.drafts = num_lookahead_tokens
        return self._new_pages(tracked)

    def _extend(self, request, tracked, num_new_tokens, num_lookahead_tokens):
        manager = self.manager
        seq = tracked.seq
        have = tracked.tokens
        tokens = request.all_token_ids
        # Known tokens (prompt and sampled) go in; drafts get slots only.
        end = request.num_computed_tokens + num_new_tokens
        target = min(end, request.num_tokens)
        left = tracked.prompt_left
        prompt_part = min(left, max(0, target - have))
        appended = max(0, target - have - prompt_part)
        drafts_after_append = max(0, tracked.drafts - appended)
        drafts = None  # unchanged
        if left == prompt_part:  # the prompt is done after this call.
            # The pages held stay (the block list only grows): the drafts'
            # end reaches into the last page held.
            slots = end + num_lookahead_tokens - target
            held = -(-(have + tracked.drafts) // self.block_size)
            slots = max(slots, (held - 1) * self.block_size + 1 - target)
            if slots != drafts_after_append:
                drafts = slots
        calls = (prompt_part > 0) + (appended > 0) + (drafts is not None)
        if calls > 1:
            manager.begin_step()
        try:
            if prompt_part > 0:
                manager.append_prompt(
                    seq,
                    np.array(tokens[have:have + prompt_part], dtype=np.int32),
                    prompt_hashes=getattr(tracked, "prompt_hashes", None))
            if appended == 1:
                manager.append_token(seq, tokens[target - 1])
            elif appended > 1:
                manager.append(seq, np.array(tokens[target - appended:target],
                                             dtype=np.int32))
            if drafts is not None:
                manager.set_drafts(seq, drafts)
        except BaseException as error:
            if calls > 1:
                manager.rollback_step()
            if isinstance(error, kvblock.ResourceExhaustedError):
                return None
            raise
        if calls > 1:
            manager.commit_step()
        tracked.tokens = target
        tracked.prompt_left = left - prompt_part
        tracked.drafts = drafts_after_append if drafts is None else drafts
        return self._new_pages(tracked)

    def check_invariants(self) -> None:
        """The manager's invariants, and every tracked request is live."""
        self.manager.check_invariants()
        manager = self.manager
        for request_id, tracked in self._requests.items():
            counts = (manager.num_tokens(tracked.seq),
                      manager.prompt_tokens_left(tracked.seq),
                      manager.num_drafts(tracked.seq),
                      len(manager.pages(tracked.seq)))
            mine = (tracked.tokens, tracked.prompt_left, tracked.drafts,
                    tracked.pages)
            if counts != mine:
                raise kvblock.InternalError(
                    f"kvblock.vllm: request {request_id}: the manager has "
                    f"(tokens, prompt left, drafts, pages) {counts}, the "
                    f"adapter {mine}")

    def __len__(self) -> int:
        return len(self._requests)
