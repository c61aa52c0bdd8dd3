# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock.vllm.KVCacheManager on hybrid models' KV cache configs, against
vLLM's contract.

The hybrid cases of vLLM's tests/v1/core/test_prefix_caching.py and the
sliding-window and chunked-local cases of test_single_type_kv_cache_manager.py
(vllm-project/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268) that a
manager's public calls reach, in our words: where vLLM's test takes a hash
out of its pool's map for a moment, this one evicts the block holding it
from a manager set up the same way (`evict_blocks`), and asserts what vLLM's
asserts. tools/bench/vllm_check.py runs vLLM's own manager beside this one
on random hybrid traces and compares every call."""
import collections
import math
import random

import pytest

import kvblock
from kvblock.vllm import BlockRemoved, BlockStored, KVCacheManager
from test_vllm import HASH, admit, make_request
from vllm_standins import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                           KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec,
                           reference_hash)

BLOCK = 16


def spec_of(kind, block_size=BLOCK):
    """vLLM's test specs: "full", "sliding_window" (a window of 2 blocks),
    "sliding_window_large" (4 blocks), "swa<N>" (N blocks), "chunk<N>"."""
    if kind == "full":
        return FullAttentionSpec(block_size)
    if kind == "sliding_window":
        return SlidingWindowSpec(block_size, 2 * block_size)
    if kind == "sliding_window_large":
        return SlidingWindowSpec(block_size, 4 * block_size)
    if kind.startswith("swa"):
        return SlidingWindowSpec(block_size, int(kind[3:]) * block_size)
    return ChunkedLocalAttentionSpec(block_size, int(kind[5:]) * block_size)


def make_hybrid(kinds, num_blocks, hash_block_size=BLOCK, **kwargs):
    specs = [spec if not isinstance(spec, str) else spec_of(spec)
             for spec in kinds]
    config = KVCacheConfig(num_blocks, [], [
        KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)])
    return KVCacheManager(config, max_model_len=kwargs.pop("max_model_len",
                                                           8192),
                          hash_block_size=hash_block_size, **kwargs)


def block_hashes_of(tokens, block_size=BLOCK):
    """The request's chain as vLLM's sha256_cbor hasher computes it."""
    from kvblock.vllm import none_hash
    chain, parent = [], none_hash(HASH)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = reference_hash(HASH, parent, tokens[start:start + block_size],
                                None)
        chain.append(parent)
    return chain


COMMON = [i for i in range(3) for _ in range(BLOCK)]


# vLLM's test_prefill_hybrid_model: one full group and two equal 2-block
# windows.
def test_prefill_hybrid_model_shares_the_window_and_nulls_the_rest():
    manager = make_hybrid(["full", "swa2", "swa2"], 21)
    tokens = COMMON + [3] * 7
    req0 = make_request("0", tokens)
    blocks, hits, new = admit(manager, req0)
    assert not blocks.blocks[0] and hits == 0
    assert new.get_block_ids() == ([1, 2, 3, 4], [5, 6, 7, 8],
                                   [9, 10, 11, 12])
    chain = block_hashes_of(tokens)
    for index, row in enumerate(((1, 5, 9), (2, 6, 10), (3, 7, 11))):
        for group, block_id in enumerate(row):
            block = manager.blocks[block_id]
            assert block.block_hash == chain[index] + group.to_bytes(4, "big")
            assert block.ref_cnt == 1
    for block_id in (4, 8, 12):
        assert manager.blocks[block_id].block_hash is None
        assert manager.blocks[block_id].ref_cnt == 1

    req1 = make_request("1", COMMON + [3] * 5)
    blocks, hits, new = admit(manager, req1)
    assert blocks.get_block_ids() == ([1, 2, 3], [0, 6, 7], [0, 10, 11])
    assert hits == 48
    assert new.get_block_ids() == ([13], [14], [15])
    assert all(block.ref_cnt == 2 for group in blocks.blocks
               for block in group if not block.is_null)
    manager.check_invariants()


# vLLM's _test_partial_request_hit cases of test_prefill_hybrid_model: which
# cached blocks (group, block index) are gone, and the hit left, in blocks.
@pytest.mark.parametrize("evicted,hit", [
    ([(1, 0), (2, 0)], 3),  # outside every window: the hit stands.
    ([(0, 0)], 0),  # full attention's first block: nothing.
    ([(0, 2), (1, 2), (2, 2)], 2),
    ([(0, 2)], 2),
    ([(1, 2)], 2),
    ([(2, 2)], 2),
    # Full attention serves one block, the windows the first two: nothing
    # both serve.
    ([(0, 2), (1, 0), (2, 0)], 0),
])
def test_a_hybrid_hit_is_what_every_group_can_serve(evicted, hit):
    manager = make_hybrid(["full", "swa2", "swa2"], 21)
    tokens = COMMON + [3] * 5
    req0 = make_request("0", COMMON + [3] * 7)
    held = admit(manager, req0)[2].get_block_ids()
    manager.free(req0)
    manager.evict_blocks([held[group][index] for group, index in evicted])
    blocks, hits = manager.get_computed_blocks(make_request("2", tokens))
    assert hits == hit * BLOCK
    assert all(len(group) == hit for group in blocks.blocks)


# vLLM's test_prefill_hybrid_model_eagle: 3-block windows, EAGLE.
def test_prefill_hybrid_model_eagle_drops_the_last_block_once():
    manager = make_hybrid(["full", "swa3", "swa3"], 31, use_eagle=True)
    common = [i for i in range(6) for _ in range(BLOCK)]
    req0 = make_request("0", common + [6] * 7)
    blocks, hits, new = admit(manager, req0)
    assert hits == 0
    assert new.get_block_ids() == (list(range(1, 8)), list(range(8, 15)),
                                   list(range(15, 22)))
    req1 = make_request("1", common + [6] * 5)
    blocks, hits, new = admit(manager, req1)
    assert blocks.get_block_ids() == ([1, 2, 3, 4, 5], [0, 0, 10, 11, 12],
                                      [0, 0, 17, 18, 19])
    assert hits == 5 * BLOCK
    assert new.get_block_ids() == ([22, 23], [24, 25], [26, 27])
    manager.check_invariants()


@pytest.mark.parametrize("evicted,hit", [
    ([(1, 0), (2, 0)], 5),
    ([(0, 0)], 0),
    ([(0, 5), (1, 5), (2, 5)], 4),
    ([(0, 5)], 4),
    # The full group's last block is dropped for EAGLE anyway; a window
    # block before it cuts the hit to 3.
    ([(1, 4)], 3),
    ([(2, 4)], 3),
    # Full attention keeps 4 blocks after the drop; the windows' block 0 is
    # outside the window of a 4-block hit.
    ([(0, 5), (1, 0), (2, 0)], 4),
])
def test_an_eagle_hybrid_hit_is_what_every_group_can_serve(evicted, hit):
    manager = make_hybrid(["full", "swa3", "swa3"], 31, use_eagle=True)
    common = [i for i in range(6) for _ in range(BLOCK)]
    req0 = make_request("0", common + [6] * 7)
    held = admit(manager, req0)[2].get_block_ids()
    manager.free(req0)
    manager.evict_blocks([held[group][index] for group, index in evicted])
    blocks, hits = manager.get_computed_blocks(
        make_request("2", common + [6] * 5))
    assert hits == hit * BLOCK
    assert all(len(group) == hit for group in blocks.blocks)


# vLLM's test_prefill_hybrid_model_combinations, less its Mamba cases.
@pytest.mark.parametrize("kinds", [
    ["full", "sliding_window"],
    ["sliding_window", "sliding_window_large"],
    ["full", "sliding_window", "sliding_window"],
    ["full", "sliding_window", "sliding_window_large"],
    ["full", "full", "sliding_window"],
    ["full", "sliding_window", "full", "sliding_window_large"],
    ["full", "chunk4", "sliding_window"],
])
def test_every_combination_of_groups_hits_the_common_prefix(kinds):
    manager = make_hybrid(kinds, 10 * len(kinds))
    req0 = make_request("0", COMMON + [3] * 7)
    blocks, hits, new = admit(manager, req0)
    assert not blocks.blocks[0] and hits == 0
    assert len(new.get_block_ids()) == len(kinds)
    manager.new_step_starts()
    req1 = make_request("1", COMMON + [4] * 5)
    blocks, hits, new = admit(manager, req1)
    assert hits == 3 * BLOCK
    assert len(blocks.blocks) == len(kinds)
    assert new is not None and len(new.get_block_ids()) == len(kinds)
    manager.free(req0)
    manager.free(req1)
    manager.check_invariants()


# vLLM's test_prefill_hybrid_model_combinations_eagle.
def test_an_eagle_combination_drops_one_block_for_all():
    manager = make_hybrid(["full", "sliding_window"], 20, use_eagle=True)
    common = [i for i in range(4) for _ in range(BLOCK)]
    admit(manager, make_request("0", common + [4] * 7))
    blocks, hits, new = admit(manager, make_request("1", common + [6] * 5))
    assert hits == 3 * BLOCK
    assert all(len(group) == 3 for group in blocks.blocks)
    assert new is not None


# vLLM's test_different_block_size: 32-token full blocks, 16-token window
# blocks, hashed every 16 tokens.
def test_groups_of_different_block_sizes_hit_on_both_units():
    manager = make_hybrid([FullAttentionSpec(32), SlidingWindowSpec(16, 32)],
                          100)
    tokens = [i for i in range(10) for _ in range(BLOCK)]
    req0 = make_request("0", tokens)
    blocks, hits = manager.get_computed_blocks(req0)
    assert not blocks.blocks[0] and not blocks.blocks[1] and hits == 0
    new = manager.allocate_slots(req0, 7 * BLOCK, 0, blocks)
    assert new.get_block_ids() == ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11])
    # A 32-token block is cached under its two 16-token hashes, joined.
    chain = block_hashes_of(tokens)
    assert manager.blocks[1].block_hash == chain[0] + chain[1] + bytes(4)
    assert manager.blocks[5].block_hash == chain[0] + (1).to_bytes(4, "big")
    for length in (7 * BLOCK + 1, 6 * BLOCK + 1):
        blocks, hits = manager.get_computed_blocks(
            make_request("1", tokens[:length]))
        assert [len(group) for group in blocks.blocks] == [3, 6]
        assert hits == 6 * BLOCK
    # Without the window's blocks 5 and 6 its hit is 5 blocks, and the full
    # group's must be a multiple of 32 tokens: 4 blocks of 16.
    manager.evict_blocks([10, 11])
    blocks, hits = manager.get_computed_blocks(
        make_request("2", tokens[:7 * BLOCK + 1]))
    assert [len(group) for group in blocks.blocks] == [2, 4]
    assert hits == 4 * BLOCK
    manager.check_invariants()


# vLLM's test_hybrid_cache_blocks_swa_tail_window_only: 32-token full
# blocks, an 8-token window of 8-token blocks; a window block caches only
# where a 32-token-aligned hit ends.
def test_a_window_caches_only_the_blocks_a_hit_can_use():
    manager = make_hybrid([FullAttentionSpec(32), SlidingWindowSpec(8, 8)],
                          100, hash_block_size=8)
    tokens = [i for i in range(8) for _ in range(8)]
    req = make_request("0", tokens, block_size=8)
    blocks, hits, new = admit(manager, req, 8 * 8)
    assert new is not None and len(req.block_hashes) == 8
    window = manager.get_block_ids("0")[1]
    cached = [manager.blocks[b].block_hash is not None for b in window]
    assert cached == [False, False, False, True, False, False, False, True]


# vLLM's test_hybrid_cache_blocks_clamped_to_lcm: nothing past the last
# 32-token boundary is cached.
def test_caching_stops_at_the_last_multiple_of_every_block_size():
    manager = make_hybrid([FullAttentionSpec(32), SlidingWindowSpec(16, 32)],
                          100)
    tokens = [i for i in range(7) for _ in range(BLOCK)]
    req = make_request("0", tokens)
    new = admit(manager, req, 7 * BLOCK)[2]
    assert new is not None and len(req.block_hashes) == 7
    full, window = manager.get_block_ids("0")
    assert [manager.blocks[b].block_hash is not None for b in full] == \
        [True, True, True, False]
    assert [manager.blocks[b].block_hash is not None for b in window] == \
        [True] * 6 + [False]


# vLLM's test_cache_blocks_multi_group: a hash is cached in each group under
# its own key, so one group losing it leaves the other's.
def test_each_group_caches_a_hash_under_its_own_key():
    manager = make_hybrid(["full", "full"], 20, max_model_len=1024)
    req = make_request("0", list(range(40)))
    held = admit(manager, req)[2].get_block_ids()
    manager.free(req)
    manager.evict_blocks([held[0][1]])
    assert manager.blocks[held[1][1]].block_hash is not None
    blocks, hits = manager.get_computed_blocks(make_request("1",
                                                            list(range(40))))
    assert hits == BLOCK and blocks.get_block_ids() == ([held[0][0]],
                                                        [held[1][0]])


# vLLM's test_block_stored_event_group_idx_multiple_groups and
# test_block_removed_event_group_idx.
def test_events_name_each_group_with_its_kind_and_window():
    manager = make_hybrid([FullAttentionSpec(4), SlidingWindowSpec(4, 128),
                           ChunkedLocalAttentionSpec(4, 8)], 7,
                          hash_block_size=4, enable_kv_cache_events=True)
    req = make_request("0", list(range(8)), block_size=4)
    admit(manager, req, 8)
    stored = manager.take_events()
    assert [type(e) for e in stored] == [BlockStored] * 3
    assert [(e.group_idx, e.kv_cache_spec_kind,
             e.kv_cache_spec_sliding_window) for e in stored] == [
        (0, "full_attention", None), (1, "sliding_window", 128),
        (2, "chunked_local_attention", None)]
    assert all(e.block_size == 4 and len(e.block_hashes) == 2
               for e in stored)
    manager.free(req)
    admit(manager, make_request("1", [99] * 8, block_size=4), 8)
    removed = [e for e in manager.take_events()
               if isinstance(e, BlockRemoved)]
    assert sorted(e.group_idx for e in removed) == [0, 0, 1, 1, 2, 2]


# vLLM's test_eagle_with_sliding_window: one window group of one block.
def test_eagle_with_a_sliding_window_needs_one_block_more():
    config = KVCacheConfig(10, [], [KVCacheGroupSpec(
        ["layer"], SlidingWindowSpec(BLOCK, BLOCK))])
    manager = KVCacheManager(config, 8192, BLOCK, use_eagle=True)
    tokens = [0] * (2 * BLOCK + 5)
    req = make_request("0", tokens)
    first = admit(manager, req)[2].get_block_ids()[0][0]
    manager.free(req)
    blocks, hits = manager.get_computed_blocks(make_request("1", tokens))
    assert len(blocks.blocks[0]) == 1 and hits == BLOCK
    # Without the first block the only run is [null, block 2], which EAGLE
    # drops to nothing.
    manager.evict_blocks([first])
    blocks, hits = manager.get_computed_blocks(make_request("2", tokens))
    assert not blocks.blocks[0] and hits == 0


# vLLM's test_can_fit_full_sequence_swa_cap_admits_long_prompt and
# test_can_fit_full_sequence_full_attention_still_gates_oversized: the
# admission gate counts a window group's recycled blocks only.
def test_the_admission_gate_counts_a_window_at_its_recycled_size():
    kinds = ["full", "swa4"]
    roomy = make_hybrid(kinds, 64 + 13 + 1, max_model_len=64 * BLOCK,
                        max_num_batched_tokens=8 * BLOCK)
    long = make_request("long", list(range(32 * BLOCK)))
    assert roomy.allocate_slots(long, BLOCK,
                                full_sequence_must_fit=True) is not None
    tiny = make_hybrid(kinds, 5, max_model_len=64 * BLOCK,
                       max_num_batched_tokens=8 * BLOCK)
    big = make_request("big", list(range(16 * BLOCK)))
    assert tiny.allocate_slots(big, BLOCK, full_sequence_must_fit=True) is None
    assert tiny.num_free_blocks == 4


# vLLM's test_sliding_window_remove_skipped_blocks: 2-token blocks, a
# 4-token window; a block goes once no later token's window reaches it.
def test_remove_skipped_blocks_frees_what_the_window_left_behind():
    config = KVCacheConfig(40, [], [KVCacheGroupSpec(
        ["layer"], SlidingWindowSpec(2, 4))])
    manager = KVCacheManager(config, 8192, 2)
    req = make_request("test", list(range(22)), block_size=2)
    manager.allocate_slots(req, 22)
    original = manager.get_block_ids("test")[0]
    assert len(original) == 11
    for computed, nulls in ((0, 0), (4, 0), (5, 1), (6, 1), (7, 2), (11, 4)):
        manager.remove_skipped_blocks("test", computed)
        assert manager.get_block_ids("test")[0] == \
            [0] * nulls + original[nulls:]
    # Freed newest first: block 3 (the longer prefix) before block 2, so
    # that it is evicted first.
    assert manager.num_free_blocks == 39 - 11 + 4
    later = make_request("later", list(range(64)), block_size=2)
    handed = manager.allocate_slots(later, 64).get_block_ids()[0]
    assert handed[-4:] == [original[0], original[1], original[3], original[2]]
    manager.check_invariants()


# vLLM's test_chunked_local_attention_remove_skipped_blocks: 2-token blocks,
# 4-token chunks; the chunks before the current one go.
def test_remove_skipped_blocks_frees_the_chunks_before_this_one():
    config = KVCacheConfig(40, [], [KVCacheGroupSpec(
        ["layer"], ChunkedLocalAttentionSpec(2, 4))])
    manager = KVCacheManager(config, 8192, 2)
    req = make_request("test", list(range(22)), block_size=2)
    manager.allocate_slots(req, 22)
    original = manager.get_block_ids("test")[0]
    for computed, nulls in ((0, 0), (4, 2), (6, 2), (12, 6)):
        manager.remove_skipped_blocks("test", computed)
        assert manager.get_block_ids("test")[0] == \
            [0] * nulls + original[nulls:]
    manager.check_invariants()


def test_a_long_window_request_holds_its_window_not_its_length():
    manager = make_hybrid(["full", "swa8"], 400)
    req = make_request("0", list(range(2048)))
    step = 256
    for done in range(0, 2048, step):
        assert manager.allocate_slots(req, step) is not None
        req.num_computed_tokens = done + step
    full, window = manager.get_block_ids("0")
    assert len(full) == len(window) == 128
    assert sum(b != 0 for b in full) == 128
    # The window keeps the blocks its last tokens read and the last step's.
    assert sum(b != 0 for b in window) <= 8 + step // BLOCK + 1
    manager.free(req)
    assert manager.num_free_blocks == 399
    manager.check_invariants()


def test_bad_hybrid_configs_and_hits_are_refused_with_nothing_changed():
    with pytest.raises(kvblock.InvalidArgumentError, match="EAGLE"):
        make_hybrid(["full", "chunk4"], 20, use_eagle=True)
    manager = make_hybrid(["full", "sliding_window"], 20)
    req = make_request("0", COMMON + [1])
    admit(manager, req)
    free = manager.num_free_blocks
    other = make_request("1", COMMON + [1])
    blocks, hits = manager.get_computed_blocks(other)
    with pytest.raises(kvblock.InvalidArgumentError, match="one a kv cache"):
        manager.allocate_slots(other, 1, hits,
                               type(blocks)((blocks.blocks[0],)))
    assert manager.num_free_blocks == free
    assert manager.get_block_ids("1") == ([], [])
    manager.check_invariants()


class HybridReference:
    """vLLM's hybrid KV cache manager as its code reads, written here
    without kvblock's: a free queue of block ids, a map from (group, joined
    hashes) to the blocks cached under it (the first answers), each
    request's block list a group. A hit is the longest prefix, a multiple of
    the block sizes' least common multiple, that every group serves: full
    attention all its blocks, a window the blocks its last token reads, a
    chunk the blocks of its current chunk (EAGLE left out)."""

    def __init__(self, groups, num_blocks, hash_block, max_model_len,
                 budget):
        self.groups = groups  # (kind, block size, window or chunk)
        self.hash_block = hash_block
        self.max_model_len = max_model_len
        self.unit = math.lcm(*(size for _, size, _ in groups))
        self.hybrid = len(groups) > 1
        self.ref = [0] * num_blocks
        self.key = [None] * num_blocks
        self.queue = list(range(1, num_blocks))
        self.cached = {}
        self.blocks = {}  # rid -> [list a group]
        self.num_cached = {}  # rid -> [count a group]
        self.caps = []
        for kind, size, extent in groups:
            if kind == "swa":
                self.caps.append(-(-min(extent - 1 + budget, max_model_len)
                                   // size) + 1)
            elif kind == "chunk":
                self.caps.append(-(-min(extent + budget, max_model_len)
                                   // size))
            else:
                self.caps.append(None)

    def _key(self, group, hashes, index):
        scale = self.groups[group][1] // self.hash_block
        if (index + 1) * scale > len(hashes):
            return None
        return group, b"".join(hashes[index * scale:(index + 1) * scale])

    def _skipped(self, group, computed):
        kind, _, extent = self.groups[group]
        if kind == "swa":
            return max(0, computed - extent + 1)
        if kind == "chunk":
            return computed // extent * extent
        return 0

    def _serves(self, group, hashes, length):
        """The group's blocks for a hit of `length` tokens, or None."""
        kind, size, extent = self.groups[group]
        count = length // size
        if kind == "swa":
            first = max(0, count - (-(-(extent - 1) // size)))
        elif kind == "chunk":
            first = length // extent * extent // size
        else:
            first = 0
        blocks = [0] * first
        for index in range(first, count):
            key = self._key(group, hashes, index)
            if key not in self.cached:
                return None
            blocks.append(self.cached[key][0])
        return blocks

    def hit(self, hashes, max_length):
        length = max(max_length, 0) // self.unit * self.unit
        while length > 0:
            served = [self._serves(g, hashes, length)
                      for g in range(len(self.groups))]
            if all(blocks is not None for blocks in served):
                return served, length
            length -= self.unit
        return [[] for _ in self.groups], 0

    def _to_allocate(self, rid, tokens, hits, computed, capped):
        total = 0
        for g, (_, size, _) in enumerate(self.groups):
            required = -(-tokens // size)
            if capped and self.caps[g] is not None:
                required = min(required, self.caps[g])
            held = len(self.blocks.get(rid, [[]] * len(self.groups))[g])
            if rid in self.num_cached:
                total += max(required - held, 0)
                continue
            skipped = self._skipped(g, computed) // size
            total += max(required - max(skipped, len(hits[g]) + held), 0)
            total += sum(1 for b in hits[g][max(0, skipped - held):]
                         if b != 0 and self.ref[b] == 0)
        return total

    def _take(self, count):
        taken = []
        for _ in range(max(count, 0)):
            block = self.queue.pop(0)
            self.uncache(block)
            self.ref[block] = 1
            taken.append(block)
        return taken

    def _release(self, blocks):
        for block in blocks:
            if block == 0:
                continue
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.queue.append(block)

    def uncache(self, block):
        key = self.key[block]
        if key is not None:
            self.cached[key].remove(block)
            if not self.cached[key]:
                del self.cached[key]
            self.key[block] = None

    def remove_skipped(self, rid, computed):
        if rid not in self.blocks:
            return
        for g, blocks in enumerate(self.blocks[rid]):
            count = min(self._skipped(g, computed) // self.groups[g][1],
                        len(blocks))
            freed = []
            for i in range(count - 1, -1, -1):
                if blocks[i] == 0:
                    break
                freed.append(blocks[i])
                blocks[i] = 0
            self._release(freed)

    def allocate(self, request, num_new, hits, hit_tokens, must_fit=False,
                 lookahead=0, delay=False):
        rid = request.request_id
        hits = hits or [[] for _ in self.groups]
        local = request.num_computed_tokens + hit_tokens
        computed = min(local, self.max_model_len)
        if must_fit and self._to_allocate(
                rid, min(request.num_tokens, self.max_model_len), hits,
                computed, True) > len(self.queue):
            return None
        need = min(computed + num_new + lookahead, self.max_model_len)
        self.remove_skipped(rid, computed)
        if self._to_allocate(rid, need, hits, local, False) > \
                len(self.queue):
            return None
        lists = self.blocks.setdefault(rid, [[] for _ in self.groups])
        if rid not in self.num_cached and any(hits):
            for g, (_, size, _) in enumerate(self.groups):
                skipped = self._skipped(g, local) // size
                kept = hits[g][skipped:]
                for block in kept:
                    if block != 0:
                        if self.ref[block] == 0:
                            self.queue.remove(block)
                        self.ref[block] += 1
                lists[g].extend([0] * skipped + kept)
            self.num_cached[rid] = [len(blocks) for blocks in lists]
        new = []
        for g, (_, size, _) in enumerate(self.groups):
            taken = self._take(-(-need // size) - len(lists[g]))
            lists[g].extend(taken)
            new.append(taken)
        if not delay:
            self.cache(request, min(computed + num_new, request.num_tokens))
        return new

    def cache(self, request, num_tokens):
        rid = request.request_id
        if self.hybrid:
            num_tokens = num_tokens // self.unit * self.unit
        lists = self.blocks.setdefault(rid, [[] for _ in self.groups])
        counts = self.num_cached.setdefault(rid, [0] * len(self.groups))
        for g, (kind, size, extent) in enumerate(self.groups):
            full = num_tokens // size
            if full <= counts[g]:
                continue
            per_unit, tail = self.unit // size, -(-(extent - 1) // size)
            for i in range(counts[g], min(full, len(lists[g]))):
                block = lists[g][i]
                masked = (self.hybrid and kind == "swa" and
                          self.unit > size and tail < per_unit and
                          i % per_unit < per_unit - tail)
                if block == 0 or masked:
                    continue
                key = self._key(g, request.block_hashes, i)
                self.key[block] = key
                self.cached.setdefault(key, []).append(block)
            counts[g] = full

    def free(self, rid):
        for blocks in self.blocks.pop(rid, []):
            self._release(reversed(blocks))
        self.num_cached.pop(rid, None)


# (groups as (kind, block size, window or chunk), hash block size).
REFERENCE_CONFIGS = [
    ([("full", 4, 0), ("swa", 4, 8)], 4),
    ([("swa", 4, 12), ("swa", 4, 12), ("full", 4, 0)], 4),
    ([("chunk", 4, 16), ("full", 4, 0)], 4),
    ([("full", 8, 0), ("swa", 4, 8)], 4),
    ([("full", 8, 0), ("swa", 2, 2)], 2),
    ([("full", 4, 0), ("swa", 4, 8), ("chunk", 4, 16)], 4),
    ([("swa", 4, 8)], 4),
]


def spec_from(kind, size, extent):
    if kind == "full":
        return FullAttentionSpec(size)
    if kind == "swa":
        return SlidingWindowSpec(size, extent)
    return ChunkedLocalAttentionSpec(size, extent)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("groups,hash_block", REFERENCE_CONFIGS)
def test_a_hybrid_loop_matches_the_reference_call_for_call(groups, hash_block,
                                                           seed):
    rng = random.Random(seed)
    num_blocks, budget, model_len = 24 * len(groups), 24, 160
    manager = make_hybrid([spec_from(*group) for group in groups], num_blocks,
                          hash_block_size=hash_block, max_model_len=model_len,
                          max_num_batched_tokens=budget)
    model = HybridReference(groups, num_blocks, hash_block, model_len,
                            budget)
    system = [rng.randrange(1, 50) for _ in range(24)]
    trace = [(i // 2, make_request(
        f"r{i}", (system[:rng.randrange(25)] if rng.random() < 0.7 else []) +
        [rng.randrange(1, 50) for _ in range(rng.randrange(1, 40))],
        hash_block, max_tokens=rng.randrange(1, 24))) for i in range(50)]
    waiting, running, delayed = [], [], []
    paths = collections.Counter()
    step = 0
    while trace or waiting or running:
        while trace and trace[0][0] <= step:
            waiting.append(trace.pop(0)[1])
        for request in delayed:
            if request in running:
                manager.cache_blocks(request, request.num_computed_tokens)
                model.cache(request, request.num_computed_tokens)
        delayed = []
        if rng.random() < 0.05:
            victims = [rng.randrange(1, num_blocks) for _ in range(3)]
            manager.evict_blocks(victims)
            for block in victims:
                model.uncache(block)
            paths["evicted"] += 1
        left, scheduled = budget, []
        for request in list(running):
            if request not in running:
                continue
            new = min(request.num_tokens - request.num_computed_tokens, left)
            if new <= 0:
                continue
            while True:
                lookahead = 2 if rng.random() < 0.2 else 0
                got = manager.allocate_slots(request, new,
                                             num_lookahead_tokens=lookahead)
                expected = model.allocate(request, new, None, 0,
                                          lookahead=lookahead)
                assert (got is None) == (expected is None), request.request_id
                if got is not None:
                    assert list(got.get_block_ids()) == expected
                    break
                victim = running.pop()
                manager.free(victim)
                model.free(victim.request_id)
                victim.num_computed_tokens = 0
                waiting.insert(0, victim)
                paths["preempted"] += 1
                scheduled = [s for s in scheduled if s[0] is not victim]
                if victim is request:
                    break
            if got is None:
                continue
            scheduled.append((request, new))
            left -= new
        while waiting and left > 0:
            request = waiting[0]
            blocks, hits = manager.get_computed_blocks(request)
            expected_blocks, expected_hits = model.hit(
                request.block_hashes, request.num_tokens - 1)
            assert hits == expected_hits
            assert list(blocks.get_block_ids()) == expected_blocks
            paths["hits"] += hits > 0
            paths["null hits"] += any(0 in group for group in
                                      expected_blocks)
            new = min(request.num_tokens - hits, left)
            delay = rng.random() < 0.1
            got = manager.allocate_slots(request, new, hits, blocks,
                                         delay_cache_blocks=delay,
                                         full_sequence_must_fit=True)
            expected = model.allocate(request, new, expected_blocks, hits,
                                      must_fit=True, delay=delay)
            assert (got is None) == (expected is None)
            if got is None:
                break
            assert list(got.get_block_ids()) == expected
            if delay:
                delayed.append(request)
            waiting.pop(0)
            request.num_computed_tokens = hits
            running.append(request)
            scheduled.append((request, new))
            left -= new
        for request, new in scheduled:
            request.num_computed_tokens += new
            if request.num_computed_tokens < request.num_tokens:
                continue
            request.append_output_token_ids(rng.randrange(1, 50))
            if request.num_output_tokens >= request.max_tokens:
                running.remove(request)
                manager.free(request)
                model.free(request.request_id)
        manager.check_invariants()
        assert manager.num_free_blocks == len(model.queue)
        for request in running:
            assert list(manager.get_block_ids(request.request_id)) == \
                model.blocks[request.request_id]
        step += 1
        assert step < 3000, "the loop does not converge"
    assert manager.usage == 0.0
    assert paths["hits"] > 0 and paths["preempted"] + paths["evicted"] > 0, \
        paths
