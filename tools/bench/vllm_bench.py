#!/usr/bin/env python3
# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock.vllm.KVCacheManager in vLLM's scheduler loop, and against vLLM's
own manager in the same loop.

  PYTHONPATH=build-release/lib/python python3 tools/bench/vllm_bench.py \\
      [--vllm-src DIR] [--model llama|gpt-oss]

Rows (medians over --rounds; each round runs every manager once, in turn,
and the ratio is the median of the rounds' ratios):
  decode allocate_slots      one decode token of each of 256 running
                             4,096-token requests (16-token blocks; 1 call in
                             16 starts a block; the request's new block hash
                             computed by its hasher, outside the call)
  admission, 1,000-token hit get_computed_blocks + allocate_slots of a
                             1,100-token prompt whose first 1,000 tokens (62
                             blocks) are cached
  retried lookup             get_computed_blocks of a waiting 1,100-token
                             request (a 1,000-token hit) asked again, as
                             the scheduler asks a request it could not admit
  free                       free of a finished 1,100-token request
  loop                       a replay shaped like vLLM's scheduler: FCFS
                             waiting queue, running requests first (decode),
                             then admissions under a 4,096-token budget with
                             full_sequence_must_fit, recompute preemption of
                             the latest request when blocks run out; 600
                             requests, half sharing a 1,000-token system
                             prompt, 100 to 1,500 unique prompt tokens, 32 to
                             256 output tokens, at most 256 running, 6,000
                             blocks. Time inside the manager's calls, and
                             inside the request hasher (vLLM's Request hashes
                             each full block as it fills).
With --model=gpt-oss every request also has a 128-token sliding-window group
(the pools are twice as large): the window's blocks are freed as requests
advance.
With --vllm-src (a folder holding vLLM's `vllm` package, e.g. a checkout of
vllm-project/vllm), vLLM's own KVCacheManager and get_request_block_hasher
(sha256_cbor) run the same calls, loaded with inert stand-ins for the modules
they do not use (torch, the engine); both hashers start from the same
NONE_HASH, and the loop checks that both managers hand out the same block ids.
"""
import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import random
import statistics
import sys
import time
import types

from kvblock import vllm as kvblock_vllm

BLOCK = 16
HASH = "sha256_cbor"


class Config:
    """vLLM's KVCacheConfig, as both managers read it: a group a spec."""

    def __init__(self, num_blocks, specs):
        self.num_blocks = num_blocks
        self.kv_cache_tensors = []
        self.kv_cache_groups = [types.SimpleNamespace(
            layer_names=[f"layer{i}"], kv_cache_spec=spec,
            is_eagle_group=False) for i, spec in enumerate(specs)]


# --model: the KV cache groups, as (spec class name, window).
MODELS = {
    "llama": [("FullAttentionSpec", 0)],
    "gpt-oss": [("FullAttentionSpec", 0), ("SlidingWindowSpec", 128)],
}


class SlidingWindowSpec(types.SimpleNamespace):
    """vLLM's SlidingWindowSpec as kvblock.vllm reads it (by class name)."""


class FullAttentionSpec(types.SimpleNamespace):
    """vLLM's FullAttentionSpec as kvblock.vllm reads it."""


class Request:
    """vLLM's Request fields the managers read; block hashes from the
    request's block hasher at creation and as tokens are appended."""

    def __init__(self, request_id, prompt, max_tokens, hasher, clock):
        self.request_id = request_id
        self._all_token_ids = list(prompt)
        self.all_token_ids = self._all_token_ids
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.max_tokens = max_tokens
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.mm_features = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None
        self.block_hashes = []
        self._hasher = hasher
        self._clock = clock
        self.update_block_hashes()

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    def append(self, token):
        self._all_token_ids.append(token)
        self.update_block_hashes()

    def update_block_hashes(self):
        start = time.perf_counter_ns()
        self.block_hashes.extend(self._hasher(self))
        self._clock[0] += time.perf_counter_ns() - start


# vLLM's own manager ----------------------------------------------------------

# The modules of vLLM that its KV cache manager runs on; every other vllm
# module (and torch) is an inert stand-in.
_REAL = {
    "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator", "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_metrics", "vllm.utils.hashing",
    "vllm.utils.math_utils", "vllm.v1.kv_cache_interface",
    "vllm.v1.metrics.stats",
}


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls()


class _Inert(metaclass=_InertMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Inert,), {})
        setattr(self, name, value)
        return value


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root):
        self.root = root

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in ("vllm", "torch"):
            return None
        if name in _REAL:
            return importlib.util.spec_from_file_location(
                name, os.path.join(self.root, *name.split(".")) + ".py")
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        if module.__name__ == "vllm.envs":
            module.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
        elif module.__name__ == "vllm.logger":
            import logging
            module.init_logger = logging.getLogger
        elif module.__name__ == "vllm.distributed.kv_events":
            class KVCacheEvent:
                def __init__(self, **fields):
                    self.__dict__.update(fields)
            module.KVCacheEvent = KVCacheEvent
            for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
                setattr(module, name, type(name, (KVCacheEvent,), {}))
            module.MEDIUM_GPU = "GPU"


def load_vllm(src):
    """vLLM's (KVCacheManager, kv_cache_utils, kv_cache_interface)."""
    sys.meta_path.insert(0, _VllmFinder(os.path.abspath(src)))
    manager = importlib.import_module("vllm.v1.core.kv_cache_manager")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    hashing = importlib.import_module("vllm.utils.hashing")
    utils.init_none_hash(hashing.sha256_cbor)
    return manager.KVCacheManager, utils, interface, hashing


class Subject:
    """One manager, its request hasher and its clocks."""

    def __init__(self, name, make_manager, hasher):
        self.name = name
        self.make_manager = make_manager
        self.hasher = hasher
        self.hash_ns = [0]

    def request(self, request_id, prompt, max_tokens=1 << 30):
        return Request(request_id, prompt, max_tokens, self.hasher,
                       self.hash_ns)


def subjects(vllm_src, model):
    # One NONE_HASH for both hashers, so that their bytes can be compared.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    kvblock_hasher = kvblock_vllm.get_request_block_hasher(BLOCK, HASH)
    groups = MODELS[model]
    specs = [globals()[name](block_size=BLOCK, sliding_window=window)
             for name, window in groups]
    out = [Subject(
        "kvblock", lambda blocks, model_len: kvblock_vllm.KVCacheManager(
            Config(blocks * len(specs), specs), model_len, BLOCK),
        kvblock_hasher)]
    if vllm_src:
        manager, utils, interface, hashing = load_vllm(vllm_src)
        vllm_specs = [
            interface.FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                        head_size=1, dtype=None)
            if name == "FullAttentionSpec" else
            interface.SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1,
                                        head_size=1, dtype=None,
                                        sliding_window=window)
            for name, window in groups]
        vllm_hasher = utils.get_request_block_hasher(BLOCK,
                                                     hashing.sha256_cbor)
        out.append(Subject(
            "vLLM", lambda blocks, model_len: manager(
                Config(blocks * len(specs), vllm_specs), model_len, BLOCK),
            vllm_hasher))
        probe = list(range(40))
        mine, theirs = out[0].request("p", probe), out[1].request("p", probe)
        assert mine.block_hashes == theirs.block_hashes, \
            "kvblock's hasher and vLLM's disagree"
    return out


# Micro rows ------------------------------------------------------------------

def bench_decode(subject):
    kv = subject.make_manager(72000, 32768)
    running = []
    for i in range(256):
        r = subject.request(f"r{i}", range(i * 10000, i * 10000 + 4096))
        kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        running.append(r)
    elapsed = calls = 0
    for _ in range(64):
        for r in running:
            r.append(7)
        start = time.perf_counter_ns()
        for r in running:
            kv.allocate_slots(r, 1)
        elapsed += time.perf_counter_ns() - start
        calls += len(running)
        for r in running:
            r.num_computed_tokens += 1
    return elapsed / calls


def bench_admission(subject, count=200):
    kv = subject.make_manager(65536, 32768)
    shared = list(range(1000))
    warm = subject.request("warm", shared + [1] * 100)
    kv.allocate_slots(warm, warm.num_tokens)
    kv.free(warm)
    requests = [subject.request(f"a{i}", shared + list(
        range(10000 + 100 * i, 10100 + 100 * i))) for i in range(count)]
    start = time.perf_counter_ns()
    for r in requests:
        blocks, hits = kv.get_computed_blocks(r)
        kv.allocate_slots(r, r.num_tokens - hits, hits, blocks)
    admit = (time.perf_counter_ns() - start) / count
    # Requests left waiting: looked up once, then asked again.
    waiting = [subject.request(f"w{i}", shared + list(
        range(90000 + 100 * i, 90100 + 100 * i))) for i in range(count)]
    for r in waiting:
        kv.get_computed_blocks(r)
    start = time.perf_counter_ns()
    for _ in range(5):
        for r in waiting:
            kv.get_computed_blocks(r)
    retried = (time.perf_counter_ns() - start) / (5 * count)
    start = time.perf_counter_ns()
    for r in requests:
        kv.free(r)
    freed = (time.perf_counter_ns() - start) / count
    return admit, retried, freed


# The loop --------------------------------------------------------------------

def make_trace(seed):
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(1000)]
    trace = []
    for i in range(600):
        prompt = (system if i % 2 == 0 else []) + [
            rng.randrange(32000) for _ in range(rng.randrange(100, 1500))]
        trace.append((i // 4, f"q{i}", prompt, rng.randrange(32, 256)))
    return trace


class Timed:
    """A manager whose calls are timed."""

    def __init__(self, manager):
        self.kv = manager
        self.ns = 0

    def __getattr__(self, name):
        method = getattr(self.kv, name)

        def timed(*args, **kwargs):
            start = time.perf_counter_ns()
            result = method(*args, **kwargs)
            self.ns += time.perf_counter_ns() - start
            return result
        setattr(self, name, timed)
        return timed


def preempt_latest(kv, running, waiting, scheduled):
    """vLLM's recompute preemption of the latest running request: freed,
    back at the head of the waiting queue, out of this step's schedule;
    (the victim, the schedule left)."""
    victim = running.pop()
    kv.free(victim)
    victim.num_computed_tokens = 0
    victim.num_preemptions += 1
    waiting.insert(0, victim)
    return victim, [s for s in scheduled if s[0] is not victim]


def run_loop(subject, trace, budget=4096, max_running=256, blocks=6000):
    """Runs the trace to its end; (manager ns, hasher ns, block ids handed
    out in order)."""
    kv = Timed(subject.make_manager(blocks, 8192))
    subject.hash_ns[0] = 0
    pending = list(trace)
    waiting, running, handed = [], [], []
    step = 0
    while pending or waiting or running:
        while pending and pending[0][0] <= step:
            _, rid, prompt, max_tokens = pending.pop(0)
            waiting.append(subject.request(rid, prompt, max_tokens))
        left = budget
        scheduled = []
        for r in list(running):
            if r not in running:
                continue
            new = min(r.num_tokens - r.num_computed_tokens, left)
            while True:
                got = kv.allocate_slots(r, new)
                if got is not None:
                    break
                victim, scheduled = preempt_latest(kv, running, waiting,
                                                   scheduled)
                if victim is r:
                    break
            if got is None:
                continue
            handed += [b for group in got.get_block_ids() for b in group]
            scheduled.append((r, new))
            left -= new
        while waiting and left > 0 and len(running) < max_running:
            r = waiting[0]
            blocks_hit, hits = kv.get_computed_blocks(r)
            new = min(r.num_tokens - hits, left)
            got = kv.allocate_slots(r, new, hits, blocks_hit,
                                    full_sequence_must_fit=True)
            if got is None:
                break
            handed += [b for group in got.get_block_ids() for b in group]
            waiting.pop(0)
            r.num_computed_tokens = hits
            running.append(r)
            scheduled.append((r, new))
            left -= new
        for r, new in scheduled:
            r.num_computed_tokens += new
            if r.num_computed_tokens < r.num_tokens:
                continue
            r.append(1 + (r.num_tokens * 7919) % 32000)
            if r.num_tokens - r.num_prompt_tokens >= r.max_tokens:
                running.remove(r)
                kv.free(r)
        step += 1
    return kv.ns, subject.hash_ns[0], handed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-src", help="folder holding vLLM's package")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="llama",
                        help="the KV cache groups: llama one full-attention "
                        "group, gpt-oss full attention and a 128-token "
                        "sliding window")
    args = parser.parse_args(argv)
    chosen = subjects(args.vllm_src, args.model)
    trace = make_trace(1)
    results = {s.name: {} for s in chosen}
    for _ in range(args.rounds):
        handed = []
        for subject in chosen:
            row = results[subject.name]
            row.setdefault("decode", []).append(bench_decode(subject))
            admit, retried, freed = bench_admission(subject)
            row.setdefault("admission", []).append(admit)
            row.setdefault("retried", []).append(retried)
            row.setdefault("free", []).append(freed)
            manager_ns, hash_ns, ids = run_loop(subject, trace)
            row.setdefault("loop manager", []).append(manager_ns)
            row.setdefault("loop hasher", []).append(hash_ns)
            row.setdefault("loop both", []).append(manager_ns + hash_ns)
            handed.append(ids)
        assert all(ids == handed[0] for ids in handed), \
            "the managers handed out different block ids"
    units = {"decode": ("us a call", 1e3), "admission": ("us a call", 1e3),
             "retried": ("us a call", 1e3), "free": ("us a call", 1e3),
             "loop manager": ("ms", 1e6), "loop hasher": ("ms", 1e6),
             "loop both": ("ms", 1e6)}
    # Medians over the rounds; the ratio is the median of each round's
    # ratio (the two ran back to back in it).
    print(f"{'row':<14}" + "".join(f"{s.name:>12}" for s in chosen) +
          ("  vLLM / kvblock" if len(chosen) > 1 else ""))
    for row, (unit, scale) in units.items():
        series = [results[s.name][row] for s in chosen]
        line = f"{row:<14}" + "".join(
            f"{statistics.median(v) / scale:>12.2f}" for v in series)
        if len(series) > 1:
            ratio = statistics.median(b / a for a, b in zip(*series))
            line += f"  {ratio:>6.1f}x"
        print(f"{line}  ({unit})")


if __name__ == "__main__":
    main(sys.argv[1:])
