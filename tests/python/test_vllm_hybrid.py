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
