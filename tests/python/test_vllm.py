# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock.vllm.KVCacheManager against vLLM's contract.

The cases of vLLM's tests/v1/core/test_prefix_caching.py that a
full-attention manager's public calls reach (vllm-project/vllm
28be48fa944d8c58aeffd1ab1b56e27828c6b268), in our words, each asserting what
vLLM's asserts with the vLLM-shaped stand-ins of vllm_standins.py; the
hasher against cbor2 + hashlib, as vLLM's functions compute it; and a
vLLM-style scheduler loop run against a reference model of vLLM's block
pool (written here from vLLM's semantics), block ids compared call for
call. And the host tier in the OffloadingConnector's shape: its refusals, a
prompt evicted to it and served from it on its next turn, and a serving
loop whose copies run on a model of the device's and the host's KV, every
token's KV it reads checked."""
import collections
import gc
import random
import re
import types
import weakref

import pytest

import kvblock
from kvblock.vllm import (AllBlocksCleared, BlockRemoved, BlockStored,
                          KVCacheBlocks, KVCacheManager,
                          get_request_block_hasher, none_hash)
from vllm_standins import (FullAttentionSpec, KVCacheConfig,
                           KVCacheGroupSpec, LoRARequest, MambaSpec,
                           MultiModalFeatureSpec, PlaceholderRange, Request,
                           SlidingWindowSpec, make_kv_cache_config,
                           reference_hash)

HASH = "sha256_cbor"


def make_manager(block_size=16, num_blocks=11, **kwargs):
    return KVCacheManager(make_kv_cache_config(block_size, num_blocks),
                          max_model_len=kwargs.pop("max_model_len", 8192),
                          hash_block_size=block_size, **kwargs)


def make_request(request_id, tokens, block_size=16, hash_fn=HASH, **kwargs):
    return Request(request_id, tokens,
                   block_hasher=get_request_block_hasher(block_size, hash_fn),
                   **kwargs)


def admit(manager, request, num_new_tokens=None):
    """get_computed_blocks then allocate_slots, as vLLM's scheduler admits."""
    blocks, hits = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - hits
    return blocks, hits, manager.allocate_slots(request, num_new_tokens, hits,
                                                blocks)


def ids(blocks):
    return blocks.get_block_ids()[0]


COMMON = [i for i in range(3) for _ in range(16)]


# vLLM's test_prefill.
def test_prefill_hands_out_vllms_ids_and_shares_the_prefix():
    manager = make_manager()
    req0 = make_request("0", COMMON + [3] * 7)
    blocks, hits, new = admit(manager, req0)
    assert len(req0.block_hashes) == 3 and not blocks.blocks[0] and hits == 0
    assert new.get_block_ids() == ([1, 2, 3, 4],)
    parent = none_hash(HASH)
    for block in new.blocks[0][:3]:
        start = (block.block_id - 1) * 16
        digest = reference_hash(HASH, parent, COMMON[start:start + 16], None)
        assert block.block_hash == digest + b"\0\0\0\0"  # group 0.
        assert block.ref_cnt == 1
        parent = digest
    assert new.blocks[0][3].block_hash is None

    req1 = make_request("1", COMMON + [3] * 5)
    blocks, hits, new = admit(manager, req1)
    assert blocks.get_block_ids() == ([1, 2, 3],) and hits == 48
    assert new.get_block_ids() == ([5],)
    assert all(block.ref_cnt == 2 for block in blocks.blocks[0])
    assert manager.num_free_blocks == 5
    manager.free(req0)
    manager.free(req1)
    assert manager.num_free_blocks == 10
    # vLLM's free queue is then [6, 7, 8, 9, 10, 4, 5, 3, 2, 1].
    req2 = make_request("2", COMMON + [3] * 6)
    blocks, hits, new = admit(manager, req2)
    assert blocks.get_block_ids() == ([1, 2, 3],)
    assert new.get_block_ids() == ([6],)
    assert manager.num_free_blocks == 6
    manager.free(req2)
    req3 = make_request("3", [99] * 160)
    blocks, hits, new = admit(manager, req3)
    assert hits == 0
    assert new.get_block_ids() == ([7, 8, 9, 10, 4, 5, 6, 3, 2, 1],)
    assert manager.num_free_blocks == 0
    manager.check_invariants()


# vLLM's test_prefill_plp: a request that skips reading the cache still
# caches its blocks, under the same hashes (duplicates).
def test_a_request_skipping_the_cache_caches_duplicates():
    manager = make_manager()
    req0 = make_request("0", COMMON + [3] * 7, skip_reading_prefix_cache=True)
    blocks, hits, new = admit(manager, req0)
    assert hits == 0 and new.get_block_ids() == ([1, 2, 3, 4],)
    hashes0 = [b.block_hash for b in new.blocks[0]]
    req1 = make_request("1", COMMON + [3] * 5)
    blocks, hits, new = admit(manager, req1)
    assert blocks.get_block_ids() == ([1, 2, 3],)
    assert new.get_block_ids() == ([5],)
    manager.free(req0)
    manager.free(req1)
    req2 = make_request("2", COMMON + [3] * 6, skip_reading_prefix_cache=True)
    blocks, hits, new = admit(manager, req2)
    assert hits == 0 and not blocks.blocks[0]
    assert [b.block_hash for b in new.blocks[0]] == hashes0
    assert ids(new) != [1, 2, 3, 4]
    assert all(b.ref_cnt == 1 for b in new.blocks[0])
    manager.free(req2)
    manager.check_invariants()


# vLLM's test_decode.
def test_decode_adds_a_block_only_when_one_fills():
    manager = make_manager()
    req0 = make_request("0", COMMON + [3] * 7)
    blocks, _, new = admit(manager, req0)
    assert ids(new) == [1, 2, 3, 4]
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_ids(8)
    new = manager.allocate_slots(req0, 4, 0, blocks)
    assert new is not None and len(new.blocks[0]) == 0
    assert manager.get_blocks("0").blocks[0][-1].block_hash is None
    req0.num_computed_tokens = 59
    for _ in range(19):
        req0.append_output_token_ids(7)
    new = manager.allocate_slots(req0, 19, 0, blocks)
    assert new is not None and len(new.blocks[0]) == 1
    held = manager.get_blocks("0").blocks[0]
    assert held[-2].block_hash is not None and held[-1].block_hash is None


# vLLM's test_evict.
def test_eviction_follows_vllms_free_queue():
    manager = make_manager()
    last = 5 * 16 + 7
    req0 = make_request("0", list(range(last)))
    _, _, new = admit(manager, req0)
    assert len(new.blocks[0]) == 6
    req1 = make_request("1", list(range(last, last + 48)))
    _, _, new = admit(manager, req1)
    assert len(new.blocks[0]) == 3
    assert manager.num_free_blocks == 1
    manager.free(req0)
    manager.free(req1)
    assert manager.num_free_blocks == 10
    # Free queue [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]: a hit on 1, 2, then 10.
    req2 = make_request("2", list(range(35)))
    blocks, hits, new = admit(manager, req2)
    assert blocks.get_block_ids() == ([1, 2],) and hits == 32
    assert new.get_block_ids() == ([10],)
    assert manager.num_free_blocks == 7


# vLLM's test_hash_block_correct_reuse.
def test_a_reused_block_loses_its_old_hash():
    manager = make_manager(num_blocks=2)
    req = make_request("0", list(range(16)))
    _, _, new = admit(manager, req)
    assert len(new.blocks[0]) == 1
    manager.free(req)
    req = make_request("1", list(range(15)))
    _, _, new = admit(manager, req)
    assert len(new.blocks[0]) == 1
    assert new.blocks[0][0].block_hash is None


# vLLM's test_computed_blocks_not_evicted.
def test_hit_blocks_are_not_evicted_for_new_blocks():
    manager = make_manager(num_blocks=3)
    req0 = make_request("0", list(range(16)))
    assert ids(admit(manager, req0)[2]) == [1]
    req1 = make_request("1", list(range(16, 32)))
    assert ids(admit(manager, req1)[2]) == [2]
    manager.free(req0)
    manager.free(req1)
    req2 = make_request("2", list(range(32)))
    blocks, hits, new = admit(manager, req2)
    assert ids(blocks) == [1] and hits == 16
    assert ids(new) == [2]


# vLLM's test_basic_prefix_caching_disabled.
def test_caching_off_shares_nothing():
    manager = make_manager(block_size=4, num_blocks=5, enable_caching=False)
    req1 = Request("1", list(range(10)))  # no hasher needed.
    blocks, hits, new = admit(manager, req1)
    assert hits == 0 and len(new.blocks[0]) == 3
    manager.free(req1)
    req2 = Request("2", list(range(16)))
    blocks, hits, new = admit(manager, req2)
    assert hits == 0 and len(new.blocks[0]) == 4
    req3 = Request("3", list(range(4)))
    blocks, hits, new = admit(manager, req3)
    assert hits == 0 and not new


# vLLM's test_mm_prefix_caching, and the isolation it exists for.
def mm_request(request_id, tokens, hashes, positions, hash_fn=HASH):
    features = [MultiModalFeatureSpec(PlaceholderRange(o, n), h)
                for (o, n), h in zip(positions, hashes)]
    return make_request(request_id, tokens, hash_fn=hash_fn,
                        mm_features=features)


MM_COMMON = (list(range(10)) + [-1] * 6 + [-1] * 4 + list(range(10, 20)) +
             [-1] * 2 + [-1] * 16)
MM_POSITIONS = [(11, 10), (30, 18), (48, 7)]


@pytest.mark.parametrize("hash_fn", ["sha256_cbor", "xxhash_cbor"])
def test_multimodal_features_are_hashed_as_vllm_hashes_them(hash_fn):
    manager = make_manager()
    tokens = MM_COMMON + [-1] * 7 + [100] * 4
    req0 = mm_request("0", tokens, ["aaa", "bbb", "ccc"], MM_POSITIONS,
                      hash_fn)
    hashes = req0.block_hashes
    assert len(hashes) == 3
    assert hashes[0] == reference_hash(hash_fn, none_hash(hash_fn),
                                       tokens[:16], (("aaa", 11),))
    assert hashes[1] == reference_hash(hash_fn, hashes[0], tokens[16:32],
                                       (("aaa", -5), ("bbb", 14)))
    assert hashes[2] == reference_hash(hash_fn, hashes[1], tokens[32:48],
                                       (("bbb", -2),))
    blocks, hits, new = admit(manager, req0)
    assert ids(new) == [1, 2, 3, 4]
    req0.num_computed_tokens = 59
    for _ in range(5):
        req0.append_output_token_ids(8)
    new = manager.allocate_slots(req0, 5)
    assert new is not None and len(new.blocks[0]) == 0
    assert len(hashes) == 4
    assert hashes[3] == reference_hash(hash_fn, hashes[2],
                                       tokens[48:] + [8] * 5, (("ccc", 0),))
    req1 = mm_request("1", MM_COMMON + [-1] * 7 + [200] * 5,
                      ["aaa", "bbb", "ccc"], MM_POSITIONS, hash_fn)
    blocks, hits = manager.get_computed_blocks(req1)
    assert len(blocks.blocks[0]) == 3 and hits == 48


def test_equal_tokens_with_different_images_share_no_block():
    manager = make_manager()
    tokens = MM_COMMON + [-1] * 7 + [100] * 4
    req0 = mm_request("0", tokens, ["cat", "dog", "owl"], MM_POSITIONS)
    admit(manager, req0)
    other = mm_request("1", tokens, ["cat", "dog", "emu"], MM_POSITIONS)
    blocks, hits = manager.get_computed_blocks(other)
    assert hits == 48  # the first three blocks hold the same images.
    changed = mm_request("2", tokens, ["lion", "dog", "owl"], MM_POSITIONS)
    blocks, hits = manager.get_computed_blocks(changed)
    assert hits == 0 and not blocks.blocks[0]
    _, _, new = admit(manager, changed)
    assert not set(ids(new)) & set(manager.get_block_ids("0")[0])


# vLLM's test_cache_key_salting.
def test_the_cache_salt_separates_tenants():
    manager = make_manager()
    tokens = COMMON + [3] * 11
    req0 = make_request("0", tokens, cache_salt="salt1")
    hashes = req0.block_hashes
    assert hashes[0] == reference_hash(HASH, none_hash(HASH), tokens[:16],
                                       ("salt1",))
    assert hashes[1] == reference_hash(HASH, hashes[0], tokens[16:32], None)
    admit(manager, req0)
    req0.num_computed_tokens = 59
    for _ in range(5):
        req0.append_output_token_ids(8)
    assert manager.allocate_slots(req0, 5) is not None
    assert hashes[3] == reference_hash(HASH, hashes[2], tokens[48:] + [8] * 5,
                                       None)
    req1 = make_request("1", COMMON + [4] * 11, cache_salt="salt1")
    assert manager.get_computed_blocks(req1)[1] == 48
    req2 = make_request("2", COMMON + [4] * 11, cache_salt="salt2")
    blocks, hits = manager.get_computed_blocks(req2)
    assert hits == 0 and not blocks.blocks[0]
    assert req2.block_hashes[0] == reference_hash(
        HASH, none_hash(HASH), COMMON[:16], ("salt2",))


def test_a_lora_adapter_is_in_every_blocks_hash():
    lora = LoRARequest("adapter", 42)
    tokens = list(range(40))
    request = make_request("0", tokens, lora_request=lora, cache_salt="s")
    hashes = request.block_hashes
    assert hashes[0] == reference_hash(HASH, none_hash(HASH), tokens[:16],
                                       ("adapter", "s"))
    assert hashes[1] == reference_hash(HASH, hashes[0], tokens[16:32],
                                       ("adapter",))


# vLLM's test_prefill_not_enough_free_blocks_with_computed_blocks.
def test_a_refused_admission_leaves_its_hits_untouched():
    manager = make_manager()
    req0 = make_request("0", COMMON)
    admit(manager, req0, 48)
    part0 = manager.get_blocks("0").blocks[0]
    req1 = make_request("1", COMMON * 2)
    blocks, hits = manager.get_computed_blocks(req1)
    assert blocks.blocks[0] == part0 and hits == 48
    manager.allocate_slots(req1, 48, hits, blocks)
    part1 = manager.get_blocks("1").blocks[0]
    manager.free(req1)
    assert {b.ref_cnt for b in part1[:3]} == {1}
    assert {b.ref_cnt for b in part1[3:]} == {0}
    req2 = make_request("2", [7] * 32)
    admit(manager, req2)
    assert manager.num_free_blocks == 5
    req3 = make_request("3", COMMON * 3)
    blocks, hits = manager.get_computed_blocks(req3)
    assert blocks.blocks[0] == part1 and hits == 96
    assert manager.allocate_slots(req3, 48, hits, blocks) is None
    assert {b.ref_cnt for b in part1[:3]} == {1}
    assert {b.ref_cnt for b in part1[3:]} == {0}
    manager.check_invariants()


# vLLM's test_reset_prefix_cache.
def test_reset_waits_until_no_block_is_in_use():
    manager = make_manager(log_stats=True)
    req0 = make_request("0", COMMON + [3] * 7)
    assert ids(manager.allocate_slots(req0, 55)) == [1, 2, 3, 4]
    req1 = make_request("1", COMMON + [4] * 7)
    blocks, hits, new = admit(manager, req1)
    assert len(blocks.blocks[0]) == 3 and ids(new) == [5]
    assert not manager.reset_prefix_cache()
    assert manager.get_computed_blocks(req1)[1] == 48  # still cached.
    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache()
    assert all(b.block_hash is None for b in manager.blocks)
    assert manager.get_computed_blocks(req1)[1] == 0
    assert manager.make_prefix_cache_stats().reset


# vLLM's test_prefix_cache_stats_disabled, and the stats it keeps.
def test_prefix_cache_stats():
    manager = make_manager()
    assert manager.prefix_cache_stats is None
    admit(manager, make_request("0", list(range(16))))
    manager.reset_prefix_cache()
    assert manager.prefix_cache_stats is None
    assert manager.make_prefix_cache_stats() is None

    manager = make_manager(log_stats=True)
    admit(manager, make_request("0", list(range(40))))
    again = make_request("1", list(range(40)))
    again.num_preemptions = 1
    manager.get_computed_blocks(again)
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 40, 0)
    assert (stats.preempted_requests, stats.preempted_queries,
            stats.preempted_hits) == (1, 40, 32)
    assert manager.make_prefix_cache_stats().requests == 0


# vLLM's test_maybe_evict_cached_block, through evict_blocks.
def test_evict_blocks_drops_hashes_one_block_at_a_time():
    manager = make_manager(block_size=4, num_blocks=8,
                           enable_kv_cache_events=True)
    req0 = make_request("0", [1] * 8, block_size=4)
    admit(manager, req0)
    req1 = make_request("1", [1] * 8 + [5], block_size=4,
                        skip_reading_prefix_cache=True)
    admit(manager, req1)  # blocks 3, 4 duplicate 1, 2; block 5 partial.
    manager.take_events()
    hit = manager.get_computed_blocks(make_request("x", [1] * 9, 4))[0]
    assert ids(hit) == [1, 2]
    manager.evict_blocks({1})
    hit = manager.get_computed_blocks(make_request("x", [1] * 9, 4))[0]
    assert ids(hit) == [3, 2]  # the duplicate of block 1 answers now.
    manager.evict_blocks([5, 3])  # 5 is not cached: nothing.
    assert manager.get_computed_blocks(make_request("x", [1] * 9, 4))[1] == 0
    events = manager.take_events()
    assert [type(e) for e in events] == [BlockRemoved, BlockRemoved]
    assert manager.blocks[1].ref_cnt == 1  # evicting does not free.
    with pytest.raises(ValueError, match="block id 8"):
        manager.evict_blocks([2, 8])
    assert manager.blocks[2].block_hash is not None  # nothing changed.


# vLLM's test_kv_cache_events.
@pytest.mark.parametrize("blocks_to_cache", [2, 3, 10])
def test_kv_cache_events(blocks_to_cache):
    manager = make_manager(num_blocks=blocks_to_cache + 1,
                           enable_kv_cache_events=True)
    num_tokens = 16 * blocks_to_cache
    req0 = make_request("0", list(range(num_tokens)))
    manager.allocate_slots(req0, num_tokens)
    events = manager.take_events()
    stored = events[-1]
    assert isinstance(stored, BlockStored)
    assert len(stored.block_hashes) == blocks_to_cache
    assert len(stored.token_ids) == stored.block_size * blocks_to_cache
    assert stored.kv_cache_spec_kind == "full_attention"
    assert stored.kv_cache_spec_sliding_window is None
    assert stored.group_idx == 0 and stored.medium == "GPU"
    assert stored.parent_block_hash is None
    assert stored.extra_keys == [None] * blocks_to_cache
    # vLLM's integer form: the digest's low 64 bits.
    assert stored.block_hashes == [int.from_bytes(h[-8:], "big")
                                   for h in req0.block_hashes]
    assert manager.take_events() == []
    manager.free(req0)
    req1 = make_request("1", list(range(num_tokens)))
    manager.allocate_slots(req1, num_tokens)
    events = manager.take_events()
    assert len(events) == blocks_to_cache + 1
    for removed in events[:-1]:
        assert isinstance(removed, BlockRemoved)
        assert removed.block_hashes[0] in stored.block_hashes
        assert removed.group_idx == 0
    assert len(events[-1].block_hashes) == blocks_to_cache
    manager.free(req1)
    manager.reset_prefix_cache()
    assert isinstance(manager.take_events()[-1], AllBlocksCleared)


def test_kv_cache_events_name_the_parent_and_the_adapter():
    manager = make_manager(enable_kv_cache_events=True)
    lora = LoRARequest("test_lora", 42)
    req = make_request("0", list(range(40)), lora_request=lora)
    manager.allocate_slots(req, 20)  # one full block.
    req.num_computed_tokens = 20
    manager.allocate_slots(req, 20)  # the second.
    first, second = manager.take_events()
    assert first.parent_block_hash is None
    assert second.parent_block_hash == first.block_hashes[0]
    assert second.token_ids == list(range(16, 32))
    assert (second.lora_id, second.lora_name) == (42, "test_lora")
    assert second.extra_keys == [("test_lora",)]
    manager.free(req)
    plain = make_request("1", list(range(40)))
    manager.allocate_slots(plain, 40)
    stored = manager.take_events()[-1]
    assert stored.lora_id is None and stored.lora_name is None


@pytest.mark.parametrize("value,digests", [("0", True), ("00", True),
                                            ("1", False), ("2", False)])
def test_events_in_digest_form(monkeypatch, value, digests):
    """The variable read as vLLM's envs.py reads it: bool(int(value))."""
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", value)
    manager = make_manager(enable_kv_cache_events=True)
    req = make_request("0", list(range(32)))
    manager.allocate_slots(req, 32)
    hashes = manager.take_events()[-1].block_hashes
    assert (hashes == req.block_hashes) == digests
    assert all(isinstance(h, int) for h in hashes) != digests


def test_a_bad_int_hashes_setting_is_vllms_value_error(monkeypatch):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "yes")
    with pytest.raises(ValueError, match="invalid literal"):
        make_manager(enable_kv_cache_events=True)
    make_manager()  # without events vLLM never reads it.


# vLLM's test_eagle_enabled_removes_last_block / _with_partial_blocks.
@pytest.mark.parametrize("length", [48, 37])
def test_eagle_recomputes_the_last_hit_block(length):
    manager = make_manager(num_blocks=10, use_eagle=True)
    tokens = [0] * length
    admit(manager, make_request("a", tokens))
    manager.free(make_request("a", tokens))
    blocks, hits = manager.get_computed_blocks(make_request("b", tokens))
    assert len(blocks.blocks[0]) == 1 and hits == 16


# vLLM's test_can_fit_full_sequence_full_attention_still_gates_oversized
# (its full-attention group).
def test_full_sequence_must_fit_gates_on_the_whole_prompt():
    manager = make_manager(num_blocks=5, max_model_len=64 * 16)
    req = make_request("oversized", list(range(16 * 16)))
    assert manager.allocate_slots(req, 16, full_sequence_must_fit=True) is None
    assert manager.num_free_blocks == 4 and manager.get_block_ids("oversized") \
        == ([],)
    assert ids(manager.allocate_slots(req, 16)) == [1]


def test_lookahead_slots_and_an_empty_prompt():
    manager = make_manager()
    req = make_request("0", list(range(20)))
    new = manager.allocate_slots(req, 20, num_lookahead_tokens=13)
    assert ids(new) == [1, 2, 3]  # 33 slots; only the verified 20 cached.
    assert [b.block_hash is None for b in new.blocks[0]] == [False, True, True]
    empty = make_request("1", [])
    # vLLM's lookup of an empty prompt fails (islice(hashes, -1)); so does
    # the adapter's, with a clear message.
    with pytest.raises(ValueError, match="with 0 tokens"):
        manager.get_computed_blocks(empty)
    assert ids(manager.allocate_slots(empty, 1, num_lookahead_tokens=3)) == [4]
    with pytest.raises(ValueError, match="num_new_tokens must be greater"):
        manager.allocate_slots(make_request("2", [1]), 0)
    manager.check_invariants()


def test_take_new_block_ids_and_common_prefix():
    manager = make_manager()
    a = make_request("a", COMMON + [5])
    admit(manager, a)
    b = make_request("b", COMMON + [6])
    admit(manager, b)
    assert manager.take_new_block_ids() == [1, 2, 3, 4, 5]
    assert manager.take_new_block_ids() == []
    assert manager.get_num_common_prefix_blocks("a") == [3]
    c = make_request("c", [9] * 20)
    admit(manager, c)
    assert manager.get_num_common_prefix_blocks("a") == [0]
    assert manager.usage == pytest.approx(7 / 10)


def test_kv_cache_blocks_behave_as_vllms():
    manager = make_manager()
    req = make_request("0", COMMON + [1])
    new = manager.allocate_slots(req, 49)
    assert new.get_unhashed_block_ids() == [4]
    assert (new + new.new_empty()).get_block_ids() == ([1, 2, 3, 4],)
    assert manager.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    assert manager.create_kv_cache_blocks(([],)) is \
        manager.empty_kv_cache_blocks
    assert manager.blocks[0].is_null and manager.blocks[0].ref_cnt == 0
    manager.cache_blocks(req, 49)  # cached already: nothing.
    manager.remove_skipped_blocks("0", 49)
    manager.new_step_starts()
    assert manager.get_blocks("unknown") is manager.empty_kv_cache_blocks


def test_prompt_embeddings_are_hashed_and_reported_as_vllm_does():
    import hashlib
    import numpy as np
    manager = make_manager(enable_kv_cache_events=True)
    embeds = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    req = make_request("0", [0] * 40)
    req.prompt_embeds = embeds
    req.block_hashes.clear()
    req.update_block_hashes()
    first = hashlib.sha256(embeds[:16].tobytes()).digest()
    assert req.block_hashes[0] == reference_hash(
        HASH, none_hash(HASH), [0] * 16, (first,))
    manager.allocate_slots(req, 40)
    stored = manager.take_events()[-1]
    assert stored.extra_keys == [
        (first,), (hashlib.sha256(embeds[16:32].tobytes()).digest(),)]


def test_caching_off_has_no_common_prefix():
    manager = make_manager(block_size=4, enable_caching=False)
    manager.allocate_slots(Request("0", list(range(9))), 9)
    assert manager.get_num_common_prefix_blocks("0") == [0]


def test_a_changed_hit_list_is_read_as_it_is_now():
    manager = make_manager(block_size=4)
    admit(manager, make_request("a", list(range(13)), 4))
    req = make_request("b", list(range(13)), 4)
    blocks, hits = manager.get_computed_blocks(req)
    assert ids(blocks) == [1, 2, 3]
    blocks.blocks[0].pop()
    retried, _ = manager.get_computed_blocks(req)
    assert ids(retried) == [1, 2, 3]  # a new list: the old one was changed.
    assert retried.blocks[0] is not blocks.blocks[0]
    new = manager.allocate_slots(req, 5, 8, blocks)
    assert ids(new) == [5, 6]
    assert manager.get_block_ids("b") == ([1, 2, 5, 6],)


def test_values_vllm_accepts_and_values_that_are_refused():
    # A FullAttentionSpec with a window is full attention to vLLM's manager.
    config = make_kv_cache_config(16, 1)
    config.kv_cache_groups[0].kv_cache_spec = FullAttentionSpec(16)
    object.__setattr__(config.kv_cache_groups[0].kv_cache_spec,
                       "sliding_window", 8)
    manager = KVCacheManager(config, 1024, 16)  # the null block only.
    assert manager.usage == 0.0 and manager.num_free_blocks == 0
    manager = make_manager()
    admit(manager, make_request("a", list(range(40))))
    fake = KVCacheBlocks(([types.SimpleNamespace(block_id=2**32 + 1)],))
    with pytest.raises(ValueError, match="block_id 4294967297 is not in"):
        manager.allocate_slots(make_request("b", list(range(40))), 8, 16,
                               fake)
    short = make_request("c", list(range(40)), hash_fn="xxhash_cbor")
    with pytest.raises(ValueError, match="have 16 bytes, the manager's 32"):
        manager.get_computed_blocks(short)
    assert manager.get_block_ids("b") == ([],)
    manager.check_invariants()


def test_a_call_that_does_not_fit_is_a_type_error_and_numpy_ints_fit():
    np = pytest.importorskip("numpy")
    manager = make_manager()
    request = make_request("a", list(range(40)))
    before = manager.get_block_ids("a")
    for call, message in [
            (lambda: manager.allocate_slots(request),
             "allocate_slots() is missing the argument 'num_new_tokens'"),
            (lambda: manager.allocate_slots(request, 20, bogus=1),
             "allocate_slots() got an unexpected keyword argument 'bogus'"),
            (lambda: manager.allocate_slots(request, 20, num_new_tokens=20),
             "got a repeated keyword argument 'num_new_tokens'"),
            (lambda: manager.allocate_slots(request, *range(9)),
             "allocate_slots() takes at most 9 arguments, got 10"),
            (lambda: manager.free(),
             "free() is missing the argument 'request'"),
            (lambda: manager.allocate_slots(request, 20.0),
             "num_new_tokens must be an int, got 20.0"),
            (lambda: manager.allocate_slots(request, True),
             "num_new_tokens must be an int, got True"),
            (lambda: manager.allocate_slots(request, np.float32(20)),
             "num_new_tokens must be an int"),
            (lambda: manager.free(types.SimpleNamespace(request_id=7)),
             "request_id must be a str, got 7")]:
        with pytest.raises(TypeError, match=re.escape(message)):
            call()
    assert manager.get_block_ids("a") == before
    manager.check_invariants()
    # numpy's integers are ints, as for the module's other calls; in the
    # request's fields too.
    request.num_computed_tokens = np.int64(0)
    blocks, hits = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, np.int64(40), np.int32(hits),
                                 blocks)
    assert new.get_block_ids() == ([1, 2, 3],)
    manager.check_invariants()


def test_prefix_cache_stats_is_vllms_live_object():
    manager = make_manager(log_stats=True)
    manager.get_computed_blocks(make_request("0", list(range(40))))
    stats = manager.prefix_cache_stats
    assert stats is manager.prefix_cache_stats and stats.queries == 40
    stats.queries += 5
    made = manager.make_prefix_cache_stats()
    assert made is stats and made.queries == 45
    assert manager.prefix_cache_stats.queries == 0


def test_python_code_inside_a_call_cannot_pull_the_hashes_away():
    manager = make_manager()
    admit(manager, make_request("a", list(range(40))))
    req = make_request("b", list(range(40)))
    blocks, hits = manager.get_computed_blocks(req)

    class Thief:
        @property
        def block_id(self):
            req.__dict__.pop("_kvblock_chain", None)
            req.block_hashes = list(req.block_hashes)
            return 1

    stolen = KVCacheBlocks(([Thief(), blocks.blocks[0][1]],))
    new = manager.allocate_slots(req, 8, hits, stolen)
    assert ids(new) == [4]
    assert [b.block_hash for b in manager.get_blocks("b").blocks[0][:2]] == \
        [b.block_hash for b in manager.get_blocks("a").blocks[0][:2]]
    manager.check_invariants()


def test_python_code_inside_a_call_cannot_pull_the_blocks_away():
    """A __bool__ the call runs empties the manager's list of blocks: the
    call is refused before it changes anything (it read ids from that list
    after the code ran, past its end)."""
    manager = make_manager()
    req = make_request("a", list(range(40)))
    blocks, hits = manager.get_computed_blocks(req)
    saved = list(manager.blocks)

    class Thief:
        def __bool__(self):
            manager.blocks.clear()
            return False

    with pytest.raises(kvblock.InternalError, match="_blocks is not its list"):
        manager.allocate_slots(req, 40, hits, blocks,
                               delay_cache_blocks=Thief())
    manager.blocks.extend(saved)
    assert manager.num_free_blocks == 10
    assert manager.get_block_ids("a") == ([],)
    assert ids(manager.allocate_slots(req, 40, hits, blocks)) == [1, 2, 3]
    manager.check_invariants()


def test_a_request_without_an_id_is_an_attribute_error():
    manager = make_manager()
    nameless = types.SimpleNamespace(num_tokens=3, num_computed_tokens=0)
    for call in (lambda: manager.allocate_slots(nameless, 3),
                 lambda: manager.free(nameless)):
        with pytest.raises(AttributeError, match="request_id"):
            call()
    assert manager.num_free_blocks == 10


def test_caches_block_names_a_group_out_of_range():
    manager = make_manager()
    assert manager._cpp.caches_block(0, 0)
    for group in (-1, 1, 2**31 - 1):
        with pytest.raises(kvblock.InvalidArgumentError,
                           match=f"group {group} is not in \\[0, 1\\)"):
            manager._cpp.caches_block(group, 0)


def test_an_interrupt_inside_a_call_leaves_the_manager_whole():
    """A KeyboardInterrupt (or any exception) raised by the request while a
    call reads it: the call changes nothing."""
    manager = make_manager(enable_kv_cache_events=True)

    class Interrupted(Request):
        armed = False

        @property
        def num_tokens(self):
            if self.armed:
                raise KeyboardInterrupt
            return len(self._all_token_ids)

    req = Interrupted("0", list(range(40)),
                      block_hasher=get_request_block_hasher(16, HASH))
    req.armed = True
    for call in (lambda: manager.get_computed_blocks(req),
                 lambda: manager.allocate_slots(req, 40)):
        with pytest.raises(KeyboardInterrupt):
            call()
        assert manager.num_free_blocks == 10
        assert manager.get_block_ids("0") == ([],)
        assert manager.take_events() == []
    req.armed = False
    assert ids(manager.allocate_slots(req, 40)) == [1, 2, 3]
    manager.check_invariants()


def test_a_dropped_manager_is_collected():
    manager = make_manager()
    admit(manager, make_request("0", list(range(40))))
    ref = weakref.ref(manager)
    del manager
    gc.collect()
    assert ref() is None


def test_threads_get_correct_results_or_a_clear_error():
    """Four threads share one manager, 5,000 calls each: a call that meets
    another one inside the manager (the GIL passed at a Python property)
    is refused with FailedPreconditionError; nothing crashes or leaks."""
    import sys
    import threading
    manager = make_manager(num_blocks=400)
    refused = collections.Counter()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    class Slow(Request):
        @property
        def num_tokens(self):  # Python code inside the call: a switch.
            return len(self._all_token_ids)

    def work(t):
        rng = random.Random(t)
        live = []
        for i in range(5000):
            try:
                if live and (len(live) > 8 or rng.random() < 0.4):
                    k = rng.randrange(len(live))
                    manager.free(live[k])
                    live.pop(k)
                else:
                    req = Slow(f"t{t}-{i}", [rng.randrange(4)] * 40,
                               block_hasher=get_request_block_hasher(
                                   16, HASH))
                    blocks, hits = manager.get_computed_blocks(req)
                    if manager.allocate_slots(req, 40 - hits, hits,
                                              blocks) is not None:
                        live.append(req)
            except kvblock.FailedPreconditionError as error:
                assert "inside another call" in str(error)
                refused[t] += 1
        while live:
            try:
                manager.free(live[-1])
                live.pop()
            except kvblock.FailedPreconditionError:
                refused[t] += 1

    # A loaded machine may run the threads one after another: a round that
    # met no race runs again, up to five rounds.
    try:
        for _ in range(5):
            threads = [threading.Thread(target=work, args=(t,))
                       for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            manager.check_invariants()
            assert manager.usage == 0.0
            if sum(refused.values()) > 0:
                break
    finally:
        sys.setswitchinterval(switch)
    assert sum(refused.values()) > 0  # the race was met, and refused.


def test_what_is_not_supported_is_refused_clearly():
    config = make_kv_cache_config(16, 8)
    with pytest.raises(ValueError, match="hash_block_size 8"):
        KVCacheManager(config, 1024, hash_block_size=8)
    mamba = KVCacheConfig(8, [], config.kv_cache_groups + [
        KVCacheGroupSpec(["mamba"], MambaSpec(16))])
    with pytest.raises(NotImplementedError, match="group 1 is MambaSpec"):
        KVCacheManager(mamba, 1024, 16)
    hybrid = KVCacheConfig(8, [], config.kv_cache_groups + [
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(16, 128))])
    with pytest.raises(ValueError, match="context parallelism"):
        KVCacheManager(hybrid, 1024, 16, dcp_world_size=2)
    sizes = KVCacheConfig(8, [], config.kv_cache_groups + [
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(24, 128))])
    with pytest.raises(kvblock.InvalidArgumentError,
                       match="block size 24 is not a multiple"):
        KVCacheManager(sizes, 1024, 16)
    with pytest.raises(NotImplementedError, match="MetricsCollector"):
        KVCacheManager(config, 1024, 16, metrics_collector=object())
    manager = KVCacheManager(config, 1024, 16)
    with pytest.raises(NotImplementedError, match="KV connectors"):
        manager.block_pool
    with pytest.raises(ValueError, match="no block_hashes"):
        manager.get_computed_blocks(_NoHashes())
    with pytest.raises(ValueError, match="not 'sha256'"):
        get_request_block_hasher(16, "sha256")


class _NoHashes:
    request_id = "x"
    num_tokens = 10
    skip_reading_prefix_cache = False
    num_preemptions = 0


def test_block_hashes_of_the_wrong_shape_are_refused():
    manager = make_manager()
    req = Request("0", list(range(32)))
    req.block_hashes = [b"\1" * 40]
    with pytest.raises(ValueError, match=r"block_hashes\[0\] must be bytes"):
        manager.get_computed_blocks(req)
    req = Request("1", list(range(32)))
    req.block_hashes = [b"\1" * 32]
    with pytest.raises(ValueError, match="caching its 32 computed tokens "
                                         "needs 2"):
        manager.allocate_slots(req, 32)
    assert manager.num_free_blocks == 10
    manager.check_invariants()


def test_the_hasher_matches_vllms_bytes_token_by_token():
    rng = random.Random(7)
    for hash_fn in ("sha256_cbor", "xxhash_cbor"):
        for block_size in (1, 3, 16):
            tokens = [rng.choice([0, 23, 24, 255, 256, 65535, 65536,
                                  2**32 - 1, 2**32, 2**40, -1, -25, -300])
                      for _ in range(3 * block_size + 2)]
            req = make_request("r", tokens, block_size, hash_fn)
            parent = none_hash(hash_fn)
            for i, digest in enumerate(req.block_hashes):
                parent = reference_hash(
                    hash_fn, parent,
                    tokens[i * block_size:(i + 1) * block_size], None)
                assert digest == parent
            assert len(req.block_hashes) == len(tokens) // block_size


# The scheduler loop against a reference model -------------------------------

class ReferencePool:
    """vLLM's BlockPool and FullAttentionManager, written plainly from their
    semantics: one free queue, a hash -> blocks map in insertion order, a
    block list per request."""

    def __init__(self, num_blocks, block_size, max_model_len):
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.ref = [0] * num_blocks
        self.hash = [None] * num_blocks
        self.queue = list(range(1, num_blocks))
        self.cached = {}  # hash -> [blocks], first answers.
        self.req_blocks = {}
        self.num_cached = {}

    def _uncache(self, block):
        digest = self.hash[block]
        if digest is None:
            return
        self.cached[digest].remove(block)
        if not self.cached[digest]:
            del self.cached[digest]
        self.hash[block] = None

    def hit(self, hashes, max_length):
        found = []
        for digest in hashes[:max_length // self.block_size]:
            if digest not in self.cached:
                break
            found.append(self.cached[digest][0])
        return found

    def allocate(self, request, num_new, hits, must_fit=False, lookahead=0,
                 external=0, delay=False):
        rid = request.request_id
        held = self.req_blocks.get(rid, [])
        size = self.block_size
        local = request.num_computed_tokens + len(hits) * size
        computed = min(local + external, self.max_model_len)
        evictable = sum(1 for b in hits if self.ref[b] == 0)

        def short(tokens):
            required = -(-min(tokens, self.max_model_len) // size)
            return max(required - len(held) - len(hits), 0) + evictable > \
                len(self.queue)

        if (must_fit and short(request.num_tokens)) or short(
                computed + num_new + lookahead):
            return None
        required = -(-min(computed + num_new + lookahead,
                          self.max_model_len) // size)
        held = self.req_blocks.setdefault(rid, [])
        if rid not in self.num_cached and (hits or external):
            for b in hits:
                if self.ref[b] == 0:
                    self.queue.remove(b)
                self.ref[b] += 1
            held.extend(hits)
            self.num_cached[rid] = len(held)
            if external:  # blocks for the connector's tokens: not "new".
                held.extend(self._take(-(-(local + external) // size) -
                                       len(held)))
        new = self._take(required - len(held))
        held.extend(new)
        if not delay:
            self.cache(request, min(computed + num_new, request.num_tokens))
        return new

    def _take(self, count):
        taken = []
        for _ in range(max(count, 0)):
            b = self.queue.pop(0)
            self._uncache(b)
            self.ref[b] = 1
            taken.append(b)
        return taken

    def cache(self, request, num_tokens):
        rid = request.request_id
        full = num_tokens // self.block_size
        first = self.num_cached.get(rid, 0)
        if full <= first:
            return
        held = self.req_blocks.setdefault(rid, [])
        for i in range(first, min(full, len(held))):
            digest = request.block_hashes[i]
            self.hash[held[i]] = digest
            self.cached.setdefault(digest, []).append(held[i])
        self.num_cached[rid] = full

    def evict(self, block_ids):
        for block in block_ids:
            self._uncache(block)

    def free(self, rid):
        blocks = self.req_blocks.pop(rid, [])
        self.num_cached.pop(rid, None)
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue.append(b)


class Scheduler:
    """vLLM v1's loop in small: running requests first (decode, the rest of a
    chunked prompt, drafts, lookahead slots now and then), recompute
    preemption of the latest running request when blocks run out, then FCFS
    admissions under a token budget with full_sequence_must_fit (some with
    tokens from a KV connector, some with their caching delayed a step);
    a connector's evict_blocks now and then."""

    def __init__(self, manager, model, budget, max_running, spec_tokens,
                 seed):
        self.kv = manager
        self.model = model
        self.budget = budget
        self.max_running = max_running
        self.spec_tokens = spec_tokens
        self.rng = random.Random(seed)
        self.waiting, self.running, self.delayed = [], [], []
        self.paths = collections.Counter()  # the odd paths taken.
        self.finished = self.preemptions = self.hits = 0

    def allocate(self, request, num_new):
        """A running request's allocate_slots, checked against the model
        (with lookahead slots now and then, as EAGLE asks)."""
        lookahead = 2 if self.rng.random() < 0.2 else 0
        expected = self.model.allocate(request, num_new, [],
                                       lookahead=lookahead)
        got = self.kv.allocate_slots(request, num_new,
                                     num_lookahead_tokens=lookahead)
        self.paths["lookahead"] += lookahead > 0
        assert (got is None) == (expected is None)
        if got is not None:
            assert ids(got) == expected
        return got

    def preempt(self, request):
        self.running.remove(request)
        self.kv.free(request)
        self.model.free(request.request_id)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.insert(0, request)
        self.preemptions += 1

    def step(self):
        budget = self.budget
        scheduled = []
        # Delayed blocks are cached once their KV arrived; a connector
        # evicts a block now and then.
        for request in self.delayed:
            if request in self.running:
                self.kv.cache_blocks(request, request.num_computed_tokens)
                self.model.cache(request, request.num_computed_tokens)
        self.delayed = []
        if self.rng.random() < 0.05:
            victims = [self.rng.randrange(1, len(self.model.ref))
                       for _ in range(2)]
            self.kv.evict_blocks(victims)
            self.model.evict(victims)
            self.paths["evicted"] += 1
        for request in list(self.running):
            if request not in self.running:
                continue
            new = min(request.num_tokens + len(request.spec_token_ids) -
                      request.num_computed_tokens, budget)
            if new <= 0:
                continue
            while True:
                got = self.allocate(request, new)
                if got is not None:
                    break
                victim = self.running[-1]
                self.preempt(victim)
                scheduled = [s for s in scheduled if s[0] is not victim]
                if victim is request:
                    break
            if got is None:
                continue
            scheduled.append((request, new))
            budget -= new
        while self.waiting and budget > 0 and \
                len(self.running) < self.max_running:
            request = self.waiting[0]
            blocks, hits = self.kv.get_computed_blocks(request)
            model_hits = self.model.hit(request.block_hashes,
                                        request.num_tokens - 1)
            assert ids(blocks) == model_hits if blocks.blocks[0] else \
                model_hits == []
            # Now and then the KV of some tokens after the hits comes from a
            # connector (P/D), or the blocks are cached a step later.
            left = request.num_tokens - 1 - hits
            external = self.rng.randrange(left + 1) \
                if left > 0 and self.rng.random() < 0.15 else 0
            delay = self.rng.random() < 0.1
            new = min(request.num_tokens - hits - external, budget)
            got = self.kv.allocate_slots(
                request, new, hits, blocks,
                num_external_computed_tokens=external,
                delay_cache_blocks=delay, full_sequence_must_fit=True)
            expected = self.model.allocate(request, new, model_hits,
                                           must_fit=True, external=external,
                                           delay=delay)
            assert (got is None) == (expected is None)
            if got is None:
                break
            assert ids(got) == expected
            if delay:
                self.delayed.append(request)
            self.paths.update(external=external > 0, delayed=delay)
            hits += external
            self.hits += hits
            self.waiting.pop(0)
            request.num_computed_tokens = hits
            self.running.append(request)
            scheduled.append((request, new))
            budget -= new
        for request, new in scheduled:
            drafts = len(request.spec_token_ids)
            request.num_computed_tokens += new
            if request.num_computed_tokens < request.num_tokens:
                continue
            accepted = 0
            while accepted < drafts and self.rng.random() < 0.7:
                accepted += 1
            request.num_computed_tokens -= drafts - accepted
            for _ in range(accepted + 1):
                if request.num_output_tokens < request.max_tokens:
                    request.append_output_token_ids(
                        self.rng.randrange(1, 50))
            request.num_computed_tokens = min(request.num_computed_tokens,
                                              request.num_tokens - 1)
            left = request.max_tokens - request.num_output_tokens
            request.spec_token_ids = [0] * min(self.spec_tokens,
                                               max(0, left - 1))
            if request.num_output_tokens >= request.max_tokens:
                self.running.remove(request)
                self.kv.free(request)
                self.model.free(request.request_id)
                self.finished += 1


def manager_ids(manager, request):
    return manager.get_block_ids(request.request_id)[0]


def make_trace(rng, count, block_size):
    system = [rng.randrange(1, 50) for _ in range(3 * block_size + 1)]
    trace = []
    for i in range(count):
        prompt = (system if rng.random() < 0.5 else []) + [
            rng.randrange(1, 50) for _ in range(rng.randrange(1, 40))]
        for s in range(3 if rng.random() < 0.15 else 1):
            trace.append((i // 3, make_request(
                f"r{i}-{s}", prompt, block_size,
                cache_salt="tenant" if i % 4 == 0 else None,
                max_tokens=rng.randrange(1, 20))))
    return trace


@pytest.mark.parametrize("seed,spec_tokens", [(1, 0), (2, 0), (3, 3), (4, 2)])
def test_a_vllm_style_loop_gets_vllms_block_ids_call_for_call(seed,
                                                             spec_tokens):
    rng = random.Random(seed)
    block_size = 4
    manager = make_manager(block_size=block_size, num_blocks=64,
                           max_model_len=128, enable_kv_cache_events=True)
    model = ReferencePool(64, block_size, 128)
    scheduler = Scheduler(manager, model, budget=48, max_running=16,
                          spec_tokens=spec_tokens, seed=seed)
    trace = make_trace(rng, 60, block_size)
    total = len(trace)
    # The cache as a router rebuilds it from the events: blocks per hash (a
    # hash is cached on several blocks when requests computed it apart).
    cached = collections.Counter()
    step = 0
    while scheduler.finished < total:
        while trace and trace[0][0] <= step:
            scheduler.waiting.append(trace.pop(0)[1])
        scheduler.step()
        manager.check_invariants()
        for request in scheduler.running:
            assert manager_ids(manager, request) == \
                model.req_blocks[request.request_id]
        for event in manager.take_events():
            if isinstance(event, BlockRemoved):
                assert cached[event.block_hashes[0]] > 0
                cached[event.block_hashes[0]] -= 1
            elif isinstance(event, BlockStored):
                cached.update(event.block_hashes)
        step += 1
        assert step < 5000, "the loop does not converge"
    assert manager.usage == 0.0
    assert +cached == collections.Counter({
        int.from_bytes(d[-8:], "big"): len(blocks)
        for d, blocks in model.cached.items()})
    assert scheduler.preemptions > 0 and scheduler.hits > 0
    assert all(scheduler.paths[path] > 0 for path in
               ("external", "delayed", "evicted", "lookahead")), \
        scheduler.paths
    assert manager.reset_prefix_cache()


# The host tier ---------------------------------------------------------------

STORE = kvblock.HostCopyDirection.DEVICE_TO_HOST
LOAD = kvblock.HostCopyDirection.HOST_TO_DEVICE


class KvMemory:
    """The KV a worker holds, as the token each slot's KV is of: the device's
    blocks and the host tier's pages, the copies run as a worker runs a
    batch (every store, then every load), and a forward pass that checks
    what attention reads before it writes what it computes."""

    def __init__(self, num_blocks, block_size, host_pages):
        self.block_size = block_size
        self.device = [[None] * block_size for _ in range(num_blocks)]
        self.host = [[None] * block_size for _ in range(host_pages)]
        self.loads = 0

    def run(self, copies):
        assert copies.dtype == kvblock.HOST_COPY_DTYPE
        for copy in copies[copies["direction"] == STORE]:
            self.host[copy["host_page"]] = list(
                self.device[copy["device_page"]])
        for copy in copies[copies["direction"] == LOAD]:
            self.device[copy["device_page"]] = list(
                self.host[copy["host_page"]])
            self.loads += 1

    def forward(self, request, block_ids, start, end):
        size = self.block_size
        tokens = request.all_token_ids
        for position in range(start):
            block = self.device[block_ids[position // size]]
            assert block[position % size] == tokens[position], \
                (request.request_id, position)
        for position in range(start, end):
            self.device[block_ids[position // size]][position % size] = \
                tokens[position]


def cpu_events(events):
    return [e for e in events if e.medium == "CPU"]


def test_a_host_tier_is_refused_where_it_cannot_serve():
    config = make_kv_cache_config(16, 8)
    hybrid = KVCacheConfig(8, [], config.kv_cache_groups + [
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(16, 128))])
    with pytest.raises(kvblock.InvalidArgumentError,
                       match="the host tier serves one full-attention group"):
        KVCacheManager(hybrid, 1024, 16, host_pages=4)
    with pytest.raises(kvblock.InvalidArgumentError, match="needs caching"):
        KVCacheManager(config, 1024, 16, enable_caching=False, host_pages=4)
    with pytest.raises(kvblock.InvalidArgumentError, match="host_pages"):
        KVCacheManager(config, 1024, 16, host_pages=-1)
    with pytest.raises(ValueError, match="host_write_policy"):
        KVCacheManager(config, 1024, 16, host_pages=4,
                       host_write_policy="later")
    # Without a host tier: no match, no copies, as without a connector.
    manager = make_manager()
    request = make_request("0", list(range(40)))
    assert manager.get_num_new_matched_tokens(request, 0) == (0, False)
    copies = manager.take_host_copies()
    assert copies.dtype == kvblock.HOST_COPY_DTYPE and len(copies) == 0
    assert manager.host_pages == 0 and manager.num_host_cached == 0


def test_a_prompt_evicted_to_the_host_tier_is_served_from_it():
    """A scheduler's turns: prompt a computed and finished, prompt b taking
    every block (a's go to the host tier), then a again: no device hit,
    the connector's count, its blocks loaded by allocate_slots and their
    copies handed out, its KV what a computed; the events a router reads."""
    manager = make_manager(block_size=4, num_blocks=11,
                           enable_kv_cache_events=True, host_pages=8)
    memory = KvMemory(11, 4, 8)
    prompt = list(range(100, 117))  # 4 full blocks and a token.
    a = make_request("a", prompt, block_size=4)
    _, hits, new = admit(manager, a)
    assert hits == 0 and manager.get_num_new_matched_tokens(a, 0) == (0, False)
    memory.run(manager.take_host_copies())
    memory.forward(a, manager_ids(manager, a), 0, 17)
    manager.free(a)
    b = make_request("b", list(range(500, 540)), block_size=4)  # 10 blocks.
    admit(manager, b)
    stores = manager.take_host_copies()
    assert len(stores) == 4 and (stores["direction"] == STORE).all()
    memory.run(stores)
    memory.forward(b, manager_ids(manager, b), 0, 40)
    manager.free(b)
    events = manager.take_events()
    (gpu_a,) = [e for e in events if isinstance(e, BlockStored) and
                e.medium == "GPU" and e.token_ids[:1] == [100]]
    # The connector's CPU events: after the manager's, raw digests (vLLM's
    # connector does not convert them), continuation first.
    stored = cpu_events(events)
    assert events[-len(stored):] == stored
    assert [e.block_hashes for e in stored] == [a.block_hashes[::-1]]
    assert stored[0] == BlockStored(
        block_hashes=a.block_hashes[::-1], parent_block_hash=None,
        token_ids=[], block_size=0, lora_id=None, medium="CPU",
        lora_name=None)
    assert stored[0].extra_keys is None and stored[0].group_idx is None
    assert stored[0].kv_cache_spec_kind is None
    assert manager.num_host_cached == 4

    # a's next turn (a new request of the same prompt).
    again = make_request("a2", prompt, block_size=4)
    blocks, hits = manager.get_computed_blocks(again)
    assert hits == 0
    external, load_async = manager.get_num_new_matched_tokens(again, hits)
    assert (external, load_async) == (16, False)
    new = manager.allocate_slots(again, again.num_tokens - external, hits,
                                 blocks, num_external_computed_tokens=external)
    held = manager_ids(manager, again)
    assert len(held) == 5 and ids(new) == held[4:]  # loaded ones not new.
    assert [manager.blocks[i].block_hash[:-4] for i in held[:4]] == \
        again.block_hashes
    copies = manager.take_host_copies()
    loads = copies[copies["direction"] == LOAD]
    assert loads["device_page"].tolist() == held[:4]
    assert set(loads["host_page"].tolist()) == \
        set(stores["host_page"].tolist())
    memory.run(copies)
    memory.forward(again, held, 16, 17)  # reads the loaded KV.
    assert memory.loads == 4
    # The loads are cached on the GPU again: BlockStored with chain and
    # tokens, as vLLM's cache_blocks after a connector's load.
    events = manager.take_events()
    (loaded,) = [e for e in events if isinstance(e, BlockStored) and
                 e.medium == "GPU"]
    assert loaded.block_hashes == gpu_a.block_hashes
    assert loaded.token_ids == prompt[:16] and loaded.parent_block_hash is None
    # b's evicted blocks went to the host tier: four CPU stores (the fifth
    # found every host page used by this batch).
    assert [len(e.block_hashes) for e in cpu_events(events)] == [4]
    manager.check_invariants()


def test_a_prompt_of_whole_blocks_from_the_host_tier_computes_its_last():
    manager = make_manager(block_size=4, num_blocks=11, host_pages=8)
    prompt = list(range(100, 116))  # 4 full blocks.
    admit(manager, make_request("a", prompt, block_size=4))
    manager.free(make_request("a", prompt, block_size=4))
    manager.take_host_copies()
    b = make_request("b", list(range(500, 540)), block_size=4)
    admit(manager, b)
    manager.free(b)
    manager.take_host_copies()
    again = make_request("a2", prompt, block_size=4)
    blocks, hits = manager.get_computed_blocks(again)
    # The connector loads all 16 and vLLM computes the 16th again: 15,
    # with the four blocks loaded in the same step.
    assert manager.get_num_new_matched_tokens(again, hits) == (15, False)
    new = manager.allocate_slots(again, 1, hits, blocks,
                                 num_external_computed_tokens=15)
    assert new.get_block_ids() == ([],)
    copies = manager.take_host_copies()
    assert (copies["direction"] == LOAD).sum() == 4
    # A stale count (more than the host tier holds) is refused, unchanged.
    other = make_request("c", list(range(900, 917)), block_size=4)
    free = manager.num_free_blocks
    with pytest.raises(kvblock.InvalidArgumentError,
                       match="the host tier does not hold block 0"):
        manager.allocate_slots(other, 1, num_external_computed_tokens=16)
    assert manager.num_free_blocks == free
    manager.check_invariants()


def test_host_events_before_a_reset_go_out_before_it():
    manager = make_manager(block_size=4, num_blocks=5,
                           enable_kv_cache_events=True, host_pages=4)
    a = make_request("a", list(range(16)), block_size=4)
    admit(manager, a)
    manager.free(a)
    manager.take_host_copies()
    b = make_request("b", list(range(100, 116)), block_size=4)
    admit(manager, b)  # evicts a's 4: stored.
    manager.free(b)
    assert not manager.reset_prefix_cache()  # its copies are not taken.
    manager.take_host_copies()
    assert manager.reset_prefix_cache()
    events = manager.take_events()
    assert isinstance(events[-1], AllBlocksCleared)
    assert [e.medium for e in events[-2:-1]] == ["CPU"]
    assert manager.num_host_cached == 0
    assert manager.get_num_new_matched_tokens(a, 0) == (0, False)


@pytest.mark.parametrize("seed,policy", [(1, "write_back"), (2, "write_back"),
                                         (3, "write_through")])
def test_a_serving_loop_reads_the_kv_it_loads_from_the_host_tier(seed,
                                                                   policy):
    """vLLM's loop in small, with the connector's two calls: running
    requests decode first (the latest preempted when blocks run out), then
    waiting ones are admitted with their device hit and what the host tier
    can load; each step's copies run before its forward pass, which checks
    that every token's KV it reads is that token's. Multi-turn prompts
    come back after the device evicted them. The CPU events rebuild the
    host tier's contents."""
    rng = random.Random(seed)
    size, num_blocks, host_pages = 4, 24, 32
    manager = make_manager(block_size=size, num_blocks=num_blocks,
                           max_model_len=256, enable_kv_cache_events=True,
                           host_pages=host_pages, host_write_policy=policy)
    memory = KvMemory(num_blocks, size, host_pages)
    bases = [[rng.randrange(1, 50) for _ in range(rng.randrange(12, 36))]
             for _ in range(6)]
    waiting, running = [], []
    host, external_total, finished = set(), 0, 0
    for step in range(400):
        if rng.random() < 0.4:
            prompt = rng.choice(bases) + [
                rng.randrange(1, 50) for _ in range(rng.randrange(0, 6))]
            waiting.append(make_request(f"r{step}", prompt, block_size=size,
                                        max_tokens=rng.randrange(1, 8)))
        scheduled = []
        index = 0
        while index < len(running):
            request = running[index]
            if manager.allocate_slots(request, 1) is None:
                victim = running.pop()  # the latest, not scheduled yet.
                manager.free(victim)
                victim.num_computed_tokens = 0
                waiting.insert(0, victim)
                continue
            scheduled.append((request, request.num_computed_tokens,
                              request.num_tokens))
            index += 1
        while waiting and len(running) < 4:
            request = waiting[0]
            blocks, hits = manager.get_computed_blocks(request)
            external, load_async = manager.get_num_new_matched_tokens(
                request, hits)
            assert not load_async
            assert external == 0 or (hits + external) % size == 0 or \
                hits + external == request.num_tokens - 1
            new = manager.allocate_slots(
                request, request.num_tokens - hits - external, hits, blocks,
                num_external_computed_tokens=external)
            if new is None:
                break
            waiting.pop(0)
            external_total += external
            scheduled.append((request, hits + external, request.num_tokens))
            running.append(request)
        memory.run(manager.take_host_copies())
        for request, start, end in scheduled:
            memory.forward(request, manager_ids(manager, request), start, end)
            request.num_computed_tokens = end
        for event in manager.take_events():
            if event.medium != "CPU":
                continue
            for digest in event.block_hashes:
                if isinstance(event, BlockRemoved):
                    host.remove(digest)
                else:
                    assert digest not in host
                    host.add(digest)
        assert len(host) == manager.num_host_cached
        for request, _, _ in scheduled:
            if request.num_output_tokens == request.max_tokens:
                running.remove(request)
                manager.free(request)
                finished += 1
            else:
                request.append_output_token_ids(rng.randrange(1, 50))
        manager.check_invariants()
    assert finished > 50 and memory.loads > 0 and external_total > 0
