# Copyright 2026 The kvblock Authors.
"""kvblock.vllm.KVCacheManager driven the way vLLM v1's scheduler drives its
KV cache manager: an FCFS waiting queue, running requests scheduled first
(decode, the rest of a chunked prompt, drafts), then admissions from the
queue head under a token budget, recompute preemption of the latest running
request when pages run out, parallel sampling as separate requests sharing
the prompt. Invariants are checked every step; every page is back at the
end."""
import enum
import random
import zlib

import numpy as np
import pytest

import kvblock
from kvblock.vllm import (AllBlocksCleared, BlockRemoved, BlockStored,
                          KVCacheManager)


class Status(enum.Enum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


class Request:
    """The fields of vLLM's Request the adapter reads."""

    def __init__(self, request_id, prompt, max_tokens, cache_salt=None):
        self.request_id = request_id
        self.all_token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.lora_request = None
        self.status = Status.WAITING
        self.num_preemptions = 0
        self.max_tokens = max_tokens
        self.spec_token_ids = []

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self):
        return self.num_tokens - self.num_prompt_tokens


def generated_token(request, position):
    key = f"{request.request_id}/{position}".encode()
    return (zlib.crc32(key) & 0x7FFF) + 1


def make_trace(seed, count=60, page_size=4):
    rng = random.Random(seed)
    system = [rng.randrange(1, 5000) for _ in range(3 * page_size + 1)]
    requests = []
    for i in range(count):
        prompt = (system if rng.random() < 0.5 else []) + [
            rng.randrange(1, 5000) for _ in range(rng.randrange(1, 40))]
        samples = 3 if rng.random() < 0.15 else 1  # parallel sampling.
        for s in range(samples):
            requests.append((i // 3, Request(f"r{i}-{s}", prompt,
                                             rng.randrange(1, 20),
                                             "tenant" if i % 4 == 0 else None)))
    return requests


class Scheduler:
    """A small vLLM v1-style scheduler loop over the adapter."""

    def __init__(self, kv, token_budget, max_running, spec_tokens=0, seed=0):
        self.kv = kv
        self.token_budget = token_budget
        self.max_running = max_running
        self.spec_tokens = spec_tokens
        self.rng = random.Random(seed)
        self.waiting = []
        self.running = []
        self.finished = 0
        self.preemptions = 0

    def preempt(self, request):
        self.running.remove(request)
        self.kv.free(request)
        request.status = Status.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.insert(0, request)
        self.preemptions += 1

    def step(self):
        budget = self.token_budget
        scheduled = {}
        # Running requests first, in order; the latest gives way when pages
        # run out.
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted below.
            new = request.num_tokens - request.num_computed_tokens
            new += len(request.spec_token_ids)
            new = min(new, budget)
            if new <= 0:
                continue
            while True:
                blocks = self.kv.allocate_slots(request, new)
                if blocks is not None:
                    break
                victim = self.running[-1]
                self.preempt(victim)
                scheduled.pop(victim.request_id, None)
                if victim is request:
                    break
            if blocks is None:
                continue
            scheduled[request.request_id] = (request, new)
            budget -= new
        # Admissions from the queue head.
        while self.waiting and budget > 0 and len(
                self.running) < self.max_running:
            request = self.waiting[0]
            blocks, hits = self.kv.get_computed_blocks(request)
            new = min(request.num_tokens - hits, budget)
            got = self.kv.allocate_slots(request, new, hits, blocks)
            if got is None:
                break
            self.waiting.pop(0)
            request.status = Status.RUNNING
            request.num_computed_tokens = hits
            self.running.append(request)
            scheduled[request.request_id] = (request, new)
            budget -= new
        # The model ran: update the requests as vLLM's update_from_output.
        for request, new in scheduled.values():
            drafts = len(request.spec_token_ids)
            request.num_computed_tokens += new
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prompt chunk, no token sampled.
            accepted = 0
            while accepted < drafts and self.rng.random() < 0.7:
                accepted += 1
            # Rejected drafts are not computed after all.
            request.num_computed_tokens -= drafts - accepted
            for _ in range(accepted + 1):
                if request.num_output_tokens < request.max_tokens:
                    request.all_token_ids.append(
                        generated_token(request, request.num_tokens))
            request.num_computed_tokens = min(request.num_computed_tokens,
                                              request.num_tokens - 1)
            left = request.max_tokens - request.num_output_tokens
            request.spec_token_ids = [0] * min(self.spec_tokens,
                                               max(0, left - 1))
            if request.num_output_tokens >= request.max_tokens:
                self.running.remove(request)
                self.kv.free(request)
                request.status = Status.FINISHED
                self.finished += 1


def check_step(kv, scheduler):
    kv.check_invariants()
    assert len(kv) == len(scheduler.running)
    for request in scheduler.running:
        (ids,) = kv.get_block_ids(request.request_id)
        needed = -(-request.num_computed_tokens // kv.block_size)
        assert len(ids) >= needed
        assert len(set(ids)) == len(ids)
        assert all(0 <= b < kv.num_blocks for b in ids)


@pytest.mark.parametrize("seed,spec_tokens,reserve,preempts", [
    (1, 0, True, True), (2, 0, False, True), (3, 3, True, False),
    (4, 2, False, False)])
def test_a_vllm_style_scheduler_runs_a_trace_to_the_end(seed, spec_tokens,
                                                        reserve, preempts):
    kv = KVCacheManager(num_blocks=96, block_size=4, max_model_len=128,
                        max_num_seqs=16, log_stats=True,
                        full_sequence_must_fit=reserve,
                        enable_kv_cache_events=True)
    scheduler = Scheduler(kv, token_budget=48, max_running=16,
                          spec_tokens=spec_tokens, seed=seed)
    arrivals = make_trace(seed)
    total = len(arrivals)
    step = 0
    cached = set()  # the cache as the events tell it, as a router would.
    while scheduler.finished < total:
        while arrivals and arrivals[0][0] <= step:
            scheduler.waiting.append(arrivals.pop(0)[1])
        scheduler.step()
        check_step(kv, scheduler)
        apply_events(kv, cached)
        step += 1
        assert step < 5000, "the loop does not converge"
    assert kv.usage == 0.0 and len(kv) == 0
    kv.check_invariants()
    # The paths the trace is built to take (fixed seeds).
    manager_stats = kv.manager.stats
    assert manager_stats["prompt_chunks"] > 0
    assert manager_stats["evictions"] > 0
    assert (manager_stats["draft_slots"] > 0) == (spec_tokens > 0)
    assert (scheduler.preemptions > 0) == preempts
    stats = kv.make_prefix_cache_stats()
    assert stats.hits > 0  # shared system prompts and parallel samples.
    assert kv.reset_prefix_cache()
    apply_events(kv, cached)
    assert not cached


def apply_events(kv, cached):
    """Applies the adapter's KV events to `cached` (vLLM's integer hashes)
    and checks it against the manager's cache."""
    for event in kv.take_events():
        if isinstance(event, AllBlocksCleared):
            cached.clear()
        elif isinstance(event, BlockRemoved):
            for block in event.block_hashes:
                cached.remove(block)
        else:
            assert isinstance(event, BlockStored)
            assert len(event.token_ids) == kv.block_size * len(
                event.block_hashes)
            assert event.block_size == kv.block_size
            if event.parent_block_hash is None:
                # A prompt's first pages: their hashes are the prompt's.
                salt = event.extra_keys[0][0] if event.extra_keys else ""
                digests = kv.manager.hash_prompt(
                    np.array(event.token_ids, dtype=np.int32),
                    cache_salt=salt)
                assert [int.from_bytes(bytes(d[-8:]), "big")
                        for d in digests] == event.block_hashes
            for block in event.block_hashes:
                assert block not in cached
                cached.add(block)
    assert len(cached) == kv.manager.num_cached


def test_admission_hits_and_new_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4, max_model_len=64)
    first = Request("a", list(range(1, 11)), 4)
    blocks, hits = kv.get_computed_blocks(first)
    assert hits == 0
    got = kv.allocate_slots(first, 10, hits, blocks)
    assert len(got.get_block_ids()[0]) == 3
    second = Request("b", list(range(1, 11)) + [77], 4)
    blocks, hits = kv.get_computed_blocks(second)
    assert hits == 8 and blocks.num_hit_blocks == 2
    got = kv.allocate_slots(second, 3, hits, blocks)
    ids_a = kv.get_block_ids("a")[0]
    ids_b = kv.get_block_ids("b")[0]
    assert ids_b[:2] == ids_a[:2]  # the shared prefix pages.
    assert got.get_block_ids()[0] == ids_b  # the hits are new to b.
    assert kv.get_num_common_prefix_blocks("a") == [2]
    kv.free(first)
    kv.free(second)
    assert kv.usage == 0.0


def test_refusals_change_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4, max_model_len=64)
    big = Request("big", list(range(1, 40)), 2)
    assert kv.allocate_slots(big, 39) is None
    assert len(kv) == 0 and kv.usage == 0.0
    with pytest.raises(ValueError, match="num_new_tokens"):
        kv.allocate_slots(big, 0)
    assert kv.take_events() == []  # events off.
